"""The flash runtime, matrices on flash and the out-of-core kernels (re-exported by
:mod:`scalefree.flash`)."""

from __future__ import annotations

import os

import numpy as np

from .. import _native
from .._units import parse_bytes
from ..errors import FlashIOError, InvalidArgumentError

def _bytes(v) -> int | None:
    return None if v is None else parse_bytes(v, "memory_budget")


def numpy_blas_path() -> str | None:
    """The shared library of the BLAS numpy uses (its bundled OpenBLAS), or None."""
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if info.get("user_api") == "blas" and info.get("filepath"):
                return info["filepath"]
    except ImportError:
        pass
    import glob

    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "lib*openblas*.so*")))
    return found[0] if found else None


class Runtime:
    """Scratch directory, IO threads, compute threads and the memory budget every flash
    kernel stays within. Defaults: ``SCALEFREE_FLASH_MEMORY``, ``SCALEFREE_FLASH_THREADS``,
    ``SCALEFREE_FLASH_DIR``.

    ``blas``: the CBLAS library that multiplies gemm's dense blocks. ``"auto"`` (default):
    ``SCALEFREE_FLASH_BLAS`` if set, else numpy's own BLAS (its OpenBLAS: the same kernels as
    in-memory ``A @ B``), else faer; ``"faer"`` (or None): always faer; or a library path. The
    library keeps its own thread count (threadpoolctl limits it)."""

    def __init__(self, memory_budget=None, threads: int | None = None, dir=None, blas="auto"):
        if blas == "auto":
            blas = None if os.environ.get("SCALEFREE_FLASH_BLAS") else (numpy_blas_path() or "")
        elif blas is None or blas == "faer":
            blas = ""
        self._rt = _native.FlashRuntime(_bytes(memory_budget), threads, dir, None if blas is None else os.fspath(blas))

    @property
    def blas(self) -> str | None:
        """The CBLAS library gemm blocks go through, or None (faer)."""
        path = self._rt.blas
        return None if path is None else str(path)

    @property
    def blas_threads(self) -> int | None:
        return self._rt.blas_threads

    @property
    def memory_budget_bytes(self) -> int:
        return self._rt.memory_budget_bytes

    @property
    def threads(self) -> int:
        return self._rt.threads

    @property
    def dir(self):
        return self._rt.dir

    @property
    def progress(self) -> tuple[int, int, int, int]:
        """Live counters ``(tasks_added, tasks_completed, bytes_read, bytes_written)``, cumulative
        over the runtime's life (read them from another thread while a kernel runs)."""
        return self._rt.progress

    def with_budget(self, memory_budget) -> "Runtime":
        """A runtime with this one's threads, scratch directory and BLAS but a budget of
        ``memory_budget`` bytes (at least 64 KiB, at most this one's): the kernels' share when an
        algorithm keeps part of its own budget for state in memory. Made once per size, then reused."""
        nbytes = min(self.memory_budget_bytes, max(1 << 16, int(memory_budget)))
        if nbytes == self.memory_budget_bytes:
            return self
        subs = self.__dict__.setdefault("_subs", {})
        if nbytes not in subs:
            subs[nbytes] = Runtime(nbytes, self.threads, self.dir, self.blas or "faer")
        return subs[nbytes]

    def __repr__(self) -> str:
        return (f"flash.Runtime(memory_budget={self.memory_budget_bytes}, threads={self.threads}, dir={str(self.dir)!r}, "
                f"blas={self.blas or 'faer'!r})")


_default_runtime = None


def default_runtime() -> Runtime:
    global _default_runtime
    if _default_runtime is None:
        _default_runtime = Runtime()
    return _default_runtime


class Matrix:
    """A dense float32/float64 matrix on flash (row- or column-major)."""

    def __init__(self, native: _native.FlashMatrix):
        self._m = native

    @classmethod
    def from_numpy(cls, a, runtime: Runtime | None = None) -> "Matrix":
        a = np.asarray(a)
        if a.ndim != 2:
            raise InvalidArgumentError(f"a flash matrix is 2-D, got shape {a.shape}")
        if a.dtype not in (np.float32, np.float64):
            raise InvalidArgumentError(f"flash matrices hold float32 or float64, got {a.dtype}")
        order = "F" if (a.flags.f_contiguous and not a.flags.c_contiguous) else "C"
        a = np.asarray(a, order=order)
        return cls(_native.FlashMatrix.from_array((runtime or default_runtime())._rt, a, a.shape[0], a.shape[1], order))

    @classmethod
    def zeros(cls, shape, dtype=np.float32, order: str = "C", runtime: Runtime | None = None) -> "Matrix":
        rows, cols = shape
        return cls(_native.FlashMatrix.scratch((runtime or default_runtime())._rt, rows, cols, np.dtype(dtype).name, order))

    @classmethod
    def open_npy(cls, path, runtime: Runtime | None = None, writable: bool = False) -> "Matrix":
        """Maps the data of a 2-D float32/float64 ``.npy`` file in place (nothing is copied;
        C or Fortran order). Only the header is read here."""
        path = os.fspath(path)
        shape, fortran, dtype, offset = npy_header(path)
        if len(shape) != 2:
            raise InvalidArgumentError(f"{path}: a flash matrix is 2-D, the array has shape {shape}")
        if dtype not in (np.float32, np.float64) or not dtype.isnative:
            raise InvalidArgumentError(f"{path}: flash matrices hold native float32 or float64, not {dtype}")
        return cls(_native.FlashMatrix.map_file((runtime or default_runtime())._rt, path, offset, shape[0], shape[1],
                                                dtype.name, "F" if fortran else "C", bool(writable)))

    @classmethod
    def create_npy(cls, path, shape, dtype=np.float32, runtime: Runtime | None = None) -> "Matrix":
        """A new zero C-order ``.npy`` file that kernels write into directly. It appears at
        ``path`` only after :meth:`publish` (synced, then renamed in one step), so an
        interrupted run never leaves a partial file there."""
        rows, cols = (int(x) for x in shape)
        name = _float_name(dtype)
        return cls(_native.FlashMatrix.create_atomic((runtime or default_runtime())._rt, os.fspath(path),
                                                     npy_header_bytes((rows, cols), np.dtype(name)), rows, cols, name, "C"))

    def publish(self) -> None:
        """Makes a matrix from :meth:`create_npy` appear at its path (no-op otherwise)."""
        self._m.publish()

    @property
    def shape(self) -> tuple[int, int]:
        return self._m.shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._m.dtype)

    def to_numpy(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype, order=self._m.order)
        self._m._read_into(out)
        return out

    def read_block(self, row0: int, col0: int, rows: int, cols: int, out=None) -> np.ndarray:
        """The ``rows x cols`` block at ``(row0, col0)`` as a numpy array in the matrix's order
        (into ``out`` when given: contiguous in that order, the matrix's dtype), read straight
        from flash."""
        if out is None:
            out = np.empty((rows, cols), dtype=self.dtype, order=self._m.order)
        self._m._read_block(int(row0), int(col0), int(rows), int(cols), out)
        return out

    def write_block(self, row0: int, col0: int, block) -> None:
        """Writes the 2-D ``block`` at ``(row0, col0)`` (converted to the matrix's dtype and order)."""
        block = np.asarray(block, dtype=self.dtype, order=self._m.order)
        rows, cols = block.shape
        self._m._write_block(int(row0), int(col0), rows, cols, block)

    def __repr__(self) -> str:
        return f"flash.Matrix(shape={self.shape}, dtype={self.dtype}, order={self._m.order!r})"


class Csr:
    """A CSR matrix on flash.

    Ids past 32 bits: the stored column indices are 32-bit positions into ``col_ids`` when the
    matrix has one — the sorted global ids (uint64) of the columns that hold entries. A matrix
    with a column id of 2**32 or more, or more than 2**32 columns, gets one from
    :meth:`from_scipy`; its ``shape`` is the whole id space, ``compact_shape`` what is stored
    (``len(col_ids)`` columns), and nothing is allocated per id of the space. Likewise
    ``row_ids``: a matrix of more than 2**32 rows (:meth:`from_scipy` of a ``coo_matrix``, or a
    Matrix Market file) and the transpose of a matrix with ``col_ids`` (:func:`csrcsc`) hold
    a row per used row id. The kernels work on the compact matrix: dense operands have a row
    per stored column (``col_ids`` order), results a row per stored row (``row_ids`` order);
    ``to_scipy`` / ``to_coo`` map the ids back (int64 indices). Column indices on flash are
    32-bit, or 64-bit in a matrix of more than 2**32 stored columns (``index_bytes``). The
    transpose of a matrix of more than 2**32 stored rows or columns is refused (it would hold
    a start per stored column)."""

    def __init__(self, native: _native.FlashCsr, col_ids=None, row_ids=None, shape=None):
        self._m = native
        self.col_ids = None if col_ids is None else np.asarray(col_ids, dtype=np.uint64)
        self.row_ids = None if row_ids is None else np.asarray(row_ids, dtype=np.uint64)
        self._shape = tuple(int(x) for x in shape) if shape is not None else None

    @classmethod
    def from_scipy(cls, s, runtime: Runtime | None = None) -> "Csr":
        """A scipy sparse matrix (any format). Past 2**32 columns the used columns get
        ``col_ids``; past 2**32 rows (pass a ``coo_matrix``, which holds nothing per row) the
        used rows get ``row_ids``."""
        rt = (runtime or default_runtime())._rt
        rows, cols = (int(x) for x in s.shape)
        if rows > 1 << 32:
            # a sparse row space (its CSR form would hold a start per row of the space)
            return cls._from_coo(s.tocoo(), rt, rows, cols)
        s = s.tocsr()
        data = s.data if s.data.dtype in (np.float32, np.float64) else s.data.astype(np.float64)
        indices = s.indices
        col_ids = None
        if cols > 1 << 32:
            # a sparse id space: store the used columns' ids once, positions in the indices
            col_ids, indices = _used_ids(indices)
        stored = cols if col_ids is None else len(col_ids)
        m = _native.FlashCsr.from_arrays(
            rt, rows, stored,
            np.ascontiguousarray(s.indptr, dtype=np.uint64), np.ascontiguousarray(indices, dtype=index_dtype(stored)),
            np.ascontiguousarray(data))
        return cls(m, col_ids=col_ids, shape=(rows, cols))

    @classmethod
    def _from_coo(cls, c, rt, rows: int, cols: int) -> "Csr":
        """A matrix of more than 2**32 rows: a row per used row id (``row_ids``), and a
        column per used column id past 2**32 columns; duplicates summed, as scipy does."""
        import scipy.sparse as sp

        row_ids, r = _used_ids(c.row)
        col_ids, k = _used_ids(c.col) if cols > 1 << 32 else (None, c.col)
        data = c.data if c.data.dtype in (np.float32, np.float64) else c.data.astype(np.float64)
        s = sp.csr_matrix((data, (r.astype(np.int64), np.asarray(k, dtype=np.int64))),
                          shape=(len(row_ids), cols if col_ids is None else len(col_ids)))
        s.sum_duplicates()
        m = _native.FlashCsr.from_arrays(rt, s.shape[0], s.shape[1], np.ascontiguousarray(s.indptr, dtype=np.uint64),
                                         np.ascontiguousarray(s.indices, dtype=index_dtype(s.shape[1])),
                                         np.ascontiguousarray(s.data))
        return cls(m, col_ids=col_ids, row_ids=row_ids, shape=(rows, cols))

    @property
    def shape(self) -> tuple[int, int]:
        """The id space: ``(rows, cols)`` including ids that hold no entry."""
        return self._shape if self._shape is not None else self._m.shape

    @property
    def compact_shape(self) -> tuple[int, int]:
        """The stored shape: ``len(row_ids)`` / ``len(col_ids)`` where the matrix has them."""
        return self._m.shape

    def compact(self) -> "Csr":
        """The same stored matrix without the id maps (shape :attr:`compact_shape`)."""
        return Csr(self._m)

    @classmethod
    def from_matrix_market(cls, path, dtype=np.float64, runtime: Runtime | None = None) -> "Csr":
        """A Matrix Market ``coordinate`` file (plain or gzip; symmetric ones expanded).
        A row or column count of 2**32 or more (up to 2**64 - 1) gives a matrix with
        ``row_ids`` / ``col_ids`` (the ids that occur, 0-based), nothing per id of the space.
        Bad lines raise :class:`~scalefree.errors.FlashIOError` naming the file and line."""
        m, row_ids, col_ids, shape = _native.FlashCsr.from_text_file(
            (runtime or default_runtime())._rt, os.fspath(path), "mtx", _float_name(dtype))
        if row_ids is None and col_ids is None:
            return cls(m)
        return cls(m, col_ids=None if col_ids is None else np.array(col_ids, dtype=np.uint64),
                   row_ids=None if row_ids is None else np.array(row_ids, dtype=np.uint64), shape=shape)

    @classmethod
    def from_docword(cls, path, dtype=np.float64, runtime: Runtime | None = None, delimiter: str | None = None,
                     header: str = "auto") -> "Csr":
        """A UCI bag-of-words ``docword`` file (plain or gzip) as a documents x words matrix
        of counts, streamed to flash with bounded memory (one document and a 64 Ki-entry
        chunk at a time, plus 8 bytes per document) when its documents come in ascending
        order, as UCI files do; other files are read in memory first. A vocabulary of 2**32
        words or more gives a matrix with ``col_ids`` (the words that occur, 0-based), a
        document count of 2**32 or more one with ``row_ids`` (the documents that occur): nothing
        is allocated per id of the space.

        Also the counts as pipelines export them, read in memory (16 bytes per entry):
        ``doc word count`` lines (1-based ids) without the UCI lines D, W, NNZ — D and W are
        then the largest ids — separated by blanks, commas or semicolons (detected, or
        ``delimiter``: tab, space, comma, semicolon), after an optional header line (``header``:
        auto, yes, no), in one file or a directory of parts (``part-*`` in name order,
        ``_SUCCESS``, ``.crc`` and hidden files skipped, the same header in every part)."""
        m, doc_ids, word_ids, shape = _native.FlashCsr.from_docword_file(
            (runtime or default_runtime())._rt, os.fspath(path), _float_name(dtype), delimiter, header)
        if doc_ids is None and word_ids is None:
            return cls(m)
        return cls(m, col_ids=None if word_ids is None else np.array(word_ids, dtype=np.uint64),
                   row_ids=None if doc_ids is None else np.array(doc_ids, dtype=np.uint64), shape=tuple(shape))

    @property
    def nnz(self) -> int:
        return self._m.nnz

    @property
    def index_bytes(self) -> int:
        """Bytes per stored column index: 4, or 8 past 2**32 stored columns."""
        return self._m.index_bytes

    def _arrays(self):
        if max(self.shape) > np.iinfo(np.int64).max:
            raise InvalidArgumentError(f"a {self.shape[0]}x{self.shape[1]} matrix has ids past scipy's int64 indices: "
                                       "read .compact() and its row_ids / col_ids instead")
        rows, _ = self._m.shape
        indptr = np.empty(rows + 1, dtype=np.uint64)
        indices = np.empty(self.nnz, dtype=np.uint64 if self.index_bytes == 8 else np.uint32)
        data = np.empty(self.nnz, dtype=self.dtype)
        self._m._read_into(indptr, indices, data)
        indices = indices.astype(np.int64) if self.col_ids is None else self.col_ids[indices].astype(np.int64)
        return indptr.astype(np.int64), indices, data

    def to_scipy(self):
        """Reads the matrix back as a ``scipy.sparse.csr_matrix`` of :attr:`shape` (the ids
        mapped back; a matrix with ``row_ids`` needs a start per row of its whole row space:
        read one past 2**32 rows with :meth:`to_coo`)."""
        import scipy.sparse as sp

        indptr, indices, data = self._arrays()
        if self.row_ids is not None:
            full = np.zeros(self.shape[0] + 1, dtype=np.int64)
            full[self.row_ids.astype(np.int64) + 1] = np.diff(indptr)
            indptr = np.cumsum(full)
        return sp.csr_matrix((data, indices, indptr), shape=self.shape)

    def to_coo(self):
        """Reads the matrix back as a ``scipy.sparse.coo_matrix`` of :attr:`shape`, ids mapped
        back (int64), with nothing allocated per id of the space."""
        import scipy.sparse as sp

        indptr, indices, data = self._arrays()
        rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
        if self.row_ids is not None:
            rows = self.row_ids[rows].astype(np.int64)
        return sp.coo_matrix((data, (rows, indices)), shape=self.shape)

    def __repr__(self) -> str:
        maps = "" if self._shape is None else f", compact_shape={self.compact_shape}"
        return f"flash.Csr(shape={self.shape}{maps}, nnz={self.nnz}, dtype={self.dtype})"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._m.dtype)


def npy_header(path):
    """``(shape, fortran_order, dtype, data_offset)`` of a ``.npy`` file, from its header only;
    a file shorter than its header says raises :class:`~scalefree.errors.FlashIOError`."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
    except (ValueError, OSError) as e:
        raise FlashIOError(f"cannot read {path} as a .npy array: {e}") from e
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < need:
        raise FlashIOError(f"{path}: truncated .npy file ({size} bytes, its header describes {need})")
    return shape, fortran, dtype, offset


def npy_header_bytes(shape, dtype, fortran: bool = False, align: int = 4096) -> bytes:
    """A version 1.0 ``.npy`` header padded with spaces to ``align`` bytes, so the data starts
    on a sector boundary (direct IO writes it without read-modify-write of edge sectors)."""
    d = np.lib.format.header_data_from_array_1_0(np.empty((0,), dtype=dtype))
    text = repr({"descr": d["descr"], "fortran_order": bool(fortran), "shape": tuple(int(x) for x in shape)})
    body = len(text) + 1  # + "\n"
    total = -(-(10 + body) // align) * align
    if total - 10 > 0xFFFF:
        raise InvalidArgumentError(f"a .npy header for shape {tuple(shape)} is too long")
    text = text + " " * (total - 10 - body) + "\n"
    return b"\x93NUMPY\x01\x00" + (total - 10).to_bytes(2, "little") + text.encode("latin1")


def index_dtype(cols: int):
    """The dtype of flash CSR column indices for ``cols`` stored columns: uint32 up to 2**32
    (half the bytes), uint64 past it (what the native side picks too)."""
    return np.uint32 if cols <= 1 << 32 else np.uint64


def _used_ids(ids):
    """The sorted distinct ``ids`` (uint64) and each id's position among them (any number of
    distinct ids: past 2**32 the matrix stores 64-bit positions)."""
    used, at = np.unique(np.asarray(ids).astype(np.uint64), return_inverse=True)
    return used, at.reshape(-1)


def _float_name(dtype) -> str:
    d = np.dtype(dtype)
    if d not in (np.float32, np.float64):
        raise InvalidArgumentError(f"flash matrices hold float32 or float64, got {d}")
    return d.name


def load(path, runtime: Runtime | None = None, dtype=None, delimiter: str | None = None, header: str = "auto"):
    """Opens a matrix file as a flash matrix, by its name: ``.npy`` → :class:`Matrix`;
    ``.npz`` (``scipy.sparse.save_npz``) → :class:`Csr`; ``.mtx`` / ``.mtx.gz`` (Matrix
    Market coordinate) → :class:`Csr`; ``docword*.txt`` / ``.csv`` / ``.tsv`` (``.gz`` too; UCI
    bag of words, or its ``doc word count`` lines as exported) and a directory of such parts
    → :class:`Csr` (:meth:`Csr.from_docword`, which takes ``delimiter`` and ``header``).
    ``dtype`` (float32/float64) defaults to the file's, or float64 for text."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return Csr.from_docword(path, dtype or np.float64, runtime, delimiter, header)
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(".npy"):
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            raise FlashIOError(f"cannot read {path} as a .npy array: {e}") from e
        if a.ndim != 2:
            raise InvalidArgumentError(f"{path}: a flash matrix is 2-D, the array has shape {a.shape}")
        if dtype is not None or a.dtype not in (np.float32, np.float64):
            a = a.astype(_float_name(dtype or np.float64))
        return Matrix.from_numpy(a, runtime)
    if name.endswith(".npz"):
        import scipy.sparse as sp

        try:
            s = sp.load_npz(path)
        except (ValueError, OSError, KeyError) as e:
            raise FlashIOError(f"cannot read {path} as a scipy sparse .npz (scipy.sparse.save_npz): {e}") from e
        if dtype is not None:
            s = s.astype(_float_name(dtype))
        return Csr.from_scipy(s, runtime)
    if name.endswith(".mtx"):
        return Csr.from_matrix_market(path, dtype or np.float64, runtime)
    if name.endswith((".txt", ".csv", ".tsv")) and "docword" in name:
        return Csr.from_docword(path, dtype or np.float64, runtime, delimiter, header)
    raise InvalidArgumentError(
        f"{path}: unknown matrix file type (expected .npy, .npz, .mtx[.gz], docword*.txt[.gz] or a directory of "
        "docword parts)")


def _as_matrix(x, runtime) -> Matrix:
    return x if isinstance(x, Matrix) else Matrix.from_numpy(x, runtime)


def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, runtime: Runtime | None = None, stats: dict | None = None) -> Matrix:
    """``C := alpha op(A) op(B) + beta C`` out of core. ``a``, ``b``, ``c`` are flash
    matrices or numpy arrays (copied to flash). Returns C as a flash :class:`Matrix`; pass
    a dict as ``stats`` to receive the run's statistics (peak memory, bytes read/written)."""
    rt = runtime or default_runtime()
    A, B = _as_matrix(a, rt), _as_matrix(b, rt)
    m = A.shape[1] if trans_a else A.shape[0]
    n = B.shape[0] if trans_b else B.shape[1]
    C = Matrix.zeros((m, n), A.dtype, runtime=rt) if c is None else _as_matrix(c, rt)
    s = _native.flash_gemm(rt._rt, trans_a, trans_b, float(alpha), A._m, B._m, float(beta), C._m)
    if stats is not None:
        stats.update(s)
    return C


def csrgemv(a: Csr, x, *, transpose: bool = False, runtime: Runtime | None = None,
            stats: dict | None = None) -> np.ndarray:
    """``y = op(A) x`` with CSR ``A`` on flash and ``x`` in memory."""
    rt = runtime or default_runtime()
    x = np.ascontiguousarray(x, dtype=a.dtype)
    rows, cols = a.compact_shape
    y = np.zeros(cols if transpose else rows, dtype=a.dtype)
    s = _native.flash_csrgemv(rt._rt, transpose, a._m, x, y)
    if stats is not None:
        stats.update(s)
    return y


def csrmm(a: Csr, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_b: bool = False,
          runtime: Runtime | None = None, stats: dict | None = None):
    """``C := alpha A op(B) + beta C`` with CSR ``A`` on flash. ``b`` is a flash
    :class:`Matrix` or a numpy array; ``c`` likewise (updated in place). Without ``c``, the
    result is a flash :class:`Matrix` when ``b`` is one, else a numpy array."""
    rt = runtime or default_runtime()
    if not isinstance(a, Csr):
        raise InvalidArgumentError("csrmm: A must be a flash.Csr (see Csr.from_scipy or flash.load)")

    def operand(x, writable):
        if isinstance(x, Matrix):
            return x._m, (x.shape[0], x.shape[1], x._m.order)
        if writable and not (isinstance(x, np.ndarray) and x.dtype == a.dtype and x.ndim == 2
                             and (x.flags.c_contiguous or x.flags.f_contiguous)):
            raise InvalidArgumentError(f"csrmm: C must be a contiguous 2-D {a.dtype} array or a flash.Matrix")
        if not writable:
            x = np.asarray(x, dtype=a.dtype)
            if x.ndim != 2:
                raise InvalidArgumentError(f"csrmm: B must be 2-D, got shape {x.shape}")
            if not (x.flags.c_contiguous or x.flags.f_contiguous):
                x = np.ascontiguousarray(x)
        order = "C" if x.flags.c_contiguous else "F"
        return x, (x.shape[0], x.shape[1], order)

    b_obj, b_shape = operand(b, False)
    n = b_shape[0] if trans_b else b_shape[1]
    if c is None:
        beta = 0.0
        m = a.compact_shape[0]
        c = Matrix.zeros((m, n), a.dtype, runtime=rt) if isinstance(b, Matrix) else np.zeros((m, n), a.dtype)
    c_obj, c_shape = operand(c, True)
    s = _native.flash_csrmm(rt._rt, float(alpha), a._m, trans_b, b_obj, b_shape, float(beta), c_obj, c_shape)
    if stats is not None:
        stats.update(s)
    return c


def csrtmm(a: Csr, x, *, gram: bool = False, runtime: Runtime | None = None, stats: dict | None = None) -> np.ndarray:
    """``Z = A^T X`` (``X`` ``rows x n``), or with ``gram=True`` ``Z = A^T A X`` (``X``
    ``cols x n``), with CSR ``A`` on flash read once and without its transpose; ``X`` and the
    returned ``Z`` (``cols x n``) are numpy arrays of A's dtype."""
    if not isinstance(a, Csr):
        raise InvalidArgumentError("csrtmm: A must be a flash.Csr")
    rt = runtime or default_runtime()
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise InvalidArgumentError(f"csrtmm: X must be 2-D, got shape {x.shape}")
    rows, cols = a.compact_shape
    want = cols if gram else rows
    if x.shape[0] != want:
        raise InvalidArgumentError(f"csrtmm: A is {rows}x{cols}, so X must have {want} rows "
                                   f"({'A^T A X' if gram else 'A^T X'}), got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=a.dtype)
    z = np.empty((cols, x.shape[1]), dtype=a.dtype)
    s = _native.flash_csrtmm(rt._rt, bool(gram), a._m, x, x.shape[1], z)
    if stats is not None:
        stats.update(s)
    return z


def csr_product(a, x, *, product: str = "gram", runtime: Runtime | None = None) -> np.ndarray:
    """An in-memory scipy sparse matrix ``A`` times a dense block, on the runtime's compute
    threads: ``product="gram"`` gives ``A^T A X`` in one pass over A (each row ``a_i`` adds
    ``a_i^T (a_i X)``), ``"transpose"`` ``A^T X`` (both with one accumulator per thread, no
    transpose of A formed), ``"times"`` ``A X`` (parallel over rows). Computed in A's dtype
    (float32 or float64); ``X`` is converted to it. Returns a new C-contiguous array."""
    return csr_arrays_product(csr_arrays(a), x, product, runtime or default_runtime())


def csr_arrays(a):
    """``(shape, indptr int64, indices int32, data)`` of a float32/float64 scipy sparse
    matrix (or a :class:`Csr` read from flash), as ``csr_product`` passes them to the native
    kernel (convert once, reuse)."""
    import scipy.sparse as sp

    if isinstance(a, Csr):  # read from flash as the kernel takes it: no int64 or scipy copy
        if a.col_ids is not None or a.row_ids is not None or a.shape[1] > np.iinfo(np.int32).max:
            raise InvalidArgumentError(f"csr_product: A has id maps or too many columns (shape {a.shape})")
        rows = a.shape[0]
        indptr = np.empty(rows + 1, dtype=np.uint64)
        indices = np.empty(a.nnz, dtype=np.uint32)
        data = np.empty(a.nnz, dtype=a.dtype)
        a._m._read_rows(0, indptr, indices, data)  # straight into these arrays
        return tuple(a.shape), indptr.view(np.int64), indices.view(np.int32), data
    if not sp.issparse(a):
        raise InvalidArgumentError("csr_product: A must be a scipy sparse matrix")
    a = a.tocsr()
    if a.dtype not in (np.float32, np.float64):
        raise InvalidArgumentError(f"csr_product: A must be float32 or float64, got {a.dtype}")
    if a.shape[1] > np.iinfo(np.int32).max:
        raise InvalidArgumentError(f"csr_product: {a.shape[1]} columns do not fit 32-bit column indices")
    return (tuple(a.shape), np.ascontiguousarray(a.indptr, dtype=np.int64),
            np.ascontiguousarray(a.indices, dtype=np.int32), np.ascontiguousarray(a.data))


def csr_arrays_product(arrays, x, product, rt) -> np.ndarray:
    (rows, cols), indptr, indices, data = arrays
    if product not in ("gram", "transpose", "times"):
        raise InvalidArgumentError(f"csr_product: product must be gram, transpose or times, got {product!r}")
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[:, None]
    want = rows if product == "transpose" else cols
    if x.ndim != 2 or x.shape[0] != want:
        raise InvalidArgumentError(f"csr_product: A is {rows}x{cols}, so X for {product!r} must have {want} rows, "
                                   f"got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=data.dtype)
    z = np.empty((rows if product == "times" else cols, x.shape[1]), dtype=data.dtype)
    _native.memory_csr_product(rt._rt, product, rows, cols, indptr, indices, data, x, x.shape[1], z)
    return z


def sort(x, *, runtime: Runtime | None = None, stats: dict | None = None):
    """Sorts out of core, in IEEE total order (NaN last), within the runtime's budget.
    ``x`` is a 1-D float32/float64 numpy array (returns a sorted copy; the data goes through
    flash) or the path of a 1-D ``.npy`` file (sorted in place on disk; returns the path)."""
    rt = runtime or default_runtime()
    if isinstance(x, (str, os.PathLike)):
        path = os.fspath(x)
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                offset = f.tell()
        except (ValueError, OSError) as e:
            raise FlashIOError(f"cannot read {path} as a .npy array: {e}") from e
        if len(shape) != 1 or dtype not in (np.float32, np.float64) or not dtype.isnative:
            raise InvalidArgumentError(f"{path}: sort takes a 1-D native float32/float64 array, got shape {shape} of {dtype}")
        s = _native.flash_sort_file(rt._rt, path, offset, shape[0], dtype.name)
        out = x
    else:
        out = np.array(x, dtype=None, copy=True, order="C")
        if out.ndim != 1 or out.dtype not in (np.float32, np.float64):
            raise InvalidArgumentError(f"sort takes a 1-D float32/float64 array, got shape {out.shape} of {out.dtype}")
        s = _native.flash_sort_array(rt._rt, out)
    if stats is not None:
        stats.update(s)
    return out


def csrcsc(a: Csr, *, runtime: Runtime | None = None, stats: dict | None = None) -> Csr:
    """The transpose of CSR ``A`` (its CSC form) as a new flash :class:`Csr`, computed out of
    core within the budget; row indices come out ascending in each column. A matrix with id
    maps (:class:`Csr`) gives one with the maps swapped: Aᵀ has a row per used column of A."""
    if not isinstance(a, Csr):
        raise InvalidArgumentError("csrcsc: A must be a flash.Csr")
    rt = runtime or default_runtime()
    t, s = _native.flash_csrcsc(rt._rt, a._m)
    if stats is not None:
        stats.update(s)
    if a._shape is None:
        return Csr(t)
    return Csr(t, col_ids=a.row_ids, row_ids=a.col_ids, shape=a.shape[::-1])


def kmeans(x, k: int, *, max_iterations: int = 100, tolerance: float = 1e-4, seed: int = 0,
           runtime: Runtime | None = None, stats: dict | None = None):
    """Lloyd's k-means on the rows of ``x`` (a flash :class:`Matrix` or a numpy array, copied
    to flash), streaming the points from flash each iteration within the budget. Starts from
    ``k`` distinct rows picked by ``seed``; stops after ``max_iterations`` or when no center
    moves more than ``tolerance``. Returns ``(centers, labels, inertia, iterations)``."""
    rt = runtime or default_runtime()
    X = _as_matrix(x, rt)
    centers, labels, inertia, iterations, s = _native.flash_kmeans(
        rt._rt, X._m, int(k), int(max_iterations), float(tolerance), int(seed))
    if stats is not None:
        stats.update(s)
    centers = np.frombuffer(centers, dtype=X.dtype).reshape(int(k), X.shape[1]).copy()
    return centers, np.frombuffer(labels, dtype=np.uint32).copy(), inertia, iterations

