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

Complex matrices (complex64/complex128, in memory or as a ``LinearOperator``) run the same
solver on ``A^H A`` in complex arithmetic.

The arguments, their checks (exception types and wording), the output dtypes and the
non-convergence exception are ``scipy.sparse.linalg.svds``' with ``solver="arpack"``: its
own test file, run against this function under each solver name, is
``tests/flash/test_svds_conformance.py`` (``scripts/conformance`` runs all of it).

``pca(X, k)`` runs the same on the centered matrix ``X - 1 mu^T`` without forming it:
``(X - 1 mu^T) v = X v - 1 (mu^T v)`` and ``(X - 1 mu^T)^T y = X^T y - mu (1^T y)``.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np

from . import core as flash
from ..errors import InvalidArgumentError, NoConvergenceError
from .eigen import blas_threads, block_krylov_schur
from .state import CsrRows

_SCIPY_SOLVERS = ("arpack", "lobpcg", "propack")

# Default block size when A is applied from flash (in memory: the solver's, min(k, 16)), and
# the number of stored entries from which a flash CSR matrix gets the in-memory default
# instead: there a pass costs its arithmetic, not its fixed costs (see _solve).
_FLASH_BLOCK = 32
_FLASH_BLOCK_NNZ_LIMIT = 8_000_000
# Up to this k an in-memory operator is applied one column at a time (see _solve).
_SINGLE_VECTOR_K = 16


# ---------------------------------------------------------------------------------------
# Operators: A X and A^T Y for each kind of A, in A's precision.


class _InMemory:
    """A numpy array or scipy sparse matrix; ``rmatmat`` applies ``A^H`` (formed once for a
    complex A; for a real one ``A.T`` is a view)."""

    def __init__(self, a, dtype):
        self.a, self.shape, self.dtype = a, a.shape, dtype
        self.ah = a.conj().T if np.dtype(dtype).kind == "c" else a.T

    def matmat(self, x):
        return np.asarray(self.a @ x.astype(self.dtype, copy=False))

    def rmatmat(self, y):
        return np.asarray(self.ah @ y.astype(self.dtype, copy=False))


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
        # The kernel's arrays read straight from flash (no scipy matrix: its int64 indices
        # would hold A twice over while loading).
        self.shape, self.dtype, self.rt = tuple(a.shape), dtype, rt
        self.arrays = flash.csr_arrays(a)
        self.bytes_read = csr_flash_bytes(a)
        self.peak_resident_bytes = self.bytes_read


class _LinearOperator(_InMemory):
    """A ``scipy.sparse.linalg.LinearOperator`` (its ``rmatmat`` is the adjoint)."""

    def __init__(self, a, dtype):
        self.a, self.shape, self.dtype = a, a.shape, dtype

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
    """The dtype A is applied in, as scipy's svds maps it: float32 and complex64 stay,
    other complex types are complex128, other numbers float64."""
    d = np.dtype(np.float64 if dtype is None else dtype)
    if not np.issubdtype(d, np.number):
        raise InvalidArgumentError(f"`A` must be of numeric data type, got {d}")
    if d in (np.float32, np.complex64):
        return d
    return np.dtype(np.complex128) if d.kind == "c" else np.dtype(np.float64)


def csr_flash_bytes(s) -> int:
    return int(s.nnz) * (np.dtype(s.dtype).itemsize + 4) + (s.shape[0] + 1) * 8


def flash_operator(a, rt, reserve: int = 0):
    """The operator of ``a``. In-memory inputs larger than the runtime's budget are copied to
    flash first; a flash CSR matrix is read into memory when it fits the budget beside
    ``reserve`` bytes (the caller's state)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator

    if isinstance(a, flash.Csr):
        if a.col_ids is not None or a.row_ids is not None:
            raise InvalidArgumentError(f"svds: A has id maps (shape {a.shape}); pass A.compact() "
                                       f"({a.compact_shape}) and map the vectors back by A.row_ids / A.col_ids")
        if csr_flash_bytes(a) + reserve <= rt.memory_budget_bytes:
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
        if dtype.kind == "c":  # the native kernels are real: complex matrices stay in scipy
            return _InMemory(a.tocsr().astype(dtype, copy=False), dtype)
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
    if arr.nbytes > rt.memory_budget_bytes and dtype.kind != "c":
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
    """``b = w diag(s) z^H`` for a tall ``b`` (``n x k``), s descending. Through the ``k x k``
    Gram matrix when ``b`` is well conditioned (``s_min >= 1e-3 s_max``: then the columns of
    ``w`` are orthonormal to ~1e-10 and ``s`` as accurate), which is 10x faster than LAPACK's
    SVD of a tall matrix; otherwise that SVD. ``vectors=False``: ``w`` is None (not formed)."""
    lam, z = np.linalg.eigh(b.conj().T @ b)
    lam, z = lam[::-1], z[:, ::-1]
    if lam[-1] > 1e-6 * lam[0] > 0:
        s = np.sqrt(lam)
        if not vectors:
            return None, s, z
        w = b @ z
        w /= s  # in place: w is as tall as b
        return w, s, z
    w, s, zh = np.linalg.svd(b, full_matrices=False)
    return w, s, zh.conj().T


@functools.cache
def _no_convergence_class():
    """The exception :func:`svds` raises when ``maxiter`` restarts do not converge: our
    :class:`~scalefree.errors.NoConvergenceError`, and what scipy's svds raises then
    (``ArpackNoConvergence`` for ARPACK, ``numpy.linalg.LinAlgError`` for PROPACK), so code
    written for either catches it. Built on first use: scipy is optional."""
    try:
        from scipy.sparse.linalg import ArpackNoConvergence
    except ImportError:
        return NoConvergenceError

    class SvdsNoConvergence(NoConvergenceError, ArpackNoConvergence, np.linalg.LinAlgError):
        def __init__(self, msg, eigenvalues=None, eigenvectors=None):
            ArpackNoConvergence.__init__(self, msg, eigenvalues, eigenvectors)  # "ARPACK error -1: " + msg

    SvdsNoConvergence.__module__ = __name__
    return SvdsNoConvergence


@dataclass
class _Plan:
    """Where a solve keeps its state (see :func:`_plan`)."""

    flash_basis: tuple | None  # (runtime, row block bytes) when the Krylov basis is on flash
    other_in_memory: bool  # A V (and u) in memory; else u goes to flash a row block at a time
    block_bytes: int  # row blocks of the out-of-core steps
    state_bytes: int  # the solver's state in memory, as planned
    kernel_bytes: int  # the flash kernels' budget (0: A is applied in memory)


def _held_bytes(op) -> int:
    """Bytes of A the operator holds in memory on our account (a loaded flash matrix)."""
    inner = getattr(op, "op", op)
    return int(getattr(inner, "bytes_read", 0)) if isinstance(inner, _Loaded) else 0


def solver_state_bytes(n, k, ncv, block_size, item=8, threads=1) -> tuple[int, int]:
    """(Krylov basis, other work) bytes of a solve on an ``n``-row basis: the basis ``n x (ncv
    + b)``; the blocks in flight (``W``, ``Q``, the SVD of ``W``, the operator's input and
    output, one accumulator per compute thread) and the ``n x k`` Ritz vectors."""
    b = block_size or max(min(k, 16), min(2, k))
    m = ncv or max(2 * k + 2 * b, 20)
    return n * (m + b) * item, n * (b * (5 + threads) + k) * item


def _plan(op, flash_op, n, other_rows, k, ncv, block_size, work, vectors, rt, threads) -> _Plan:
    """Splits the runtime's memory budget M between the state of the solve and the flash
    kernels. A loaded A counts against M. Then, with ``free`` what is left: the Krylov basis
    stays in memory when it fits (beside the blocks in flight and the Ritz vectors, and half of
    ``free`` when the kernels stream A from flash), else it goes to flash (``flash_basis``),
    worked on in row blocks; the final ``A V`` (``other_rows x k``, and ``u`` beside it) stays
    in memory when it fits what is left, else ``u`` is written to flash a row block at a
    time (:func:`_triplets_out_of_core`). A streamed A gets the rest as its kernels' budget
    (at least a quarter of ``free``). Complex problems keep everything in memory (flash
    matrices are real)."""
    item = work.itemsize
    budget = rt.memory_budget_bytes if rt is not None else 1 << 62
    free = max(0, budget - _held_bytes(op))
    basis, other_work = solver_state_bytes(n, k, ncv, block_size, item, threads)
    streamed = isinstance(flash_op, OnFlash) and not isinstance(flash_op, _Loaded)
    share = free // 2 if streamed else free
    real = work.kind != "c" and rt is not None
    basis_on_flash = real and basis + other_work > share
    state = other_work + (0 if basis_on_flash else basis)
    left = max(0, share - state)
    block_bytes = max(1 << 16, left // 4)
    if basis_on_flash:
        state += 2 * block_bytes
    out = other_rows * k * item * (2 if vectors else 1)
    other_in_memory = not real or out + state <= share
    if other_in_memory:
        state += out
    else:
        state += 2 * block_bytes
    kernel = max(free - state, free // 4) if streamed else 0
    if streamed and rt is not None:
        flash_op.rt = rt.with_budget(kernel)
        kernel = flash_op.rt.memory_budget_bytes  # at least 64 KiB
    return _Plan(flash_basis=(rt, block_bytes) if basis_on_flash else None, other_in_memory=other_in_memory,
                 block_bytes=block_bytes, state_bytes=state, kernel_bytes=kernel)


def _rows_times(op, x, block_bytes, rt):
    """``(lo, hi, A[lo:hi] @ x)`` over row blocks of A, each of about ``block_bytes`` of
    output (a flash CSR matrix read a row block at a time; an in-memory one sliced)."""
    rows = op.shape[0]
    step = max(1, block_bytes // max(1, x.shape[1] * x.itemsize))
    if isinstance(op, _FlashCsr):
        for lo, hi, blk in CsrRows(op.a, max(1 << 16, block_bytes // 2), dtype=None):
            yield lo, hi, np.asarray(blk @ x.astype(op.dtype, copy=False))
        return
    if isinstance(op, _MemoryCsr):
        (_, cols), indptr, indices, data = op.arrays
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            s0, s1 = int(indptr[lo]), int(indptr[hi])
            part = ((hi - lo, cols), indptr[lo:hi + 1] - s0, indices[s0:s1], data[s0:s1])
            yield lo, hi, flash.csr_arrays_product(part, x, "times", rt)
        return
    if isinstance(op, _InMemory) and not isinstance(op, _LinearOperator):
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            yield lo, hi, np.asarray(op.a[lo:hi] @ x.astype(op.dtype, copy=False))
        return
    yield 0, rows, op.matmat(x)  # dense flash matrices and LinearOperators: whole


def _triplets_out_of_core(op, apply, x, right, vectors, plan, rt, threads, u_on_flash=False):
    """The singular triplets from the converged eigenvectors ``x`` without ``A V`` in memory:
    ``s^2`` and ``z`` are the eigenpairs of the ``k x k`` Gram matrix ``x^H (A^H A x)``
    (``A^H A x`` formed a block of columns at a time), ``v = x z``, and ``u = (A x) z / s``
    formed a row block at a time: in memory (descending s, as the in-memory path), or with
    ``u_on_flash`` written to a flash matrix with its columns in ascending order of s (what
    :func:`svds` returns). Returns ``(u, s, z, x z)`` (``u``, ``x z``: None without
    vectors). Wide matrices (``A A^H``) form ``A^H x`` whole (columns of A are not streamed)."""
    k = x.shape[1]
    b = max(1, min(k, 16))
    g = np.empty((k, k), dtype=x.dtype)
    for i in range(0, k, b):
        g[:, i:i + b] = x.conj().T @ apply(np.ascontiguousarray(x[:, i:i + b]))
    with blas_threads(threads):
        lam, z = np.linalg.eigh(0.5 * (g + g.conj().T))
    lam, z = lam[::-1], z[:, ::-1]
    s = np.sqrt(np.maximum(lam, 0.0))
    if not vectors:
        return None, s, z, None
    xz = x @ z
    safe = np.where(s > 0, s, 1.0)
    if not right:  # A A^H: x are left vectors, u = x z, v = A^H x z / s
        v = np.asarray(op.rmatmat(x), dtype=x.dtype) @ z
        v /= safe
        return v, s, z, xz
    rows = op.shape[0]
    if not u_on_flash:
        u = np.empty((rows, k), dtype=x.dtype)
        for lo, hi, ax in _rows_times(op, x, plan.block_bytes, rt):
            u[lo:hi] = np.asarray(ax, dtype=x.dtype) @ z
            u[lo:hi] /= safe
        return u, s, z, xz
    out = np.float32 if np.dtype(op.dtype) == np.float32 else np.float64
    u = flash.Matrix.zeros((rows, k), out, runtime=rt)
    zr, sr = z[:, ::-1], safe[::-1]  # ascending, as svds returns u
    for lo, hi, ax in _rows_times(op, x, plan.block_bytes, rt):
        blk = np.asarray(ax, dtype=np.float64) @ zr
        blk /= sr
        u.write_block(lo, 0, blk.astype(out, copy=False))
    return u, s, z, xz


def _solve(op, k, *, ncv, tol, which, v0, maxiter, random_state, block_size, stats, vectors=True, threads=1,
           runtime=None, u_on_flash=False):
    """The top (``which='LM'``) or bottom (``'SM'``) ``k`` singular triplets of ``op``, in
    descending order of s: ``(u, s, vh)`` in float64 or complex128 (``vectors=False``:
    ``(None, s, None)``). ``tol`` is scipy's, a tolerance of the singular values: the
    eigenpairs of ``A^H A`` are solved to a relative residual of ``tol**2`` (as scipy's svds
    asks ARPACK). ``ncv``: the Krylov basis size (the block shrinks to ``ncv - k`` if needed)."""
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
    elif block_size is None and k <= _SINGLE_VECTOR_K:
        # In memory a product costs its arithmetic, and single-vector Krylov-Schur (ARPACK's
        # Lanczos) needs the fewest operator columns: on a 20000 x 5000 random sparse matrix,
        # k=6: 305 columns against 2970 at block 6 (1.0 s against 3.1 s); which='SM' on
        # scipy's test_small_sigma_sparse matrix converges in 224 restarts, not in 1000 at
        # block 5. Larger k takes blocks for BLAS-3 orthogonalization.
        block_size = 1
    if ncv is not None:
        block_size = min(block_size or max(min(k, 16), min(2, k)), ncv - k)
    n = cols if right else rows
    work = np.dtype(np.complex128 if np.dtype(op.dtype).kind == "c" else np.float64)
    plan = _plan(op, flash_op, n, rows if right else cols, k, ncv, block_size, work, vectors, runtime, threads)
    if right:
        def apply(x):
            if hasattr(op, "gram"):  # A^T A X in one pass over A
                return np.asarray(op.gram(x), dtype=work)
            return np.asarray(op.rmatmat(op.matmat(x)), dtype=work)
    else:
        def apply(x):
            return np.asarray(op.matmat(op.rmatmat(x)), dtype=work)
    try:
        theta, x, info = block_krylov_schur(
            apply, n, k, which="LA" if which == "LM" else "SA", tol=tol ** 2, block_size=block_size,
            basis_size=ncv, maxiter=maxiter, v0=v0, random_state=random_state,
            operator_eps=np.finfo(op.dtype).eps, dtype=work, flash_basis=plan.flash_basis)
    except NoConvergenceError as e:
        raise _no_convergence_class()(
            f"No convergence: k={k} singular triplets did not converge within maxiter={maxiter} restarts "
            f"(block Krylov-Schur; {len(e.eigenvalues)} converged); raise maxiter or tol",
            e.eigenvalues, e.eigenvectors) from None
    if plan.other_in_memory:
        other = np.asarray(op.matmat(x) if right else op.rmatmat(x), dtype=work)
        # No operator runs now: the products with the tall ``other`` (n x k, the largest dense
        # work of a solve) use the runtime's threads.
        with blas_threads(threads):
            w, s, z = _small_svd(other, vectors)
            del other
            x = x @ z if vectors else None
    elif not vectors:
        # Values only, A V not in memory: the Gram matrix x^H (A^H A x) of the converged Ritz
        # vectors would cost k more operator columns (k/16 passes over A, a fifth of the
        # 1M x 100K solve) and gives the Ritz values again, to the same accuracy (both are
        # eigenvalues of A^H A, no better conditioned than theta): s = sqrt(theta).
        w, s = None, np.sort(np.sqrt(np.maximum(np.real(theta), 0.0)))[::-1]
    else:
        w, s, z, x = _triplets_out_of_core(op, apply, x, right, vectors, plan, runtime, threads, u_on_flash)
    s = np.asarray(s, dtype=np.float64)
    if stats is not None:
        stats.update(restarts=info.restarts, operator_blocks=info.operator_blocks,
                     operator_columns=info.operator_columns, block_size=info.block_size,
                     basis_size=info.basis_size, dense=info.dense,
                     max_relative_residual=float(np.max(info.residuals / np.maximum(np.abs(theta), 1e-300))),
                     basis_on_flash=plan.flash_basis is not None, vectors_on_flash=not plan.other_in_memory,
                     state_bytes=plan.state_bytes, kernel_budget_bytes=plan.kernel_bytes,
                     on_flash=isinstance(op, OnFlash) or isinstance(getattr(op, "op", None), OnFlash),
                     loaded=isinstance(op, _Loaded) or isinstance(getattr(op, "op", None), _Loaded),
                     peak_resident_bytes=getattr(op, "peak_resident_bytes", 0),
                     bytes_read=getattr(op, "bytes_read", 0), bytes_written=getattr(op, "bytes_written", 0),
                     kernel_seconds=getattr(op, "kernel_seconds", 0.0), cache_hits=getattr(op, "cache_hits", 0),
                     cache_misses=getattr(op, "cache_misses", 0),
                     compute_idle_seconds=getattr(op, "compute_idle_seconds", 0.0))
    if not vectors:
        return None, s, None
    return (w, s, x.conj().T) if right else (x, s, w.conj().T)


def _check_scipy_arguments(A, k, ncv, tol, which, v0, maxiter, return_singular_vectors, solver, rng):
    """scipy's svds checks, in its order, with its exception types and wording (ours subclass
    them: :class:`~scalefree.errors.InvalidArgumentError` is a ``ValueError``). A value
    ``int()`` cannot take raises what ``int()`` raises, as in scipy. Returns the normalized
    ``(k, ncv, tol, which, v0, maxiter)``."""
    if str(solver).lower() not in _SCIPY_SOLVERS:
        raise InvalidArgumentError(f"solver must be one of {set(_SCIPY_SOLVERS)}, got {solver!r}")
    shape = tuple(A.shape)
    if len(shape) != 2:
        raise InvalidArgumentError(f"`A` must be 2-D, got shape {shape}")
    if math.prod(shape) == 0:
        raise InvalidArgumentError(f"`A` must not be empty (shape {shape})")
    if int(k) != k or not 0 < k <= min(shape) - 1:
        raise InvalidArgumentError(f"`k` must be an integer satisfying `0 < k < min(A.shape)`; A has shape {shape}, "
                                   f"got k={k!r}")
    k = int(k)
    if ncv is not None:
        if int(ncv) != ncv or not k < ncv < min(shape):
            raise InvalidArgumentError(f"`ncv` must be an integer satisfying `k < ncv < min(A.shape)`; k={k}, "
                                       f"A has shape {shape}, got ncv={ncv!r}")
        ncv = int(ncv)
    if tol < 0 or not np.isfinite(tol):
        raise InvalidArgumentError(f"`tol` must be a non-negative floating point value, got {tol!r}")
    which = str(which).upper()
    if which not in ("LM", "SM"):
        raise InvalidArgumentError(f"`which` must be in {{'LM', 'SM'}}, got {which!r}")
    if v0 is not None:
        v0 = np.atleast_1d(v0)
        if not (np.issubdtype(v0.dtype, np.complexfloating) or np.issubdtype(v0.dtype, np.floating)):
            raise InvalidArgumentError(f"`v0` must be of floating or complex floating data type, got {v0.dtype}")
        if v0.shape != (min(shape),):
            raise InvalidArgumentError(f"`v0` must have shape {(min(shape),)}, got {v0.shape}")
    if maxiter is not None:
        if int(maxiter) != maxiter or maxiter <= 0:
            raise InvalidArgumentError(f"`maxiter` must be a positive integer, got {maxiter!r}")
        maxiter = int(maxiter)
    if return_singular_vectors not in {True, False, "u", "vh"}:
        raise InvalidArgumentError(f"`return_singular_vectors` must be in {{True, False, 'u', 'vh'}}, "
                                   f"got {return_singular_vectors!r}")
    if not (rng is None or isinstance(rng, (numbers.Integral, np.random.Generator, np.random.RandomState))):
        raise InvalidArgumentError(f"'{rng}' is neither a NumPy Generator nor an integer seed to instantiate one")
    return k, ncv, float(tol), which, v0, maxiter


def _as_matrix(A):
    """``A`` as svds takes it: flash matrices, LinearOperators and scipy sparse matrices as
    they are, anything else through ``numpy.asarray`` (a list of lists works, as in scipy)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator

    if isinstance(A, (flash.Csr, flash.Matrix, LinearOperator)) or sp.issparse(A):
        return A
    arr = np.asarray(A)
    if arr.ndim == 0 or arr.dtype.kind in "USV":
        raise TypeError(f"type not understood: svds takes an array, a sparse matrix, a LinearOperator or a flash "
                        f"matrix, got {type(A).__name__}")
    if arr.ndim > 2:
        raise InvalidArgumentError(f"`A` must be 2-D: array must have ndim <= 2, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number):
        raise InvalidArgumentError(f"`A` must be of numeric data type, got {arr.dtype}")
    return arr


def svds(A, k=6, ncv=None, tol=0, which="LM", v0=None, maxiter=None, return_singular_vectors=True,
         solver="arpack", rng=None, options=None, *, random_state=None, runtime=None, block_size=None, stats=None,
         u_on_flash=False):
    """Partial SVD with the contract of ``scipy.sparse.linalg.svds`` (``solver="arpack"``):
    ``(u, s, vh)`` with ``s`` ascending (the ``k`` largest singular values for ``which='LM'``,
    the smallest for ``'SM'``), ``u`` ``M x k`` and ``vh`` ``k x N``;
    ``return_singular_vectors=False`` gives ``s`` alone, ``'u'`` gives ``(u, s, None)``,
    ``'vh'`` gives ``(None, s, vh)``.

    ``A``: a :class:`flash.Csr` (stays on flash; read once and applied in memory when its
    arrays fit the runtime's memory budget) or :class:`flash.Matrix` (stays on flash), a scipy
    sparse matrix or numpy array (computed in memory, or copied to flash first when larger
    than the runtime's memory budget), or a ``scipy.sparse.linalg.LinearOperator``. Output
    dtypes are scipy's: float32 and complex64 inputs give float32 ``s`` and vectors of their
    own dtype, other complex types complex128, everything else float64. Complex inputs are
    computed in memory (the flash kernels are real).

    ``k``: ``0 < k < min(A.shape)``. ``tol``: tolerance of the singular values (0, the
    default: the input's machine precision); as in scipy, the eigenpairs of ``A^H A`` are
    solved to a relative residual of ``tol**2``. ``ncv``: Krylov basis size before a restart
    (``k < ncv < min(A.shape)``; default ``max(2k + 2b, 20)``). ``maxiter``: number of
    restarts. ``v0``: start vector, shape ``(min(A.shape),)``, float or complex. ``rng`` (or
    its former name ``random_state``): a seed, ``numpy.random.Generator`` or ``RandomState``
    for the other start vectors. ``solver``: any of scipy's names (``"arpack"``,
    ``"lobpcg"``, ``"propack"``), accepted for compatibility; the solver is always block
    Krylov-Schur and the contract always ARPACK's (``"lobpcg"`` also warns, as scipy's does,
    when a problem is small enough for the dense eigensolver). ``options``: ``{"block_size": b}`` (also
    a keyword, ``block_size``: columns per operator application, default ``min(k, 16)``,
    ``min(k, 32)`` when A is applied from flash). ``runtime``: the :class:`flash.Runtime`
    (default :func:`flash.default_runtime`). ``stats``: a dict that receives restarts,
    operator applications, the final residual, ``on_flash`` (whether A was applied from
    flash), ``loaded`` (a flash A read once into memory), ``peak_resident_bytes`` (the flash
    kernels' largest peak), ``bytes_read``/``bytes_written`` and ``kernel_seconds`` (summed
    over the kernel calls), ``basis_on_flash``, ``vectors_on_flash``, ``state_bytes`` and
    ``kernel_budget_bytes`` (the memory plan, below).

    Memory: the runtime's budget covers the solve's state, not only the flash kernels. A
    loaded A counts against it; the Krylov basis (``min(A.shape) x (ncv + b)``) stays in
    memory when it fits what is left, else it is a scratch flash matrix worked on in row
    blocks; the final ``A V`` (``max(A.shape) x k``) is formed in memory when it fits, else
    the triplets come from the ``k x k`` Gram matrix ``V^T A^T A V`` and ``u`` is formed a
    row block at a time — into a numpy array (the default: scipy's contract), or, with
    ``u_on_flash=True``, into a :class:`flash.Matrix` (``u`` returned on flash, columns in
    ascending order like the numpy one) so that the whole solve stays within the budget. A
    streamed A's kernels get the rest of the budget (a runtime of that budget,
    :meth:`Runtime.with_budget`).

    Invalid arguments raise what scipy's svds raises, with its wording (``ValueError``s are
    :class:`~scalefree.errors.InvalidArgumentError`). When ``maxiter`` restarts do not
    converge ``k`` triplets: an exception that is at once a
    :class:`~scalefree.errors.NoConvergenceError`, scipy's ``ArpackNoConvergence`` and numpy's
    ``LinAlgError`` (what scipy's PROPACK path raises).
    """
    if random_state is not None:
        if rng is not None:
            raise TypeError("svds: pass rng or random_state (its former name), not both")
        rng = random_state
    A = _as_matrix(A)
    k, ncv, tol, which, v0, maxiter = _check_scipy_arguments(A, k, ncv, tol, which, v0, maxiter,
                                                             return_singular_vectors, solver, rng)
    rsv = return_singular_vectors
    if options:
        unknown = set(options) - {"block_size"}
        if unknown:
            raise InvalidArgumentError(f"svds: unknown options {sorted(unknown)} (known: block_size)")
        block_size = options.get("block_size", block_size)
    rt = runtime or flash.default_runtime()
    # A flash CSR matrix is read into memory when it fits the budget beside the solver's state
    # (then applied in memory, with the in-memory block size).
    reserve = sum(solver_state_bytes(min(A.shape), k, ncv, block_size or max(min(k, 16), min(2, k)), 8, rt.threads))
    op = flash_operator(A, rt, reserve)
    if v0 is not None and v0.dtype.kind == "c" and np.dtype(op.dtype).kind != "c":
        raise InvalidArgumentError(f"`v0` is complex ({v0.dtype}) for a real matrix ({np.dtype(op.dtype)})")
    st = stats if stats is not None else {}
    u, s, vh = _solve(op, k, ncv=ncv, tol=tol, which=which, v0=v0, maxiter=maxiter, random_state=rng,
                      block_size=block_size, stats=st, vectors=rsv is not False, threads=rt.threads, runtime=rt,
                      u_on_flash=u_on_flash)
    if st["dense"] and str(solver).lower() == "lobpcg":
        # scipy's LOBPCG path warns when it falls back to a dense eigensolver; so do we,
        # under that name, for the same small problems (code may filter or expect it).
        warnings.warn(f"The problem size {min(A.shape)} is too small relative to the block Krylov-Schur basis "
                      f"({st['basis_size']} + {st['block_size']} columns): using a dense eigensolver instead of "
                      f"iterations", UserWarning, stacklevel=2)
    dtype = np.dtype(op.dtype)
    real = np.finfo(dtype).dtype  # float32 for complex64, float64 for complex128
    if rsv is False:
        return s[::-1].astype(real)
    # Ascending order, as scipy: u's columns reversed in place (u is max(A.shape) x k: a
    # reversed copy, and a contiguous one, would each hold another u). A u that did not fit
    # the budget is a flash.Matrix, written in ascending order already.
    if not isinstance(u, flash.Matrix):
        u = _reverse_columns(np.ascontiguousarray(u)).astype(dtype, copy=False)
    s, vh = s[::-1].astype(real), vh[::-1].astype(dtype)
    if rsv == "u":
        return u, s, None
    if rsv == "vh":
        return None, s, np.ascontiguousarray(vh)
    return u, s, np.ascontiguousarray(vh)


def _reverse_columns(a: np.ndarray) -> np.ndarray:
    """``a[:, ::-1]`` in place (a column at a time through one column of scratch)."""
    k = a.shape[1]
    for j in range(k // 2):
        col = a[:, j].copy()
        a[:, j] = a[:, k - 1 - j]
        a[:, k - 1 - j] = col
    return a


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
    sparse or on-flash ``X`` is never densified. ``1 <= k < min(X.shape)``. ``tol``: as
    :func:`svds`' (a tolerance of the singular values; 0: machine precision). Each component's
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
                      random_state=random_state, block_size=block_size, stats=stats, threads=rt.threads, runtime=rt)
    if isinstance(u, flash.Matrix):
        u = u.to_numpy()[:, ::-1]  # pca returns its scores in memory
    flip = np.sign(vt[np.arange(k), np.argmax(np.abs(vt), axis=1)])
    flip[flip == 0] = 1.0
    vt, u = vt * flip[:, None], u * flip[None, :]
    return PCA(components=vt, explained_variance=s ** 2 / max(samples - 1, 1), singular_values=s, mean=mu,
               scores=u * s[None, :])
