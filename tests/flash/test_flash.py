"""scalefree.flash from Python: out-of-core results equal numpy's / scipy's, within budget."""

import numpy as np
import pytest

from scalefree import flash
import scalefree
import scalefree.errors


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return flash.Runtime(memory_budget="1M", threads=2, dir=tmp_path_factory.mktemp("flash"))


@pytest.fixture(scope="module")
def rt_faer(tmp_path_factory):
    return flash.Runtime(memory_budget="1M", threads=2, dir=tmp_path_factory.mktemp("flash"), blas="faer")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 3), (300, 170, 250), (64, 257, 129)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("runtime", ["rt", "rt_faer"])  # numpy's BLAS (where found) and faer blocks
def test_gemm_matches_numpy(request, runtime, dtype, m, n, k, trans_a, trans_b):
    rt = request.getfixturevalue(runtime)
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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,cols,n", [(0, 5, 3), (1, 1, 1), (301, 177, 9), (1000, 700, 33)])
@pytest.mark.parametrize("trans_b", [False, True])
def test_csrmm_matches_scipy(rt, dtype, rows, cols, n, trans_b):
    sp = pytest.importorskip("scipy.sparse")
    s = sp.random(rows, cols, density=0.02, format="csr", random_state=rows + n, dtype=np.float64).astype(dtype)
    A = flash.Csr.from_scipy(s, rt)
    rng = np.random.default_rng(n)
    b = rng.standard_normal((n, cols) if trans_b else (cols, n)).astype(dtype)
    c0 = rng.standard_normal((rows, n)).astype(dtype)
    want = 0.5 * (s @ (b.T if trans_b else b)) + 2.0 * c0
    tol = 1e-4 if dtype == np.float32 else 1e-12
    # numpy in, numpy out (C updated in place, Fortran order too)
    c = np.asfortranarray(c0.copy())
    stats = {}
    got = flash.csrmm(A, b, c, alpha=0.5, beta=2.0, trans_b=trans_b, runtime=rt, stats=stats)
    assert got is c
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    assert stats["peak_resident_bytes"] <= stats["budget_bytes"]
    # flash in, flash out
    C = flash.csrmm(A, flash.Matrix.from_numpy(b, rt), flash.Matrix.from_numpy(c0, rt), alpha=0.5, beta=2.0,
                    trans_b=trans_b, runtime=rt)
    np.testing.assert_allclose(C.to_numpy(), want, rtol=tol, atol=tol)
    # no C: the product alone, in memory
    np.testing.assert_allclose(flash.csrmm(A, b, trans_b=trans_b, runtime=rt), s @ (b.T if trans_b else b),
                               rtol=tol, atol=tol)


def test_csrmm_bad_inputs(rt):
    sp = pytest.importorskip("scipy.sparse")
    A = flash.Csr.from_scipy(sp.random(10, 8, density=0.3, format="csr", random_state=0), rt)
    with pytest.raises(ValueError, match="shape"):
        flash.csrmm(A, np.ones((7, 3)), runtime=rt)
    with pytest.raises(scalefree.InvalidArgumentError, match="C must be"):
        flash.csrmm(A, np.ones((8, 3)), np.ones((10, 3), np.float32), runtime=rt)
    with pytest.raises(scalefree.InvalidArgumentError, match="flash.Csr"):
        flash.csrmm(np.ones((10, 8)), np.ones((8, 3)), runtime=rt)


def test_load_npy_and_npz(rt, tmp_path):
    sp = pytest.importorskip("scipy.sparse")
    a = np.random.default_rng(2).standard_normal((37, 21)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    M = flash.load(tmp_path / "a.npy", rt)
    assert isinstance(M, flash.Matrix) and M.dtype == np.float32
    np.testing.assert_array_equal(M.to_numpy(), a)
    np.save(tmp_path / "f.npy", np.asfortranarray(a.astype(np.float64)))
    np.testing.assert_array_equal(flash.load(tmp_path / "f.npy", rt).to_numpy(), a)
    np.save(tmp_path / "i.npy", np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(flash.load(tmp_path / "i.npy", rt).to_numpy(), np.arange(6.0).reshape(2, 3))
    s = sp.random(50, 40, density=0.1, format="csc", random_state=1)
    sp.save_npz(tmp_path / "s.npz", s)
    S = flash.load(tmp_path / "s.npz", rt)
    assert isinstance(S, flash.Csr) and S.shape == (50, 40) and S.nnz == s.nnz
    np.testing.assert_array_equal(S.to_scipy().toarray(), s.toarray())
    np.savez(tmp_path / "plain.npz", x=np.ones(3))
    with pytest.raises(scalefree.errors.FlashIOError, match="plain.npz"):
        flash.load(tmp_path / "plain.npz", rt)
    with pytest.raises(scalefree.InvalidArgumentError, match="unknown matrix file"):
        flash.load(tmp_path / "x.csv", rt)


def test_load_matrix_market_matches_scipy(rt, tmp_path):
    sp = pytest.importorskip("scipy.sparse")
    sio = pytest.importorskip("scipy.io")
    s = sp.random(60, 45, density=0.05, format="coo", random_state=4)
    sio.mmwrite(tmp_path / "g.mtx", s)
    sym = sp.random(30, 30, density=0.1, random_state=5)
    sym = (sym + sym.T).tocoo()
    sio.mmwrite(tmp_path / "s.mtx", sym, symmetry="symmetric")
    for name, want in [("g.mtx", s), ("s.mtx", sym)]:
        for dtype in (np.float32, np.float64):
            S = flash.load(tmp_path / name, rt, dtype=dtype)
            assert S.dtype == dtype
            np.testing.assert_allclose(S.to_scipy().toarray(), want.toarray(), rtol=1e-6)
    (tmp_path / "bad.mtx").write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n1 4 2.0\n")
    with pytest.raises(scalefree.errors.FlashIOError, match=r"bad\.mtx.*line 4: column 4 is outside 1..=3"):
        flash.load(tmp_path / "bad.mtx", rt)


def test_load_docword(rt, tmp_path):
    import gzip
    import os
    (tmp_path / "docword.t.txt").write_text("3\n4\n4\n1 2 3\n1 4 1\n3 1 2\n3 2 5\n")
    with gzip.open(tmp_path / "docword.t.txt.gz", "wt") as f:
        f.write("3\n4\n4\n1 2 3\n1 4 1\n3 1 2\n3 2 5\n")
    want = np.array([[0, 3, 0, 1], [0, 0, 0, 0], [2, 5, 0, 0]], dtype=float)
    for name in ("docword.t.txt", "docword.t.txt.gz"):
        np.testing.assert_array_equal(flash.load(tmp_path / name, rt).to_scipy().toarray(), want)
    (tmp_path / "docword.bad.txt").write_text("3\n4\n1\n1 2 x\n")
    with pytest.raises(scalefree.errors.FlashIOError, match=r"docword\.bad\.txt.*line 4: cannot read the count"):
        flash.load(tmp_path / "docword.bad.txt", rt)
    kos = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "kos", "docword.kos.txt.gz")
    if os.path.exists(kos):
        K = flash.load(kos, rt)
        assert K.shape == (3430, 6906) and K.nnz == 353160
        x = np.ones(6906)
        assert flash.csrgemv(K, x, runtime=rt).sum() == pytest.approx(467714)


DOCWORD_RSS_SCRIPT = r"""
import sys
from scalefree import flash

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

path, d = sys.argv[1], sys.argv[2]
rt = flash.Runtime(memory_budget="4M", threads=2, dir=d)
flash.load(path, rt)  # warm-up: thread pools, the native module's buffers
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
base = status("VmRSS")
m = flash.load(path, rt)
print(status("VmHWM") - base, m.nnz)
"""


def test_load_docword_streams_with_bounded_memory(tmp_path):
    """A docword file of 2M entries (in memory as triplets and CSR: >= 50 MB) loads with the
    process's resident memory growing by a few MiB: one chunk and the row starts at a time.
    The result equals scipy's COO -> CSR of the same entries (duplicates summed)."""
    import os
    import subprocess
    import sys

    import scipy.sparse as sp

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs")
    rng = np.random.default_rng(0)
    docs, words, per_doc = 20_000, 5000, 100
    r = np.repeat(np.arange(docs), per_doc)
    c = rng.integers(0, words, r.size)  # unsorted within a document, some repeated
    v = rng.integers(1, 9, r.size)
    path = tmp_path / "docword.big.txt"
    with open(path, "w") as f:
        f.write(f"{docs + 1}\n{words}\n{r.size}\n")
        np.savetxt(f, np.stack([r + 1, c + 1, v], axis=1), fmt="%d")
    p = subprocess.run([sys.executable, "-c", DOCWORD_RSS_SCRIPT, str(path), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    grown, nnz = map(int, p.stdout.split())
    want = sp.coo_matrix((v.astype(float), (r, c)), shape=(docs + 1, words)).tocsr()
    want.sum_duplicates()
    assert nnz == want.nnz
    assert grown <= 16 << 20, f"RSS grew by {grown >> 20} MiB loading {r.size} entries"
    got = flash.load(path, flash.Runtime(memory_budget="4M", threads=2, dir=tmp_path)).to_scipy()
    assert got.shape == want.shape and (got != want).nnz == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 2, 1001, 100_003])
def test_sort_matches_numpy(rt, dtype, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    if n > 10:
        x[::5] = 0.25  # many ties
        x[3::11] = np.nan
        x[4::13] = -np.inf
    stats = {}
    got = flash.sort(x, runtime=rt, stats=stats)
    np.testing.assert_array_equal(got, np.sort(x))
    if n > 1:
        assert 0 < stats["peak_resident_bytes"] <= stats["budget_bytes"]


def test_sort_npy_file_in_place(rt, tmp_path):
    x = np.random.default_rng(7).random(300_001)  # 2.4 MB through a 1 MiB budget
    np.save(tmp_path / "x.npy", x)
    stats = {}
    flash.sort(tmp_path / "x.npy", runtime=rt, stats=stats)
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), np.sort(x))
    assert stats["peak_resident_bytes"] <= 1 << 20
    np.save(tmp_path / "m.npy", np.ones((2, 2)))
    with pytest.raises(scalefree.InvalidArgumentError, match="1-D"):
        flash.sort(tmp_path / "m.npy", runtime=rt)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,cols,density", [(0, 3, 0.1), (1, 1, 1.0), (3, 5, 0.0), (301, 177, 0.05), (3000, 2000, 0.01)])
def test_csrcsc_matches_scipy(rt, dtype, rows, cols, density):
    sp = pytest.importorskip("scipy.sparse")
    s = sp.random(rows, cols, density=density, format="csr", random_state=rows, dtype=np.float64).astype(dtype)
    stats = {}
    T = flash.csrcsc(flash.Csr.from_scipy(s, rt), runtime=rt, stats=stats)
    assert T.shape == (cols, rows) and T.nnz == s.nnz and T.dtype == dtype
    got, want = T.to_scipy(), s.T.tocsr()
    want.sort_indices()
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    if s.nnz:
        assert stats["peak_resident_bytes"] <= stats["budget_bytes"]


@pytest.mark.parametrize("budget", ["1M", "64M"])
def test_csrcsc_in_memory_and_out_of_core_paths_agree(tmp_path, budget):
    """64M holds A and its transpose: one read, a parallel counting sort (two pieces at
    this size), one write, no tasks; 1M goes through the out-of-core DAG runs."""
    sp = pytest.importorskip("scipy.sparse")
    rt = flash.Runtime(memory_budget=budget, threads=2, dir=tmp_path)
    s = sp.random(20_001, 3_001, density=0.004, format="csr", random_state=5, dtype=np.float64)
    stats = {}
    T = flash.csrcsc(flash.Csr.from_scipy(s, rt), runtime=rt, stats=stats)
    got, want = T.to_scipy(), s.T.tocsr()
    want.sort_indices()
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    assert stats["peak_resident_bytes"] <= stats["budget_bytes"]
    assert (stats["tasks"] == 0) == (budget == "64M")
    assert stats["bytes_read"] >= s.nnz * 12


def _lloyd(x, centers, iterations):
    for _ in range(iterations):
        d = ((x[:, None, :] - centers[None, :, :]) ** 2).sum(-1)
        labels = d.argmin(1)
        centers = np.array([x[labels == c].mean(0) if (labels == c).any() else centers[c] for c in range(len(centers))])
    return centers, labels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (50, 2, 50), (2000, 9, 6)])
def test_kmeans_matches_numpy_lloyd(rt, dtype, n, d, k):
    rng = np.random.default_rng(n)
    means = rng.standard_normal((k, d)) * 20
    x = (means[np.arange(n) % k] + rng.standard_normal((n, d))).astype(dtype)
    stats = {}
    centers, labels, inertia, iterations = flash.kmeans(x, k, max_iterations=4, tolerance=-1, seed=1, runtime=rt, stats=stats)
    assert iterations == 4 and centers.shape == (k, d) and centers.dtype == dtype
    # The start is k distinct rows picked by the seed; one iteration from it gives c1, and
    # numpy's Lloyd from c1 must then reproduce flash's next three iterations.
    c1, _, _, _ = flash.kmeans(x, k, max_iterations=1, tolerance=-1, seed=1, runtime=rt)
    x64 = x.astype(np.float64)
    want_c, want_l = _lloyd(x64, c1.astype(np.float64), 3)
    np.testing.assert_array_equal(labels, want_l)
    np.testing.assert_allclose(centers, want_c, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-4)
    assert stats["peak_resident_bytes"] <= stats["budget_bytes"]
    # inertia: of the last assignment (against the centers after 2 more iterations from c1)
    before = _lloyd(x64, c1.astype(np.float64), 2)[0]
    want_inertia = ((x64[:, None, :] - before[None]) ** 2).sum(-1).min(1).sum()
    eps = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(inertia, want_inertia, rtol=eps * 10, atol=eps * (x64 ** 2).sum())


def test_kmeans_recovers_separated_clusters_and_checks_k(rt):
    rng = np.random.default_rng(0)
    means = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    x = means[np.arange(3000) % 3] + rng.standard_normal((3000, 2))
    X = flash.Matrix.from_numpy(x, rt)
    best = min((flash.kmeans(X, 3, seed=s, runtime=rt) for s in range(5)), key=lambda r: r[2])
    np.testing.assert_allclose(np.sort(best[0][:, 0] + 7 * best[0][:, 1]), np.sort(means[:, 0] + 7 * means[:, 1]), atol=0.5)
    with pytest.raises(scalefree.InvalidArgumentError, match="k = 0"):
        flash.kmeans(X, 0, runtime=rt)


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs mounted under tmp_path (root only; skipped where mounting is not allowed)."""
    import shutil
    import subprocess

    mnt = tmp_path / "full"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_is_a_named_error_with_the_directory(full_disk):
    rt = flash.Runtime(memory_budget="64M", dir=full_disk)
    with pytest.raises(scalefree.errors.FlashIOError, match=f"disk full while writing {full_disk}"):
        flash.Matrix.from_numpy(np.ones((1024, 1024), np.float32), rt)
    with pytest.raises(scalefree.errors.FlashIOError, match=f"disk full while writing {full_disk}"):
        flash.gemm(np.ones((512, 512), np.float32), np.ones((512, 2048), np.float32), runtime=rt)
    # Nothing is left behind (scratch files are unnamed), and a small job still runs there.
    assert list(full_disk.iterdir()) == []
    small = flash.Matrix.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), rt)
    assert (small.to_numpy() == np.arange(12).reshape(3, 4)).all()


def test_unreadable_files_are_named_errors(tmp_path):
    rt = flash.Runtime(memory_budget="64M")
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY garbage")
    short = tmp_path / "short.npy"
    np.save(short, np.ones((100, 100), np.float32))
    with open(short, "r+b") as f:
        f.truncate(1000)
    for path in (tmp_path / "missing.npy", bad, short, tmp_path / "missing.mtx"):
        with pytest.raises(scalefree.errors.FlashIOError, match=path.name):
            flash.load(path, rt)
