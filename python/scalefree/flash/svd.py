"""Truncated SVD and PCA of matrices that may stay on flash, on the block Krylov-Schur
eigensolver (:mod:`scalefree.flash.eigen`).

``svds(A, k)`` solves the symmetric eigenproblem of ``A^T A`` (or ``A A^T`` when A is
wider than tall, so the Krylov basis has ``min(A.shape)`` rows), applying the operator
block by block: for a flash :class:`~scalefree.flash.core.Csr`, ``A^T A X`` is one pass of
``flash.csrtmm(A, X, gram=True)`` over A (each row block of A times X, then scattered back
through its transpose), and ``A A^T X`` is ``flash.csrtmm`` then ``flash.csrmm`` (two
passes); A is streamed from flash each iteration, never held in memory, and never
transposed. The converged
eigenvectors ``V`` are turned into singular triplets by one more product and a small SVD:
``A V = U' S Z^T`` gives ``u = U'``, ``s = S``, ``v = V Z`` (orthonormal on both sides, and
small singular values come from ``||A v||`` rather than a square root; the small SVD goes
through the ``k x k`` Gram matrix when ``A V`` is well conditioned).

``pca(X, k)`` runs the same on the centered matrix ``X - 1 mu^T`` without forming it:
``(X - 1 mu^T) v = X v - 1 (mu^T v)`` and ``(X - 1 mu^T)^T y = X^T y - mu (1^T y)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import core as flash
from ..errors import InvalidArgumentError
from .eigen import blas_threads, block_krylov_schur

_SCIPY_SOLVERS = ("arpack", "propack", "lobpcg")

# Default block size when A is applied from flash (in memory: the solver's, min(k, 16)), and
# the number of stored entries from which a flash CSR matrix gets the in-memory default
# instead: there a pass costs its arithmetic, not its fixed costs (see _solve).
_FLASH_BLOCK = 32
_FLASH_BLOCK_NNZ_LIMIT = 8_000_000


# ---------------------------------------------------------------------------------------
# Operators: A X and A^T Y for each kind of A, in A's precision.


class _InMemory:
    def __init__(self, a, dtype):
        self.a, self.shape, self.dtype = a, a.shape, dtype

    def matmat(self, x):
        return np.asarray(self.a @ x.astype(self.dtype, copy=False))

    def rmatmat(self, y):
        return np.asarray(self.a.T @ y.astype(self.dtype, copy=False))


class _MemoryCsr(_InMemory):
    """A CSR matrix in memory, applied by ``flash.csr_product`` on the runtime's compute
    threads: ``A X`` parallel over rows, ``A^T Y`` and the fused ``A^T A X`` (one pass over A)
    with one accumulator per thread (scipy's products are single-threaded, and ``A^T (A X)``
    reads A twice)."""

    def __init__(self, a, dtype, rt):
        super().__init__(a, dtype)
        self.rt = rt
        self.arrays = flash.csr_arrays(a)  # index arrays converted once, not per product

    def matmat(self, x):
        return flash.csr_arrays_product(self.arrays, x, "times", self.rt)

    def rmatmat(self, y):
        return flash.csr_arrays_product(self.arrays, y, "transpose", self.rt)

    def gram(self, x):
        return flash.csr_arrays_product(self.arrays, x, "gram", self.rt)


class _Loaded(_MemoryCsr):
    """A flash CSR matrix that fits the runtime's memory budget, read from flash once and
    applied in memory: an in-memory product costs far less than a pass of the flash kernels
    (a DAG run and a read of A per call), and the budget allows holding A."""

    def __init__(self, a: flash.Csr, dtype, rt):
        super().__init__(a.to_scipy(), dtype, rt)
        self.bytes_read = csr_flash_bytes(self.a)
        self.peak_resident_bytes = self.bytes_read


class _LinearOperator(_InMemory):
    def matmat(self, x):
        return np.asarray(self.a.matmat(x.astype(self.dtype, copy=False)))

    def rmatmat(self, y):
        return np.asarray(self.a.rmatmat(y.astype(self.dtype, copy=False)))


class OnFlash:
    """Sums what the kernel calls of this operator reported: the largest
    ``peak_resident_bytes``, bytes read and written, seconds in kernels."""

    peak_resident_bytes = 0
    bytes_read = 0
    bytes_written = 0
    kernel_seconds = 0.0
    cache_hits = 0
    cache_misses = 0
    compute_idle_seconds = 0.0

    def _track(self, stats):
        self.cache_hits += int(stats.get("cache_hits", 0))
        self.cache_misses += int(stats.get("cache_misses", 0))
        self.compute_idle_seconds += float(stats.get("compute_idle_seconds", 0.0))
        self.peak_resident_bytes = max(self.peak_resident_bytes, int(stats.get("peak_resident_bytes", 0)))
        self.bytes_read += int(stats.get("bytes_read", 0))
        self.bytes_written += int(stats.get("bytes_written", 0))
        self.kernel_seconds += float(stats.get("seconds", 0.0))


class _FlashCsr(OnFlash):
    """A flash CSR matrix: ``A X`` by ``flash.csrmm``, ``A^T Y`` and ``A^T A X`` by
    ``flash.csrtmm`` (one pass over A each, no transpose is formed)."""

    def __init__(self, a: flash.Csr, rt):
        self.a, self.rt, self.shape, self.dtype = a, rt, a.shape, a.dtype

    def _call(self, fn, *args, **kwargs):
        st = {}
        out = fn(*args, runtime=self.rt, stats=st, **kwargs)
        self._track(st)
        return out

    def matmat(self, x):
        return self._call(flash.csrmm, self.a, np.ascontiguousarray(x, dtype=self.dtype))

    def rmatmat(self, y):
        return self._call(flash.csrtmm, self.a, y)

    def gram(self, x):
        return self._call(flash.csrtmm, self.a, x, gram=True)


class _FlashDense(OnFlash):
    """A dense flash Matrix, applied by ``flash.gemm``."""

    def __init__(self, a: flash.Matrix, rt):
        self.a, self.rt, self.shape, self.dtype = a, rt, a.shape, a.dtype

    def _gemm(self, x, trans_a):
        st = {}
        out = flash.gemm(self.a, np.ascontiguousarray(x, dtype=self.dtype), trans_a=trans_a, runtime=self.rt,
                         stats=st).to_numpy()
        self._track(st)
        return out

    def matmat(self, x):
        return self._gemm(x, False)

    def rmatmat(self, y):
        return self._gemm(y, True)


class _Centered:
    """``A - 1 mu^T`` from A and the row vector ``mu``."""

    def __init__(self, op, mu):
        self.op, self.mu, self.shape, self.dtype = op, mu, op.shape, op.dtype

    def __getattr__(self, name):  # the flash counters of the wrapped operator
        if name in ("peak_resident_bytes", "bytes_read", "bytes_written", "kernel_seconds", "cache_hits",
                    "cache_misses", "compute_idle_seconds"):
            return getattr(self.op, name, 0)
        raise AttributeError(name)

    def matmat(self, x):
        return np.asarray(self.op.matmat(x), dtype=np.float64) - (self.mu @ x)[None, :]

    def rmatmat(self, y):
        return np.asarray(self.op.rmatmat(y), dtype=np.float64) - np.outer(self.mu, y.sum(axis=0))


def _compute_dtype(dtype) -> np.dtype:
    d = np.dtype(dtype)
    if d.kind == "c":
        raise InvalidArgumentError(f"svds takes real matrices, got {d}")
    if d.kind not in "fiub":
        raise InvalidArgumentError(f"svds takes a numeric matrix, got {d}")
    return np.dtype(np.float32) if d == np.float32 else np.dtype(np.float64)


def csr_flash_bytes(s) -> int:
    return int(s.nnz) * (np.dtype(s.dtype).itemsize + 4) + (s.shape[0] + 1) * 8


def flash_operator(a, rt):
    """The operator of ``a``. In-memory inputs larger than the
    runtime's budget are copied to flash first."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator

    if isinstance(a, flash.Csr):
        if a.col_ids is not None or a.row_ids is not None:
            raise InvalidArgumentError(f"svds: A has id maps (shape {a.shape}); pass A.compact() "
                                       f"({a.compact_shape}) and map the vectors back by A.row_ids / A.col_ids")
        if csr_flash_bytes(a) <= rt.memory_budget_bytes:
            return _Loaded(a, np.dtype(a.dtype), rt)
        return _FlashCsr(a, rt)
    if isinstance(a, flash.Matrix):
        return _FlashDense(a, rt)
    if isinstance(a, LinearOperator):
        if len(a.shape) != 2:
            raise InvalidArgumentError(f"svds takes a 2-D operator, got shape {a.shape}")
        return _LinearOperator(a, _compute_dtype(a.dtype))
    if sp.issparse(a):
        dtype = _compute_dtype(a.dtype)
        if a.ndim != 2:
            raise InvalidArgumentError(f"svds takes a 2-D matrix, got shape {a.shape}")
        if csr_flash_bytes(a) > rt.memory_budget_bytes:
            s = a.tocsr().astype(dtype, copy=False)
            return _FlashCsr(flash.Csr.from_scipy(s, rt), rt)
        s = a.tocsr().astype(dtype, copy=False)
        if s.shape[1] <= np.iinfo(np.int32).max:
            return _MemoryCsr(s, dtype, rt)
        return _InMemory(s, dtype)
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise InvalidArgumentError(f"svds takes a 2-D matrix, got shape {arr.shape}")
    dtype = _compute_dtype(arr.dtype)
    arr = arr.astype(dtype, copy=False)
    if arr.nbytes > rt.memory_budget_bytes:
        return _FlashDense(flash.Matrix.from_numpy(arr, rt), rt)
    return _InMemory(arr, dtype)


def _check_k(k, shape, what="svds"):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidArgumentError(f"{what}: k must be an integer, got {k!r}")
    lo = min(shape)
    if not 0 < k < lo:
        raise InvalidArgumentError(f"{what}: k must be between 1 and min(A.shape) - 1 = {lo - 1} "
                                   f"for a matrix of shape {tuple(shape)}, got k={k}")
    return int(k)


def _small_svd(b, vectors=True):
    """``b = w diag(s) z^T`` for a tall ``b`` (``n x k``), s descending. Through the ``k x k``
    Gram matrix when ``b`` is well conditioned (``s_min >= 1e-3 s_max``: then the columns of
    ``w`` are orthonormal to ~1e-10 and ``s`` as accurate), which is 10x faster than LAPACK's
    SVD of a tall matrix; otherwise that SVD. ``vectors=False``: ``w`` is None (not formed)."""
    lam, z = np.linalg.eigh(b.T @ b)
    lam, z = lam[::-1], z[:, ::-1]
    if lam[-1] > 1e-6 * lam[0] > 0:
        s = np.sqrt(lam)
        return ((b @ z) / s if vectors else None), s, z
    w, s, zt = np.linalg.svd(b, full_matrices=False)
    return w, s, zt.T


def _solve(op, k, *, ncv, tol, which, v0, maxiter, random_state, block_size, stats, vectors=True, threads=1):
    """The top (``which='LM'``) or bottom (``'SM'``) ``k`` singular triplets of ``op``, in
    descending order of s: ``(u, s, vt)`` as float64 (``vectors=False``: ``(None, s, None)``)."""
    rows, cols = op.shape
    right = cols <= rows  # eigenvectors of A^T A are right singular vectors
    flash_op = op if isinstance(op, OnFlash) else getattr(op, "op", None)
    if block_size is None and isinstance(flash_op, OnFlash):
        # On a small matrix a pass of the flash kernels costs about the same for 16 columns as
        # for 32 (a DAG run, reading A), so wider blocks mean fewer passes (kos under a
        # quarter of its size: 508 ms against 646 at 16, more operator columns but half the
        # passes). On a large CSR matrix a pass costs its arithmetic, about proportional to
        # the columns, and block 16's fewer operator columns win (47M entries at a quarter
        # budget: 31.8 s against 36.0 s at 32; 384 operator columns against 512).
        large = isinstance(flash_op, _FlashCsr) and flash_op.a.nnz >= _FLASH_BLOCK_NNZ_LIMIT
        if not large:
            block_size = max(min(k, _FLASH_BLOCK), min(2, k))
    n = cols if right else rows
    if right:
        def apply(x):
            if hasattr(op, "gram"):  # A^T A X in one pass over A
                return np.asarray(op.gram(x), dtype=np.float64)
            return np.asarray(op.rmatmat(op.matmat(x)), dtype=np.float64)
    else:
        def apply(x):
            return np.asarray(op.matmat(op.rmatmat(x)), dtype=np.float64)
    theta, x, info = block_krylov_schur(
        apply, n, k, which="LA" if which == "LM" else "SA", tol=tol, block_size=block_size,
        basis_size=ncv, maxiter=maxiter, v0=v0, random_state=random_state,
        operator_eps=np.finfo(op.dtype).eps)
    other = np.asarray(op.matmat(x) if right else op.rmatmat(x), dtype=np.float64)
    # No operator runs now: the products with the tall ``other`` (n x k, the largest dense
    # work of a solve) use the runtime's threads.
    with blas_threads(threads):
        w, s, z = _small_svd(other, vectors)
        x = x @ z if vectors else None
    if stats is not None:
        stats.update(restarts=info.restarts, operator_blocks=info.operator_blocks,
                     operator_columns=info.operator_columns, block_size=info.block_size,
                     basis_size=info.basis_size, dense=info.dense,
                     max_relative_residual=float(np.max(info.residuals / np.maximum(np.abs(theta), 1e-300))),
                     on_flash=isinstance(op, OnFlash) or isinstance(getattr(op, "op", None), OnFlash),
                     loaded=isinstance(op, _Loaded) or isinstance(getattr(op, "op", None), _Loaded),
                     peak_resident_bytes=getattr(op, "peak_resident_bytes", 0),
                     bytes_read=getattr(op, "bytes_read", 0), bytes_written=getattr(op, "bytes_written", 0),
                     kernel_seconds=getattr(op, "kernel_seconds", 0.0), cache_hits=getattr(op, "cache_hits", 0),
                     cache_misses=getattr(op, "cache_misses", 0),
                     compute_idle_seconds=getattr(op, "compute_idle_seconds", 0.0))
    if not vectors:
        return None, s, None
    return (w, s, x.T) if right else (x, s, w.T)


def svds(A, k=6, ncv=None, tol=0, which="LM", v0=None, maxiter=None, return_singular_vectors=True,
         solver="arpack", random_state=None, options=None, *, runtime=None, block_size=None, stats=None):
    """Partial SVD, with the arguments and return convention of
    ``scipy.sparse.linalg.svds``: ``(u, s, vt)`` with ``s`` ascending (the ``k`` largest
    singular values for ``which='LM'``, the smallest for ``'SM'``), ``u`` ``m x k`` and ``vt``
    ``k x n``; ``return_singular_vectors=False`` gives ``s`` alone, ``'u'`` gives
    ``(u, s, None)``, ``'vh'`` gives ``(None, s, vt)``.

    ``A``: a :class:`flash.Csr` (stays on flash; read once and applied in memory when its
    arrays fit the runtime's memory budget) or :class:`flash.Matrix` (stays on flash), a scipy sparse
    matrix or numpy array (computed in memory, or copied to flash first when larger than the
    runtime's memory budget), or a ``scipy.sparse.linalg.LinearOperator``. float32 inputs
    are computed and returned in float32, everything else in float64.

    ``k``: ``1 <= k < min(A.shape)`` (a ``ValueError`` otherwise). ``tol``: relative
    residual of the eigenpairs of ``A^T A`` (0: the input's machine precision). ``ncv``:
    Krylov basis size before a restart (default ``max(2k + 2b, 20)``). ``maxiter``: number of
    restarts. ``v0``: start vector of length ``min(A.shape)``. ``solver`` is accepted for
    compatibility (any of scipy's names) and ignored: the solver is always block
    Krylov-Schur. ``options``: ``{"block_size": b}`` (also a keyword, ``block_size``:
    columns per operator application, default ``min(k, 16)``, ``min(k, 32)`` when A is
    applied from flash). ``runtime``: the
    :class:`flash.Runtime` (default :func:`flash.default_runtime`). ``stats``: a dict that
    receives restarts, operator applications, the final residual, ``on_flash`` (whether A
    was applied from flash), ``loaded`` (a flash A read once into memory), ``peak_resident_bytes`` (the flash kernels' largest peak),
    ``bytes_read``/``bytes_written`` and ``kernel_seconds`` (summed over the kernel calls).
    Raises :class:`~scalefree.errors.NoConvergenceError` when ``maxiter`` restarts do not
    converge ``k`` triplets.
    """
    if which not in ("LM", "SM"):
        raise InvalidArgumentError(f"svds: which must be 'LM' or 'SM', got {which!r}")
    rsv = return_singular_vectors
    if not (rsv is True or rsv is False or (isinstance(rsv, str) and rsv in ("u", "vh"))):
        raise InvalidArgumentError(f"svds: return_singular_vectors must be True, False, 'u' or 'vh', "
                                   f"got {return_singular_vectors!r}")
    if solver not in _SCIPY_SOLVERS:
        raise InvalidArgumentError(f"svds: solver must be one of {', '.join(_SCIPY_SOLVERS)}, got {solver!r}")
    if tol is None or not tol >= 0:
        raise InvalidArgumentError(f"svds: tol must be >= 0, got {tol!r}")
    if options:
        unknown = set(options) - {"block_size"}
        if unknown:
            raise InvalidArgumentError(f"svds: unknown options {sorted(unknown)} (known: block_size)")
        block_size = options.get("block_size", block_size)
    rt = runtime or flash.default_runtime()
    shape = tuple(A.shape)
    if len(shape) != 2:
        raise InvalidArgumentError(f"svds takes a 2-D matrix, got shape {shape}")
    k = _check_k(k, shape)
    if v0 is not None:
        v0 = np.asarray(v0)
        if v0.shape != (min(shape),):
            raise InvalidArgumentError(f"svds: v0 must have length min(A.shape) = {min(shape)}, got shape {v0.shape}")
    op = flash_operator(A, rt)
    u, s, vt = _solve(op, k, ncv=ncv, tol=float(tol), which=which, v0=v0, maxiter=maxiter,
                      random_state=random_state, block_size=block_size, stats=stats, vectors=rsv is not False,
                      threads=rt.threads)
    dtype = op.dtype
    if rsv is False:
        return s[::-1].astype(dtype)
    u, s, vt = u[:, ::-1].astype(dtype), s[::-1].astype(dtype), vt[::-1].astype(dtype)
    if rsv == "u":
        return np.ascontiguousarray(u), s, None
    if rsv == "vh":
        return None, s, np.ascontiguousarray(vt)
    return np.ascontiguousarray(u), s, np.ascontiguousarray(vt)


@dataclass
class PCA:
    """The result of :func:`pca`, largest component first: ``components`` (``k x
    n_features``, orthonormal rows), ``explained_variance`` (``s**2 / (n_samples - 1)``),
    ``singular_values`` of the centered matrix, ``mean`` (``n_features``), and ``scores``
    (``n_samples x k``: the centered samples in the components' coordinates, ``U S``)."""

    components: np.ndarray
    explained_variance: np.ndarray
    singular_values: np.ndarray
    mean: np.ndarray
    scores: np.ndarray

    def transform(self, x) -> np.ndarray:
        """Coordinates of the rows of ``x`` (in memory) in the components."""
        return (np.asarray(x, dtype=np.float64) - self.mean) @ self.components.T


def pca(X, k, *, tol=0, maxiter=None, random_state=None, runtime=None, block_size=None, stats=None) -> PCA:
    """Principal components of the rows of ``X`` (samples x features; any input :func:`svds`
    takes), from the SVD of the centered matrix applied as ``X v - 1 (mu^T v)`` so that a
    sparse or on-flash ``X`` is never densified. ``1 <= k < min(X.shape)``. Each component's
    sign is fixed so that its entry of largest magnitude is positive. Returns a :class:`PCA`."""
    rt = runtime or flash.default_runtime()
    shape = tuple(X.shape)
    if len(shape) != 2:
        raise InvalidArgumentError(f"pca takes a 2-D matrix, got shape {shape}")
    k = _check_k(k, shape, "pca")
    op = flash_operator(X, rt)
    samples = shape[0]
    mu = np.asarray(op.rmatmat(np.ones((samples, 1))), dtype=np.float64)[:, 0] / samples
    u, s, vt = _solve(_Centered(op, mu), k, ncv=None, tol=float(tol), which="LM", v0=None, maxiter=maxiter,
                      random_state=random_state, block_size=block_size, stats=stats, threads=rt.threads)
    flip = np.sign(vt[np.arange(k), np.argmax(np.abs(vt), axis=1)])
    flip[flip == 0] = 1.0
    vt, u = vt * flip[:, None], u * flip[None, :]
    return PCA(components=vt, explained_variance=s ** 2 / max(samples - 1, 1), singular_values=s, mean=mu,
               scores=u * s[None, :])
