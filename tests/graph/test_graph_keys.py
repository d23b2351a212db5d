"""The load path on packed edge keys (``src << 32 | dst``): the key readers give the edges of
:func:`read_edge_share` in the same order for every input they take (text, CSV parts with
headers, gzip, Parquet row groups) over 1..4 ranks and None for the rest; the kernels (each
key into its owner's piece, sort + dedup in place into u32 columns) match numpy; and a
multi-rank load from each input, with ids past 2**32 on one rank only, leaves every distinct
edge on exactly one rank."""

import gzip

import numpy as np
import pytest

from ranks import collect, spawn_ranks
from scalefree import _native
from scalefree.errors import InvalidArgumentError
from scalefree.graph.io import edge_owner, read_edge_keys, read_edge_share

pa = pytest.importorskip("pyarrow", reason="pyarrow writes the Parquet test files")
pq = pytest.importorskip("pyarrow.parquet")


def random_edges(m, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, m), rng.integers(0, n, m)


def packed(src, dst):
    return (np.asarray(src, np.uint64) << np.uint64(32)) | np.asarray(dst, np.uint64)


def inputs(tmp_path, src, dst):
    """The same edges in every form the key readers take, and an .npz they do not."""
    files = {}
    lines = "".join(f"{a}\t{b}\n" for a, b in zip(src.tolist(), dst.tolist()))
    files["txt"] = tmp_path / "g.txt"
    files["txt"].write_text("# comment\n" + lines)
    files["gz"] = tmp_path / "g.txt.gz"
    with gzip.open(files["gz"], "wt") as f:
        f.write(lines)
    parts = tmp_path / "csv"
    parts.mkdir()
    for i, (a, b) in enumerate(zip(np.array_split(src, 3), np.array_split(dst, 3))):
        (parts / f"part-{i:05d}.csv").write_text("src,dst\n" + "".join(f"{x},{y}\n" for x, y in zip(a, b)))
    (parts / "_SUCCESS").write_text("")
    files["csv"] = parts
    files["parquet"] = tmp_path / "g.parquet"
    pq.write_table(pa.table({"src": src.astype(np.int32), "dst": dst.astype(np.int64)}), files["parquet"],
                   row_group_size=max(1, len(src) // 5))
    return files


@pytest.mark.parametrize("m", [1, 2, 7, 1000])
def test_keys_are_the_shares_packed(tmp_path, m):
    src, dst = random_edges(m, 1 << 31, seed=m)
    for name, path in inputs(tmp_path, src, dst).items():
        for p in (1, 2, 4):
            for r in range(p):
                s, d = read_edge_share(path, r, p)
                k = read_edge_keys(path, r, p)
                assert k is not None and k.dtype == np.uint64, (name, p, r)
                np.testing.assert_array_equal(k, packed(s, d), err_msg=f"{name} rank {r} of {p}")


def test_keys_none_past_32_bits_and_for_arrays(tmp_path):
    src, dst = random_edges(50, 100, seed=1)
    np.savez(tmp_path / "g.npz", src=src, dst=dst)
    assert read_edge_keys(tmp_path / "g.npz", 0, 1) is None
    dst[-1] = 1 << 32
    files = inputs(tmp_path, src, dst)
    for name, path in files.items():
        assert read_edge_keys(path, 0, 1) is None, name
    # Only the share that holds the large id is refused.
    assert read_edge_keys(files["txt"], 0, 2) is not None
    assert read_edge_keys(files["txt"], 1, 2) is None
    with pytest.raises(InvalidArgumentError):
        read_edge_keys(files["txt"], 0, 1, columns=["src", "dst"])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1001, 70001])
@pytest.mark.parametrize("ids", [1, 5, 1 << 12, 1 << 32])
def test_partition_and_sort_dedup_match_numpy(n, ids):
    rng = np.random.default_rng(n + ids)
    src, dst = rng.integers(0, ids, n, dtype=np.uint64), rng.integers(0, ids, n, dtype=np.uint64)
    keys = packed(src, dst)
    for size in (1, 3, 4, 300):
        counts, owners = _native.key_owners(keys, size)
        want_owner = edge_owner(src, dst, size)
        np.testing.assert_array_equal(counts, np.bincount(want_owner, minlength=size))
        if size <= 256:
            np.testing.assert_array_equal(owners, want_owner)
        pieces = [np.empty(c, np.uint64) for c in counts]
        _native.scatter_keys(keys, owners, pieces)
        for o in range(size):  # each owner's keys, in input order
            np.testing.assert_array_equal(pieces[o], keys[want_owner == o])
    want = np.unique(keys)
    k = keys.copy()
    m = _native.sort_dedup_keys(k, np.empty(n + 1, np.uint64))
    out = k.view(np.uint32)
    assert m == len(want)
    np.testing.assert_array_equal(out[:m], want >> np.uint64(32))
    np.testing.assert_array_equal(out[n:n + m], want & np.uint64(0xFFFFFFFF))
    got = _native.dedup_sorted_keys(np.sort(keys))
    np.testing.assert_array_equal(got[0], want >> np.uint64(32))
    np.testing.assert_array_equal(got[1], want & np.uint64(0xFFFFFFFF))
    if len(want) > 1:
        assert _native.dedup_sorted_keys(want[::-1].copy()) is None
    assert _native.keys_id_bound(keys) == (int(max(src.max(), dst.max())) + 1 if n else 0)


def test_kernels_refuse_misuse():
    k = np.arange(10, dtype=np.uint64)
    with pytest.raises(InvalidArgumentError, match="scratch"):
        _native.sort_dedup_keys(k, np.empty(9, np.uint64))
    with pytest.raises(InvalidArgumentError, match="overlap"):
        _native.sort_dedup_keys(k[:5], k[2:])
    with pytest.raises(InvalidArgumentError, match="uint64"):
        _native.key_owners(np.arange(4, dtype=np.int32), 2)
    with pytest.raises(InvalidArgumentError, match="size"):
        _native.key_owners(k, 0)
    counts, owners = _native.key_owners(k, 2)
    with pytest.raises(InvalidArgumentError, match="piece"):
        _native.scatter_keys(k, owners, [np.empty(counts[0] + 1, np.uint64), np.empty(counts[1] - 1, np.uint64)])
    with pytest.raises(InvalidArgumentError, match="overlap"):
        _native.scatter_keys(k, owners, [k[:counts[0]].copy(), np.empty(counts[1], np.uint64)][:1] * 2)
    assert _native.pack_edge_keys(np.array([1, 2]), np.array([3, 4])).tolist() == [1 << 32 | 3, 2 << 32 | 4]
    assert _native.pack_edge_keys(np.array([1 << 32]), np.array([0])) is None


LOAD = r"""
import sys, numpy as np, scalefree
from scalefree.graph.io import load_graph
g = scalefree.init(timeout=60)
for path, out in zip(sys.argv[1::2], sys.argv[2::2]):
    times = {}
    s, d, n_ids, edges = load_graph(g, path, times=times)
    np.save(out + f".{g.rank}.npy", np.stack([np.asarray(s, np.int64), np.asarray(d, np.int64)], 1))
    assert (s.dtype == np.uint32) == (n_ids <= 1 << 32), (s.dtype, n_ids)
    print(n_ids, edges, times["dedup_path"])
"""


@pytest.mark.parametrize("p", [1, 3])
def test_load_leaves_each_distinct_edge_on_one_rank(tmp_path, p):
    src, dst = random_edges(3000, 200, seed=p)
    src, dst = np.concatenate([src, src[:400]]), np.concatenate([dst, dst[:400]])  # duplicates
    files = inputs(tmp_path, src, dst)
    np.savez(tmp_path / "g.npz", src=src, dst=dst)  # columns, packed after the read
    files["npz"] = tmp_path / "g.npz"
    big = tmp_path / "big.txt"  # an id past 2**32 in the last rank's share only
    big_dst = dst.copy()
    big_dst[-1] = (1 << 32) + 5
    big.write_text("".join(f"{a} {b}\n" for a, b in zip(src.tolist(), big_dst.tolist())))
    files["big"] = big
    args = []
    for name, path in files.items():
        args += [str(path), str(tmp_path / f"got-{name}")]
    res = collect(spawn_ranks(p, LOAD, args=args), 120)
    for r in res:
        assert r.returncode == 0, r.stderr
    printed = res[0].stdout.splitlines()
    for (name, path), line in zip(files.items(), printed):
        want = np.unique(np.stack([src, big_dst if name == "big" else dst], 1), axis=0)
        out = tmp_path / f"got-{name}"
        got = np.concatenate([np.load(f"{out}.{r}.npy") for r in range(p)])
        assert len(got) == len(want), name  # each distinct edge on exactly one rank
        np.testing.assert_array_equal(np.unique(got, axis=0), want, err_msg=name)
        n_ids, edges, how = line.split()
        assert int(n_ids) == int(want.max()) + 1 and int(edges) == len(want) and how == "exchange", name
        for r in range(p):  # every rank's edges sorted, distinct
            e = np.load(f"{out}.{r}.npy")
            assert np.array_equal(np.unique(e, axis=0), e), name
    assert len(printed) == len(files)
