"""Collective results equal numpy's reference for every op x dtype x size x world size,
with real rank processes."""

import pytest

from ranks import run_ranks

SWEEP = r"""
import numpy as np, scalefree, sys
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
rng_seed = 1234
OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
DTYPES = [np.float32, np.float64, np.int32, np.int64]
SIZES = [0, 1, 7, 1000, 12345, 1 << 20]
ALGOS = ["auto", "one_shot", "direct", "ring"]

def contribution(rank, size, dtype, op):
    rng = np.random.default_rng([rng_seed, rank, size])
    if op == "prod":  # keep products finite and exact
        x = rng.choice(np.array([-1, 1, 2], dtype=np.int64), size=size)
    else:
        x = rng.integers(-1000, 1000, size=size)
    return x.astype(dtype)

checked = 0
for dtype in DTYPES:
    for size in SIZES:
        for op, f in OPS.items():
            want = contribution(0, size, dtype, op)
            for r in range(1, n):
                want = f(want, contribution(r, size, dtype, op))
            for algo in ALGOS:
                if algo == "one_shot" and size * np.dtype(dtype).itemsize > 256 * 1024:
                    continue
                if size == 1 << 20 and (algo == "one_shot" or op in ("prod", "min")) and dtype != np.float32:
                    continue  # keep the sweep quick; large sizes are covered for the rest
                a = contribution(me, size, dtype, op)
                out = g.allreduce(a, op=op, algorithm=algo)
                assert out is a
                np.testing.assert_array_equal(a, want, err_msg=f"{dtype} {size} {op} {algo}")
                checked += 1
print("checked", checked)
"""

OTHERS = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
for size in [0, 1, 7, 1000, 12345, 1 << 20]:
    for dtype in [np.float32, np.int64, np.uint8, np.complex128]:
        # allgather and broadcast move any dtype
        mine = (np.arange(size) + 1000 * me).astype(dtype)
        allg = g.allgather(mine)
        assert allg.shape == (n, size)
        for r in range(n):
            np.testing.assert_array_equal(allg[r], (np.arange(size) + 1000 * r).astype(dtype))
        for root in range(n):
            b = (np.arange(size) * 3 + root).astype(dtype) if me == root else np.zeros(size, dtype)
            assert g.broadcast(b, root=root) is b
            np.testing.assert_array_equal(b, (np.arange(size) * 3 + root).astype(dtype))
    # reduce_scatter: this rank's share of the sum
    x = np.arange(size, dtype=np.float64) * (me + 1)
    share = g.reduce_scatter(x)
    lo, hi = g.share_bounds(size)
    np.testing.assert_array_equal(share, np.arange(size, dtype=np.float64)[lo:hi] * sum(range(1, n + 1)))
    g.barrier()
# 2-D arrays, Fortran order, and arrays inside a registered region (zero-copy path)
m = np.asfortranarray(np.arange(6 * 5, dtype=np.float32).reshape(6, 5) * (me + 1))
g.allreduce(m)
np.testing.assert_array_equal(m, np.asfortranarray(np.arange(30, dtype=np.float32).reshape(6, 5)) * sum(range(1, n + 1)))
region = g.device.alloc_region(8 << 20)
for count in [3, 100_000, 1 << 20]:
    v = region.array(np.float64)[:count]
    v[:] = me + 1
    g.allreduce(v)
    assert (v == sum(range(1, n + 1))).all(), count
print("ok")
"""

# Both in one job (one start of the ranks): SWEEP, then OTHERS on the same group.
BOTH = SWEEP + OTHERS.split("me, n = g.rank, g.size\n", 1)[1]


def _both_ok(res):
    for r in res:
        assert "checked" in r.stdout and r.stdout.strip().endswith("ok"), r.stdout[-2000:]


# How large buffers reach peers: numpy arrays in the registered arena (the default), staged
# through shared memory, or read from ordinary memory by cross-memory attach.
MODES = {
    "arena": {},
    "staged": {"SCALEFREE_ARENA": "0"},
    "cma": {"SCALEFREE_ARENA": "0", "SCALEFREE_STAGE_MAX": "0"},
    "no-cma": {"SCALEFREE_ARENA": "0", "SCALEFREE_CMA": "0", "SCALEFREE_STAGE_MAX": "0"},
}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allreduce_matches_numpy(n):
    res = run_ranks(n, SWEEP, timeout=240)
    assert all("checked" in r.stdout for r in res)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allgather_broadcast_reduce_scatter(n):
    res = run_ranks(n, OTHERS, timeout=240)
    assert all(r.stdout.strip().endswith("ok") for r in res)


@pytest.mark.parametrize("mode", ["staged", "cma", "no-cma"])
@pytest.mark.parametrize("n", [2, 3])
def test_every_buffer_path(mode, n):
    _both_ok(run_ranks(n, BOTH, timeout=300, extra_env=MODES[mode]))


def _ucx_or_skip():
    from scalefree.errors import UnsupportedError
    from scalefree.launch.ucx import info

    try:
        return info()
    except UnsupportedError as e:
        pytest.skip(f"UCX is not installed here: {e}")


UCX_CHECK = """g = scalefree.init(timeout=60)
assert g.transport == "ucx", g.transport
assert all(g._ucx_transports(p) for p in range(g.size) if p != g.rank)"""


@pytest.mark.parametrize("n", [3])
def test_whole_suite_over_ucx(n):
    """The same sweeps with every peer reached over UCX (one host: UCX picks tcp/lo), at an odd
    world size. 2 and 4 ranks each over UCX run these sweeps in test_hosts.py
    (test_dense_suite_across_hosts: one rank per simulated host), and 1 to 4 ranks the Rust
    thread suite over UCX (scripts/test)."""
    _ucx_or_skip()
    env = {"SCALEFREE_TRANSPORT": "ucx"}
    _both_ok(run_ranks(n, BOTH.replace("g = scalefree.init(timeout=60)", UCX_CHECK), timeout=400, extra_env=env))


@pytest.mark.parametrize("n,per_host", [(3, 2), (6, 3)])
def test_hosts_simulated_on_one_machine(n, per_host):
    """Ranks split into simulated hosts of `per_host` (shared memory within, UCX between):
    hierarchical when every host has the same number of ranks, flat otherwise. 2 hosts of 2
    ranks run the sweep hierarchical in test_hosts.py (test_two_hosts_two_ranks_each_hierarchical)
    and the Rust thread suite with SCALEFREE_SIMULATE_HOSTS=2 (scripts/test)."""
    _ucx_or_skip()
    env = {"SCALEFREE_SIMULATE_HOSTS": str(per_host)}
    check = """g = scalefree.init(timeout=60)
assert g.transport == "ucx", g.transport"""
    both = BOTH.replace("g = scalefree.init(timeout=60)", check).replace(
        'ALGOS = ["auto", "one_shot", "direct", "ring"]', 'ALGOS = ["auto", "one_shot", "direct", "hierarchical"]')
    _both_ok(run_ranks(n, both, timeout=400, extra_env=env))


ALLTOALLV = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size

def piece(s, d, k, width, dtype):
    rng = np.random.default_rng([s, d, k])
    m = int(rng.integers(0, 5)) * k  # some pieces empty
    shape = (m,) if width == 0 else (m, width)
    return rng.integers(-1 << 30, 1 << 30, size=shape).astype(dtype)

for k in (0, 1, 7, 50001):
    for width, dtype in ((0, np.int64), (2, np.uint32), (3, np.float64)):
        pieces = [piece(me, d, k, width, dtype) for d in range(n)]
        send = np.concatenate(pieces) if width == 0 else np.concatenate(pieces).reshape(-1, width)
        got = g.alltoallv(send, [len(p) for p in pieces])
        want = [piece(s, me, k, width, dtype) for s in range(n)]
        want = np.concatenate(want) if width == 0 else np.concatenate(want).reshape(-1, width)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
        assert np.array_equal(got, want), (k, width)
try:
    g.alltoallv(np.zeros(3), [1] * (n + 1))
except scalefree.InvalidArgumentError as e:
    assert "counts" in str(e)
else:
    raise AssertionError("bad counts accepted")
print("ok")
"""


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_alltoallv_delivers_every_piece_in_rank_order(n):
    for r in run_ranks(n, ALLTOALLV):
        assert r.returncode == 0, r.stderr
        assert "ok" in r.stdout


# Many small exchanges in a row: a piece from another host must have landed when alltoallv
# returns. Before the senders notified their receivers, the end of the exchange was a barrier,
# which on hosts of equal rank counts goes by recursive doubling: a receiver heard that a
# sender on another host was done through a third rank, on another socket, before the
# sender's own bytes had been read into its region (2 hosts x 2 ranks: 17-24 of 800 pieces wrong).
ALLTOALLV_HOSTS = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
assert g.transport == "ucx", g.transport
def count(s, d, t):
    return ((s * 7 + d * 13 + t * 101) % 17 + 1) * 100
bad = []
for t in range(200):
    counts = [count(me, d, t) for d in range(n)]
    send = np.concatenate([np.full(c, (t << 16) + (me << 8) + d, np.int64) for d, c in enumerate(counts)])
    got = g.alltoallv(send, counts)
    want = np.concatenate([np.full(count(s, me, t), (t << 16) + (s << 8) + me, np.int64) for s in range(n)])
    if not np.array_equal(got, want):
        bad.append(t)
assert not bad, f"rank {me}: exchanges {bad} wrong"
x = g.alltoallv_fill([count(me, d, 0) for d in range(n)], np.int64,
                     lambda pieces: [p.fill((me << 8) + d) for d, p in enumerate(pieces)])
assert np.array_equal(x, np.concatenate([np.full(count(s, me, 0), (s << 8) + me) for s in range(n)]))
print("ok")
"""


@pytest.mark.parametrize("layout", ["2,2", "2,2,2"])
def test_alltoallv_across_simulated_hosts_has_landed(layout):
    """2 and 3 simulated hosts of 2 ranks (shared memory within a host, UCX between)."""
    _ucx_or_skip()
    n = sum(int(k) for k in layout.split(","))
    for r in run_ranks(n, ALLTOALLV_HOSTS, timeout=300, extra_env={"SCALEFREE_SIMULATE_HOSTS": layout}):
        assert r.returncode == 0, r.stderr[-3000:]
        assert "ok" in r.stdout


UINT8 = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
me, n = g.rank, g.size
OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
def part(r, size):
    return np.random.default_rng([99, r, size]).integers(0, 256, size).astype(np.uint8)
for size in [0, 1, 7, 12345, 1 << 20]:
    for op, f in OPS.items():
        want = part(0, size)
        for r in range(1, n):
            want = f(want, part(r, size))  # numpy's uint8: sum and product wrap
        for algo in ["auto", "one_shot", "direct", "ring"]:
            if algo == "one_shot" and size > 256 * 1024:
                continue
            a = part(me, size)
            assert g.allreduce(a, op=op, algorithm=algo) is a
            np.testing.assert_array_equal(a, want, err_msg=f"{size} {op} {algo}")
print("ok")
"""


@pytest.mark.parametrize("n", [1, 3])
def test_uint8_allreduce_wraps_like_numpy(n):
    res = run_ranks(n, UINT8, timeout=120)
    assert all(r.stdout.strip().endswith("ok") for r in res)


BIG_BROADCAST = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=120)
piece = 64 << 20   # the broadcast's piece (MAX_BROADCAST_PIECE)
for dtype, count in [(np.float64, piece // 8 * 2 + 1001), (np.uint8, piece + 7)]:
    root = g.size - 1
    want = (np.arange(count, dtype=np.int64) * 2654435761 % 1000003).astype(dtype)
    a = want.copy() if g.rank == root else np.zeros(count, dtype)
    assert g.broadcast(a, root=root) is a
    assert np.array_equal(a, want), (dtype, np.flatnonzero(a != want)[:5])
print("ok")
"""


@pytest.mark.parametrize("mode", ["arena", "no-cma"])
def test_broadcast_larger_than_a_piece(mode):
    """Broadcasts over 64 MiB go in pieces (bounded staging memory): the same result across
    the piece boundaries, an odd tail included."""
    res = run_ranks(3, BIG_BROADCAST, timeout=240, extra_env=MODES[mode])
    assert all(r.stdout.strip().endswith("ok") for r in res)
