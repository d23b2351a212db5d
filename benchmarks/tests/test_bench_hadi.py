"""``scalefree bench hadi``: one row per (graph, method, ranks, seed), the estimators' error
against the exact row of the same graph (a tiny graph: this checks the harness, not the
speed)."""

import json
import subprocess
import sys

import pytest


def test_parse_method_and_error():
    from scalefree_bench.hadi import max_relative_error, parse_method

    assert parse_method("hll:p=10:s=0") == {"method": "hll", "label": "hll:p=10:s=0", "precision": 10, "sample": 0}
    assert parse_method("exact") == {"method": "exact", "label": "exact"}
    for bad in ("bfs", "fm:p=3", "hll:q=1", "hll:p=x"):
        with pytest.raises(ValueError):
            parse_method(bad)
    # the shorter list keeps its last value
    assert max_relative_error([10, 20, 30], [10, 20, 30, 40]) == (0.25, 3)
    assert max_relative_error([10.0], [10.0]) == (0.0, 0)


def test_bench_hadi_rows_and_errors(tmp_path):
    from scalefree.graph.rmat import write_rmat

    g = tmp_path / "g.txt"
    write_rmat(g, 8, 2000, seed=3, progress=False)
    out = tmp_path / "hadi.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "hadi", str(g), "-n", "2",
                        "--methods", "exact,hll,hll:s=0", "--json", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [r["label"] for r in recs] == ["exact", "hll", "hll:s=0"]
    exact, sampled, registers = recs
    assert exact["max_rel_error"] == 0
    # 256 vertices at most: the default sample holds every vertex, so hll is exact
    assert sampled["max_rel_error"] < 1e-9 and sampled["sample"] == exact["vertices"]
    assert 0 < registers["max_rel_error"] < 0.5 and registers["sample"] == 0
    assert all(len(r["peak_rss_bytes"]) == 2 for r in recs)
    assert "max err" in p.stdout


def test_bench_hadi_against_a_baseline_tree(tmp_path):
    """``--baseline NAME=PYTHONPATH --repeats R``: every estimator row runs R times per code,
    alternating, and the last table compares the codes (here the same tree under two
    names: the harness, not the speed)."""
    from pathlib import Path

    import scalefree
    from scalefree.graph.rmat import write_rmat

    g = tmp_path / "g.txt"
    write_rmat(g, 7, 600, seed=2, progress=False)
    out = tmp_path / "hadi.json"
    tree = str(Path(scalefree.__file__).resolve().parents[1])
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "hadi", str(g), "-n", "2", "--methods", "hll",
                        "--baseline", f"same={tree}", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [(r["code"], r["run"]) for r in recs] == [("this", 1), ("same", 1)]
    assert recs[0]["neighbourhood"] == recs[1]["neighbourhood"]
    assert "ms/hop this/code" in p.stdout and "same" in p.stdout
    bad = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "hadi", str(g), "--baseline", "x=/no/such"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such directory /no/such" in bad.stderr
