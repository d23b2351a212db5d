"""Block Krylov-Schur (scalefree.flash.eigen), flash.svds and flash.pca against numpy and
scipy.sparse.linalg.svds: random and power-law matrices, tiny, odd and larger shapes,
float32/float64, every input kind, bad arguments, and a flash matrix far larger than the budget."""

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from scalefree import flash

from scalefree.flash import svd as flash_svd
from scalefree.errors import InvalidArgumentError, NoConvergenceError
from scalefree.flash.eigen import block_krylov_schur


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return flash.Runtime(memory_budget="1M", threads=2, dir=tmp_path_factory.mktemp("flash-eigen"))


def power_law(rows, cols, nnz, seed, dtype=np.float64):
    """Rows and columns drawn with Zipf-like popularity: a few hubs, a long tail."""
    rng = np.random.default_rng(seed)
    pr = 1.0 / np.arange(1, rows + 1) ** 0.9
    pc = 1.0 / np.arange(1, cols + 1) ** 1.1
    r = rng.choice(rows, nnz, p=pr / pr.sum())
    c = rng.choice(cols, nnz, p=pc / pc.sum())
    a = sp.coo_matrix((rng.random(nnz) + 0.5, (rng.permutation(rows)[r], rng.permutation(cols)[c])),
                      shape=(rows, cols)).tocsr()
    a.sum_duplicates()
    return a.astype(dtype)


def random_sparse(rows, cols, density, seed, dtype=np.float64):
    return sp.random(rows, cols, density=density, random_state=seed, format="csr", dtype=dtype)


def check_triplets(a, u, s, vt, k, want_s, rtol):
    """u, s, vt are a partial SVD of a with singular values want_s (ascending)."""
    dense = a.toarray() if sp.issparse(a) else np.asarray(a)
    dense = dense.astype(np.float64)
    assert u.shape == (dense.shape[0], k) and s.shape == (k,) and vt.shape == (k, dense.shape[1])
    assert np.all(np.diff(s) >= -rtol * s.max()), "s must be ascending"
    np.testing.assert_allclose(s, want_s, rtol=rtol, atol=rtol * want_s.max())
    u64, s64, vt64 = u.astype(np.float64), s.astype(np.float64), vt.astype(np.float64)
    np.testing.assert_allclose(u64.T @ u64, np.eye(k), atol=10 * rtol)
    np.testing.assert_allclose(vt64 @ vt64.T, np.eye(k), atol=10 * rtol)
    scale = max(s64.max(), 1e-300)
    assert np.linalg.norm(dense @ vt64.T - u64 * s64) <= 10 * rtol * scale * np.sqrt(k)
    assert np.linalg.norm(dense.T @ u64 - vt64.T * s64) <= 10 * rtol * scale * np.sqrt(k)


def top_singular_values(a, k):
    dense = a.toarray() if sp.issparse(a) else np.asarray(a)
    return np.sort(np.linalg.svd(dense.astype(np.float64), compute_uv=False))[-k:]


# ---------------------------------------------------------------------------------------
# csrtmm: A^T X and A^T A X in one pass over a flash matrix


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,n", [((1, 1), 1), ((37, 23), 3), ((23, 37), 16), ((3000, 800), 5), ((0, 5), 2)])
def test_csrtmm_matches_scipy(rt, dtype, shape, n):
    a = power_law(*shape, 20 * max(shape), seed=n, dtype=dtype) if min(shape) > 1 else sp.csr_matrix(
        np.ones(shape, dtype=dtype))
    A = flash.Csr.from_scipy(a, rt)
    rng = np.random.default_rng(0)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    x = rng.standard_normal((shape[0], n)).astype(dtype)
    stats = {}
    z = flash.csrtmm(A, x, runtime=rt, stats=stats)
    assert z.dtype == dtype and z.shape == (shape[1], n)
    np.testing.assert_allclose(z, a.T @ x, rtol=tol, atol=tol * max(1.0, np.abs(a.T @ x).max(initial=0)))
    x = rng.standard_normal((shape[1], n)).astype(dtype)
    z = flash.csrtmm(A, x, gram=True, runtime=rt, stats=stats)
    want = a.T @ (a @ x)
    np.testing.assert_allclose(z, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)))
    if shape[0]:
        assert stats["peak_resident_bytes"] <= rt.memory_budget_bytes


def test_csrtmm_bad_shapes(rt):
    A = flash.Csr.from_scipy(random_sparse(6, 4, 0.5, seed=0), rt)
    with pytest.raises(ValueError, match="X must have 6 rows"):
        flash.csrtmm(A, np.ones((4, 2)), runtime=rt)
    with pytest.raises(ValueError, match="X must have 4 rows"):
        flash.csrtmm(A, np.ones((6, 2)), gram=True, runtime=rt)
    with pytest.raises(ValueError, match="flash.Csr"):
        flash.csrtmm(np.ones((6, 4)), np.ones((6, 2)), runtime=rt)
    np.testing.assert_allclose(flash.csrtmm(A, np.ones(6), runtime=rt)[:, 0], A.to_scipy().T @ np.ones(6))


# ---------------------------------------------------------------------------------------
# csr_product: the in-memory parallel products (fused A^T A X, A^T X, A X) of svds


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,n", [((0, 0), 2), ((1, 1), 1), ((0, 5), 2), ((5, 0), 3), ((1, 7), 3),
                                     ((37, 23), 3), ((23, 37), 16), ((3001, 801), 5), ((20000, 3000), 33)])
@pytest.mark.parametrize("threads", [1, 2])
def test_csr_product_matches_scipy(tmp_path, dtype, shape, n, threads):
    rt = flash.Runtime(memory_budget="1M", threads=threads, dir=tmp_path)
    a = (power_law(*shape, 20 * max(shape), seed=n, dtype=dtype) if min(shape) > 1
         else sp.csr_matrix(np.arange(1, shape[0] * shape[1] + 1, dtype=dtype).reshape(shape)))
    rng = np.random.default_rng(n)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    x = rng.standard_normal((shape[1], n))  # float64: converted to A's dtype
    for product, want in (("gram", a.T @ (a @ x.astype(dtype))), ("times", a @ x.astype(dtype))):
        z = flash.csr_product(a, x, product=product, runtime=rt)
        assert z.dtype == dtype and z.shape == want.shape and z.flags.c_contiguous
        np.testing.assert_allclose(z, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)))
    y = rng.standard_normal((shape[0], n)).astype(dtype)
    z = flash.csr_product(a, y, product="transpose", runtime=rt)
    want = a.T @ y
    assert z.shape == want.shape
    np.testing.assert_allclose(z, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)))


def test_csr_product_duplicates_unsorted_and_bad_arguments(rt):
    # Non-canonical CSR (a duplicate entry, unsorted columns) is summed like scipy does.
    a = sp.csr_matrix((np.array([1.0, 2.0, 3.0, 4.0]), np.array([2, 0, 2, 1], dtype=np.int32),
                       np.array([0, 3, 3, 4])), shape=(3, 3))
    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(flash.csr_product(a, x, runtime=rt), a.toarray().T @ (a.toarray() @ x))
    np.testing.assert_allclose(flash.csr_product(a, np.ones(3), product="times", runtime=rt)[:, 0],
                               a.toarray() @ np.ones(3))
    wide = a.copy()  # 64-bit index arrays (scipy's choice for large matrices) are converted
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    np.testing.assert_allclose(flash.csr_product(wide, x, product="transpose", runtime=rt), a.toarray().T @ x)
    with pytest.raises(ValueError, match="must have 3 rows"):
        flash.csr_product(a, np.ones((4, 2)), runtime=rt)
    with pytest.raises(ValueError, match="gram, transpose or times"):
        flash.csr_product(a, x, product="both", runtime=rt)
    with pytest.raises(ValueError, match="scipy sparse"):
        flash.csr_product(np.ones((3, 3)), x, runtime=rt)
    with pytest.raises(ValueError, match="float32 or float64"):
        flash.csr_product(a.astype(np.int64), x, runtime=rt)
    bad = sp.csr_matrix((np.array([1.0]), np.array([-1], dtype=np.int32), np.array([0, 1])), shape=(1, 3))
    with pytest.raises(ValueError, match="column"):
        flash.csr_product(bad, np.ones((3, 1)), runtime=rt)


def test_svds_in_memory_sparse_uses_the_parallel_products(rt, monkeypatch):
    """A scipy sparse input that fits the budget goes through csr_product (gram for a tall A,
    transpose + times for a wide one) and agrees with scipy."""
    calls = []
    from scalefree.flash import core

    real = core.csr_arrays_product

    def spy(arrays, x, product, rt):
        calls.append(product)
        return real(arrays, x, product, rt)

    monkeypatch.setattr(core, "csr_arrays_product", spy)
    for shape in ((900, 300), (300, 900)):
        a = power_law(*shape, 9000, seed=5)
        want = np.sort(sla.svds(a, k=8, return_singular_vectors=False, random_state=0))
        calls.clear()
        u, s, vt = flash.svds(a, k=8, runtime=rt)
        np.testing.assert_allclose(s, want, rtol=1e-9)
        assert np.linalg.norm(a @ vt.T - u * s) <= 1e-8 * want[-1]
        assert ("gram" in calls) == (shape[0] >= shape[1]) and "times" in calls
        np.testing.assert_allclose(flash.svds(a, k=8, return_singular_vectors=False, runtime=rt), s, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# The eigensolver on its own


@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
@pytest.mark.parametrize("k,block", [(1, None), (5, None), (6, 3), (12, 4)])
def test_block_krylov_schur_matches_eigh(which, k, block):
    rng = np.random.default_rng(k)
    n = 300
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.concatenate([np.linspace(-10.1, -1.3, 20), rng.uniform(-1, 1, n - 40), np.linspace(1, 8, 20)])
    m = (q * lam) @ q.T
    theta, x, info = block_krylov_schur(lambda v: m @ v, n, k, which=which, tol=1e-10, block_size=block,
                                        random_state=0)
    order = {"LA": np.argsort(-lam), "SA": np.argsort(lam), "LM": np.argsort(-np.abs(lam))}[which]
    np.testing.assert_allclose(theta, lam[order[:k]], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(x.T @ x, np.eye(k), atol=1e-10)
    assert np.linalg.norm(m @ x - x * theta) < 1e-7
    assert not info.dense and info.restarts >= 0 and info.operator_columns > 0


def test_block_krylov_schur_restarts_and_finds_an_invariant_subspace():
    # Rank 3 operator, k = 5: the Krylov space closes after one block (deflation), and the
    # zero eigenvalues must still come back with orthonormal vectors.
    rng = np.random.default_rng(1)
    n = 200
    b = rng.standard_normal((n, 3))
    m = b @ b.T
    theta, x, info = block_krylov_schur(lambda v: m @ v, n, 5, which="LA", block_size=4, basis_size=24)
    want = np.sort(np.linalg.eigvalsh(m))[::-1][:5]
    np.testing.assert_allclose(theta, want, atol=1e-9 * want[0])
    np.testing.assert_allclose(x.T @ x, np.eye(5), atol=1e-10)
    # A slowly converging spectrum forces several restarts.
    lam = 1.0 + 1e-3 * np.arange(n)
    theta, x, info = block_krylov_schur(lambda v: lam[:, None] * v, n, 4, which="LA", tol=1e-10, basis_size=20)
    np.testing.assert_allclose(theta, lam[::-1][:4], rtol=1e-9)
    assert info.restarts >= 1


def test_block_krylov_schur_small_problems_go_dense_and_bad_arguments_raise():
    m = np.diag(np.arange(1.0, 11.0))
    theta, x, info = block_krylov_schur(lambda v: m @ v, 10, 10, which="SA")
    assert info.dense
    np.testing.assert_allclose(theta, np.arange(1.0, 11.0))
    for kwargs in [dict(k=0), dict(k=11), dict(which="BE"), dict(tol=-1.0), dict(block_size=0),
                   dict(basis_size=3), dict(maxiter=0)]:
        args = dict(k=2) | kwargs
        with pytest.raises(ValueError):
            block_krylov_schur(lambda v: m @ v, 10, **args)
    with pytest.raises(ValueError, match="operator returned shape"):
        block_krylov_schur(lambda v: v[:5], 100, 2)


def test_block_krylov_schur_reports_no_convergence():
    lam = 1.0 + 1e-6 * np.arange(2000)
    with pytest.raises(NoConvergenceError, match="converged after 1 restarts") as e:
        block_krylov_schur(lambda v: lam[:, None] * v, 2000, 6, which="LA", tol=1e-14, maxiter=1)
    assert e.value.eigenvectors.shape[0] == 2000
    assert isinstance(e.value, RuntimeError)


# ---------------------------------------------------------------------------------------
# svds against scipy and numpy


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,k", [((2, 9), 1), ((9, 2), 1), ((5, 7), 4), ((7, 5), 4), ((30, 13), 12),
                                     ((101, 37), 6), ((37, 101), 6), ((131, 67), 3)])
def test_svds_matches_numpy_and_scipy_small_and_odd(rt, dtype, shape, k):
    a = random_sparse(*shape, density=0.6, seed=shape[0] * 7 + k, dtype=dtype)
    want = top_singular_values(a, k)
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    for inp in (a, a.toarray(), flash.Csr.from_scipy(a, rt)):
        u, s, vt = flash.svds(inp, k=k, runtime=rt, random_state=0)
        assert s.dtype == dtype and u.dtype == dtype and vt.dtype == dtype
        check_triplets(a, u, s, vt, k, want, rtol)
    s_scipy = sla.svds(a.astype(np.float64), k=k, return_singular_vectors=False, random_state=0)
    np.testing.assert_allclose(np.sort(s_scipy), want, rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,nnz,k", [((3000, 800), 30000, 10), ((700, 2500), 20000, 7)])
@pytest.mark.parametrize("budget", ["100K", "2M"])
def test_svds_power_law_matches_scipy(tmp_path, budget, dtype, shape, nnz, k):
    """Under 100K the matrix (166-384 KB as flash CSR) stays on flash and every product is a
    flash kernel; under 2M it fits beside the solver's state, so it is read once and applied
    in memory."""
    rt = flash.Runtime(memory_budget=budget, threads=2, dir=tmp_path)
    a = power_law(*shape, nnz, seed=k, dtype=dtype)
    u2, s2, vt2 = sla.svds(a.astype(np.float64), k=k, random_state=0)
    A = flash.Csr.from_scipy(a, rt)
    fits = a.nnz * (a.dtype.itemsize + 4) + (a.shape[0] + 1) * 8 <= rt.memory_budget_bytes
    assert fits == (budget == "2M")
    stats = {}
    u, s, vt = flash.svds(A, k=k, runtime=rt, stats=stats, random_state=0)
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    check_triplets(a, u, s, vt, k, s2, rtol)
    assert not stats["dense"]
    assert stats["on_flash"] == (not fits) and stats["loaded"] == fits
    assert 0 < stats["peak_resident_bytes"] <= rt.memory_budget_bytes
    if fits:  # one read of A
        assert stats["bytes_read"] == a.nnz * (a.dtype.itemsize + 4) + (a.shape[0] + 1) * 8


def test_svds_which_sm_and_tol(rt):
    rng = np.random.default_rng(5)
    q1, _ = np.linalg.qr(rng.standard_normal((300, 120)))
    q2, _ = np.linalg.qr(rng.standard_normal((120, 120)))
    sv = np.linspace(1.0, 3.0, 120)
    a = (q1 * sv) @ q2.T
    u, s, vt = flash.svds(a, k=3, which="SM", runtime=rt, tol=1e-12)
    np.testing.assert_allclose(s, sv[:3], rtol=1e-8)
    # A loose tolerance is still accurate to about that tolerance, with fewer operator calls.
    b = power_law(2000, 600, 20000, seed=9)
    loose, tight = {}, {}
    s_loose = flash.svds(b, k=5, tol=1e-4, return_singular_vectors=False, stats=loose, runtime=rt)
    s_tight = flash.svds(b, k=5, tol=0, return_singular_vectors=False, stats=tight, runtime=rt)
    np.testing.assert_allclose(s_loose, s_tight, rtol=1e-4)
    assert loose["operator_columns"] <= tight["operator_columns"]


def test_svds_return_singular_vectors_options_and_input_kinds(rt):
    a = random_sparse(80, 50, 0.2, seed=3)
    want = top_singular_values(a, 4)
    s = flash.svds(a, k=4, return_singular_vectors=False, runtime=rt)
    assert s.shape == (4,)
    np.testing.assert_allclose(s, want, rtol=1e-9)
    u, s, vt = flash.svds(a, k=4, return_singular_vectors="u", runtime=rt)
    assert vt is None and u.shape == (80, 4)
    u, s, vt = flash.svds(a, k=4, return_singular_vectors="vh", runtime=rt)
    assert u is None and vt.shape == (4, 50)
    for inp in (a.tocsc(), a.tocoo(), a.toarray(),
                flash.Matrix.from_numpy(a.toarray(), rt), sla.aslinearoperator(a)):
        u, s, vt = flash.svds(inp, k=4, runtime=rt)
        check_triplets(a, u, s, vt, 4, want, 1e-9)
    ints = sp.csr_matrix(np.arange(12).reshape(4, 3))
    s = flash.svds(ints, k=2, return_singular_vectors=False)
    assert s.dtype == np.float64
    np.testing.assert_allclose(s, top_singular_values(ints, 2), rtol=1e-12)
    v0 = np.ones(50)
    u, s, vt = flash.svds(a, k=4, v0=v0, options={"block_size": 2}, ncv=24, runtime=rt, solver="propack")
    check_triplets(a, u, s, vt, 4, want, 1e-9)


def test_svds_of_a_zero_and_rank_deficient_matrix(rt):
    z = sp.csr_matrix((40, 30))
    u, s, vt = flash.svds(z, k=3, runtime=rt)
    np.testing.assert_array_equal(s, 0.0)
    np.testing.assert_allclose(u.T @ u, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(vt @ vt.T, np.eye(3), atol=1e-12)
    rng = np.random.default_rng(2)
    r2 = rng.standard_normal((200, 2)) @ rng.standard_normal((2, 150))
    u, s, vt = flash.svds(r2, k=4, runtime=rt)
    want = top_singular_values(r2, 4)
    np.testing.assert_allclose(s, want, atol=1e-9 * want.max())
    np.testing.assert_allclose(vt @ vt.T, np.eye(4), atol=1e-9)


@pytest.mark.parametrize("shape", [(1, 7), (7, 1), (1, 1)])
def test_svds_one_row_or_column_has_no_valid_k(rt, shape):
    a = np.ones(shape)
    with pytest.raises(ValueError, match="`k` must be an integer satisfying `0 < k < min"):
        flash.svds(a, k=1, runtime=rt)
    with pytest.raises(ValueError):  # scipy refuses it too
        sla.svds(a, k=1)


def test_svds_bad_arguments(rt):
    a = random_sparse(20, 10, 0.3, seed=1)
    for k in (0, -1, 10, 11, 2.5, "2"):  # as scipy: k=True is 1
        with pytest.raises(ValueError, match="`k` must be an integer"):
            flash.svds(a, k=k, runtime=rt)
    bad = [dict(which="LA"), dict(return_singular_vectors="x"), dict(tol=-1), dict(solver="lapack"),
           dict(v0=np.ones(20)), dict(options={"bogus": 1}), dict(maxiter=0), dict(ncv=2)]
    for kwargs in bad:
        with pytest.raises(ValueError):
            flash.svds(a, k=3, runtime=rt, **kwargs)
    with pytest.raises(InvalidArgumentError, match="complex"):  # a complex start for a real problem
        flash.svds(a, k=2, v0=np.ones(10, dtype=np.complex128), runtime=rt)
    with pytest.raises(ValueError, match="2-D"):
        flash.svds(np.ones((3, 3, 3)), k=1, runtime=rt)


def test_svds_flash_matrix_far_larger_than_the_budget(tmp_path):
    rt = flash.Runtime(memory_budget="1M", threads=2, dir=tmp_path)
    a = power_law(60000, 3000, 400000, seed=11)  # ~3.5 MB as flash CSR (duplicates merged), 3x the budget
    assert a.nnz * 12 + (a.shape[0] + 1) * 8 > 3 * rt.memory_budget_bytes
    s_scipy = np.sort(sla.svds(a, k=5, return_singular_vectors=False, random_state=0))
    # An in-memory scipy matrix larger than the budget is spilled to flash.
    stats = {}
    u, s, vt = flash.svds(a, k=5, runtime=rt, stats=stats)
    assert stats["on_flash"]
    assert 0 < stats["peak_resident_bytes"] <= rt.memory_budget_bytes
    np.testing.assert_allclose(s, s_scipy, rtol=1e-9)
    # And a flash matrix (here a Matrix Market file on disk) stays there.
    path = tmp_path / "a.mtx"
    import scipy.io

    scipy.io.mmwrite(str(path), a)
    A = flash.load(path, rt)
    stats = {}
    u, s, vt = flash.svds(A, k=5, runtime=rt, stats=stats)
    assert stats["on_flash"] and stats["peak_resident_bytes"] <= rt.memory_budget_bytes
    np.testing.assert_allclose(s, s_scipy, rtol=1e-9)
    assert np.linalg.norm(a @ vt.T - u * s) <= 1e-9 * s.max()
    # A small in-memory matrix is not spilled.
    stats = {}
    flash.svds(random_sparse(50, 40, 0.1, seed=0), k=2, runtime=rt, stats=stats)
    assert not stats["on_flash"]


def test_svds_dense_numpy_spilled_to_flash(tmp_path):
    rt = flash.Runtime(memory_budget="1M", threads=2, dir=tmp_path)
    a = np.random.default_rng(4).standard_normal((600, 400))  # 1.9 MB > 1 MB
    stats = {}
    u, s, vt = flash.svds(a, k=4, runtime=rt, stats=stats)
    assert stats["on_flash"]
    check_triplets(a, u, s, vt, 4, top_singular_values(a, 4), 1e-9)


# ---------------------------------------------------------------------------------------
# PCA


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pca_matches_numpy_on_the_centered_matrix(rt, dtype):
    x = power_law(1500, 300, 15000, seed=2, dtype=dtype)
    k = 5
    dense = x.toarray().astype(np.float64)
    mean = dense.mean(axis=0)
    _, sv, vt = np.linalg.svd(dense - mean, full_matrices=False)
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    for inp in (x, flash.Csr.from_scipy(x, rt)):
        p = flash.pca(inp, k, runtime=rt)
        np.testing.assert_allclose(p.mean, mean, rtol=rtol, atol=rtol * np.abs(mean).max())
        np.testing.assert_allclose(p.singular_values, sv[:k], rtol=rtol)
        np.testing.assert_allclose(p.explained_variance, sv[:k] ** 2 / (x.shape[0] - 1), rtol=3 * rtol)
        # Same components up to sign (fixed: largest entry positive).
        np.testing.assert_allclose(np.abs(p.components @ vt[:k].T), np.eye(k), atol=1e-3 if dtype == np.float32 else 1e-7)
        assert np.all(p.components[np.arange(k), np.argmax(np.abs(p.components), axis=1)] > 0)
        np.testing.assert_allclose(p.scores, p.transform(dense), atol=rtol * sv[0] * 10)
    with pytest.raises(ValueError, match="k must be"):
        flash.pca(x, 300, runtime=rt)


def test_bench_svd_end_to_end(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "svd.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "svd", "--data", "random", "--rows", "2000",
                        "--cols", "500", "--nnz", "20000", "--k", "5", "--repeat", "1", "--budget-fractions", "1,0.25",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [(r["impl"], r["variant"]) for r in recs] == [
        ("scipy", "memory"), ("scalefree", "memory"), ("scalefree", "flash-1"), ("scalefree", "flash-0.25")]
    for r in recs:
        assert r["bench"] == "svd" and r["median_s"] > 0 and r["k"] == 5
        assert r["max_rel_err"] < 1e-3
        if "budget_bytes" in r:
            assert r["peak_resident_bytes"] <= r["budget_bytes"]
        if sys.platform == "linux":  # the process's peak RSS around the timed calls
            assert r["peak_rss_bytes"] >= r["rss_before_bytes"] > 0
    assert "vs scipy" in p.stdout and "peak RSS" in p.stdout


def test_bench_svd_distinct_budget_sizes_and_no_warmup(tmp_path):
    import json
    import subprocess
    import sys

    from scalefree_bench.svd import _power_law

    assert _power_law(2000, 500, 20000, distinct=True).nnz == 20000
    out = tmp_path / "svd.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "svd", "--data", "random", "--rows", "2000",
                        "--cols", "500", "--nnz", "20000", "--distinct", "--k", "5", "--repeat", "1", "--warmup", "0",
                        "--budget-fractions", "0.25", "--budget", "1M,64K", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [r["variant"] for r in recs] == ["memory", "memory", "flash-0.25", "flash-1M", "flash-64K"]
    assert recs[0]["data"] == "random 2000x500 (20000 distinct)"
    # 0.25 of this small matrix is below the 1 MiB floor of a fraction, so that row holds A too.
    assert [r.get("operand") for r in recs[2:]] == ["loaded", "loaded", "flash"]
    assert recs[3]["budget_bytes"] == 1 << 20 and recs[4]["budget_bytes"] == 64 << 10
    assert all(r["max_rel_err"] < 1e-3 for r in recs)


def test_cli_flash_svd(tmp_path):
    import subprocess
    import sys

    a = power_law(500, 120, 4000, seed=3)
    path = tmp_path / "a.npz"
    sp.save_npz(path, a)
    out = tmp_path / "usv.npz"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", "svd", str(path), "-k", "4", "--memory", "1M",
                        "--dir", str(tmp_path), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    want = top_singular_values(a, 4)[::-1]
    np.testing.assert_allclose([float(v) for v in p.stdout.split()], want, rtol=1e-9)
    assert "operator columns" in p.stderr and "peak" in p.stderr
    r = np.load(out)
    np.testing.assert_allclose(r["s"], want, rtol=1e-9)
    assert np.linalg.norm(a @ r["vt"].T - r["u"] * r["s"]) <= 1e-9 * want[0]
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", "svd", str(path), "-k", "120"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "A has shape (500, 120), got k=120" in p.stderr
    assert "scalefree flash svd: error: `k` must be an integer satisfying `0 < k < min(A.shape)`" in p.stderr
    # -o with a name without a suffix is written as named; --json has the values and times.
    out2, js = tmp_path / "usv", tmp_path / "svd.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", "svd", str(path), "-k", "3", "-q",
                        "-o", str(out2), "--json", str(js)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert out2.exists() and not list(tmp_path.glob(".*tmp*"))
    np.testing.assert_allclose(np.load(out2)["s"], want[:3], rtol=1e-9)
    import json

    doc = json.loads(js.read_text())
    np.testing.assert_allclose(doc["singular_values"], want[:3], rtol=1e-9)
    assert doc["seconds"] > 0 and doc["k"] == 3 and "bytes_read" in doc


def test_svds_block_size_default_on_flash_and_in_memory(tmp_path, monkeypatch):
    """Blocks of min(k, 32) columns when A is applied from flash (a pass costs the same for
    more columns), min(k, 16) in memory; the values agree with scipy either way."""
    a = power_law(3000, 800, 30000, seed=3)
    want = np.sort(sla.svds(a, k=20, return_singular_vectors=False, random_state=0))
    for budget, on_flash, b in (("100K", True, 20), ("2M", False, 16)):
        rt = flash.Runtime(memory_budget=budget, threads=2, dir=tmp_path)
        stats = {}
        s = flash.svds(flash.Csr.from_scipy(a, rt), k=20, return_singular_vectors=False, runtime=rt, stats=stats)
        assert stats["on_flash"] == on_flash and stats["block_size"] == b
        np.testing.assert_allclose(s, want, rtol=1e-9)
    stats = {}
    flash.svds(flash.Csr.from_scipy(a, rt), k=20, block_size=8, return_singular_vectors=False, runtime=rt, stats=stats)
    assert stats["block_size"] == 8
    # A large CSR matrix on flash (here: the limit lowered below this one's entries) gets the
    # in-memory default, 16: its passes cost their arithmetic.
    monkeypatch.setattr(flash_svd, "_FLASH_BLOCK_NNZ_LIMIT", a.nnz)
    rt = flash.Runtime(memory_budget="100K", threads=2, dir=tmp_path)
    stats = {}
    s = flash.svds(flash.Csr.from_scipy(a, rt), k=20, return_singular_vectors=False, runtime=rt, stats=stats)
    assert stats["on_flash"] and stats["block_size"] == 16
    np.testing.assert_allclose(s, want, rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(60, 45), (45, 60), (7, 5)])
@pytest.mark.parametrize("which", ["LM", "SM"])
def test_svds_complex_against_numpy(rt, dtype, shape, which):
    """Complex matrices, dense, sparse and as LinearOperators: scipy's output dtypes, and the
    triplets of numpy's full SVD (the Krylov path at 45+ columns, the dense one at 5)."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    k = 3
    full = np.linalg.svd(a.astype(np.complex128), compute_uv=False)
    want = np.sort(full)[-k:] if which == "LM" else np.sort(full)[:k]
    tol = 1e-4 if dtype == np.complex64 else 1e-10
    for inp in (a, sp.csr_matrix(a), sla.aslinearoperator(a)):
        u, s, vh = flash.svds(inp, k=k, which=which, rng=0, runtime=rt)
        assert u.dtype == dtype and vh.dtype == dtype and s.dtype == np.finfo(dtype).dtype
        np.testing.assert_allclose(s, want, rtol=tol, atol=tol * full.max())
        a64, u64, vh64 = a.astype(np.complex128), u.astype(np.complex128), vh.astype(np.complex128)
        np.testing.assert_allclose(u64.conj().T @ u64, np.eye(k), atol=10 * tol)
        np.testing.assert_allclose(vh64 @ vh64.conj().T, np.eye(k), atol=10 * tol)
        assert np.linalg.norm(a64 @ vh64.conj().T - u64 * s) <= 10 * tol * full.max()


def test_svds_no_convergence_is_scipys_exception(rt):
    """Too few restarts raise what scipy's svds raises (ArpackNoConvergence, and PROPACK's
    LinAlgError), and still our NoConvergenceError."""
    a = np.diag(np.arange(60.0))
    with pytest.raises(sla.ArpackNoConvergence, match="ARPACK error -1: No convergence") as e:
        flash.svds(a, k=1, ncv=3, maxiter=1, rng=0, runtime=rt)
    assert isinstance(e.value, NoConvergenceError) and isinstance(e.value, np.linalg.LinAlgError)


def test_svds_rng_and_random_state(rt):
    a = np.random.default_rng(0).random((100, 100))
    by_rng = flash.svds(a, k=2, rng=7, runtime=rt)
    by_state = flash.svds(a, k=2, random_state=7, runtime=rt)
    for x, y in zip(by_rng, by_state):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(TypeError, match="not both"):
        flash.svds(a, k=2, rng=1, random_state=1, runtime=rt)
    with pytest.raises(ValueError, match="neither a NumPy Generator"):
        flash.svds(a, k=2, rng="seed", runtime=rt)


def test_pca_matches_sklearn(rt):
    """flash.pca gives scikit-learn's PCA: components (and their signs), variances, mean, transform."""
    decomposition = pytest.importorskip("sklearn.decomposition")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 40)) @ rng.standard_normal((40, 40))
    ours = flash.pca(x, 5, runtime=rt)
    theirs = decomposition.PCA(5, svd_solver="full").fit(x)
    np.testing.assert_allclose(ours.components, theirs.components_, atol=1e-10)
    np.testing.assert_allclose(ours.explained_variance, theirs.explained_variance_, rtol=1e-12)
    np.testing.assert_allclose(ours.singular_values, theirs.singular_values_, rtol=1e-12)
    np.testing.assert_allclose(ours.mean, theirs.mean_, atol=1e-12)
    np.testing.assert_allclose(ours.transform(x), theirs.transform(x), atol=1e-9)
