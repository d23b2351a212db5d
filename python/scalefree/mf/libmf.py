"""LIBMF's text model (``mf-train``'s output, ``mf_save_model`` / ``mf_load_model``), read and
written, so models move between LIBMF and scalefree both ways.

The format, as LIBMF writes it::

    f 0            loss (0: squared error; LIBMF's -f)
    m 943          rows of P: users 0 .. m-1
    n 1682         rows of Q: items 0 .. n-1
    k 40           factors per row
    b 3.52986      the training mean: the answer for ids out of range
    p0 T 0.12 ...  one line per user, "T" and k values ("F" and k zeros: no training ratings)
    ...
    q0 T 0.31 ...  one line per item, the same way

A prediction is ``p_u · q_v``; ``b`` when ``u`` or ``v`` is past the model or its row is an
"F" row. LIBMF's ids are the numbers in its files: row ``u`` of P is user ``u``.

**Ids.** Read: user ``u`` is row ``u``; the "F" rows are ids the model does not know (ours
answer them with the mean, as LIBMF answers them with ``b``), so predictions agree id for id.
Written: row ``id`` holds the factors of training id ``id``. Training ids that are exactly
0 .. m-1 give the same file LIBMF would; other ids leave gaps, written as "F" rows, as LIBMF
itself writes the ids its training file skips — so LIBMF's ``mf-predict`` on the original ids
gives our predictions. Ids past LIBMF's 32-bit index (2**31 - 2), or ids so sparse that the
gaps would outnumber the rows (more than ``2 · rows + 2**20`` lines), cannot be written
usefully: an ``InvalidArgumentError`` names the id and the count.

Values are written with 9 significant digits (a float32 round-trips exactly; LIBMF writes 6 and
reads either). Writes are atomic (temporary file, then rename).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from .. import _native
from .._atomic import atomic_path
from ..errors import DataError, InvalidArgumentError

# LIBMF's losses (``-f``): 0-2 real-valued, 5-7 binary, 10-12 one-class. Every one predicts p·q.
LOSSES = (0, 1, 2, 5, 6, 7, 10, 11, 12)
MAX_ROWS = 2**31 - 1  # LIBMF's mf_int: rows per side
_HEADER_KEYS = ("f", "m", "n", "k", "b")
_CHUNK_ROWS = 1 << 14  # factor lines parsed (written) at a time
_FIRST_LINE = re.compile(rb"f[ \t]+-?\d+[ \t]*\r?$")


def is_libmf_model(path) -> bool:
    """True when the file begins as LIBMF's text model does (a first line ``f <loss>``); False
    when it cannot be read (the native reader then says why)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(64)
    except OSError:
        return False
    return bool(_FIRST_LINE.match(first.rstrip(b"\n")))


def _bad(path, line: int, msg: str) -> DataError:
    return DataError(f"{path}:{line}: {msg}")


def _header(f, path) -> tuple[int, int, int, int, float]:
    values = []
    for no, key in enumerate(_HEADER_KEYS, 1):
        line = f.readline()
        if not line:
            raise _bad(path, no, f"LIBMF model ends in its header (expected '{key} <value>'; truncated?)")
        parts = line.split()
        if len(parts) != 2 or parts[0] != key:
            raise _bad(path, no, f"not a LIBMF model header: expected '{key} <value>', found {line.strip()[:60]!r}")
        try:
            values.append(float(parts[1]) if key == "b" else int(parts[1]))
        except ValueError:
            raise _bad(path, no, f"LIBMF model header '{key}' needs a number, found {parts[1][:40]!r}") from None
    fun, m, n, k, b = values
    if fun not in LOSSES:
        raise _bad(path, 1, f"unknown LIBMF loss f {fun} (LIBMF has {', '.join(map(str, LOSSES))})")
    for no, key, v in ((2, "m", m), (3, "n", n)):
        if not 0 <= v <= MAX_ROWS:
            raise _bad(path, no, f"LIBMF model header '{key} {v}' is out of range")
    if k < 1:
        raise _bad(path, 4, f"LIBMF model header 'k {k}' must be at least 1")
    if not np.isfinite(b):
        raise _bad(path, 5, f"LIBMF model header 'b {b}' is not finite")
    return fun, m, n, k, b


def _check_line(path, no: int, line: str, prefix: str, row: int, k: int) -> None:
    """Raises the DataError of the first problem of one factor line (the slow path: only
    after a chunk failed its vectorised checks)."""
    parts = line.split()
    if not parts:
        raise _bad(path, no, f"empty line where LIBMF model row {prefix}{row} belongs")
    if parts[0] != f"{prefix}{row}":
        raise _bad(path, no, f"expected LIBMF model row '{prefix}{row}', found {parts[0][:40]!r}")
    if len(parts) < 2 or parts[1] not in ("T", "F"):
        raise _bad(path, no, f"row {prefix}{row}: expected 'T' or 'F' after the label, found "
                             f"{(parts[1] if len(parts) > 1 else '')[:20]!r}")
    if len(parts) != k + 2:
        raise _bad(path, no, f"row {prefix}{row} has {len(parts) - 2} values, the header says k {k} (truncated?)")
    for tok in parts[2:]:
        try:
            float(tok)
        except ValueError:
            raise _bad(path, no, f"row {prefix}{row}: {tok[:40]!r} is not a number") from None


def _rows(f, path, prefix: str, count: int, k: int, first_line: int):
    """(factors float32 (count × k), known bool (count,)) of one side."""
    out = np.zeros((count, k), np.float32)
    known = np.zeros(count, bool)
    width = k + 2
    done = 0
    while done < count:
        lines = list(itertools.islice(f, min(_CHUNK_ROWS, count - done)))
        if len(lines) < min(_CHUNK_ROWS, count - done):
            at = done + len(lines)
            raise _bad(path, first_line + at, f"LIBMF model ends after {at} of {count} '{prefix}' rows "
                                              f"(header m/n; truncated?)")
        toks = "".join(lines).split()
        ok = len(toks) == len(lines) * width
        if ok:
            grid = np.array(toks, dtype=object).reshape(len(lines), width)
            labels = [f"{prefix}{r}" for r in range(done, done + len(lines))]
            flags = grid[:, 1]
            ok = bool((grid[:, 0] == np.array(labels, dtype=object)).all()) and \
                bool(((flags == "T") | (flags == "F")).all())
        if ok:
            try:
                vals = grid[:, 2:].astype(np.float32)
            except ValueError:
                ok = False
        if not ok:
            for j, line in enumerate(lines):
                _check_line(path, first_line + done + j, line, prefix, done + j, k)
            raise _bad(path, first_line + done, f"malformed LIBMF model rows {prefix}{done}..")  # not reached
        t = flags == "T"
        t &= np.isfinite(vals).all(axis=1)  # a row LIBMF would answer with b
        out[done:done + len(lines)][t] = vals[t]
        known[done:done + len(lines)] = t
        done += len(lines)
    return out, known


def read_model(path) -> "_native.MfModel":
    """LIBMF's text model at ``path`` as a native model (ids 0 .. m-1 and 0 .. n-1, the mean b;
    "F" rows unknown). A bad file is a ``DataError`` naming the file and line."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "r", encoding="ascii", errors="replace", newline=None) as f:
        fun, m, n, k, b = _header(f, path)
        # Each row is at least k + 2 tokens and as many separators: catch a cut file (or a
        # corrupt header) before allocating what the header claims.
        if (m + n) * 2 * (k + 2) > size:
            raise _bad(path, 2, f"LIBMF model header says {m} + {n} rows of k {k} values, the file has only "
                                f"{size} bytes (truncated?)")
        p, ku = _rows(f, path, "p", m, k, 6)
        q, ki = _rows(f, path, "q", n, k, 6 + m)
        for extra, line in enumerate(f, 6 + m + n):
            if line.strip():
                raise _bad(path, extra, f"text after the LIBMF model's {m} + {n} rows: {line.strip()[:40]!r}")
    return _native.MfModel.from_parts(k, p.tobytes(), q.tobytes(), np.arange(m, dtype=np.int64).tobytes(),
                                      np.arange(n, dtype=np.int64).tobytes(), float(np.float32(b)),
                                      ku.astype(np.uint8).tobytes(), ki.astype(np.uint8).tobytes())


def check_ids(side: str, ids: np.ndarray, count: int | None = None) -> int:
    """The rows LIBMF's file needs for ``ids`` (uint64; ``count`` distinct ones, default
    ``len(ids)``): max id + 1, or an ``InvalidArgumentError`` when that cannot be written (see
    the module doc). Lets a caller refuse before training rather than after."""
    if not len(ids):
        return 0
    count = len(ids) if count is None else count
    top = int(ids.max())
    if top >= MAX_ROWS - 1:
        raise InvalidArgumentError(f"{side} id {top} does not fit LIBMF's 32-bit row index (ids must be below "
                                   f"{MAX_ROWS - 1}); renumber the ids or keep the native model format")
    rows = top + 1
    if rows > 2 * count + (1 << 20):
        raise InvalidArgumentError(f"{side} ids are sparse: {count} {side}s with ids up to {top}, so LIBMF's "
                                   f"file would hold {rows} rows (it indexes rows by id); renumber the ids "
                                   f"densely or keep the native model format")
    return rows


def _padded(side: str, ids: np.ndarray, factors: np.ndarray, known: np.ndarray):
    """Rows indexed by id (LIBMF's numbering): gaps become unknown rows."""
    rows = check_ids(side, ids)
    if not rows:
        return factors[:0], known[:0]
    if rows == len(ids) and (ids == np.arange(rows)).all():
        return factors, known
    out = np.zeros((rows, factors.shape[1]), np.float32)
    out[ids] = factors
    kn = np.zeros(rows, bool)
    kn[ids] = known
    return out, kn


def _write_rows(out, prefix: str, factors: np.ndarray, known: np.ndarray) -> None:
    k = factors.shape[1]
    t_fmt = f"{prefix}%d T " + "%.9g " * k + "\n"
    f_line = " F " + "0 " * k + "\n"
    for a in range(0, len(factors), _CHUNK_ROWS):
        block = factors[a:a + _CHUNK_ROWS].astype(np.float64).tolist()
        kn = known[a:a + _CHUNK_ROWS].tolist()
        out.write("".join(t_fmt % (a + j, *row) if kn[j] else f"{prefix}{a + j}{f_line}"
                          for j, row in enumerate(block)))


def write_model(model: "_native.MfModel", path) -> None:
    """``model`` as LIBMF's text model (loss 0, squared error), atomically; see the module doc
    for how ids map to rows."""
    p, q, uid, iid, mean, ku, ki = model.parts()
    k = model.k
    P, ku_ = _padded("user", np.frombuffer(uid, np.uint64), np.frombuffer(p, np.float32).reshape(-1, k),
                     np.frombuffer(ku, np.uint8).astype(bool))
    Q, ki_ = _padded("item", np.frombuffer(iid, np.uint64), np.frombuffer(q, np.float32).reshape(-1, k),
                     np.frombuffer(ki, np.uint8).astype(bool))
    with atomic_path(path) as tmp, open(tmp, "w", encoding="ascii") as out:
        out.write(f"f 0\nm {len(P)}\nn {len(Q)}\nk {k}\nb {float(mean):.9g}\n")
        _write_rows(out, "p", P, ku_)
        _write_rows(out, "q", Q, ki_)
