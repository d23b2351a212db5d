"""Writing an edge set in another format (``scalefree graph convert``), the format chosen by
the output's name:

* ``.npz``: arrays ``src`` and ``dst`` (int32 while ids fit, uncompressed);
* ``.gz``: a SNAP edge list (``src<TAB>dst`` lines) as gzip members of about
  ``member_bytes`` of text each, so the ranks of a job split it by members;
* ``.csv``: ``src,dst`` lines after a ``src,dst`` header;
* ``.parquet``: columns ``src`` and ``dst`` (int32 while ids fit, else int64), snappy, in row
  groups of ``row_group`` rows (the unit a rank reads); ``.arrow`` / ``.feather``: the same
  as an Arrow IPC file (Feather v2) of record batches of ``row_group`` rows, lz4. Both are
  written with pyarrow;
* anything else: a SNAP edge list;
* with ``sort``, the distinct edges sorted by (src, dst) (what ``distinct().sort()`` writes;
  Parquet declares the two sorting columns): :func:`~.io.load_graph` then keeps every
  rank's edges where they were read instead of sending them to their owners;
* with ``parts`` N > 0, ``out`` is a directory of N parts named as Spark names them
  (``part-00000.csv``, ``part-00001.txt.gz`` ... by ``suffix``) and a ``_SUCCESS`` marker,
  the edges in N consecutive runs; a CSV part has the header at its top, as Spark writes it.

Every file is written atomically (temporary name, then rename).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from .._atomic import atomic_path

# Text per gzip member when writing ``.gz``: 4 MiB.
DEFAULT_MEMBER_BYTES = 4 << 20
# Edges formatted at a time.
_BLOCK = 1 << 20
# Rows per Parquet row group / Arrow record batch.
DEFAULT_ROW_GROUP = 1 << 20


def _lines(src, dst, sep: str) -> bytes:
    if not len(src):
        return b""
    fmt = f"%d{sep}%d"
    return ("\n".join(map(fmt.__mod__, zip(src.tolist(), dst.tolist()))) + "\n").encode()


def _kind(name: str) -> str:
    name = name.lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".arrow", ".feather", ".ipc")):
        return "arrow"
    base = name[:-3] if name.endswith(".gz") else name
    return "csv" if base.endswith(".csv") else "text"


def _write_text(path: Path, src, dst, csv: bool, gz: bool, member_bytes: int, compresslevel: int) -> None:
    """One text file of the edges (CSV with header or SNAP lines), gzip members of about
    ``member_bytes`` of text when ``gz``."""
    sep = "," if csv else "\t"
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        pending = [b"src,dst\n"] if csv else []
        size = sum(map(len, pending))

        def flush():
            nonlocal pending, size
            if pending:
                data = b"".join(pending)
                f.write(gzip.compress(data, compresslevel, mtime=0) if gz else data)
            pending, size = [], 0

        for i in range(0, len(src), _BLOCK):
            text = _lines(src[i:i + _BLOCK], dst[i:i + _BLOCK], sep)
            # Members end at line ends: a block's text is cut at the last newline within the
            # member size.
            while text:
                room = member_bytes - size if gz else len(text)
                if len(text) <= room:
                    pending.append(text)
                    size += len(text)
                    text = b""
                else:
                    cut = text.rfind(b"\n", 0, max(1, room)) + 1
                    if cut == 0:
                        cut = text.find(b"\n") + 1
                    pending.append(text[:cut])
                    text = text[cut:]
                    flush()
            if not gz and size >= member_bytes:
                flush()
        flush()


def _write_columnar(path: Path, src, dst, kind: str, row_group: int, sort: bool = False) -> None:
    try:
        import pyarrow as pa
    except ImportError:
        raise ValueError(f"{path}: writing Parquet or Arrow needs pyarrow (pip install pyarrow)") from None
    top = max(int(src.max(initial=0)), int(dst.max(initial=0)))
    dt = np.int32 if top < 2**31 else np.int64
    table = pa.table({"src": src.astype(dt, copy=False), "dst": dst.astype(dt, copy=False)})
    with atomic_path(path) as tmp:
        if kind == "parquet":
            import pyarrow.parquet as pq

            order = [pq.SortingColumn(0), pq.SortingColumn(1)] if sort else None
            pq.write_table(table, tmp, row_group_size=row_group, compression="snappy", sorting_columns=order)
        else:
            import pyarrow.feather as feather

            feather.write_feather(table, tmp, chunksize=row_group, compression="lz4")


def sorted_distinct(src, dst) -> tuple[np.ndarray, np.ndarray]:
    """The distinct edges of ``(src, dst)`` (non-negative ids), sorted by (src, dst)."""
    from .. import _native

    top = max(int(src.max(initial=0)), int(dst.max(initial=0)))
    pairs = np.empty((len(src), 2), np.uint32 if top < 2**32 else np.int64)
    pairs[:, 0] = src
    pairs[:, 1] = dst
    return _native.sort_dedup_pairs(pairs)


def write_edges(out, src, dst, parts: int = 0, suffix: str | None = None, member_bytes: int = DEFAULT_MEMBER_BYTES,
                compresslevel: int = 6, row_group: int = DEFAULT_ROW_GROUP, sort: bool = False) -> int:
    """Writes the edges ``(src, dst)`` (ids as given) to ``out`` in the format its name says
    (module doc). ``suffix``: the name ending of each part with ``parts`` (default ``.csv``).
    ``row_group``: rows per Parquet row group / Arrow record batch. ``sort``: the distinct
    edges, sorted by (src, dst). Returns the number of edges written."""
    out = Path(out)
    src = np.asarray(src)
    dst = np.asarray(dst)
    if len(src) != len(dst):
        raise ValueError(f"src and dst differ in length: {len(src)} and {len(dst)}")
    if sort:
        src, dst = sorted_distinct(src, dst)
    if parts:
        suffix = suffix or ".csv"
        out.mkdir(parents=True, exist_ok=True)
        bounds = [len(src) * i // parts for i in range(parts + 1)]
        for i in range(parts):
            name = f"part-{i:05d}{suffix}"
            lo, hi = bounds[i], bounds[i + 1]
            _write_one(out / name, src[lo:hi], dst[lo:hi], member_bytes, compresslevel, row_group, sort)
        with atomic_path(out / "_SUCCESS") as tmp:
            open(tmp, "wb").close()
        return len(src)
    _write_one(out, src, dst, member_bytes, compresslevel, row_group, sort)
    return len(src)


def _write_one(path: Path, src, dst, member_bytes: int, compresslevel: int, row_group: int, sort: bool = False) -> None:
    kind = _kind(path.name)
    if kind in ("parquet", "arrow"):
        _write_columnar(path, src, dst, kind, row_group, sort)
        return
    if kind == "npz":
        top = max(int(src.max(initial=0)), int(dst.max(initial=0)))
        dt = np.int32 if top < 2**31 else np.int64
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, src=src.astype(dt), dst=dst.astype(dt))
        return
    _write_text(path, src, dst, kind == "csv", path.name.lower().endswith(".gz"), member_bytes, compresslevel)


def convert(inp, out, parts: int = 0, suffix: str | None = None, member_bytes: int = DEFAULT_MEMBER_BYTES,
            delimiter: str | None = None, header: str = "auto", compresslevel: int = 6,
            row_group: int = DEFAULT_ROW_GROUP, columns: list[str] | None = None, sort: bool = False) -> int:
    """Reads every edge of ``inp`` (any input of :func:`~.io.read_edge_share`, duplicates and
    order kept for text unless ``sort``) in this process and writes them to ``out``
    (:func:`write_edges`). Returns the number of edges written."""
    from .io import read_edge_share

    if os.path.exists(out) and os.path.samefile(inp, out):
        raise ValueError(f"{out}: the output is the input")
    src, dst = read_edge_share(inp, 0, 1, delimiter=delimiter, header=header, columns=columns)
    return write_edges(out, src, dst, parts, suffix, member_bytes, compresslevel, row_group, sort)
