"""Reading graphs: edge files in every format the graph commands take, and the edge
partition of a multi-rank job."""

from __future__ import annotations

import gzip
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import _native, _text_stream
from ..errors import DataError, InvalidArgumentError

# The largest vertex id (scalefree-io's MAX_VERTEX_ID).
MAX_VERTEX_ID = (1 << 62) - 1


class EdgeListError(DataError):
    """A line of an edge list that cannot be read (names the file and line)."""


def read_edge_list(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads a SNAP-style edge list (`#` comments, two integer ids per line, any
    whitespace) in one process, duplicates kept. Returns (src, dst, ids) with src/dst as
    compact 0-based indices into the sorted array of original ids. Raises
    :class:`EdgeListError` naming the file and line of a bad line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        src, dst = _text_share([path], 0, 1)
    except EdgeListError:
        raise
    except DataError as e:
        raise EdgeListError(str(e)) from None
    ids, s, d = local_ids(src, dst, int(max(src.max(initial=-1), dst.max(initial=-1))) + 1)
    return s.astype(np.int64), d.astype(np.int64), ids


class GraphFormatError(DataError):
    """An edge file that cannot be read (names the file and what is wrong)."""


def read_edges(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An edge file, whole, in one process → (src, dst, ids) with compact 0-based ids into the
    sorted ids that occur; duplicate edges dropped (as a networkx DiGraph reads them). Any
    form :func:`read_edge_share` reads; multi-rank
    jobs read shares instead (:func:`load_graph`)."""
    return compact_edges(*read_edge_share(path, 0, 1))


def partition_edges(src, dst, rank: int, size: int, seed: int = 0):
    """This rank's share of a seeded random edge partition."""
    owner = np.random.default_rng(seed).integers(0, size, len(src))
    m = owner == rank
    return src[m], dst[m]


def compact_ids(a, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for ids in ``[0, n)``: by a marker array of
    size ``n`` (linear time) when that is no larger than ``a`` itself, else by sorting."""
    a = np.asarray(a, np.int64)
    if 0 < n <= len(a):
        mark = np.zeros(n, np.bool_)
        mark[a] = True
        u = np.flatnonzero(mark)
        pos = np.empty(n, np.int64)
        pos[u] = np.arange(len(u))
        return u, pos[a]
    u, inv = np.unique(a, return_inverse=True)
    return u, inv.reshape(-1)


def local_ids(src, dst, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, src, dst): the distinct ids of the edges, sorted, and the edges as indices into
    them (uint32 while they fit). By a marker array over ``[0, n)`` when that is no larger
    than the edges' endpoints (linear time), else by sorting (memory O(edges))."""
    src, dst = np.asarray(src), np.asarray(dst)
    m = len(src)
    if 0 < n <= 2 * m:
        from .. import _native

        if src.dtype != dst.dtype or src.dtype not in (np.uint32, np.int64, np.uint64):
            src, dst = src.astype(np.int64), dst.astype(np.int64)
        return _native.local_ids(np.ascontiguousarray(src), np.ascontiguousarray(dst), n)
    ids = sorted_unique(np.concatenate([src.astype(np.int64), dst.astype(np.int64)]))
    it = np.uint32 if len(ids) < 1 << 32 else np.int64
    return ids, np.searchsorted(ids, src).astype(it), np.searchsorted(ids, dst).astype(it)


def compact_edges(src, dst) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst) of original ids → (src, dst, ids): duplicate edges dropped, edges sorted,
    endpoints renumbered into the sorted ids that occur."""
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    ids, s, d = local_ids(src, dst, int(max(src.max(initial=-1), dst.max(initial=-1))) + 1)
    w = max(1, len(ids))
    key = sorted_unique(s.astype(np.int64) * w + d)
    return key // w, key % w, ids


# ---------------------------------------------------------------------------------------
# Partitioned input: each rank of a job reads only its share of the edges.


def share_bytes(path, rank: int = 0, size: int = 1) -> int:
    """About how many bytes of ``path`` rank reads (its share of the files' bytes)."""
    parts = edge_parts(path)
    if parts is None:
        return os.path.getsize(path) // size
    if not _all_text(parts):
        return sum(os.path.getsize(p) for p in parts[rank::size])
    return sum(os.path.getsize(p) for p in parts) // size


def edge_parts(path) -> list[Path] | None:
    """The part files of a directory (``_native.resolve_parts``: sorted by name, markers such
    as ``_SUCCESS``, ``.crc`` and hidden files skipped) or of a glob pattern (sorted), or None
    when ``path`` names one file."""
    import glob

    from .. import _native

    s = str(path)
    if any(c in s for c in "*?["):
        parts = sorted(Path(p) for p in glob.glob(s) if Path(p).is_file())
        if not parts:
            raise FileNotFoundError(f"{s}: no file matches")
        return parts
    if Path(s).is_dir():
        try:
            return [Path(p) for p in _native.resolve_parts(s)]
        except DataError as e:
            raise GraphFormatError(str(e)) from None
    return None


def _binary(path) -> bool:
    return Path(path).name.lower().endswith((".npy", ".npz", ".mtx", ".mtx.gz"))


def _all_text(parts) -> bool:
    return not any(_binary(p) for p in parts)


def read_edge_share(path, rank: int = 0, size: int = 1, progress=None, delimiter: str | None = None,
                    header: str = "auto", columns: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """This rank's share of the edges in ``path``, as (src, dst) int64 arrays of the ids as
    written (Matrix Market's are 1-based). Every edge of
    the input is in exactly one rank's share; duplicates are kept (see
    :func:`owner_dedup`).

    How the share is cut, by input:

    * a text edge list (SNAP: ``#`` comments, two ids per line separated by blanks, commas
      or semicolons, an optional header line; ``delimiter``/``header`` override the
      detection) or Matrix Market ``.mtx``: the lines that start in the rank's ``1/size`` of
      the bytes, parsed in native code;
    * a directory of text part files (Spark, Dask, Hive: ``_SUCCESS``, ``.crc`` and hidden
      files skipped; the same header in every part, if any) or a glob: the parts in name
      order are one body cut by bytes the same way, so a few large parts are shared by
      several ranks; a directory holding ``.npy``/``.npz``/``.mtx`` parts: rank r reads the
      parts ``r, r + size, ...`` whole;
    * ``.gz`` (also as parts): a file of several gzip members (BGZF, concatenated members,
      ``graph convert``'s output) is cut by members, each rank decompressing only its
      own; one gzip stream cannot be split, so each rank sharing it decompresses all of it
      and parses only its chunks (:func:`load_graph` instead has rank 0 decompress it once
      and hand the chunks out: :func:`stream_share`);
    * ``.npy`` (shape ``(m, 2)``) and ``.npz`` (``src`` and ``dst``, or a scipy sparse
      matrix): the rank's ``1/size`` of the entries, memory-mapped from uncompressed
      members and streamed from compressed ones;
    * Parquet or Arrow IPC / Feather (a file, or a directory of such parts): the rank's row
      groups or record batches, balanced by rows over all parts (:mod:`scalefree._columnar`);
      ``columns`` names the two id columns (default: the first two integer columns).

    ``progress(nbytes)``, if given, is called as the bytes of the share are read.
    """
    from .. import _columnar

    path = Path(path)
    columnar = _columnar_input(path, columns)
    if columnar is not None:
        got = _columnar.read_share(columnar, rank, size, "edges", columns, MAX_VERTEX_ID)
        if progress is not None:
            progress(share_bytes(path, rank, size))
        return got
    parts = edge_parts(path)
    if parts is not None:
        if _all_text(parts):
            return _text_share(parts, rank, size, progress=progress, delimiter=delimiter, header=header)
        got = [read_edge_share(p, 0, 1, progress) for p in parts[rank::size]]
        if not got:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([s for s, _ in got]), np.concatenate([d for _, d in got])
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if _binary(path):
        name = path.name.lower()
        read = _npy_share if name.endswith(".npy") else _npz_share if name.endswith(".npz") else _mtx_share
        got = read(path, rank, size)
        if progress is not None:
            progress(os.path.getsize(path) // size)
        return got
    return _text_share([path], rank, size, progress=progress, delimiter=delimiter, header=header)


def _columnar_input(path: Path, columns) -> list[str] | None:
    """The Parquet / Arrow IPC files of ``path`` (``_columnar.columnar_parts``), or None for
    any other input, for which choosing ``columns`` is an error."""
    from .. import _columnar

    columnar = _columnar.columnar_parts(path)
    if columnar is None and columns is not None:
        raise InvalidArgumentError(f"{path}: columns are chosen for Parquet and Arrow IPC input only")
    return columnar


# A share of a plain text file larger than this is read in pieces, so progress can be shown.
_PIECE_BYTES = 64 << 20


def _text_share(parts, rank, size, offset: int = 0, max_fields: int = 2, progress=None, delimiter=None,
                header="auto"):
    """Rank's share of text edge files (one body: the parts in order), parsed natively.
    Share ``r`` of ``P`` is exactly shares ``r*k .. r*k+k-1`` of ``P*k`` (the same nominal
    cuts), so a large share is read in ``k`` pieces with ``progress(bytes)`` called after
    each; input with gzip parts is one piece."""
    from .. import _native

    parts = [str(p) for p in parts]
    total = max(0, sum(os.path.getsize(p) for p in parts) - offset)
    mine = total // size
    gz = any(_is_gzip(p) for p in parts)
    k = 1 if gz or progress is None else max(1, -(-mine // _PIECE_BYTES))
    kw = dict(offset=offset, max_fields=max_fields, delimiter=delimiter, header=header)
    if k == 1:
        got = _native.read_edges_share(parts, rank, size, **kw)
        if progress is not None:
            progress(mine)
        return got
    pieces = []
    for j in range(k):
        pieces.append(_native.read_edges_share(parts, rank * k + j, size * k, **kw))
        progress(mine // k)
    return np.concatenate([s for s, _ in pieces]), np.concatenate([d for _, d in pieces])


def read_edge_keys(path, rank: int = 0, size: int = 1, progress=None, delimiter: str | None = None,
                   header: str = "auto", columns: list[str] | None = None) -> np.ndarray | None:
    """This rank's share of the edges in ``path`` as :func:`read_edge_share` cuts it, each
    edge packed into one uint64 key ``src << 32 | dst`` (half the memory of two int64
    columns; the keys sort as the edges do by (src, dst)), in file order. None when an id is
    2**32 or larger, or for an input the key readers do not take (``.npy``, ``.npz``,
    ``.mtx``, parts of those): read it with :func:`read_edge_share` then. Text (a file, part
    directory or glob, ``.gz`` too) and Parquet / Arrow IPC are read straight into keys."""
    path = Path(path)
    columnar = _columnar_input(path, columns)
    if columnar is not None:
        keys = _native.read_edge_keys_share(columnar, rank, size, columnar=True, columns=columns,
                                            max_id=MAX_VERTEX_ID)
        if progress is not None:
            progress(share_bytes(path, rank, size))
        return keys
    parts = edge_parts(path)
    if parts is None:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file")
        parts = [path]
    if not _all_text(parts):
        return None
    parts = [str(p) for p in parts]
    mine = sum(os.path.getsize(p) for p in parts) // size
    # A large share is read in pieces (the same cuts: see _text_share) to show progress.
    k = 1 if progress is None or any(_is_gzip(p) for p in parts) else max(1, -(-mine // _PIECE_BYTES))
    pieces = []
    for j in range(k):
        got = _native.read_edge_keys_share(parts, rank * k + j, size * k, delimiter=delimiter, header=header)
        if got is None:
            return None
        pieces.append(got)
        if progress is not None:
            progress(mine // k)
    return pieces[0] if k == 1 else np.concatenate(pieces)


def _is_gzip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _check_ids(path, src, dst) -> tuple[np.ndarray, np.ndarray]:
    for what, a in (("src", src), ("dst", dst)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise GraphFormatError(f"{path}: {what} must hold integer vertex ids, got {a.dtype}")
        if a.size and a.min() < 0:
            raise GraphFormatError(f"{path}: {what} has a negative vertex id")
    return np.asarray(src, np.int64), np.asarray(dst, np.int64)


def _npy_share(path, rank, size):
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise GraphFormatError(f"{path}: not a readable .npy file ({e})") from None
    if a.ndim != 2 or a.shape[1] != 2:
        raise GraphFormatError(f"{path}: an edge array must have shape (edges, 2), got {a.shape}")
    lo, hi = len(a) * rank // size, len(a) * (rank + 1) // size
    return _check_ids(path, np.array(a[lo:hi, 0]), np.array(a[lo:hi, 1]))


def _npy_header(f, path, name) -> tuple[tuple, np.dtype]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except ValueError as e:
        raise GraphFormatError(f"{path}: array {name!r} has no readable .npy header ({e})") from None
    if fortran and len(shape) > 1:
        raise GraphFormatError(f"{path}: array {name!r} is in Fortran order")
    return shape, np.dtype(dtype)


class _NpzMember:
    """One 1-D array of an ``.npz``, read in slices: memory-mapped when the member is
    stored uncompressed, else streamed (decompressing up to the slice's end)."""

    def __init__(self, path, zf, name):
        import zipfile

        self.path, self.zf, self.name = path, zf, name
        info = zf.getinfo(name + ".npy")
        with zf.open(info) as f:
            shape, dtype = _npy_header(f, path, name)
            header = f.tell()
        if len(shape) != 1:
            raise GraphFormatError(f"{path}: array {name!r} must be 1-D, got shape {shape}")
        self.info, self.shape, self.dtype = info, shape, np.dtype(dtype)
        self.stored = info.compress_type == zipfile.ZIP_STORED
        if self.stored:
            # Data of a stored member starts after its local header, name and extra field.
            with open(path, "rb") as raw:
                raw.seek(info.header_offset)
                local = raw.read(30)
                n, m = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
            self.data_at = info.header_offset + 30 + n + m + header

    def __len__(self):
        return int(self.shape[0])

    def slice(self, lo: int, hi: int) -> np.ndarray:
        hi = max(lo, hi)
        if self.stored:
            mm = np.memmap(self.path, self.dtype, "r", offset=self.data_at, shape=self.shape) if len(self) else None
            return np.array(mm[lo:hi]) if mm is not None else np.zeros(0, self.dtype)
        item = self.dtype.itemsize
        with self.zf.open(self.info) as f:
            _npy_header(f, self.path, self.name)
            skip = lo * item
            while skip:
                got = f.read(min(skip, 16 << 20))
                if not got:
                    raise GraphFormatError(f"{self.path}: array {self.name!r} is truncated")
                skip -= len(got)
            data = f.read((hi - lo) * item)
        if len(data) != (hi - lo) * item:
            raise GraphFormatError(f"{self.path}: array {self.name!r} is truncated")
        return np.frombuffer(data, self.dtype).copy()


def _npz_share(path, rank, size):
    import zipfile

    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise GraphFormatError(f"{path}: not a readable .npz file ({e})") from None
    with zf:
        keys = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}

        def member(name):
            return _NpzMember(path, zf, name)

        if {"src", "dst"} <= keys:
            s, d = member("src"), member("dst")
            if len(s) != len(d):
                raise GraphFormatError(f"{path}: src and dst must be 1-D arrays of one length, got {len(s)} and {len(d)}")
            lo, hi = len(s) * rank // size, len(s) * (rank + 1) // size
            return _check_ids(path, s.slice(lo, hi), d.slice(lo, hi))
        if "format" not in keys:
            raise GraphFormatError(f"{path}: expected arrays 'src' and 'dst' or a scipy sparse matrix "
                                   f"(save_npz), found {sorted(keys)}")
        with np.load(path, allow_pickle=False) as z:
            fmt = z["format"].item()
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt == "coo":
            r, c = member("row"), member("col")
            lo, hi = len(r) * rank // size, len(r) * (rank + 1) // size
            return _check_ids(path, r.slice(lo, hi), c.slice(lo, hi))
        if fmt not in ("csr", "csc"):
            raise GraphFormatError(f"{path}: scipy sparse format {fmt!r} is not supported (csr, csc, coo are)")
        indptr = member("indptr").slice(0, len(member("indptr"))).astype(np.int64)
        ind = member("indices")
        lo, hi = len(ind) * rank // size, len(ind) * (rank + 1) // size
        minor = ind.slice(lo, hi)
        first = int(np.searchsorted(indptr, lo, side="right")) - 1 if len(ind) else 0
        last = int(np.searchsorted(indptr, hi, side="left")) if len(ind) else 0
        rows = np.arange(first, max(first, last), dtype=np.int64)
        counts = np.diff(np.clip(indptr[first:max(first, last) + 1], lo, hi))
        major = np.repeat(rows, counts)
        return _check_ids(path, major, minor) if fmt == "csr" else _check_ids(path, minor, major)


def _mtx_header(path) -> tuple[int, str, int, int, int]:
    """(byte offset of the body in the decompressed text, symmetry, rows, cols, entries)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        first = f.readline()
        header = first.decode(errors="replace").split()
        if len(header) != 5 or header[0] != "%%MatrixMarket" or header[1].lower() != "matrix":
            raise GraphFormatError(f"{path}:1: not a Matrix Market header (%%MatrixMarket matrix coordinate ...)")
        fmt, field, symmetry = (h.lower() for h in header[2:])
        if fmt != "coordinate":
            raise GraphFormatError(f"{path}:1: only the coordinate format holds a graph, got {fmt!r}")
        if field not in ("pattern", "real", "integer", "double", "complex"):
            raise GraphFormatError(f"{path}:1: unknown field {field!r}")
        if symmetry not in ("general", "symmetric", "skew-symmetric", "hermitian"):
            raise GraphFormatError(f"{path}:1: unknown symmetry {symmetry!r}")
        offset, line_no = len(first), 1
        for line in f:
            line_no += 1
            offset += len(line)
            if line.strip() and not line.startswith(b"%"):
                break
        else:
            raise GraphFormatError(f"{path}: no size line")
        try:
            rows, cols, nnz = (int(x) for x in line.split())
        except ValueError:
            raise GraphFormatError(f"{path}:{line_no}: expected 'rows cols entries', got "
                                   f"{line.strip()[:60].decode(errors='replace')!r}") from None
    return offset, symmetry, rows, cols, nnz


def _mtx_share(path, rank, size):
    """Rank's share of a Matrix Market coordinate file: entry (i, j) is the edge i -> j, ids
    1-based as written; symmetric files give both directions. Read whole (one rank), the
    entry count of the size line is checked too."""
    offset, symmetry, rows, cols, nnz = _mtx_header(path)
    src, dst = _text_share([path], rank, size, offset=offset, max_fields=4, header="no")
    if size == 1 and len(src) != nnz:
        raise GraphFormatError(f"{path}: expected {nnz} entries (the size line), found {len(src)}")
    if len(src) and (src.min() < 1 or dst.min() < 1 or src.max() > rows or dst.max() > cols):
        raise GraphFormatError(f"{path}: an entry lies outside the {rows} x {cols} matrix (ids are 1-based)")
    if symmetry != "general":
        off = src != dst
        src, dst = np.concatenate([src, dst[off]]), np.concatenate([dst, src[off]])
    return src, dst


def _single_gzip_stream(path, delimiter, header, ranks: int):
    """The opened ``_native.TextStream`` if ``path`` is one text edge list in one gzip stream
    (which ranks cannot split), else None; its chunks sized for ``ranks``."""
    if _binary(path):
        return None
    return _text_stream.single_gzip_stream(path, "edges", delimiter, header, ranks)


def stream_share(group, path, delimiter: str | None = None, header: str = "auto", chunk_bytes: int | None = None,
                 stream=None):
    """Collective: this rank's edges of an edge list in one gzip stream, which cannot be cut
    by members: rank 0 decompresses the stream once and hands its chunks (about
    ``chunk_bytes`` of text, cut at line ends) to ranks 1 .. P-1, which parse them
    (:func:`scalefree._text_stream.stream_share`). Rank 0 gets no edges; the stream is
    decompressed once instead of once per rank. ``chunk_bytes``: text per chunk (default
    :func:`scalefree._text_stream.chunk_bytes_for` the group's size). A bad line raises on the rank that parses it,
    naming the file and line. ``stream``: the stream already opened (its chunk size then
    holds)."""
    from .. import _native

    if stream is None:
        chunk_bytes = _text_stream.chunk_bytes_for(group.size) if chunk_bytes is None else chunk_bytes
        stream = _native.TextStream(str(path), "edges", delimiter, header, chunk_bytes)
    got = _text_stream.stream_share(group, stream)
    return got[0] if got else (np.zeros(0, np.int64), np.zeros(0, np.int64))


def edge_owner(src, dst, size: int) -> np.ndarray:
    """The rank that owns each edge: a hash of (src, dst) modulo ``size`` (uint16 for a
    linear-time stable sort by owner)."""
    with np.errstate(over="ignore"):
        h = (np.asarray(src).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.asarray(dst).astype(np.uint64)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return (h % np.uint64(size)).astype(np.uint16)


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a``, sorted (sorts ``a`` in place; numpy's ``unique`` hashes
    first, several times slower on large integer arrays)."""
    a.sort()
    if len(a) < 2:
        return a
    keep = np.empty(len(a), np.bool_)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def owner_dedup(group, edges: list, n_ids: int, ranks: int | None = None, first: int = 0):
    """Collective: sends every edge to the rank that owns it (:func:`edge_owner`) and drops
    the duplicates there. ``edges`` is ``[src, dst]`` (this rank's edges, one integer dtype);
    the list is emptied as the arrays are consumed, so their memory goes back before the
    exchange lands. Returns this rank's distinct edges (src, dst), sorted, as uint32 when
    every id is below 2**32 (else int64). ``ranks``/``first``: the edges go to ranks
    ``first .. first + ranks - 1`` (one replica set of a replicated job); default all."""
    from .. import _native

    ranks = group.size if ranks is None else int(ranks)
    src, dst = (np.ascontiguousarray(a) for a in edges)
    edges.clear()
    if src.dtype != dst.dtype or src.dtype.kind not in "iu":
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    if ranks == 1 and group.size == 1:  # one owner: no hash, no exchange
        pairs = np.empty((len(src), 2), np.uint32 if n_ids <= 1 << 32 else np.int64)
        pairs[:, 0] = src
        pairs[:, 1] = dst
        del src, dst
        return _native.sort_dedup_pairs(pairs)
    pairs, cnt = _native.owner_partition(src, dst, ranks, "uint32" if n_ids <= 1 << 32 else "int64")
    del src, dst
    counts = np.zeros(group.size, np.int64)
    counts[first:first + ranks] = cnt
    got = group.alltoallv(pairs, counts)
    del pairs
    return _native.sort_dedup_pairs(got)


def sorted_dedup(group, src, dst, n_ids: int, ranks: int | None = None, first: int = 0):
    """Collective: this rank's distinct edges without the owner exchange, when the shares of
    ranks ``first .. first + ranks - 1`` are, in rank order, runs of one edge list sorted by
    (src, dst) — a file written sorted (``graph convert --sort``; a ``distinct().sort()``
    export) read by any reader, whose shares are contiguous in file order. Checked, not
    trusted: each rank checks its share in one pass (``_native.dedup_sorted``) and the ranks
    compare their first and last edges (one ``allgather``); a duplicate across a share
    boundary is dropped by the later rank. Returns ``(src, dst)`` as :func:`owner_dedup`
    does (sorted, distinct, uint32 while ids fit), or None on every rank when some share is
    not sorted (the caller then exchanges: :func:`owner_dedup`). The edges stay where they
    were read, so a rank holds its contiguous run of the sorted edges instead of the edges
    its hash owns."""
    from .. import _native

    src, dst = np.ascontiguousarray(src), np.ascontiguousarray(dst)
    if src.dtype != dst.dtype or src.dtype.kind not in "iu":
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    got = _native.dedup_sorted(src, dst, "uint32" if n_ids <= 1 << 32 else "int64")
    return _sorted_runs(group, got, ranks, first)


def sorted_dedup_keys(group, keys, ranks: int | None = None, first: int = 0):
    """:func:`sorted_dedup` of this rank's edges as packed keys (:func:`read_edge_keys`):
    ``(src, dst)`` uint32, or None on every rank when some share is not sorted."""
    return _sorted_runs(group, _native.dedup_sorted_keys(keys), ranks, first)


def _sorted_runs(group, got, ranks, first):
    """Collective: ``got`` (this rank's distinct edges if its share is sorted, else None) if
    every share of ranks ``first .. first + ranks - 1`` is sorted and they follow each other
    in rank order, with a duplicate across a share boundary dropped; else None everywhere."""
    ranks = group.size if ranks is None else int(ranks)
    info = np.zeros(6, np.int64)  # sorted, edges, first (src, dst), last (src, dst)
    if got is not None:
        s, d = got
        info[:2] = 1, len(s)
        if len(s):
            info[2:] = s[0], d[0], s[-1], d[-1]
    every = np.asarray(group.allgather(info)).reshape(group.size, 6)[first:first + ranks]
    if not every[:, 0].all():
        return None
    runs = every[every[:, 1] > 0]
    for a, b in zip(runs[:-1], runs[1:]):
        if (b[2], b[3]) < (a[4], a[5]):
            return None
    me = group.rank - first
    before = every[:me][every[:me, 1] > 0]
    if len(before) and len(s) and (int(s[0]), int(d[0])) == (int(before[-1][4]), int(before[-1][5])):
        s, d = s[1:], d[1:]
    return s, d


def owner_dedup_keys(group, edges: list, ranks: int | None = None, first: int = 0, times: dict | None = None):
    """Collective: :func:`owner_dedup` of this rank's edges as packed keys (``edges`` is
    ``[keys]``, :func:`read_edge_keys`; emptied, and the keys array reused): every key is
    written straight into its owner's receive region (``_native.key_owners``, then
    ``_native.scatter_keys`` inside :meth:`~scalefree.group.Group.alltoallv_fill`), and each
    owner sorts and deduplicates what landed there, with the sent keys' buffer as scratch
    (``_native.sort_dedup_keys``). Returns ``(src, dst)`` uint32, sorted, distinct: views of
    the receive region. ``times``, if given, receives ``exchange_s`` (owners and sending)
    and ``sort_s``."""
    ranks = group.size if ranks is None else int(ranks)
    keys = edges.pop()
    edges.clear()
    t0 = time.perf_counter()
    if ranks == 1 and group.size == 1:  # one owner: no exchange
        got, scratch = keys, np.empty(len(keys), np.uint64)
    else:
        mine, owners = _native.key_owners(keys, ranks)
        counts = np.zeros(group.size, np.int64)
        counts[first:first + ranks] = mine
        got = group.alltoallv_fill(counts, np.uint64,
                                   lambda pieces: _native.scatter_keys(keys, owners, pieces[first:first + ranks]))
        del owners
        scratch = keys if len(keys) >= len(got) else np.empty(len(got), np.uint64)
    del keys
    t1 = time.perf_counter()
    m = _native.sort_dedup_keys(got, scratch)
    del scratch
    if times is not None:
        times["exchange_s"], times["sort_s"] = t1 - t0, time.perf_counter() - t1
    out = got.view(np.uint32)
    return out[:m], out[len(got):len(got) + m]


def logical_rank(group, replication: int = 1) -> tuple[int, int]:
    """(logical node, logical nodes) of this rank when the group's ranks are ``replication``
    replicas of ``size / replication`` logical nodes (replicas partition data alike)."""
    replication = int(replication)
    if replication < 1 or group.size % replication:
        raise ValueError(f"replication must be >= 1 and divide the group size {group.size}, got {replication}")
    m = group.size // replication
    return group.rank % m, m


def load_graph(group, path, replication: int = 1, progress: bool = False, delimiter: str | None = None,
               header: str = "auto", columns: list[str] | None = None,
               times: dict | None = None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Collective: reads this rank's share of the edge file (:func:`~.io.read_edge_share`),
    sends every edge to the rank that owns it and drops duplicates there
    (:func:`~.io.owner_dedup`; an input written sorted by (src, dst) keeps its edges where
    they were read: :func:`sorted_dedup`). Returns (src, dst, id space, distinct edges in the graph);
    ids stay as written. No rank holds more than its share of the edges. ``delimiter``,
    ``header``, ``columns`` (the two id columns of a Parquet / Arrow IPC input): as
    :func:`read_edge_share`. With
    ``replication`` r, the replicas of a logical node end up with the same edges. ``times``,
    if given, receives ``read_s`` (this rank's share read and parsed, the slowest rank's)
    and ``dedup_s`` (edges sent to their owners, duplicates dropped), ``dedup_path``
    (``"sorted"`` or ``"exchange"``)."""
    me, m = logical_rank(group, replication)
    t0 = time.perf_counter()
    bar = None
    mine = share_bytes(path, me, m) if progress and group.rank == 0 else 0
    if progress and group.rank == 0:
        from .._progress import bar as progress_bar

        bar = progress_bar(mine, "reading rank 0's share", "B", unit_scale=True, leave=False)
    keys = src = dst = None
    try:
        stream = _single_gzip_stream(path, delimiter, header, m) if replication == 1 and m > 1 else None
        if stream is not None:
            src, dst = stream_share(group, path, delimiter, header, stream=stream)
        else:
            update = None if bar is None else bar.update
            keys = read_edge_keys(path, me, m, progress=update, delimiter=delimiter, header=header, columns=columns)
            if keys is None:
                src, dst = read_edge_share(path, me, m, progress=update, delimiter=delimiter, header=header,
                                           columns=columns)
    finally:
        if bar is not None:
            bar.close()
    read_s = time.perf_counter() - t0
    if keys is not None:
        top = _native.keys_id_bound(keys)
    else:
        top = max(int(src.max(initial=-1)), int(dst.max(initial=-1))) + 1
    n_ids = int(group.allreduce(np.array([top], np.int64), op="max")[0])
    if times is not None:
        times["read_s"] = float(group.allreduce(np.array([read_s]), op="max")[0])
    if progress and group.rank == 0:
        dt = time.perf_counter() - t0
        n_read = len(keys) if keys is not None else len(src)
        print(f"read {n_read} edges (rank 0's share, {mine / 1e6:.0f} MB) in {dt:.2f} s",
              file=sys.stderr, flush=True)
    # Packed keys while every id of every rank fits 32 bits; else two int64 columns.
    if n_ids <= 1 << 32 and keys is None:
        keys = _native.pack_edge_keys(src, dst)
        src = dst = None
    elif n_ids > 1 << 32 and keys is not None:
        src, dst = (keys >> np.uint64(32)).astype(np.int64), (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
        keys = None
    first = (group.rank // m) * m
    t1 = time.perf_counter()
    stages: dict = {}
    if keys is not None:
        got = sorted_dedup_keys(group, keys, ranks=m, first=first)
    else:
        got = sorted_dedup(group, src, dst, n_ids, ranks=m, first=first)
    if times is not None:
        times["dedup_path"] = "exchange" if got is None else "sorted"
    if got is not None:
        keys = src = dst = None
        src, dst = got
    elif keys is not None:
        edges = [keys]
        del keys
        src, dst = owner_dedup_keys(group, edges, ranks=m, first=first, times=stages)
    else:
        edges = [src, dst]
        del src, dst
        src, dst = owner_dedup(group, edges, n_ids, ranks=m, first=first)
    edges = int(group.allreduce(np.array([len(src)], np.int64))[0]) // replication
    if times is not None:
        times["dedup_s"] = time.perf_counter() - t1
        # The slowest rank's grouping + sending, and sorting (the exchange path).
        if stages:
            slow = group.allreduce(np.array([stages["exchange_s"], stages["sort_s"]]), op="max")
            times["exchange_s"], times["sort_s"] = float(slow[0]), float(slow[1])
    if progress and group.rank == 0:
        print(f"edges sent to their owners, duplicates dropped: {edges} distinct edges in "
              f"{time.perf_counter() - t1:.2f} s", file=sys.stderr, flush=True)
    return src, dst, n_ids, edges
