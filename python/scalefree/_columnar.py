"""Parquet and Arrow IPC (Feather v2) input, read by the Rust crate ``scalefree-columnar``:
one file, or a directory of part files (the one rule of ``_native.resolve_parts``: sorted by
name, ``_SUCCESS``, ``.crc`` and hidden files skipped). Rank r of P reads the footers of all
parts and then only its row groups (Parquet) or record batches (Arrow IPC), balanced by rows
across all parts (``scalefree-columnar``'s crate doc). Columns are chosen by name
(``--columns src,dst``, ``--columns user,item,rating``) or default to the first two integer
columns (and for ratings the first numeric column after them). Nulls, wrong types, missing
columns and truncated files raise :class:`~scalefree.errors.DataError` naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import _native
from .errors import DataError, InvalidArgumentError

_MAGIC_EXTENSIONS = (".parquet", ".pq", ".arrow", ".feather", ".ipc")


def parse_columns(text: str | None, table: str) -> list[str] | None:
    """``"src,dst"`` → ``["src", "dst"]`` (2 names for edges, 3 for ratings, 2 or 3 for
    ``"pairs"``: user, item and an optional rating); None stays None."""
    if text is None:
        return None
    names = [n.strip() for n in str(text).split(",")]
    want = {"edges": (2,), "ratings": (3,), "pairs": (2, 3)}[table]
    if len(names) not in want or not all(names):
        example = {"edges": "src,dst", "ratings": "user,item,rating", "pairs": "user,item[,rating]"}[table]
        count = " or ".join(map(str, want))
        raise InvalidArgumentError(f"--columns takes {count} comma-separated column names (e.g. {example}), got {text!r}")
    return names


def columnar_parts(path) -> list[str] | None:
    """The files to read if ``path`` is a Parquet / Arrow IPC file or a directory whose first
    part is one (by magic bytes or extension), else None (a text or other file: the caller's reader)."""
    p = Path(path)
    if not p.exists():
        return None
    parts = [str(x) for x in _native.resolve_parts(str(p))] if p.is_dir() else [str(p)]
    if not parts:
        return None
    if parts[0].lower().endswith(_MAGIC_EXTENSIONS):
        return parts  # read as columnar even when damaged: the error names the problem
    return parts if _native.columnar_format(parts[0]) is not None else None


def read_pairs(parts: list[str], columns: list[str] | None = None):
    """All rows of ``parts`` as ``(user, item, rating)`` (int64, int64, float32) for
    predictions: the columns named (``user,item`` or ``user,item,rating``), or by default the
    first two integer columns and the next numeric one, NaN ratings when there is none."""
    if columns is None or len(columns) == 3:
        try:
            return _native.read_columnar_share(parts, 0, 1, "ratings", columns)
        except DataError as e:
            if columns is not None or "expected a numeric rating column" not in str(e):
                raise
    u, i = _native.read_columnar_share(parts, 0, 1, "edges", columns)
    return u, i, np.full(len(u), np.nan, np.float32)


def read_share(parts: list[str], rank: int, size: int, table: str, columns: list[str] | None = None,
               max_id: int = (1 << 63) - 1):
    """Rank's share of the rows of ``parts`` (from :func:`columnar_parts`): ``(src, dst)``
    int64 for ``table="edges"``, ``(user, item, rating)`` int64, int64, float32 for
    ``"ratings"``."""
    return _native.read_columnar_share(parts, rank, size, table, columns, max_id)
