"""The out-of-core state of svds and topics (issue 38): dense state on flash gives the
in-memory results (to the solver's tolerance), and the whole process stays within the
memory budget plus a fixed overhead."""

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from scalefree import flash
from scalefree.flash.state import DenseState


@pytest.mark.parametrize("on_flash", [False, True])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("rows,cols", [(0, 3), (1, 1), (7, 3), (1000, 13)])
def test_dense_state_reads_back_what_was_written(tmp_path, on_flash, order, rows, cols):
    rt = flash.Runtime(memory_budget="1M", dir=tmp_path)
    ref = np.random.default_rng(rows).standard_normal((rows, cols))
    st = DenseState(rows, cols, np.float64, rt, on_flash=on_flash, order=order)
    for lo, hi in st.row_ranges(256):
        st.write(lo, 0, ref[lo:hi])
    if cols > 2 and rows:
        st.write(rows // 2, 1, ref[rows // 2:, 1:3] * 2)  # a sub-block in place
        ref[rows // 2:, 1:3] *= 2
    got = np.vstack([st.read(lo, hi) for lo, hi in st.row_ranges(100)] or [np.zeros((0, cols))])
    assert np.array_equal(got, ref)
    assert np.array_equal(st.to_numpy(), ref)
    if rows > 2 and cols > 2:
        assert np.array_equal(st.read(1, rows - 1, 1, cols - 1), ref[1:rows - 1, 1:cols - 1])


def _matrix(rows=1500, cols=250, seed=0):
    rng = np.random.default_rng(seed)
    a = sp.random(rows, cols, density=0.03, random_state=rng, format="csr")
    a.data = rng.standard_normal(a.nnz)
    return a


def _same_subspace(u1, u2, tol):
    """Columns equal up to sign."""
    dots = np.abs(np.sum(u1 * u2, axis=0))
    assert np.all(np.abs(dots - 1) < tol), dots


@pytest.mark.parametrize("shape", [(1500, 250), (250, 1500)])
def test_svds_with_its_state_on_flash_matches_in_memory(tmp_path, shape):
    """A budget far below the Krylov basis puts the basis (and u) on flash: same singular
    values and vectors as the in-memory solve, to the tolerance."""
    a = _matrix(*shape)
    big = flash.Runtime(memory_budget="1G", dir=tmp_path)
    u0, s0, vt0 = flash.svds(a, k=8, tol=1e-6, runtime=big, rng=0)
    tiny = flash.Runtime(memory_budget="128K", dir=tmp_path)  # below A's 147 KB: A streamed too
    st: dict = {}
    u1, s1, vt1 = flash.svds(a, k=8, tol=1e-6, runtime=tiny, rng=0, stats=st)
    assert st["basis_on_flash"] and st["vectors_on_flash"] and st["on_flash"]
    assert 0 < st["peak_resident_bytes"] <= st["kernel_budget_bytes"] <= tiny.memory_budget_bytes
    np.testing.assert_allclose(s1, s0, rtol=1e-8)
    assert isinstance(u1, np.ndarray) and u1.shape == u0.shape
    _same_subspace(u1, u0, 1e-5)
    _same_subspace(vt1.T, vt0.T, 1e-5)
    st2: dict = {}
    u2, s2, vt2 = flash.svds(a, k=8, tol=1e-6, runtime=tiny, rng=0, stats=st2, u_on_flash=True)
    np.testing.assert_allclose(s2, s0, rtol=1e-8)
    if shape[0] >= shape[1]:  # tall: u (the long side) is returned on flash
        assert isinstance(u2, flash.Matrix) and u2.shape == u0.shape
        _same_subspace(u2.to_numpy(), u0, 1e-5)
    s3 = flash.svds(a, k=8, tol=1e-6, runtime=tiny, rng=0, return_singular_vectors=False)
    np.testing.assert_allclose(s3, s0, rtol=1e-8)


def test_svds_keeps_everything_in_memory_when_it_fits(tmp_path):
    a = _matrix()
    st: dict = {}
    u, s, vt = flash.svds(a, k=8, tol=1e-6, runtime=flash.Runtime(memory_budget="1G", dir=tmp_path), rng=0, stats=st)
    assert not st["basis_on_flash"] and not st["vectors_on_flash"]
    ref = np.sort(np.linalg.svd(a.toarray(), compute_uv=False))[-8:]
    np.testing.assert_allclose(s, ref, rtol=1e-8)


def test_topics_with_state_on_flash_matches_in_memory(tmp_path):
    """A tiny budget: Lloyd by row blocks of B, the SVD's basis and u on flash; the same
    clusters and topics as with everything in memory."""
    truth = flash.planted_topics(300, 4, beta=0.05, seed=5)
    path = tmp_path / "docword.p.txt"
    flash.write_corpus(path, truth, 2000, alpha=0.05, mean_length=60, seed=5, chunk=500)
    big = flash.Runtime(memory_budget="256M", dir=tmp_path)
    m0 = flash.topics(flash.load(path, big, dtype=np.float32), 4, runtime=big, seed=2)
    tiny = flash.Runtime(memory_budget="256K", dir=tmp_path)
    m1 = flash.topics(flash.load(path, tiny, dtype=np.float32), 4, runtime=tiny, seed=2)
    assert not m0.stats["lloyd_row_blocks"] and not m0.stats["svd_basis_on_flash"]
    assert m1.stats["on_flash"] and m1.stats["lloyd_row_blocks"] and m1.stats["svd_vectors_on_flash"]
    assert m1.stats["peak_resident_bytes"] <= tiny.memory_budget_bytes
    assert np.array_equal(m1.labels, m0.labels)
    np.testing.assert_allclose(m1.topic_word, m0.topic_word, atol=1e-9)


RSS_SCRIPT = r"""
import sys, numpy as np, scipy.sparse as sp
from scalefree import flash

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

budget, d = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
rt = flash.Runtime(memory_budget=budget, threads=2, dir=d)
rows, cols = 200_000, 2_000
a = sp.random(rows, cols, density=3e-3, random_state=rng, format="csr", dtype=np.float64)
A = flash.Csr.from_scipy(a, rt)
del a
# Warm-up: the libraries, and the threads of the kernels' runtime (Runtime.with_budget).
flash.svds(A, k=20, tol=1e-2, runtime=rt, rng=0, return_singular_vectors=False)
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
base = status("VmRSS")
st = {}
u, s, vt = flash.svds(A, k=20, tol=1e-3, runtime=rt, rng=0, stats=st, u_on_flash=True)
print(status("VmHWM") - base, rows * 20 * 8, int(st["basis_on_flash"]), int(isinstance(u, flash.Matrix)))
"""


def test_svds_peak_rss_stays_within_the_budget(tmp_path):
    """The process grows by at most the budget plus a little (thread buffers, the allocator)
    while svds computes 20 triplets of a 200 000-row matrix whose u alone is 32 MB, under 12 MiB
    (A, 14 MB, streamed from flash; u on flash)."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs")
    budget = 12 << 20
    p = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(budget), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    grown, u_bytes, _, u_on_flash = map(int, p.stdout.split())
    assert u_on_flash and u_bytes > 2 * budget
    assert grown <= budget + (8 << 20), f"RSS grew by {grown >> 20} MiB under a {budget >> 20} MiB budget"
