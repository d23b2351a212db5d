"""csrmm on wide dense operands (the AVX2 row kernel) against scipy, and the
``--cold`` option of the flash benches (sync + drop the page cache, or a clear fallback)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from scalefree import flash
from scalefree_bench import common


def _power_law_csr(rows, cols, nnz, dtype, seed):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, rows, nnz) if rows else np.zeros(0, int)
    c = np.minimum((rng.pareto(1.1, nnz) * 3).astype(np.int64), cols - 1) if cols else np.zeros(0, int)
    a = sp.coo_matrix(((rng.random(nnz) + 0.5).astype(dtype), (r, c)), shape=(rows, cols)).tocsr()
    a.sum_duplicates()
    return a


# Wide B (tens of MB), power-law A, odd widths (37: not a multiple of the 8 AVX2 lanes),
# row- and column-major B (the strided path), 0 and 1 rows.
@pytest.mark.parametrize("rows,cols,n,dtype,order", [
    (0, 70000, 48, np.float64, "C"),
    (1, 70000, 48, np.float64, "C"),
    (2001, 70000, 48, np.float64, "C"),
    (1999, 100000, 37, np.float32, "C"),
    (517, 100000, 37, np.float32, "F"),
    (3, 5, 1, np.float32, "C"),
])
@pytest.mark.parametrize("budget", [1 << 30, 256 << 10])
def test_csrmm_wide_b_matches_scipy(tmp_path, rows, cols, n, dtype, order, budget):
    a = _power_law_csr(rows, cols, rows * 40, dtype, seed=rows + n)
    b = np.asarray(np.random.default_rng(n).standard_normal((cols, n)).astype(dtype), order=order)
    rt = flash.Runtime(memory_budget=budget, threads=2, dir=str(tmp_path))
    A = flash.Csr.from_scipy(a, rt)
    got = flash.csrmm(A, b, runtime=rt)
    want = a @ b
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))))
    # alpha/beta into an existing C, column tiles included
    c0 = np.random.default_rng(1).standard_normal(want.shape).astype(dtype)
    c = c0.copy()
    flash.csrmm(A, b, c, alpha=0.5, beta=-2.0, runtime=rt)
    np.testing.assert_allclose(c, 0.5 * want - 2.0 * c0, rtol=tol, atol=tol * max(1.0, float(np.abs(c0).max(initial=0)) * 4))


def test_page_cache_drop_writes_3_before_each_call(tmp_path):
    knob = tmp_path / "drop_caches"
    knob.write_text("")
    cache = common.PageCache(True, "test", path=str(knob))
    assert cache.enabled and cache.state == "cold"
    knob.write_text("")
    cache.drop()
    cache.drop()
    assert cache.drops == 2 and knob.read_text() == "3\n"
    warm = common.PageCache(False, "test", path=str(knob))
    warm.drop()
    assert not warm.enabled and warm.state == "warm" and warm.drops == 0


def test_page_cache_refused_falls_back_with_a_note(tmp_path, capsys):
    cache = common.PageCache(True, "test", path=str(tmp_path / "no" / "such" / "drop_caches"))
    cache.drop()  # a no-op, never raises
    assert not cache.enabled and cache.drops == 0
    assert cache.state.startswith("warm (cold refused:") and "drop_caches" in cache.state
    assert "cannot drop the page cache" in capsys.readouterr().err


@pytest.mark.parametrize("bench,extra", [
    ("flash-kernels", ["--kernels", "csrmm", "--sparse", "random", "--sparse-rows", "300", "--sparse-cols", "70",
                       "--sparse-nnz", "2000", "--sparse-distinct", "--csrmm-k", "5", "--csrmm-dtype", "float32",
                       "--budget", "1M,64K"]),
    ("flash-gemm", ["--n", "64"]),
    ("svd", ["--data", "random", "--rows", "300", "--cols", "80", "--nnz", "3000", "--k", "3",
             "--budget-fractions", "1"]),
])
def test_bench_cold_option_reports_the_cache_state(tmp_path, bench, extra):
    """``--cold`` on a tiny case. The test must not drop the real page cache (that slows
    every other job on the machine), so it points the bench at a stand-in file through
    ``SCALEFREE_DROP_CACHES``: once writable (a cold run, one drop per timed call), once
    missing (the printed fallback, a warm run)."""
    knob = tmp_path / "drop_caches"
    knob.write_text("")
    for path, want in [(knob, "cold"), (tmp_path / "missing" / "drop_caches", "warm (cold refused:")]:
        out = tmp_path / f"{bench}.json"
        env = dict(__import__("os").environ, SCALEFREE_DROP_CACHES=str(path))
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", bench, *extra, "--repeat", "2", "--cold",
                            "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        recs = json.loads(out.read_text())
        assert recs and all(r["page_cache"].startswith(want) for r in recs), recs
        if want == "cold":
            assert knob.read_text() == "3\n"
            assert "page cache: cold" in p.stdout
        else:
            assert "cannot drop the page cache" in p.stderr and "page cache: warm (cold refused" in p.stdout


def test_power_law_distinct_has_the_requested_entries():
    from scalefree_bench.svd import _power_law

    for rows, cols, nnz in [(1, 1, 1), (7, 5, 35), (2000, 500, 30001)]:
        a = _power_law(rows, cols, nnz, distinct=True)
        a.check_format(full_check=True)
        assert a.nnz == nnz and a.has_canonical_format and a.data.min() >= 0.5
    with pytest.raises(ValueError):
        _power_law(3, 3, 10, distinct=True)
