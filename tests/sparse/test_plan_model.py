"""The PageRank scale model (``scalefree.graph.model``, ``scalefree sparse plan --pagerank``):
touched vertices against brute force under the real edge hash, the closed-form R-MAT degrees
against a measured histogram, the time and memory formulas at known inputs, the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scalefree.graph import model
from scalefree.graph.io import edge_owner
from scalefree.graph.rmat import rmat_blocks

ROOT = Path(__file__).resolve().parents[2]
HIST = ROOT / "docs/results/scale-model/rmat22-degrees.json"
CHECK = ROOT / "docs/results/scale-model/check.json"


def _rmat(scale, edges, seed=3):
    """Distinct edges of an R-MAT graph, ids as generated (not compacted)."""
    s, d = (np.concatenate(x) for x in zip(*rmat_blocks(scale, edges, seed)))
    key = np.unique(s * (1 << scale) + d)
    return key >> scale, key & ((1 << scale) - 1)


def _histograms(s, d, n):
    out, inn = np.bincount(s, minlength=n), np.bincount(d, minlength=n)
    tot = out + inn - np.bincount(s[s == d], minlength=n)

    def h(a):
        v, c = np.unique(a[a > 0], return_counts=True)
        return np.stack([v, c], axis=1)

    return h(tot), h(out), h(inn)


def _touched_brute(s, d, ranks):
    """Mean over ranks of the distinct vertices (any end, sources, targets) of a rank's
    edges when the edges are placed by the real edge_owner hash."""
    own = edge_owner(s, d, ranks)
    got = np.array([[len(np.union1d(s[own == r], d[own == r])), len(np.unique(s[own == r])),
                     len(np.unique(d[own == r]))] for r in range(ranks)], float)
    return got.mean(axis=0)


@pytest.fixture(scope="module")
def graph():
    scale, m = 13, 120_000
    s, d = _rmat(scale, m)
    tot, out, inn = _histograms(s, d, 1 << scale)
    hist = model.HistogramShape(1 << scale, len(s), m, tot, out, inn)
    return scale, m, s, d, hist


@pytest.mark.parametrize("ranks", [1, 2, 3, 7, 16, 64])
def test_touched_matches_brute_force_under_the_edge_hash(graph, ranks):
    scale, m, s, d, hist = graph
    brute = _touched_brute(s, d, ranks)
    pred_hist = [hist.touched(ranks, w) for w in ("total", "out", "in")]
    pred_rmat = [model.RmatShape(scale, m).touched(ranks, w) for w in ("total", "out", "in")]
    # The histogram formula is the exact expectation for an ideal hash; one graph, one hash.
    np.testing.assert_allclose(pred_hist, brute, rtol=0.01)
    # The closed form is the expectation over R-MAT graphs too: one sample, so a bit looser.
    np.testing.assert_allclose(pred_rmat, brute, rtol=0.03)


def test_touched_is_not_the_naive_guesses(graph):
    # Neither every vertex nor 2E/P endpoints: the model must sit strictly between.
    _, _, s, _, hist = graph
    for p in (4, 16):
        t = hist.touched(p)
        assert t < 0.9 * hist.vertices and t < 0.9 * 2 * len(s) / p


def test_closed_form_matches_the_measured_scale22_histogram():
    h = model.histogram_shape(HIST)
    r = model.RmatShape(22, h.generated)
    assert r.edges == pytest.approx(h.edges, rel=1e-3)
    for p in (1, 2, 4, 16, 256):
        for w in ("total", "out", "in"):
            assert r.touched(p, w) == pytest.approx(h.touched(p, w), rel=2e-3), (p, w)


def test_touched_is_monotone():
    r = model.RmatShape(20, 16 << 20)
    ts = [r.touched(p) for p in (1, 2, 4, 8, 16, 64, 256, 1024)]
    assert all(a > b for a, b in zip(ts, ts[1:]))  # each rank touches fewer ...
    ps = [p * t for p, t in zip((1, 2, 4, 8, 16, 64, 256, 1024), ts)]
    assert all(a < b for a, b in zip(ps, ps[1:]))  # ... but all ranks together more
    assert ts[0] == pytest.approx(r.vertices)
    assert ts[-1] < 2 * r.edges / 1024  # never more than the endpoints


class _Shape:
    ids, generated, edges, vertices = 1000, 8000.0, 4000.0, 600.0

    def touched(self, ranks, which="total"):
        return {"total": 300.0, "out": 200.0, "in": 100.0}[which]


def test_time_and_memory_formulas_at_known_inputs():
    k = model.Constants(read_s_per_edge={"npz": 1.0, "text": 2.0}, partition_s_per_edge=0.5, dedup_s_per_edge=0.25,
                        exchange_local_s_per_edge=0.25, setup_s_per_edge={"dense": 3.0, "sparse": 4.0}, setup_s_per_id=0.5,
                        iteration_s_per_edge=0.125, iteration_s_per_touched=1.0, probed={2: (0.0,) * 5},
                        base_bytes=100.0, bytes_per_read_edge={"npz": 1.0, "text": 3.0},
                        bytes_per_edge={"dense": 10.0, "sparse": 20.0},
                        bytes_per_id=2.0, bytes_per_touched=5.0)
    # One host, 4 ranks on 2 cores: compute twice as slow; no network term.
    c = model.Cluster(hosts=1, ranks_per_host=4, cores_per_host=2)
    r = model.predict(_Shape(), c, "text", k)
    assert r["edges_read"] == 2000 and r["edges"] == 1000 and r["touched"] == 300
    assert r["read_s"] == pytest.approx(2 * 2000 * 2.0)
    assert r["exchange_s"] == pytest.approx(2 * 2000 * 1.0)
    assert r["setup_path"] == "dense"  # 1000 ids <= 2 * 4000 / 4 + 1
    # in slots: sources (out-degree > 0: 200) + owned (600 / 4); out slots: targets (100)
    assert r["spmv_s"] == pytest.approx(2 * (1000 * 0.125 + (200 + 150 + 100) * 1.0))
    assert r["peak_bytes"] == pytest.approx(100 + 3 * 2000 + 10 * 1000 + 2 * 1000 + 5 * 300)
    # Two hosts of one rank: 8-byte pairs, half of them over a 1 GB/s link, 1 message of 1 ms.
    c2 = model.Cluster(hosts=2, ranks_per_host=1, cores_per_host=2, net_gbps=1.0, latency_us=1000.0)
    r2 = model.predict(_Shape(), c2, "npz", k)
    assert r2["exchange_s"] == pytest.approx(4000 * 1.0 + 8 * 4000 * 0.5 / 1e9 + 1e-3)
    assert r2["read_s"] == pytest.approx(4000 * 1.0)
    assert r2["peak_bytes"] == pytest.approx(100 + 1 * 4000 + 10 * 2000 + 2 * 1000 + 5 * 300)
    # Storage slower than parsing bounds the read.
    c3 = model.Cluster(hosts=2, net_gbps=1.0, storage_gbps=1e-9 * 8 * 4000 / 1e5)
    assert model.predict(_Shape(), c3, "npz", k)["read_s"] == pytest.approx(1e5)


def test_predictions_fall_with_hosts_and_take_the_sparse_path_past_the_id_space():
    shape = model.RmatShape(26, float(1 << 30))
    rows = [model.predict(shape, model.Cluster(h, net_gbps=12.5)) for h in (16, 32, 64, 128, 256)]
    assert [r["setup_path"] for r in rows] == ["dense"] + ["sparse"] * 4  # 2**26 ids vs 2 * 1.06e9 / P
    for key in ("load_s", "iteration_s", "touched"):
        assert all(a[key] > b[key] for a, b in zip(rows, rows[1:])), key
    assert all(a["peak_bytes"] > b["peak_bytes"] for a, b in zip(rows[1:], rows[2:]))
    slow = model.predict(shape, model.Cluster(64, net_gbps=3.125))
    assert slow["iteration_s"] > rows[2]["iteration_s"] and slow["load_s"] > rows[2]["load_s"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "sparse", "plan", *args], capture_output=True,
                          text=True, check=True).stdout


def test_cli_table():
    out = _cli("--pagerank", "--edges", "256M", "--ids", "16M", "--hosts", "4,16", "--format", "text")
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["4", "16"]
    assert all(float(x) > 0 for r in rows for x in r[1:7])
    assert float(rows[0][-1]) > float(rows[1][-1])  # memory per rank falls with hosts
    with pytest.raises(subprocess.CalledProcessError):
        _cli("--pagerank", "--ids", "1000")  # not a power of two and no --degrees


def test_cli_degrees_file_and_check():
    out = _cli("--pagerank", "--edges", "1G", "--hosts", "16", "--degrees", str(HIST))
    assert "copies" in out
    out = _cli("--pagerank", "--check", str(CHECK))
    runs = json.loads(CHECK.read_text())
    rows = [line for line in out.splitlines() if line.split() and line.split()[1:2] and line.split()[1].isdigit()]
    assert len(rows) == len(runs) and all(row.count("%") == 6 for row in rows)
    assert all("+0%" in row for row in rows if "(calibration)" in row)  # calibration rows fit exactly
    worst = float(out.strip().splitlines()[-1].split()[-1].rstrip("%"))
    assert math.isfinite(worst) and worst < 100  # the committed check stays within a factor of 2


def test_default_constants_are_the_calibration_of_the_committed_runs():
    got = model.calibrate(json.loads(CHECK.read_text()))
    k = model.Constants()
    for name in ("read_s_per_edge", "setup_s_per_edge", "bytes_per_edge"):
        for key, v in getattr(k, name).items():
            assert getattr(got, name)[key] == pytest.approx(v, rel=0.01), (name, key)
    for name in ("dedup_s_per_edge", "exchange_local_s_per_edge", "iteration_s_per_edge"):
        assert getattr(got, name) == pytest.approx(getattr(k, name), rel=0.01), name
