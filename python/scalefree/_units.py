"""Byte sizes as users write them (65536, 64K, 1.5M, 1G, 256MiB) and as we print them: the one
parser and the one formatter."""

from __future__ import annotations

import os

from .errors import InvalidArgumentError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(value, what: str = "size") -> int:
    """An int is taken as is; a string may end in K, M, G or T (binary), optionally + B/iB."""
    if isinstance(value, int):
        return value
    s = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (s[:-1], s[-1]) if s and s[-1] in _UNITS else (s, "")
    try:
        n = int(float(num) * _UNITS[unit])
    except ValueError:
        raise InvalidArgumentError(f"{what} {value!r} is not a size like 65536, 64K, 256M or 1G") from None
    if n < 0:
        raise InvalidArgumentError(f"{what} {value!r} is negative")
    return n


def env_bytes(name: str, default: int) -> int:
    """The size in environment variable ``name`` (as :func:`parse_bytes` reads it), or
    ``default`` when it is unset or blank."""
    v = os.environ.get(name, "").strip()
    return parse_bytes(v, name) if v else default


def parse_positive_bytes(value, what: str = "size") -> int:
    """:func:`parse_bytes`, and at least one byte."""
    n = parse_bytes(value, what)
    if n <= 0:
        raise InvalidArgumentError(f"{what} {value!r} must be at least one byte")
    return n


def human_bytes(nbytes: int) -> str:
    """``1024`` -> ``"1 KiB"``, ``1536`` -> ``"1.5 KiB"``, ``100`` -> ``"100 B"``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{nbytes} B"
