"""Partitioned graph input: every rank reads only its share of an edge file (text, gzip,
npy, npz members mapped or streamed, scipy matrices, part directories, globs), every edge
is read exactly once over P = 1..5 ranks, and the owners' deduplication leaves each
distinct edge on exactly one rank."""

import gzip
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from ranks import run_ranks
from scalefree.graph.io import GraphFormatError, edge_owner, read_edge_share


def random_edges(m, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, m), rng.integers(0, n, m)


def write_text(path, src, dst, crlf_every=3, comments=True, final_newline=True):
    lines = []
    if comments:
        lines.append("# a comment")
    for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
        if comments and i % 17 == 5:
            lines.append("% another comment")
            lines.append("")
        sep = "\t" if i % 2 else "  "
        lines.append(f"{a}{sep}{b}" + ("\r" if crlf_every and i % crlf_every == 0 else ""))
    text = "\n".join(lines) + ("\n" if final_newline else "")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        f.write(text)


def shares(path, p):
    got = [read_edge_share(path, r, p) for r in range(p)]
    return np.concatenate([s for s, _ in got]), np.concatenate([d for _, d in got])


def same_multiset(a, b):
    return sorted(zip(a[0].tolist(), a[1].tolist())) == sorted(zip(b[0].tolist(), b[1].tolist()))


@pytest.mark.parametrize("m", [0, 1, 2, 7, 333])
def test_every_edge_once_in_every_form(tmp_path, m):
    src, dst = random_edges(m, 50, seed=m)
    files = {}
    if m:  # an empty text file is an error (tested below); the array forms may be empty
        files["txt"] = tmp_path / "g.txt"
        write_text(files["txt"], src, dst, final_newline=m % 2 == 0)
        files["gz"] = tmp_path / "g.txt.gz"
        write_text(files["gz"], src, dst)
    files["npy"] = tmp_path / "g.npy"
    np.save(files["npy"], np.stack([src, dst], 1).astype(np.int32))
    files["npz"] = tmp_path / "g.npz"
    np.savez(files["npz"], src=src, dst=dst)
    files["npzc"] = tmp_path / "gc.npz"
    np.savez_compressed(files["npzc"], src=src, dst=dst)
    files["coo"] = tmp_path / "coo.npz"
    sp.save_npz(files["coo"], sp.coo_matrix((np.ones(m), (src, dst)), shape=(50, 50)))
    for name, f in files.items():
        for p in range(1, 6):
            assert same_multiset(shares(f, p), (src, dst)), (name, p)


def test_csr_npz_shares_hold_each_stored_entry_once(tmp_path):
    src, dst = random_edges(500, 40, seed=3)
    a = sp.csr_matrix((np.ones(500), (src, dst)), shape=(40, 40))
    a.sum_duplicates()
    f = tmp_path / "csr.npz"
    sp.save_npz(f, a, compressed=False)
    want = a.nonzero()
    for p in range(1, 6):
        assert same_multiset(shares(f, p), want), p


def test_part_directory_and_glob_round_robin(tmp_path):
    src, dst = random_edges(400, 60, seed=4)
    d = tmp_path / "parts"
    d.mkdir()
    cuts = [0, 0, 90, 90, 250, 400]  # empty parts too
    for i in range(len(cuts) - 1):
        sl = slice(cuts[i], cuts[i + 1])
        if cuts[i] == cuts[i + 1]:
            np.savez(d / f"part-{i:05d}.npz", src=src[sl], dst=dst[sl])
        else:
            write_text(d / f"part-{i:05d}", src[sl], dst[sl])
    (d / "_SUCCESS").write_text("")
    for p in range(1, 6):
        assert same_multiset(shares(d, p), (src, dst)), p
        assert same_multiset(shares(str(d / "part-*"), p), (src, dst)), p
    # Ranks take parts round-robin: rank r reads parts r, r + p, ...
    s0, _ = read_edge_share(d, 1, 2)
    assert len(s0) == (90 - 0) + (250 - 90)  # parts 1 and 3


def test_mtx_shares_keep_ids_as_written_and_symmetric_files_mirror(tmp_path):
    f = tmp_path / "g.mtx"
    f.write_text("%%MatrixMarket matrix coordinate pattern symmetric\n% c\n5 5 4\n2 1\n3 1\n4 4\n5 2\n")
    want = ([2, 3, 4, 5, 1, 1, 2], [1, 1, 4, 2, 2, 3, 5])
    for p in range(1, 5):
        got = shares(f, p)
        assert same_multiset(got, (np.array(want[0]), np.array(want[1]))), p


def test_errors_name_the_file_and_line_inside_a_share(tmp_path):
    f = tmp_path / "bad.txt"
    lines = [f"{i} {i + 1}" for i in range(100)]
    lines[77] = "77 x"
    f.write_text("\n".join(lines) + "\n")
    # Whichever rank's share holds line 78 raises; the others read their lines.
    raised = []
    for r in range(4):
        try:
            read_edge_share(f, r, 4)
        except ValueError as e:
            raised.append(str(e))
    assert len(raised) == 1 and raised[0].startswith(f"{f}:78:") and "'x'" in raised[0], raised
    with pytest.raises(FileNotFoundError, match="missing"):
        read_edge_share(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="no file matches"):
        read_edge_share(str(tmp_path / "nothing-*"))
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 3), np.int64))
    with pytest.raises(GraphFormatError, match=r"shape \(edges, 2\)"):
        read_edge_share(bad)
    neg = tmp_path / "neg.npz"
    np.savez(neg, src=np.array([1, -2]), dst=np.array([0, 1]))
    with pytest.raises(GraphFormatError, match="negative"):
        read_edge_share(neg)


def test_edge_owner_spreads_and_is_stable():
    src, dst = random_edges(100000, 1 << 20, seed=5)
    o = edge_owner(src, dst, 5)
    assert np.array_equal(o, edge_owner(src.copy(), dst.copy(), 5))
    counts = np.bincount(o, minlength=5)
    assert counts.min() > 0.9 * counts.mean(), counts


DEDUP = r"""
import sys, numpy as np, scalefree
from scalefree.graph.io import load_graph
g = scalefree.init(timeout=60)
s, d, n_ids, edges = load_graph(g, sys.argv[1])
np.save(sys.argv[2] + f".{g.rank}.npy", np.stack([np.asarray(s, np.int64), np.asarray(d, np.int64)], 1))
print(n_ids, edges)
"""


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_owners_drop_duplicates_across_parts(tmp_path, p):
    src, dst = random_edges(3000, 300, seed=p)
    src = np.concatenate([src, src[:500]])  # duplicates, landing in other parts
    dst = np.concatenate([dst, dst[:500]])
    d = tmp_path / "parts"
    d.mkdir()
    for i, (a, b) in enumerate(zip(np.array_split(src, 7), np.array_split(dst, 7))):
        write_text(d / f"part-{i:05d}", a, b)
    out = tmp_path / "got"
    from ranks import spawn_ranks, collect

    res = collect(spawn_ranks(p, DEDUP, args=[str(d), str(out)]), 120)
    for r in res:
        assert r.returncode == 0, r.stderr
    got = np.concatenate([np.load(f"{out}.{r}.npy") for r in range(p)])
    want = np.unique(np.stack([src, dst], 1), axis=0)
    assert len(got) == len(want)  # each distinct edge on exactly one rank
    assert np.array_equal(np.unique(got, axis=0), want)
    n_ids, edges = res[0].stdout.split()
    assert int(n_ids) == int(max(src.max(), dst.max())) + 1 and int(edges) == len(want)


def test_cli_pagerank_same_top_from_every_form(tmp_path):
    from scalefree.graph.rmat import write_rmat

    outs = []
    for name, kw in (("g.npz", {}), ("g.txt", {}), ("parts", {"parts": 3})):
        f = tmp_path / name
        write_rmat(f, 10, 20000, seed=7, progress=False, **kw)
        for n in (1, 3):
            p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(f), "-n", str(n),
                                "--top", "5", "--tol", "1e-12"], capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stderr
            outs.append([ln.split()[-2:] for ln in p.stdout.splitlines()[1:]])
    for o in outs[1:]:
        assert [v for v, _ in o] == [v for v, _ in outs[0]]
        np.testing.assert_allclose([float(x) for _, x in o], [float(x) for _, x in outs[0]], rtol=1e-9)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_pagerank_with_a_sparse_id_space_matches_the_compact_graph(tmp_path, n):
    """Ids spread over 2**40 (far more ids than edges per rank) take the set-up path that
    holds nothing over the id space; the scores equal those of the same graph renumbered."""
    from scalefree.graph.rmat import rmat_edges

    s, d, ids = rmat_edges(9, 6000, seed=3)
    spread = np.random.default_rng(1).choice(1 << 40, len(ids), replace=False)
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    write_text(big, spread[s], spread[d], comments=False)
    write_text(small, s, d, comments=False)
    tops = []
    for f in (small, big):
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(f), "-n", str(n),
                            "--top", "8", "--tol", "1e-12"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        tops.append([ln.split("\t") for ln in p.stdout.splitlines()[1:]])
        assert p.stdout.startswith(f"{len(ids)} vertices, {len(s)} edges"), p.stdout
    np.testing.assert_allclose([float(x) for _, x in tops[1]], [float(x) for _, x in tops[0]], rtol=1e-9)
    assert [int(v) for v, _ in tops[1]] == [int(spread[int(v)]) for v, _ in tops[0]]
