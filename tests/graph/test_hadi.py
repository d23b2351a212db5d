"""HADI over the OR/max sparse allreduce, against an exact BFS neighbourhood function: exact
bitsets must agree exactly (world sizes 1-4, graphs of 0, 1 and an odd number of edges),
HyperLogLog and Flajolet-Martin within a tolerance (seeded, so the same numbers every run)."""

import gzip
import json
import subprocess
import sys
from collections import deque

import numpy as np
import pytest

from ranks import collect, spawn_ranks

RUN = r"""
import json, sys
import numpy as np, scalefree
from scalefree.graph.io import partition_edges
from scalefree.graph.hadi import hadi
g = scalefree.init(timeout=60)
z = np.load(sys.argv[1])
n = int(z["n"])
s, d = partition_edges(z["src"], z["dst"], g.rank, g.size, seed=5)
kw = json.loads(sys.argv[6])
if "round_bytes" in kw:
    import scalefree.graph.hadi
    scalefree.graph.hadi.HOP_ROUND_BYTES = kw.pop("round_bytes")
stats = {}
nf, enc, _ = hadi(g, s, d, n, method=sys.argv[3], k=int(sys.argv[4]), precision=int(sys.argv[5]), stats=stats, **kw)
# every rank must hold the same neighbourhood function
print(json.dumps(nf))
if g.rank == 0:
    np.save(sys.argv[2], np.array(nf))
    np.save(sys.argv[2] + ".sd.npy", np.array(stats.get("sd_bound", [])))
"""


def bfs_neighbourhood(src, dst, n):
    """Exact N(h): pairs (u, v) with v within h hops of u along the edges, up to the
    largest finite distance."""
    adj = [[] for _ in range(n)]
    for a, b in zip(src.tolist(), dst.tolist()):
        adj[a].append(b)
    hist = {}
    for s in range(n):
        dist = {s: 0}
        q = deque([s])
        while q:
            u = q.popleft()
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    q.append(v)
        for dd in dist.values():
            hist[dd] = hist.get(dd, 0) + 1
    hmax = max(hist) if hist else 0
    return np.cumsum([hist.get(h, 0) for h in range(hmax + 1)]).astype(float)


def run_hadi(tmp_path, ranks, src, dst, n, method="exact", k=32, precision=8, with_sd=False, **kw):
    """N(h) from ``ranks`` processes (and, ``with_sd``, the bound on its standard deviation per
    hop); ``kw`` goes to ``hadi`` (``round_bytes``: ``HOP_ROUND_BYTES``)."""
    g = tmp_path / "g.npz"
    out = tmp_path / "nf.npy"
    np.savez(g, src=np.asarray(src, np.int64), dst=np.asarray(dst, np.int64), n=n)
    res = collect(spawn_ranks(ranks, RUN, args=[str(g), str(out), method, str(k), str(precision), json.dumps(kw)]),
                  120)
    for r in res:
        assert r.returncode == 0, r.stderr[-3000:]
    lines = {r.stdout.strip().splitlines()[-1] for r in res}
    assert len(lines) == 1, f"ranks disagree: {lines}"
    return (np.load(out), np.load(str(out) + ".sd.npy")) if with_sd else np.load(out)


def skewed_graph(n, m, seed):
    rng = np.random.default_rng(seed)
    e = np.unique(np.minimum(rng.zipf(1.6, (m, 2)) - 1, n - 1), axis=0)
    e = e[e[:, 0] != e[:, 1]]
    # scramble ids so the hubs are not the small ids
    perm = rng.permutation(n)
    return perm[e[:, 0]], perm[e[:, 1]]


GRAPHS = {
    "path-odd": (np.arange(6), np.arange(1, 7), 7),  # 0->1->...->6, diameter 6
    "one-edge": (np.array([0]), np.array([1]), 2),
    "no-edges": (np.zeros(0, np.int64), np.zeros(0, np.int64), 3),
    "empty": (np.zeros(0, np.int64), np.zeros(0, np.int64), 0),
    "cycle-plus-tail": (np.array([0, 1, 2, 3, 4, 9, 8]), np.array([1, 2, 3, 4, 0, 8, 0]), 11),
}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_exact_matches_bfs_small(tmp_path, ranks, name):
    src, dst, n = GRAPHS[name]
    got = run_hadi(tmp_path, ranks, src, dst, n)
    want = bfs_neighbourhood(src, dst, n) if n else np.array([0.0])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ranks", [1, 3, 4])
def test_exact_matches_bfs_skewed(tmp_path, ranks):
    src, dst = skewed_graph(301, 1500, seed=ranks)  # 301 vertices: bitsets of 5 words, last partial
    got = run_hadi(tmp_path, ranks, src, dst, 301)
    np.testing.assert_array_equal(got, bfs_neighbourhood(src, dst, 301))


def test_fm_estimate_close_to_bfs(tmp_path):
    from scalefree.graph.hadi import effective_diameter

    n = 1200
    src, dst = skewed_graph(n, 6000, seed=11)
    src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])  # undirected: one big component
    want = bfs_neighbourhood(src, dst, n)
    got = run_hadi(tmp_path, 3, src, dst, n, method="fm", k=64)
    assert abs(len(got) - len(want)) <= 2
    m = min(len(got), len(want))
    rel = np.abs(got[:m] - want[:m]) / want[:m]
    # Small sets carry FM's known small-range bias (hop 0: singletons, ~1.8x); large ones are
    # within the estimator's spread (~0.78/sqrt(k) per vertex, correlated across vertices).
    assert rel[1] < 0.5 and rel[2:].max() < 0.25, rel
    assert abs(effective_diameter(got)[1] - effective_diameter(want)[1]) <= 1.0


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name", ["path-odd", "cycle-plus-tail", "one-edge", "no-edges", "empty"])
def test_hll_small_graphs_near_bfs(tmp_path, ranks, name):
    src, dst, n = GRAPHS[name]
    got = run_hadi(tmp_path, ranks, src, dst, n, method="hll", sample=0)  # the registers alone
    want = bfs_neighbourhood(src, dst, n) if n else np.array([0.0])
    assert got[0] == want[0]  # N(0): the vertex count, exactly
    assert abs(len(got) - len(want)) <= 1
    m = min(len(got), len(want))
    # a handful of items in 64 registers: linear counting, off by a collision at most
    np.testing.assert_allclose(got[:m], want[:m], rtol=0.1)


@pytest.mark.parametrize("ranks", [1, 4])
def test_hll_matches_bfs_skewed_directed(tmp_path, ranks):
    n = 301
    src, dst = skewed_graph(n, 1500, seed=ranks)
    want = bfs_neighbourhood(src, dst, n)
    got = run_hadi(tmp_path, ranks, src, dst, n, method="hll", sample=0)
    assert got[0] == want[0]
    m = min(len(got), len(want))
    assert abs(len(got) - len(want)) <= 1
    # Most vertices reach the same few dozen: their counters are one set's, so N(h) errs by
    # about one counter's relative error, 1.04/sqrt(256) at the default precision: 3 sigma.
    assert (np.abs(got[:m] - want[:m]) / want[:m]).max() < 3 * 1.04 / 16


def test_hll_close_to_bfs(tmp_path):
    from scalefree.graph.hadi import effective_diameter

    n = 1201  # odd
    src, dst = skewed_graph(n, 6000, seed=11)
    src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])  # undirected: one big component
    want = bfs_neighbourhood(src, dst, n)
    for precision, tol in ((8, 3 * 1.04 / 16), (11, 0.05)):
        # one big component: late hops err by about one counter's 1.04/sqrt(2^precision)
        got = run_hadi(tmp_path, 3, src, dst, n, method="hll", precision=precision, sample=0)
        assert abs(len(got) - len(want)) <= 1
        m = min(len(got), len(want))
        rel = np.abs(got[:m] - want[:m]) / want[:m]
        assert rel[0] == 0 and rel.max() < tol, (precision, rel)  # unlike fm, no small-range bias
    assert effective_diameter(got)[0] == effective_diameter(want)[0]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_hll_sample_of_every_vertex_is_exact(tmp_path, ranks):
    """A sample as large as the graph holds every vertex: the bits are exact sets, and N(h) is
    the BFS one whatever the registers say (rows sent in rounds of 1 KiB: many rounds)."""
    src, dst = skewed_graph(301, 1500, seed=ranks)
    want = bfs_neighbourhood(src, dst, 301)
    got = run_hadi(tmp_path, ranks, src, dst, 301, method="hll", sample=512, round_bytes=1024)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_hll_on_flash_with_a_sample_of_every_vertex_is_exact(tmp_path):
    """The --memory-budget hop is the same hop, its rows' edges streamed from flash a round
    at a time (rounds of 1 KiB cut the flash row blocks anywhere): with a sample of every
    vertex its N(h) is the BFS one."""
    src, dst = skewed_graph(301, 1500, seed=3)
    want = bfs_neighbourhood(src, dst, 301)
    got = run_hadi(tmp_path, 3, src, dst, 301, method="hll", sample=512, round_bytes=1024, memory_budget="8K")
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("ranks", [2, 5])
def test_hll_with_a_sample_within_its_bound(tmp_path, ranks):
    """Registers plus a sample of 512 of 1201 vertices, one big component (where the registers
    alone err by one counter's error at every late hop): N(h) within 4 standard deviations of
    the exact one at every hop, by the bound the run reports (the sum of the vertices'
    standard deviations, which bounds the sum's); seeded, so the same numbers every run."""
    n = 1201
    src, dst = skewed_graph(n, 6000, seed=11)
    src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    want = bfs_neighbourhood(src, dst, n)
    got, sd = run_hadi(tmp_path, ranks, src, dst, n, method="hll", sample=512, with_sd=True)
    assert got[0] == want[0] and sd[0] == 0
    assert abs(len(got) - len(want)) <= 1
    m = min(len(got), len(want))
    assert (np.abs(got[:m] - want[:m]) <= 4 * sd[:m]).all(), (got[:m] / want[:m] - 1, sd[:m] / want[:m])
    # the two together are tighter at the late hops than the registers alone, 1.04/sqrt(256)
    assert (sd[m - 1] / got[m - 1]) < 1.04 / 16, sd[m - 1] / got[m - 1]


def test_hll_initial_and_estimate():
    from scalefree.graph.hadi import Encoding

    e = Encoding("hll", 1 << 20, seed=3, precision=6)
    v = np.arange(200000)
    a = e.initial(v)
    assert a.dtype == np.uint8 and a.shape == (len(v), 64)
    assert np.array_equal(a, Encoding("hll", 1 << 20, seed=3, precision=6).initial(v))
    assert ((a != 0).sum(axis=1) == 1).all()  # one register a vertex
    rank = a.max(axis=1)
    assert 0.48 < (rank == 1).mean() < 0.52 and 0.23 < (rank == 2).mean() < 0.27  # geometric
    # unions (register-wise max) of known sizes: within 4 sigma of 1.04/sqrt(m)
    for size in (1, 5, 50, 1000, 100000):
        est = e.count(a[:size].max(axis=0, keepdims=True))[0]
        assert abs(est - size) <= max(1.0, 4 * 1.04 / 8 * size), (size, est)
    assert e.count(a[:1])[0] == pytest.approx(1, abs=0.01)
    with pytest.raises(ValueError, match="precision"):
        Encoding("hll", 10, precision=3)


def test_effective_diameter():
    from scalefree.graph.hadi import effective_diameter

    assert effective_diameter([10, 50, 90, 100]) == (2, 2.0)
    h, hi = effective_diameter([10, 30, 100])
    assert h == 2 and abs(hi - (1 + (90 - 30) / 70)) < 1e-12
    assert effective_diameter([5]) == (0, 0.0)


def test_encoding_rejects_bad_input():
    from scalefree.graph.hadi import Encoding

    with pytest.raises(ValueError, match="method"):
        Encoding("bogus", 10)
    with pytest.raises(ValueError, match="bitstrings"):
        Encoding("fm", 10, k=0)


def test_fm_initial_is_seeded_and_geometric():
    from scalefree.graph.hadi import Encoding

    e = Encoding("fm", 100000, k=8, seed=3)
    a = e.initial(np.arange(100000))
    assert np.array_equal(a, Encoding("fm", 100000, k=8, seed=3).initial(np.arange(100000)))
    assert (a != 0).all() and (a & (a - np.uint32(1)) == 0).all()  # one bit set per string
    low = (a == 1).mean()
    assert 0.48 < low < 0.52  # bit 0 with probability 1/2


def test_cli_diameter(tmp_path):
    src, dst = skewed_graph(150, 600, seed=2)
    p = tmp_path / "g.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write("# comment\n")
        for a, b in zip(src.tolist(), dst.tolist()):
            f.write(f"{a + 1000}\t{b + 1000}\n")
    out = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "diameter", str(p), "-n", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from scalefree.graph.io import read_edges
    from scalefree.graph.hadi import effective_diameter

    s, d, ids = read_edges(p)
    want = bfs_neighbourhood(s, d, len(ids))
    h, hi = effective_diameter(want)
    assert f"effective diameter (0.9): {h} (interpolated {hi:.3f})" in out.stdout, out.stdout
    assert f"{len(want) - 1}\t{int(want[-1])}" in out.stdout


def test_edges_out_of_range_raise(tmp_path):
    res = collect(spawn_ranks(1, r"""
import numpy as np, scalefree
from scalefree.graph.hadi import hadi
g = scalefree.init(timeout=30)
try:
    hadi(g, np.array([0, 5]), np.array([1, 2]), 4)
except ValueError as e:
    assert "[0, 4)" in str(e), e
    print("ok")
"""), 60)
    assert res[0].returncode == 0 and "ok" in res[0].stdout, res[0].stderr
