"""The native set-up kernels of a partitioned graph load (``_native.owner_partition``,
``sort_dedup_pairs``, ``degree_counts``, ``PageRankCsr.from_edges``) against the numpy code
they replace."""

import numpy as np
import pytest

from scalefree import _native
from scalefree.errors import InvalidArgumentError
from scalefree.graph.io import edge_owner

SIZES = [0, 1, 2, 7, 1001, 50_000]


def _edges(rng, n, top, dtype):
    return rng.integers(0, top, n).astype(dtype), rng.integers(0, top, n).astype(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.uint32, np.int64, np.uint64])
def test_owner_partition_matches_numpy(n, dtype):
    rng = np.random.default_rng(n)
    src, dst = _edges(rng, n, 1 << 22 if n % 2 else 50, dtype)
    for size in range(1, 6):
        owner = edge_owner(src, dst, size)
        order = np.argsort(owner, kind="stable")
        want = np.stack([src, dst], axis=1)[order]
        for out in ["uint32", "int64", "uint64"]:
            pairs, counts = _native.owner_partition(src, dst, size, out)
            assert pairs.dtype == np.dtype(out) and pairs.shape == (n, 2)
            np.testing.assert_array_equal(pairs, want.astype(out))
            assert counts.dtype == np.int64
            np.testing.assert_array_equal(counts, np.bincount(owner, minlength=size))


def test_owner_partition_wide_ids_and_errors():
    src = np.array([1 << 40, 3, 5], np.int64)
    dst = np.array([7, 1 << 33, 5], np.int64)
    pairs, counts = _native.owner_partition(src, dst, 3, "int64")
    owner = edge_owner(src, dst, 3)
    np.testing.assert_array_equal(pairs, np.stack([src, dst], 1)[np.argsort(owner, kind="stable")])
    np.testing.assert_array_equal(counts, np.bincount(owner, minlength=3))
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        _native.owner_partition(src, dst, 3)
    with pytest.raises(InvalidArgumentError):
        _native.owner_partition(src, dst[:2], 3)
    with pytest.raises(InvalidArgumentError):
        _native.owner_partition(src, dst.astype(np.uint64), 3)
    with pytest.raises(InvalidArgumentError):
        _native.owner_partition(src.astype(np.float64), dst.astype(np.float64), 3)
    with pytest.raises(InvalidArgumentError):
        _native.owner_partition(src, dst, 0)
    with pytest.raises(InvalidArgumentError):
        _native.owner_partition(src, dst, 3, "int32")


@pytest.mark.parametrize("n", SIZES + [300_000])
@pytest.mark.parametrize("top", [1, 40, 1 << 22, 1 << 32])
def test_sort_dedup_pairs_matches_numpy(n, top):
    rng = np.random.default_rng(n + top)
    pairs = np.stack(_edges(rng, n, top, np.uint64), axis=1)
    pairs = np.concatenate([pairs, pairs[: n // 3]])  # duplicates for sure
    want = np.unique(pairs, axis=0) if len(pairs) else np.zeros((0, 2), np.uint64)
    for dtype in [np.uint32, np.int64, np.uint64]:
        for p in [pairs.astype(dtype), pairs.astype(dtype).reshape(-1)]:
            s, d = _native.sort_dedup_pairs(p)
            assert s.dtype == d.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(s, want[:, 0].astype(dtype))
            np.testing.assert_array_equal(d, want[:, 1].astype(dtype))


def test_sort_dedup_pairs_wide_ids_and_errors():
    rng = np.random.default_rng(1)
    for top in [(1 << 40, 1 << 20), (1 << 62, 1 << 62)]:
        pairs = np.stack([rng.integers(0, top[0], 5000), rng.integers(0, top[1], 5000)], 1).astype(np.int64)
        pairs = np.concatenate([pairs, pairs[::2]])
        s, d = _native.sort_dedup_pairs(pairs)
        want = np.unique(pairs, axis=0)
        np.testing.assert_array_equal(np.stack([s, d], 1), want)
    with pytest.raises(InvalidArgumentError):
        _native.sort_dedup_pairs(np.arange(3, dtype=np.uint32))
    with pytest.raises(InvalidArgumentError):
        _native.sort_dedup_pairs(np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("n", SIZES)
def test_degree_counts_matches_bincount(n):
    rng = np.random.default_rng(n)
    nv = 1 + n // 3
    for dtype in [np.uint32, np.int64]:
        src, dst = _edges(rng, n, nv, dtype)
        got = _native.degree_counts(src, dst, nv)
        want = np.concatenate([np.bincount(src, minlength=nv), np.bincount(dst, minlength=nv)]).astype(np.float64)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)
    with pytest.raises(InvalidArgumentError, match="edge 1"):
        _native.degree_counts(np.array([0, 5], np.uint32), np.array([0, 0], np.uint32), 5)


@pytest.mark.parametrize("n", SIZES + [300_000])
def test_degree_order_matches_stable_argsort(n):
    rng = np.random.default_rng(n)
    total = (rng.integers(0, 8, n) * rng.integers(0, 1 << 12, n)).astype(np.float64)
    np.testing.assert_array_equal(_native.degree_order(total), np.argsort(-total, kind="stable"))
    if n:
        total[n // 2] = 0.5  # not a count: the comparison sort
        total[0] = 2.0**40
        np.testing.assert_array_equal(_native.degree_order(total), np.argsort(-total, kind="stable"))
    with pytest.raises(InvalidArgumentError):
        _native.degree_order(np.ones(3, np.float32))


def degree_keys(src, dst, n, size):
    """Keys as vertex_keys hands them out: ids by falling degree, every size-th to one of
    the size key ranges [r * width, r * width + count). Returns (key uint32, order, nkeys)."""
    total = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    order = np.argsort(-total, kind="stable")
    width = -(-n // size)
    g = np.arange(n, dtype=np.uint32)
    key = np.empty(n, np.uint32)
    key[order] = (g % np.uint32(size)) * np.uint32(width) + g // np.uint32(size)
    return key, order, size * width


def _numpy_local(src, dst, key, flow_key, own_lo_key, n_own, nkeys):
    """The marker/slot block of SparsePageRank.__init__ as it was in numpy."""
    sk, dk = key[src], key[dst]
    mark = np.zeros(nkeys + 1, np.bool_)
    mark[dk] = True
    mark[flow_key] = True
    out_keys = np.flatnonzero(mark)
    mark[:] = False
    mark[sk] = True
    mark[own_lo_key: own_lo_key + n_own] = True
    mark[flow_key] = True
    in_keys = np.flatnonzero(mark)
    slot = np.empty(nkeys + 1, np.uint32)
    slot[out_keys] = np.arange(len(out_keys), dtype=np.uint32)
    rows = slot[dk]
    slot[in_keys] = np.arange(len(in_keys), dtype=np.uint32)
    cols = slot[sk]
    return out_keys, in_keys, rows, cols


@pytest.mark.parametrize("n_edges", SIZES)
@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("dedup", [False, True])
def test_from_edges_matches_numpy(n_edges, size, dedup):
    rng = np.random.default_rng(n_edges * 10 + size)
    n = max(1, n_edges // 4)
    src, dst = _edges(rng, n_edges, n, np.uint32)
    if dedup:
        src, dst = _native.sort_dedup_pairs(np.stack([src, dst], 1))
    key, order, nkeys = degree_keys(src, dst, n, size)
    width = nkeys // size
    for me in range(size):
        n_own = len(order[me::size])
        out_keys, in_keys, rows, cols = _numpy_local(src, dst, key, nkeys, me * width, n_own, nkeys)
        for dtype in ["float64", "float32"]:
            want = _native.PageRankCsr(rows, cols, len(out_keys) - 1, len(in_keys), dtype)
            for ids in [np.uint32, np.int64]:
                csr, ok, ik = _native.PageRankCsr.from_edges(src.astype(ids), dst.astype(ids), key, nkeys, me * width,
                                                             n_own, dtype)
                assert ok.dtype == ik.dtype == np.int64
                np.testing.assert_array_equal(ok, out_keys)
                np.testing.assert_array_equal(ik, in_keys)
                assert csr.nnz == want.nnz == len(src)
                # Same matrix, same column order: the products agree bit for bit.
                got_in = rng.random(len(in_keys)).astype(dtype)
                inv = rng.random(len(in_keys)).astype(dtype)
                y1 = np.zeros(len(out_keys), dtype)
                y2 = np.zeros(len(out_keys), dtype)
                t1 = csr.step(got_in, inv, 0.1, 0.85, y1)
                t2 = want.step(got_in, inv, 0.1, 0.85, y2)
                np.testing.assert_array_equal(y1, y2)
                assert t1 == t2


def test_from_edges_errors():
    key = np.array([0, 2, 1], np.uint32)
    e = np.array([0, 3], np.uint32)
    with pytest.raises(InvalidArgumentError, match="edge 1"):
        _native.PageRankCsr.from_edges(e, np.array([1, 1], np.uint32), key, 3, 0, 1, "float64")
    one = np.array([1], np.uint32)  # key 2
    with pytest.raises(InvalidArgumentError, match="flow_key 2"):
        _native.PageRankCsr.from_edges(one, one, key, 2, 0, 1, "float64")
    with pytest.raises(InvalidArgumentError, match="past flow_key"):
        _native.PageRankCsr.from_edges(one, one, key, 3, 2, 2, "float64")
    with pytest.raises(InvalidArgumentError):
        _native.PageRankCsr.from_edges(e[:1], e[:1], key.astype(np.int64), 3, 0, 1, "float64")
    with pytest.raises(InvalidArgumentError):
        _native.PageRankCsr.from_edges(e[:1], e[:1], key, 3, 0, 1, "float16")
