"""Graphs out of core (``--memory-budget``): each rank's edges on flash, streamed once per
iteration or hop, give the in-memory job's results bit for bit, within the budget, and leave
no file behind (even when a rank is killed)."""

import json
import subprocess
import sys

import numpy as np
import pytest


def _cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def rmat(tmp_path_factory):
    p = tmp_path_factory.mktemp("g") / "g.txt"
    out = _cli("rmat", p, "--scale", 11, "--edges", "24K", "--seed", 3, "-q")
    assert out.returncode == 0, out.stderr
    return p


@pytest.mark.parametrize("ranks,dtype", [(1, "float64"), (3, "float32")])
def test_pagerank_on_flash_equals_in_memory_bit_for_bit(rmat, tmp_path, ranks, dtype):
    common = ("pagerank", rmat, "-n", ranks, "--dtype", dtype, "--tol", "1e-7", "--top", 10)
    mem = _cli(*common, "-o", tmp_path / "mem.tsv", "--json", tmp_path / "mem.json")
    assert mem.returncode == 0, mem.stderr
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ooc = _cli(*common, "--memory-budget", "16K", "--flash-dir", scratch, "-o", tmp_path / "ooc.tsv",
               "--json", tmp_path / "ooc.json")
    assert ooc.returncode == 0, ooc.stderr
    assert (tmp_path / "ooc.tsv").read_text() == (tmp_path / "mem.tsv").read_text()
    a, b = json.loads((tmp_path / "mem.json").read_text()), json.loads((tmp_path / "ooc.json").read_text())
    assert a["top"] == b["top"] and a["iterations"] == b["iterations"]
    f = b["flash"]
    assert f["memory_budget_bytes"] == 16 << 10
    assert f["csr_bytes_per_rank"] == a["csr_bytes_per_rank"] and sum(f["csr_bytes_per_rank"]) > 0
    for csr, read, peak, blocks in zip(f["csr_bytes_per_rank"], f["last_iteration_bytes_read_per_rank"],
                                       f["peak_resident_bytes_per_rank"], f["row_blocks_per_rank"]):
        assert read >= csr  # the whole CSR every iteration (sector-rounded)
        assert 0 < peak <= 16 << 10
        assert blocks > 1
    assert list(scratch.iterdir()) == []  # unnamed scratch files


def test_diameter_on_flash_equals_in_memory(rmat, tmp_path):
    """One hop for both: the budget path (edges streamed from flash) with a target sample
    gives the in-memory N(h), bounds and sample estimates bit for bit."""
    common = ("diameter", rmat, "-n", 2, "--method", "hll", "--precision", 5, "--sample", 256)
    mem = _cli(*common, "--json", tmp_path / "mem.json")
    assert mem.returncode == 0, mem.stderr
    ooc = _cli(*common, "--memory-budget", "8K", "--flash-dir", tmp_path, "--json", tmp_path / "ooc.json")
    assert ooc.returncode == 0, ooc.stderr
    a, b = json.loads((tmp_path / "mem.json").read_text()), json.loads((tmp_path / "ooc.json").read_text())
    assert a["neighbourhood"][0] > 1000 and a["sample"] == b["sample"] == 256
    for key in ("neighbourhood", "sd_bound", "sample_only", "rounds"):
        assert a[key] == b[key], key
    assert mem.stdout.splitlines()[1:] == ooc.stdout.splitlines()[1:]
    assert b["flash"]["edge_bytes_on_flash"] > 0
    assert 0 < b["flash"]["last_hop"]["peak_resident_bytes"] <= 8 << 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem.json", "ooc.json"]  # unnamed scratch files


def test_a_killed_rank_leaves_no_scratch_file(rmat, tmp_path):
    p = _cli("pagerank", rmat, "-n", 2, "--memory-budget", "16K", "--flash-dir", tmp_path, "--fail-rank", "1:2")
    assert p.returncode != 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,code,says", [
    (("--memory-budget", "lots"), 2, "--memory-budget 'lots' is not a size"),
    (("--memory-budget", "1M", "--collective", "dense"), 2, "--memory-budget needs --collective sparse"),
    (("--memory-budget", "1M", "--flash-dir", "/nonexistent/dir"), 2, "--flash-dir /nonexistent/dir: no such directory"),
    (("--memory-budget", "64"), 1, "budget"),  # a row's edges do not fit 64 bytes: OutOfBudgetError
])
def test_bad_budgets_are_one_line(rmat, args, code, says):
    p = _cli("pagerank", rmat, *args)
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines


def test_diameter_budget_needs_hll(rmat):
    p = _cli("diameter", rmat, "--method", "exact", "--memory-budget", "1M")
    assert p.returncode == 2 and "--method hll" in p.stderr


def test_flash_rows_in_python_match_the_in_memory_hop(tmp_path):
    """FlashRows.union_changed over any range of rows equals hadi_union_changed on it:
    packed messages (id, then the union of the changed targets' rows) and hit flags."""
    from scalefree import _native

    rng = np.random.default_rng(0)
    rt = _native.FlashRuntime(4096, 1, str(tmp_path), "")
    for rows, cols, edges, width, wm in [(1, 1, 0, 4, 4), (40, 30, 500, 24, 8), (300, 50, 3000, 12, 4)]:
        indptr = np.concatenate([[0], np.sort(rng.integers(0, edges + 1, rows - 1)), [edges]]).astype(np.int64)
        targets = rng.integers(0, cols, edges).astype(np.uint32)
        regs = rng.integers(0, 255, (cols, width)).astype(np.uint8)
        changed = (rng.random(cols) < 0.7).astype(np.uint8)
        ids = rng.integers(-2**40, 2**40, rows).astype(np.int64)
        fr = _native.FlashRows(rt, indptr, targets, cols)
        assert fr.size_bytes == 8 * rows + 4 * edges
        for lo, hi in [(0, rows), (rows // 3, rows - rows // 4), (rows - 1, rows), (0, 0)]:
            want, want_hit = np.full((hi - lo, 8 + width), 7, np.uint8), np.zeros(hi - lo, np.uint8)
            k = _native.hadi_union_changed(regs, width, wm, changed, targets, indptr[lo: hi + 1], ids[lo:hi], want,
                                           want_hit)
            got, hit = np.full((hi - lo, 8 + width), 9, np.uint8), np.ones(hi - lo, np.uint8)
            assert fr.union_changed(regs, width, wm, changed, lo, hi, ids[lo:hi], got, hit) == k
            np.testing.assert_array_equal(hit, want_hit)
            np.testing.assert_array_equal(got[:k], want[:k])
            # the reference: ids first, then max over the register part and OR over the rest
            sel = np.flatnonzero(hit)
            np.testing.assert_array_equal(got[:k, :8].copy().view(np.int64).reshape(-1), ids[lo:hi][sel])
            for j, r in enumerate(lo + sel):
                t = targets[indptr[r]: indptr[r + 1]]
                t = t[changed[t] != 0]
                np.testing.assert_array_equal(got[j, 8: 8 + wm], regs[t, :wm].max(axis=0))
                np.testing.assert_array_equal(got[j, 8 + wm:], np.bitwise_or.reduce(regs[t, wm:], axis=0))
        assert fr.last_stats["peak_resident_bytes"] <= 4096
    with pytest.raises(ValueError):
        _native.FlashRows(rt, np.array([0, 1], np.int64), np.array([5], np.int64), 5)
    with pytest.raises(ValueError):
        fr.union_changed(regs, width, wm, changed, 0, rows + 1, ids, got, hit)
