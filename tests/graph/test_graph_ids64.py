"""Ids past 2**32 through the graph package: every edge reader (text, gzip, Matrix Market,
.npy, .npz, part directories, shares at odd world sizes) keeps them as written, and HADI and
PageRank on them give what a simple reference gives (HADI: the same Flajolet-Martin
recurrence in plain numpy; PageRank: the same graph with compact ids)."""

import gzip
import subprocess
import sys

import numpy as np
import pytest

from ranks import collect, spawn_ranks

# Ids at and around the 32- and 31-bit boundaries and far past them, up to the readers' bound
# (2**62 - 1: what the edge readers accept; the largest here is written 1-based in .mtx).
BOUNDARY = np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**53 + 1,
                     2**61 + 5, 2**62 - 2], np.int64)


def huge_edges(m=300, seed=0):
    """``m`` edges over BOUNDARY plus random ids past 2**32, duplicates included."""
    rng = np.random.default_rng(seed)
    pool = np.concatenate([BOUNDARY, (1 << 32) + rng.integers(0, 1 << 50, 40)])
    e = pool[rng.integers(0, len(pool), (m, 2))]
    e = np.concatenate([np.stack([BOUNDARY, np.roll(BOUNDARY, 1)], 1), e])  # every boundary id
    return e[:, 0].copy(), e[:, 1].copy()


def _text(path, s, d):
    body = "# ids past 2**32\n" + "".join(f"{a}\t{b}\n" for a, b in zip(s.tolist(), d.tolist()))
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(body.encode()))
    else:
        path.write_text(body)


def _mtx(path, s, d):
    """Matrix Market, 1-based: entry (s + 1, d + 1) for edge s -> d."""
    top = int(max(s.max(), d.max())) + 1
    body = "%%MatrixMarket matrix coordinate pattern general\n% wide ids\n" + f"{top} {top} {len(s)}\n" \
        + "".join(f"{a + 1} {b + 1}\n" for a, b in zip(s.tolist(), d.tolist()))
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(body.encode()))
    else:
        path.write_text(body)


def test_edge_readers_keep_ids_past_2_to_the_32(tmp_path):
    from scalefree.graph.io import read_edge_list, read_edge_share, read_edges

    s, d = huge_edges()
    files = {}
    for name in ("g.txt", "g.txt.gz"):
        _text(tmp_path / name, s, d)
        files[name] = (s, d)
    for name in ("g.mtx", "g.mtx.gz"):
        _mtx(tmp_path / name, s, d)
        files[name] = (s + 1, d + 1)  # ids as written, 1-based (2**62 - 1 at the top)
    np.save(tmp_path / "g.npy", np.stack([s, d], 1))
    files["g.npy"] = (s, d)
    np.savez(tmp_path / "g.npz", src=s, dst=d)
    files["g.npz"] = (s, d)
    parts = tmp_path / "parts"
    parts.mkdir()
    for k in range(3):
        _text(parts / f"part-{k}.txt", s[k::3], d[k::3])
    files["parts"] = (np.concatenate([s[k::3] for k in range(3)]), np.concatenate([d[k::3] for k in range(3)]))
    for name, (ws, wd) in files.items():
        p = tmp_path / name
        got = read_edge_share(p, 0, 1)
        assert got[0].dtype == np.int64, name
        np.testing.assert_array_equal(got[0], ws, err_msg=name)
        np.testing.assert_array_equal(got[1], wd, err_msg=name)
        for size in (2, 3, 5):  # shares of odd and even world sizes: every edge exactly once
            shares = [read_edge_share(p, r, size) for r in range(size)]
            have = sorted(zip(np.concatenate([a for a, _ in shares]).tolist(), np.concatenate([b for _, b in shares]).tolist()))
            assert have == sorted(zip(ws.tolist(), wd.tolist())), (name, size)
        cs, cd, ids = read_edges(p)  # compact, duplicates dropped
        assert sorted(zip(ids[cs].tolist(), ids[cd].tolist())) == sorted(set(zip(ws.tolist(), wd.tolist()))), name
    ls, ld, ids = read_edge_list(tmp_path / "g.txt")  # compact, duplicates kept
    np.testing.assert_array_equal(ids[ls], s)
    np.testing.assert_array_equal(ids[ld], d)


def test_edge_reader_refuses_ids_past_its_bound(tmp_path):
    from scalefree.errors import DataError
    from scalefree.graph.io import read_edge_share

    p = tmp_path / "g.txt"
    p.write_text(f"1 2\n3 {2**62 - 1}\n3 {2**62}\n")
    with pytest.raises(DataError, match=r"g\.txt:3: vertex id .* too large"):
        read_edge_share(p, 0, 1)


HADI = r"""
import json, sys
import numpy as np, scalefree
from scalefree.graph.hadi import hadi
g = scalefree.init(timeout=60)
z = np.load(sys.argv[1])
s, d = z["src"][g.rank::g.size], z["dst"][g.rank::g.size]
nf, enc, _ = hadi(g, s, d, int(z["n"]), method="fm", k=16, seed=3, isolated=False)
print(json.dumps(nf))
"""


def fm_reference(s, d, k=16, seed=3):
    """N(h) by the FM recurrence on the whole graph in one process: b_{h+1}(v) = b_h(v) | OR of
    b_h(u) over edges v -> u, vertices = ids on an edge, until no string changes."""
    from scalefree.graph.hadi import Encoding

    ids, inv = np.unique(np.concatenate([s, d]), return_inverse=True)
    ls, ld = inv[: len(s)], inv[len(s):]
    enc = Encoding("fm", int(ids.max()) + 1, k, seed)
    b = enc.initial(ids)
    nf = [float(len(ids))]  # N(0): the vertex count, exactly (not an estimate)
    while True:
        nb = b.copy()
        np.bitwise_or.at(nb, ls, b[ld])
        if (nb == b).all():
            return nf
        b = nb
        nf.append(enc.count(b).sum())


def _run_on(tmp_path, ranks, script, s, d):
    """`script` on `ranks` ranks over the edges (s, d), saved as an .npz (its argv[1])."""
    f = tmp_path / "g.npz"
    np.savez(f, src=s, dst=d, n=int(max(s.max(), d.max())) + 1)
    res = collect(spawn_ranks(ranks, script, args=[str(f)]), 120)
    for r in res:
        assert r.returncode == 0, r.stderr[-3000:]
    return res


@pytest.mark.parametrize("ranks", [1, 3])
def test_hadi_on_ids_past_2_to_the_32_matches_the_reference(tmp_path, ranks):
    s, d = huge_edges(200, seed=4)
    got = {r.stdout.strip().splitlines()[-1] for r in _run_on(tmp_path, ranks, HADI, s, d)}
    assert len(got) == 1, got
    import json

    np.testing.assert_allclose(json.loads(got.pop()), fm_reference(s, d), rtol=1e-12)


def test_cli_pagerank_and_diameter_on_ids_past_2_to_the_32(tmp_path):
    """The CLI from a text file with ids past 2**32 (2 ranks): PageRank's scores are those of
    the same graph with compact ids; the diameter's N(h) is the reference recurrence's."""
    s, d = huge_edges(250, seed=5)
    ids, inv = np.unique(np.concatenate([s, d]), return_inverse=True)
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    _text(big, s, d)
    _text(small, inv[: len(s)], inv[len(s):])
    tops = []
    for f in (small, big):
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(f), "-n", "2",
                            "--top", "10", "--tol", "1e-12"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        tops.append([ln.split("\t") for ln in p.stdout.splitlines()[1:]])
    assert [int(v) for v, _ in tops[1]] == [int(ids[int(v)]) for v, _ in tops[0]]
    np.testing.assert_allclose([float(x) for _, x in tops[1]], [float(x) for _, x in tops[0]], rtol=1e-9)
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "graph", "diameter", str(big), "-n", "2",
                        "--method", "fm", "-k", "16", "--fm-seed", "3"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    nf = [float(ln.split("\t")[1]) for ln in lines[lines.index("hop\tN(h)") + 1:]]
    dedup = np.unique(np.stack([s, d], 1), axis=0)
    np.testing.assert_allclose(nf, fm_reference(dedup[:, 0], dedup[:, 1]), rtol=1e-5)


SLOTS = r"""
import json, sys, tempfile
import numpy as np, scalefree
import scalefree.graph.pagerank as pr
g = scalefree.init(timeout=60)
z = np.load(sys.argv[1])
s, d = z["src"], z["dst"]
mine = np.arange(len(s)) % g.size == g.rank
out = {}
for name, narrow, budget in [("u32", 2**32, None), ("u64", 1, None), ("u64-flash", 1, "64K")]:
    pr.NARROW_SLOTS = narrow  # 1: every rank numbers its slots in uint64, as past 2**32 slots
    p = pr.SparsePageRank(g, s[mine], d[mine], n=int(z["n"]), isolated=False, memory_budget=budget,
                          flash_dir=tempfile.gettempdir())
    for _ in range(15):
        p.step()
    p.finish()
    out[name] = [p.owned.tolist(), p.scores.tolist(), p.csr.size_bytes, p.csr.nnz, p.csr.on_flash]
print(json.dumps(out))
"""


@pytest.mark.parametrize("ranks", [1, 3])
def test_pagerank_slots_past_32_bits_are_the_narrow_ones(tmp_path, ranks):
    """A rank with more than 2**32 out or in slots numbers them in uint64 (8 bytes per edge)
    instead of refusing: forced on a small graph with ids past 2**32 (NARROW_SLOTS = 1), in
    memory and on flash, the scores are the uint32 run's bit for bit and the matrix is 8
    bytes per edge instead of 4."""
    import json

    for r in _run_on(tmp_path, ranks, SLOTS, *huge_edges(300, seed=6)):
        got = json.loads(r.stdout.strip().splitlines()[-1])
        narrow, wide, flash = got["u32"], got["u64"], got["u64-flash"]
        assert narrow[:2] == wide[:2] == flash[:2]  # owned ids and scores, bit for bit
        nnz = narrow[3]
        assert wide[3] == flash[3] == nnz and flash[4] and not wide[4]
        assert wide[2] - narrow[2] == 4 * nnz  # 8 bytes per edge instead of 4
