"""Sparse-allreduce PageRank agrees with networkx (stored reference, and live when
networkx is installed) on wiki-Vote, and with a dense numpy PageRank on random graphs."""

import gzip
from pathlib import Path

import numpy as np
import pytest

from ranks import run_ranks

WIKI = Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki-vote" / "wiki-Vote.txt"
REF = Path(__file__).resolve().parents[1] / "data" / "wiki_vote_pagerank_networkx.txt.gz"

RUN = r"""
import numpy as np, scalefree, sys
from scalefree.graph.io import read_edges, partition_edges
from scalefree.graph.pagerank import pagerank, gather_scores
g = scalefree.init(timeout=60)
src, dst, ids = read_edges(sys.argv[1])
n = len(ids)
s, d = partition_edges(src, dst, g.rank, g.size)
owned, r, it, _ = pagerank(g, s, d, n, tol=1e-13)
allr = gather_scores(g, owned, r, n)
if g.rank == 0:
    np.save(sys.argv[2], np.stack([ids.astype(np.float64), allr]))
"""


def networkx_reference() -> dict[int, float]:
    """networkx's PageRank of wiki-Vote, stored: vertex id -> score."""
    ref = {}
    with gzip.open(REF, "rt") as f:
        for line in f:
            if not line.startswith("#"):
                k, v = line.split()
                ref[int(k)] = float(v)
    return ref


def _run(n, edges, out):
    from ranks import collect, spawn_ranks

    res = collect(spawn_ranks(n, RUN, args=[str(edges), str(out)]), 120)
    for r in res:
        assert r.returncode == 0, r.stderr[-3000:]
    return np.load(out)


@pytest.mark.skipif(not WIKI.exists(), reason="../shared/data/wiki-vote not present")
@pytest.mark.parametrize("n", [1, 3])
def test_wiki_vote_matches_networkx(tmp_path, n):
    ids, r = _run(n, WIKI, tmp_path / "r.npy")
    ref = networkx_reference()
    want = np.array([ref[int(i)] for i in ids])
    assert len(ref) == len(ids)
    assert np.abs(r - want).max() < 1e-6


@pytest.mark.skipif(not WIKI.exists(), reason="../shared/data/wiki-vote not present")
def test_wiki_vote_live_networkx(tmp_path):
    nx = pytest.importorskip("networkx")
    G = nx.read_edgelist(str(WIKI), create_using=nx.DiGraph, nodetype=int, comments="#")
    pr = nx.pagerank(G, alpha=0.85, tol=1e-12, max_iter=1000)
    ids, r = _run(2, WIKI, tmp_path / "r.npy")
    assert np.abs(r - np.array([pr[int(i)] for i in ids])).max() < 1e-6


def dense_pagerank(src, dst, n, d=0.85):
    deg = np.bincount(src, minlength=n).astype(float)
    r = np.full(n, 1.0 / n)
    for _ in range(1000):
        w = np.where(deg[src] > 0, r[src] / np.maximum(deg[src], 1), 0)
        y = np.bincount(dst, weights=w, minlength=n)
        new = (1 - d) / n + d * (y + r[deg == 0].sum() / n)
        if np.abs(new - r).sum() < 1e-14:
            return new
        r = new
    return r


@pytest.mark.parametrize("n", [2, 4])
def test_random_graph_gzip_matches_dense(tmp_path, n):
    rng = np.random.default_rng(n)
    e = np.unique(rng.integers(0, 300, (2000, 2)) ** 2 // 300, axis=0)  # skewed, with dangling ids
    p = tmp_path / "g.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write("# a comment\n")
        for a, b in e:
            f.write(f"{a}\t{b}\n")
    ids, r = _run(n, p, tmp_path / "r.npy")
    uid, inv = np.unique(e, return_inverse=True)
    inv = inv.reshape(-1, 2)
    want = dense_pagerank(inv[:, 0], inv[:, 1], len(uid))
    np.testing.assert_array_equal(ids, uid)
    assert np.abs(r - want).max() < 1e-9


def test_rmat_generator_is_seeded_skewed_and_readable(tmp_path):
    from scalefree.graph.io import read_edges
    from scalefree.graph.rmat import write_rmat

    a, b = tmp_path / "a.txt.gz", tmp_path / "b.txt.gz"
    write_rmat(a, 12, 20000, seed=3, block=7000, progress=False)
    write_rmat(b, 12, 20000, seed=3, block=7000, progress=False)
    assert gzip.open(a).read() == gzip.open(b).read()
    src, dst, ids = read_edges(a)
    assert ids.max() < 4096
    deg = np.bincount(src)
    assert deg.max() > 20 * deg[deg > 0].mean() / 4  # heavy tail
    ids2, r = _run(2, a, tmp_path / "r.npy")
    np.testing.assert_array_equal(ids2, ids)
    want = dense_pagerank(src, dst, len(ids))
    assert np.abs(r - want).max() < 1e-9


@pytest.mark.parametrize("n,m", [(0, 0), (1, 0), (1, 3), (7, 3), (50, 1000), (1000, 50)])
def test_compact_ids_equals_unique(n, m):
    from scalefree.graph.io import compact_ids

    a = np.random.default_rng(m).integers(0, max(n, 1), m) if n else np.zeros(0, np.int64)
    u, inv = compact_ids(a, n)
    wu, winv = np.unique(a, return_inverse=True)
    np.testing.assert_array_equal(u, wu)
    np.testing.assert_array_equal(inv, winv.reshape(-1))


def test_read_edges_matrix_market_and_npz(tmp_path):
    from scalefree.graph.io import read_edges

    snap = tmp_path / "g.txt"
    snap.write_text("1\t2\n2\t3\n3\t1\n3\t5\n1\t2\n")
    want = read_edges(snap)
    mtx = tmp_path / "g.mtx"
    mtx.write_text("%%MatrixMarket matrix coordinate real general\n% c\n5 5 5\n1 2 1.0\n2 3 1\n3 1 2\n3 5 1\n1 2 1\n")
    mgz = tmp_path / "g.mtx.gz"
    with gzip.open(mgz, "wt") as f:
        f.write("%%MatrixMarket matrix coordinate pattern general\n5 5 4\n1 2\n2 3\n3 1\n3 5\n")
    npz = tmp_path / "g.npz"
    np.savez(npz, src=np.array([1, 2, 3, 3]), dst=np.array([2, 3, 1, 5]))
    for p in (mtx, mgz, npz):
        got = read_edges(p)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=str(p))
    sp = pytest.importorskip("scipy.sparse")
    m = sp.csr_matrix((np.ones(4), ([1, 2, 3, 3], [2, 3, 1, 5])), shape=(6, 6))
    for fmt in ("csr", "csc", "coo"):
        f = tmp_path / f"m_{fmt}.npz"
        sp.save_npz(f, m.asformat(fmt))
        got = read_edges(f)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=fmt)
    sym = tmp_path / "s.mtx"
    sym.write_text("%%MatrixMarket matrix coordinate pattern symmetric\n3 3 2\n2 1\n3 3\n")
    s, d, ids = read_edges(sym)
    assert sorted(zip(ids[s].tolist(), ids[d].tolist())) == [(1, 2), (2, 1), (3, 3)]


def test_read_edges_bad_files_say_why(tmp_path):
    from scalefree.graph.io import GraphFormatError, read_edges

    p = tmp_path / "a.mtx"
    p.write_text("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n")
    with pytest.raises(GraphFormatError, match="coordinate"):
        read_edges(p)
    p.write_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 2 1\n")
    with pytest.raises(GraphFormatError, match="expected 2 entries"):
        read_edges(p)
    p.write_text("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 3\n")
    with pytest.raises(GraphFormatError, match="outside the 2 x 2"):
        read_edges(p)
    q = tmp_path / "b.npz"
    np.savez(q, a=np.arange(3))
    with pytest.raises(GraphFormatError, match="'src' and 'dst'"):
        read_edges(q)
    np.savez(q, src=np.array([0, -1]), dst=np.array([1, 1]))
    with pytest.raises(GraphFormatError, match="negative"):
        read_edges(q)
    with pytest.raises(FileNotFoundError):
        read_edges(tmp_path / "missing.mtx")


@pytest.mark.parametrize("edges", [[(0, 1)], [(0, 0)], [(0, 1), (1, 2), (2, 0)], [(2, 1), (0, 1), (1, 0), (3, 1), (4, 3)]])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_tiny_graphs_with_idle_ranks_match_dense(tmp_path, n, edges):
    # 1, 3 or 5 edges over up to 4 ranks: some ranks hold no edge at all.
    e = np.array(edges)
    p = tmp_path / "g.txt"
    p.write_text("".join(f"{a} {b}\n" for a, b in e))
    ids, r = _run(n, p, tmp_path / "r.npy")
    uid, inv = np.unique(e, return_inverse=True)
    inv = inv.reshape(-1, 2)
    np.testing.assert_array_equal(ids, uid)
    assert np.abs(r - dense_pagerank(inv[:, 0], inv[:, 1], len(uid))).max() < 1e-9


TABLE_RUN = r"""
import numpy as np, scalefree, sys
from scalefree.graph.pagerank import pagerank, gather_scores
kind, path, out = sys.argv[1:]
g = scalefree.init(timeout=60)
e = np.load(path)
e = e[len(e) * g.rank // g.size: len(e) * (g.rank + 1) // g.size]
if kind == "pandas":
    import pandas as pd
    table = pd.DataFrame({"label": ["x"] * len(e), "to": e[:, 1], "from": e[:, 0]})
elif kind == "pyarrow":
    import pyarrow as pa
    table = pa.table({"to": e[:, 1].astype(np.uint32), "from": e[:, 0].astype(np.int16)})
elif kind == "scipy":
    import scipy.sparse as sp
    table = sp.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(e.max() + 1,) * 2)
else:
    table = np.ascontiguousarray(e)
columns = ["from", "to"] if kind in ("pandas", "pyarrow") else None
owned, r, it, _ = pagerank(g, table, columns=columns, tol=1e-13)  # n: the largest id + 1
got = gather_scores(g, owned, r, 32)
if g.rank == 0:
    np.save(out, got)
"""


@pytest.mark.parametrize("kind", ["numpy", "pandas", "pyarrow", "scipy"])
@pytest.mark.parametrize("n", [1, 3])
def test_pagerank_takes_tables(tmp_path, kind, n):
    """pagerank(group, table) with the table's columns by name (pandas, pyarrow: the Arrow
    buffers viewed, scalefree._tables) or position (2-D array, scipy COO) equals the dense
    reference; n defaults to the largest id + 1."""
    pytest.importorskip({"numpy": "numpy", "pandas": "pandas", "pyarrow": "pyarrow", "scipy": "scipy"}[kind])
    from ranks import collect, spawn_ranks

    rng = np.random.default_rng(7)
    e = np.unique(rng.integers(0, 32, (150, 2)), axis=0)
    e = e[rng.permutation(len(e))]
    np.save(tmp_path / "e.npy", e)
    res = collect(spawn_ranks(n, TABLE_RUN, args=[kind, str(tmp_path / "e.npy"), str(tmp_path / "r.npy")]), 120)
    for r in res:
        assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(tmp_path / "r.npy")
    want = np.zeros(32)
    uid = np.unique(e)
    idx = np.searchsorted(uid, e)
    want[uid] = dense_pagerank(idx[:, 0], idx[:, 1], len(uid))
    assert np.abs(got - want).max() < 1e-9
