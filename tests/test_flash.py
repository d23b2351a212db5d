"""scalefree.flash from Python: out-of-core results equal numpy's / scipy's, within budget."""

import numpy as np
import pytest

from scalefree import flash
import scalefree


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return flash.Runtime(memory_budget="1M", threads=2, dir=tmp_path_factory.mktemp("flash"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 3), (300, 170, 250), (64, 257, 129)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_matches_numpy(rt, dtype, m, n, k, trans_a, trans_b):
    rng = np.random.default_rng([m, n, k])
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    if trans_b:
        b = np.asfortranarray(b)  # layouts mix freely
    stats = {}
    C = flash.gemm(a, b, c0, alpha=0.5, beta=2.0, trans_a=trans_a, trans_b=trans_b, runtime=rt, stats=stats)
    want = 0.5 * (a.T if trans_a else a) @ (b.T if trans_b else b) + 2.0 * c0
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(C.to_numpy(), want, rtol=tol, atol=tol * k)
    assert stats["peak_resident_bytes"] <= stats["budget_bytes"] == 1 << 20


def test_gemm_with_data_far_larger_than_the_budget(rt):
    # 3 x 512x512 float64 = 6 MiB of data through a 1 MiB budget.
    rng = np.random.default_rng(1)
    a, b = rng.random((512, 512)), rng.random((512, 512))
    stats = {}
    C = flash.gemm(flash.Matrix.from_numpy(a, rt), flash.Matrix.from_numpy(b, rt), runtime=rt, stats=stats)
    np.testing.assert_allclose(C.to_numpy(), a @ b, rtol=1e-10)
    assert stats["peak_resident_bytes"] <= 1 << 20
    assert stats["bytes_read"] >= a.nbytes + b.nbytes


@pytest.mark.parametrize("transpose", [False, True])
def test_csrgemv_matches_scipy(rt, transpose):
    sp = pytest.importorskip("scipy.sparse")
    s = sp.random(1000, 700, density=0.01, format="csr", random_state=3, dtype=np.float64)
    A = flash.Csr.from_scipy(s, rt)
    assert A.shape == (1000, 700) and A.nnz == s.nnz
    x = np.random.default_rng(0).random(1000 if transpose else 700)
    y = flash.csrgemv(A, x, transpose=transpose, runtime=rt)
    np.testing.assert_allclose(y, (s.T if transpose else s) @ x, rtol=1e-12)


def test_bad_inputs(rt):
    with pytest.raises(scalefree.InvalidArgumentError, match="2-D"):
        flash.Matrix.from_numpy(np.ones(5), rt)
    with pytest.raises(scalefree.InvalidArgumentError, match="float32 or float64"):
        flash.Matrix.from_numpy(np.ones((2, 2), np.int64), rt)
    with pytest.raises(ValueError):
        flash.gemm(np.ones((3, 4)), np.ones((5, 6)), runtime=rt)
    with pytest.raises(ValueError):
        flash.gemm(np.ones((3, 4), np.float32), np.ones((4, 6)), runtime=rt)
    with pytest.raises(scalefree.InvalidArgumentError):
        flash.Runtime(memory_budget="lots")
    with pytest.raises(OSError):
        flash.Runtime(dir="/no/such/dir")
