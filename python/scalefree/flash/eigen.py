"""Restarted Block Krylov-Schur eigensolver for symmetric operators.

    theta, X, info = block_krylov_schur(apply, n, k, which="LA", tol=1e-8)

``apply(Q)`` maps an ``n x b`` float64 block to ``op @ Q`` (``op`` symmetric; with
``dtype=complex128``, complex blocks and ``op`` Hermitian); it is the only access to the operator, so the operator may live anywhere (a flash matrix applied
through ``flash.csrmm``, an in-memory product, a rank-one corrected one for PCA). The Krylov
basis (``n x basis_size`` float64) lives in memory.

The method (Stewart's Krylov-Schur, in block form):

1. Start from an orthonormal block ``Q`` (``v0`` as its first column, the rest random).
2. Expand: for each new block ``Q``, ``W = op Q``; orthogonalize ``W`` against the whole
   basis ``[V, Q]`` twice (classical Gram-Schmidt with one full re-orthogonalization pass);
   the projections fill the columns of ``H = V^H op V``; ``W = Q_next R`` by a thin SVD (a
   rank-deficient ``W`` — an invariant subspace was found — is completed with random
   directions orthogonal to the basis and a zero coupling). Then
   ``op V = V H + Q_next R E^T`` with ``E`` the last ``b`` columns.
3. Schur form of the projected matrix: ``H`` is symmetric, so its real Schur form is its
   eigendecomposition ``H = Y diag(theta) Y^T``. The residual of Ritz pair
   ``(theta_i, V y_i)`` is ``||R Y[-b:, i]||`` without touching the operator.
4. Checked after every block once the basis has been full once (``basis_size`` columns, as
   ARPACK checks after a full Lanczos factorization; the small eigendecomposition is cheap
   next to an operator call), so a loose tolerance stops early, but never on a basis so
   small that its Ritz values are poor (a rank-one operator makes a two-block space look
   invariant). Converged when the ``k`` wanted Ritz pairs have ``residual_i <= tol * |theta_i|``,
   where ``tol`` is at least a small multiple of the operator's precision times
   ``max |theta|`` (``tol = 0`` means that precision).
5. Else restart: keep the ``p`` wanted Ritz vectors (``p >= k``, about halfway between ``k``
   and the basis size): ``V <- V Y[:, :p]``, ``H <- diag(theta[:p])``; the relation becomes
   ``op V = V H + Q_next (R E^T Y[:, :p])`` — a Krylov decomposition with a full coupling row,
   which the next expansion's full orthogonalization folds back into ``H``. Go to 2.

Small problems (``n`` no larger than one basis plus a block) are solved densely: the
operator is applied to the identity in blocks and ``numpy.linalg.eigh`` does the rest.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgumentError, NoConvergenceError
from .state import DenseState

WHICH = ("LA", "SA", "LM")


@dataclass
class KrylovSchurInfo:
    """What one solve did: ``restarts`` (Krylov-Schur restarts), ``operator_blocks`` (calls of
    ``apply``), ``operator_columns`` (columns pushed through the operator), ``residuals`` (of
    the returned pairs), ``dense`` (solved by the small dense path)."""

    restarts: int = 0
    operator_blocks: int = 0
    operator_columns: int = 0
    block_size: int = 0
    basis_size: int = 0
    dense: bool = False
    converged: int = 0
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(0))


_blas_controller = None


def _one_blas_thread():
    """A context in which BLAS runs on one thread, for the solver's own dense work (skinny
    products with the basis, LAPACK on one block and on the small projected matrix): threaded
    OpenBLAS gains little on these memory-bound shapes and, on a busy machine, makes them
    10-50x slower (its threads spin waiting for each other). The operator runs outside it.
    Uses threadpoolctl when it is installed; otherwise a no-op."""
    return blas_threads(1)


def blas_threads(threads: int):
    """A context in which BLAS runs on at most ``threads`` threads (see :func:`_one_blas_thread`)."""
    global _blas_controller
    if _blas_controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas_controller = False
        else:
            _blas_controller = ThreadpoolController()
    if _blas_controller is False:
        return contextlib.nullcontext()
    return _blas_controller.limit(limits=max(1, int(threads)), user_api="blas")


def _order(theta: np.ndarray, which: str) -> np.ndarray:
    """Indices of ``theta``, most wanted first."""
    if which == "LA":
        return np.argsort(-theta, kind="stable")
    if which == "SA":
        return np.argsort(theta, kind="stable")
    return np.argsort(-np.abs(theta), kind="stable")


def _rng(random_state):
    if isinstance(random_state, (np.random.Generator, np.random.RandomState)):
        return random_state
    return np.random.default_rng(random_state)


def _standard_normal(rng, shape, dtype=np.float64):
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2.0)
    return rng.standard_normal(shape)


def _orthonormal_complement(rng, basis, columns: int, n: int, dtype=None) -> np.ndarray:
    """``columns`` random orthonormal vectors orthogonal to ``basis`` (``n x j``, orthonormal;
    or a function ``z -> z - B B^H z`` projecting out a basis ``B`` kept elsewhere)."""
    dtype = basis.dtype if dtype is None else dtype
    out = np.empty((n, 0), dtype=dtype)
    for _ in range(10):
        z = _standard_normal(rng, (n, columns - out.shape[1]), dtype)
        for _ in range(2):
            if callable(basis):
                z = basis(z)
            elif basis.shape[1]:
                z -= basis @ (basis.conj().T @ z)
            if out.shape[1]:
                z -= out @ (out.conj().T @ z)
        q, r = np.linalg.qr(z)
        good = np.abs(np.diag(r)) > 1e-8 * np.sqrt(n)
        out = np.hstack([out, q[:, good]])
        if out.shape[1] == columns:
            return out
    raise InvalidArgumentError(f"cannot extend a basis of {basis.shape[1]} vectors in dimension {n} by {columns}")


def _check_block(w, n, b, dtype=np.float64):
    w = np.asarray(w, dtype=dtype)
    if w.shape != (n, b):
        raise InvalidArgumentError(f"the operator returned shape {w.shape} for a block of shape {(n, b)}")
    return w


def _dense(apply, n, k, which, block, info, dtype):
    """Eigenpairs of a small operator from its full matrix, built ``block`` columns at a time."""
    m = np.empty((n, n), dtype=dtype)
    eye = np.eye(n, dtype=dtype)
    for s in range(0, n, block):
        e = min(n, s + block)
        m[:, s:e] = _check_block(apply(eye[:, s:e]), n, e - s, dtype)
        info.operator_blocks += 1
        info.operator_columns += e - s
    m = 0.5 * (m + m.conj().T)
    with _one_blas_thread():
        theta, y = np.linalg.eigh(m)
    pick = _order(theta, which)[:k]
    info.dense = True
    info.converged = k
    info.residuals = np.linalg.norm(m @ y[:, pick] - y[:, pick] * theta[pick], axis=0)
    return theta[pick], y[:, pick]


def block_krylov_schur(apply, n: int, k: int, *, which: str = "LA", tol: float = 0.0,
                       block_size: int | None = None, basis_size: int | None = None,
                       maxiter: int | None = None, v0=None, random_state=None,
                       operator_eps: float = np.finfo(np.float64).eps, dtype=np.float64,
                       strict: bool = True, flash_basis=None):
    """The ``k`` wanted eigenpairs of a symmetric ``n x n`` operator given by ``apply``.

    ``which``: ``"LA"`` largest algebraic, ``"SA"`` smallest algebraic, ``"LM"`` largest
    magnitude. ``tol``: relative residual ``||op x - theta x|| <= tol |theta|`` (0: the
    operator's precision, ``operator_eps``, e.g. float32's when the operator computes in
    float32). ``block_size`` (default ``min(k, 16)``, at least 2 when ``k > 1``) columns per
    operator call; ``basis_size`` (default ``max(2 k + 2 b, 20)``) columns of the Krylov
    basis before a restart; ``maxiter`` restarts (default ``max(100, 10 n / basis_size)``).
    ``v0`` the first start vector. ``dtype``: float64 (``op`` real symmetric) or complex128
    (``op`` Hermitian: blocks, basis and eigenvectors complex, eigenvalues real).

    Returns ``(theta, X, info)``: eigenvalues most wanted first, their orthonormal
    eigenvectors as the columns of ``X`` (``n x k``, ``dtype``), and a :class:`KrylovSchurInfo`.
    Raises :class:`NoConvergenceError` after ``maxiter`` restarts without ``k`` converged pairs
    (``strict=False``: returns the current Ritz pairs instead, ``info.converged`` of them
    converged).

    ``flash_basis``: ``(runtime, block_bytes)`` keeps the Krylov basis on flash (a scratch
    matrix of that runtime, column-major so a new block is one write) and works on it in row
    blocks of ``block_bytes``: the orthogonalization reads it three times per block (the
    projection; the subtraction fused with the second projection; the second subtraction),
    a restart rewrites its kept columns a row block at a time. The same method, summed in
    another order: the results agree with the in-memory basis's to the tolerance.
    """
    n, k = int(n), int(k)
    if n < 1:
        raise InvalidArgumentError(f"the operator must have a positive dimension, got n={n}")
    if not 1 <= k <= n:
        raise InvalidArgumentError(f"k must be between 1 and n={n}, got k={k}")
    if which not in WHICH:
        raise InvalidArgumentError(f"which must be one of {', '.join(WHICH)}, got {which!r}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float64, np.complex128):
        raise InvalidArgumentError(f"dtype must be float64 or complex128, got {dtype}")
    if not tol >= 0:
        raise InvalidArgumentError(f"tol must be >= 0, got {tol}")
    b = int(block_size) if block_size is not None else max(min(k, 16), min(2, k))
    if b < 1:
        raise InvalidArgumentError(f"block_size must be >= 1, got {b}")
    m = int(basis_size) if basis_size is not None else max(2 * k + 2 * b, 20)
    if m < k + b:
        raise InvalidArgumentError(f"basis_size must be >= k + block_size = {k + b}, got {m}")
    if maxiter is not None and maxiter < 1:
        raise InvalidArgumentError(f"maxiter must be >= 1, got {maxiter}")
    maxiter = int(maxiter) if maxiter is not None else max(100, 10 * n // m)
    info = KrylovSchurInfo(block_size=b, basis_size=m)
    if n <= m + b:
        theta, x = _dense(apply, n, k, which, max(b, min(n, 64)), info, dtype)
        return theta, x, info

    rng = _rng(random_state)
    q = _standard_normal(rng, (n, b), dtype)
    if v0 is not None:
        v0 = np.asarray(v0).reshape(-1)
        if v0.dtype.kind == "c" and dtype.kind != "c":
            raise InvalidArgumentError("v0 is complex for a real operator")
        v0 = v0.astype(dtype)
        if v0.shape != (n,):
            raise InvalidArgumentError(f"v0 must have {n} entries, got {v0.size}")
        if np.any(v0):
            q[:, 0] = v0
    with _one_blas_thread():
        q, _ = np.linalg.qr(q)
    # Columns [0, j) of V are the basis; H[:j, :j] = V^T op V; q is the block being added.
    V = np.empty((n, m + b), dtype=dtype) if flash_basis is None else _FlashBasis(n, m + b, dtype, *flash_basis)
    H = np.zeros((m + b, m + b), dtype=dtype)
    j = 0
    filled = False  # the basis has been full once: convergence is checked from then on
    eps = max(float(operator_eps), np.finfo(np.float64).eps)
    restarts = 0
    keep = min(m - b, max(k, (k + m - b) // 2 + 1))
    while True:
        # --- expand by one block ---
        if isinstance(V, _FlashBasis):
            V.write(0, j, q)
        else:
            V[:, j:j + b] = q
        w = _check_block(apply(q), n, b, dtype)
        info.operator_blocks += 1
        info.operator_columns += b
        with _one_blas_thread():
            q, r = (V.orthogonalize if isinstance(V, _FlashBasis) else _orthogonalize)(V, H, j, b, w, rng)
        j += b
        full = j >= m
        filled = filled or full
        if not filled:
            continue
        with _one_blas_thread():
            # --- Schur form of the projected matrix, residuals, convergence (every block
            # once there are k + b columns: the eigh of H is cheap next to an operator call) ---
            theta, y = np.linalg.eigh(0.5 * (H[:j, :j] + H[:j, :j].conj().T))
            order = _order(theta, which)
            theta, y = theta[order], y[:, order]
            res = np.linalg.norm(r @ y[j - b:j, :], axis=0)
            floor = 64.0 * eps * np.abs(theta).max(initial=0.0)
            ok = res[:k] <= np.maximum(tol * np.abs(theta[:k]), floor)
            if ok.all() or (full and restarts >= maxiter):
                x = V.combine(j, y[:, :k]) if isinstance(V, _FlashBasis) else V[:, :j] @ y[:, :k]
                info.restarts = restarts
                info.residuals = res[:k]
                info.converged = int(ok.sum())
                if not ok.all() and strict:
                    good = np.flatnonzero(ok)
                    raise NoConvergenceError(
                        f"block Krylov-Schur: {good.size} of {k} eigenpairs converged after {restarts} restarts "
                        f"({info.operator_columns} operator columns); raise maxiter or tol",
                        theta[good], x[:, good])
                return theta[:k], x, info
            if not full:
                continue
            # --- Krylov-Schur restart: keep the wanted Ritz vectors, truncate the rest ---
            restarts += 1
            if isinstance(V, _FlashBasis):
                V.restart(j, y[:, :keep])
            else:
                V[:, :keep] = V[:, :j] @ y[:, :keep]
            H[:] = 0.0
            H[np.arange(keep), np.arange(keep)] = theta[:keep]
            j = keep
            # q (the next block) is orthogonal to the kept vectors already; the coupling
            # R E^T Y reappears in H through the full orthogonalization of the next expansion.


def _orthogonalize(V, H, j, b, w, rng):
    """Orthogonalizes ``w = op V[:, j:j+b]`` against ``V[:, :j+b]`` (twice), storing the
    projections in ``H``; returns ``(q_next, r)`` with ``w = q_next r`` and ``q_next``
    orthonormal and orthogonal to the basis (deflated directions replaced by random ones
    with a zero row in ``r``)."""
    n = V.shape[0]
    basis = V[:, :j + b]
    bh = basis.conj().T
    c = bh @ w
    w -= basis @ c
    c2 = bh @ w
    w -= basis @ c2
    c += c2
    H[:j + b, j:j + b] = c
    H[j:j + b, :j + b] = c.conj().T
    u, s, zt = np.linalg.svd(w, full_matrices=False)
    scale = max(np.abs(H[:j + b, :j + b]).max(initial=0.0), 1e-300)
    small = s <= 1e-12 * scale
    r = s[:, None] * zt
    if small.any():
        r[small] = 0.0
        u = u[:, ~small]
        fresh = _orthonormal_complement(rng, np.hstack([basis, u]), int(small.sum()), n)
        u = np.hstack([u, fresh])
        r = np.vstack([r[~small], r[small]])
    return u, r


class _FlashBasis(DenseState):
    """The Krylov basis on flash (see ``flash_basis`` of :func:`block_krylov_schur`): the
    operations the solver does on ``V[:, :j]``, a row block of ``block_bytes`` at a time."""

    def __init__(self, n, cols, dtype, rt, block_bytes):
        super().__init__(n, cols, dtype, rt, on_flash=True, order="F")
        self.block_bytes = int(block_bytes)

    def _blocks(self, cols):
        for lo, hi in self.row_ranges(self.block_bytes, cols):
            yield lo, hi, self.read(lo, hi, 0, cols)

    def project(self, cols, z):
        """``z - V V^H z`` for ``V = self[:, :cols]`` (two passes)."""
        c = np.zeros((cols, z.shape[1]), dtype=z.dtype)
        for lo, hi, vr in self._blocks(cols):
            c += vr.conj().T @ z[lo:hi]
        for lo, hi, vr in self._blocks(cols):
            z[lo:hi] -= vr @ c
        return z

    def orthogonalize(self, _V, H, j, b, w, rng):
        """:func:`_orthogonalize` with the basis ``self[:, :j + b]`` on flash, in three passes."""
        n, cols = self.shape[0], j + b
        c = np.zeros((cols, b), dtype=w.dtype)
        c2 = np.zeros_like(c)
        for lo, hi, vr in self._blocks(cols):
            c += vr.conj().T @ w[lo:hi]
        for lo, hi, vr in self._blocks(cols):  # the subtraction and the second projection
            w[lo:hi] -= vr @ c
            c2 += vr.conj().T @ w[lo:hi]
        for lo, hi, vr in self._blocks(cols):
            w[lo:hi] -= vr @ c2
        c += c2
        H[:cols, j:cols] = c
        H[j:cols, :cols] = c.conj().T
        u, s, zt = np.linalg.svd(w, full_matrices=False)
        scale = max(np.abs(H[:cols, :cols]).max(initial=0.0), 1e-300)
        small = s <= 1e-12 * scale
        r = s[:, None] * zt
        if small.any():
            r[small] = 0.0
            u = u[:, ~small]

            def project(z):
                z = self.project(cols, z)
                return z - u @ (u.conj().T @ z) if u.shape[1] else z

            fresh = _orthonormal_complement(rng, project, int(small.sum()), n, w.dtype)
            u = np.hstack([u, fresh])
            r = np.vstack([r[~small], r[small]])
        return u, r

    def combine(self, j, y):
        """``V[:, :j] @ y`` (in memory: ``n x y.shape[1]``)."""
        out = np.empty((self.shape[0], y.shape[1]), dtype=np.result_type(self.dtype, y.dtype))
        for lo, hi, vr in self._blocks(j):
            out[lo:hi] = vr @ y
        return out

    def restart(self, j, y):
        """``V[:, :y.shape[1]] = V[:, :j] @ y``, a row block at a time (in place)."""
        for lo, hi, vr in self._blocks(j):
            self.write(lo, 0, vr @ y)
