"""``scalefree bench pagerank`` end to end on tiny graphs: the records have the harness
shape and every implementation's scores agree with scipy's (no timing is asserted)."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from scalefree_bench import common

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and common.find_mpiexec() is not None


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="scipy missing")
@pytest.mark.parametrize("ranks", ["1,3", "2"])
def test_bench_pagerank_end_to_end(tmp_path, ranks):
    g = tmp_path / "g.txt"
    rng = np.random.default_rng(0)
    e = np.unique(rng.integers(0, 200, (1500, 2)) ** 2 // 200, axis=0)
    g.write_text("# tiny\n" + "".join(f"{a}\t{b}\n" for a, b in e))
    out = tmp_path / "out.json"
    vs = "mpi,scipy" if HAVE_MPI else "scipy"
    cmd = [sys.executable, "-m", "scalefree.cli", "bench", "pagerank", "-n", ranks, "--wiki-vote", str(g),
           "--rmat-scale", "9", "--rmat-edges", "3K", "--vs", vs, "--min-calls", "5", "--target-seconds", "0.01",
           "--warmup", "1", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    records = json.loads(out.read_text())
    nranks = [int(x) for x in ranks.split(",")]
    want = {("scipy", "1-process", 1)}
    for n in nranks:
        want |= {("scalefree", "sparse", n), ("scalefree", "sparse-f32", n), ("scalefree", "dense", n)}
        if HAVE_MPI:
            want |= {("mpi", "dense", n), ("mpi", "allgatherv", n)}
    for graph in ("wiki-vote", "rmat-s9-e3072"):
        got = {(r["impl"], r["variant"], r["ranks"]) for r in records if r["graph"] == graph}
        assert got == want, graph
    for r in records:
        f32 = r["variant"] == "sparse-f32"
        assert r["bench"] == "pagerank" and r["dtype"] == ("float32" if f32 else "float64") and r["hosts"] == 1
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["n"] >= 5
        assert r["max_abs_err"] <= (1e-7 if f32 else 1e-12)
        assert r["iters_per_s"] > 0 and r["vertices"] > 0 and r["n_items"] > 0
        assert 0 <= r["comm_fraction"] <= 1.0 + 1e-9 or r["ranks"] == 1
        if r["variant"] in ("sparse", "sparse-f32"):
            assert r["config_s"] > 0 and 0 < r["touched_frac"] <= 1
    assert "peer/ours(sparse)" in p.stdout and "pagerank:" in p.stderr


def test_bench_pagerank_rejects_bad_arguments():
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "pagerank", "--graphs", "twitter"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown graph 'twitter'" in p.stderr


def test_bench_pagerank_flash_end_to_end(tmp_path):
    """``scalefree bench pagerank-flash`` on a tiny graph: one repeat, the records carry the
    disk rate, both jobs' iteration times and the top-10 comparison (no timing asserted)."""
    g = tmp_path / "g.npz"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "rmat", str(g), "--scale", "10", "--edges", "8K",
                        "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "pagerank-flash", str(g), "--repeats", "1",
                        "--iterations", "2", "--dd-bytes", "4M", "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (r,) = json.loads(out.read_text())
    assert r["bench"] == "pagerank-flash" and r["iterations"] == 2 and r["top_equal"] and r["bits_equal"]
    assert r["disk_read_bytes_per_s"] > 0 and r["csr_read_s"] > 0 and r["flash_per_iteration_s"] > 0
    assert r["memory_budget_bytes"] >= max(r["csr_bytes_per_rank"]) // 4
    assert r["flash"]["last_iteration_bytes_read_per_rank"][0] >= r["csr_bytes_per_rank"][0]
    assert not (tmp_path / ".scalefree-bench-dd").exists()
    assert "median per iteration / CSR read" in p.stdout
