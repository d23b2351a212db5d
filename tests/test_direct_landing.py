"""Direct landing across simulated hosts: the allgather half of a large allreduce is received
over the TCP lanes straight into the caller's array (no copy out of the landing region).
Results are checked against numpy for sizes 0, 1, odd and large, on 2-4 hosts, with it on and
off, alternating arrays (a stale flag of an earlier call must not skip a copy), and the
bytes that really landed directly are asserted (so the path under test is the one taken).
The first peer's reduce-scatter pieces are reduced into the caller's array as they arrive
(`SCALEFREE_REDUCE_ON_ARRIVAL`): checked the same way, with sum, max and min."""

import os

import pytest

from test_hosts import ACROSS, launch_all, simhosts  # noqa: F401

CODE = ACROSS.replace("{per_host}", "1") + """
import numpy as np
direct = os.environ.get("SCALEFREE_DIRECT_LANDING", "1") != "0"
on_arrival = os.environ.get("SCALEFREE_REDUCE_ON_ARRIVAL", "1") != "0"
rng = np.random.default_rng(g.rank)
reduced0 = g._reduced_on_arrival_bytes()
for dtype in (np.float32, np.float64, np.int32):
    for n in (0, 1, 7, 1000003, (3 << 20) + 5):
        es = np.dtype(dtype).itemsize
        arrays = [np.arange(n, dtype=dtype) % 11 + g.rank + j for j in range(2)]
        for call in range(4):
            j = call % 2
            a = arrays[j]
            before = g._direct_landed_bytes()
            g.allreduce(a)
            got = g._direct_landed_bytes() - before
            want = (np.arange(n, dtype=dtype) % 11) * g.size + sum(range(g.size)) + j * g.size
            assert np.array_equal(a, want), (dtype, n, call)
            # Every call changes the array in place: the next one on it starts from this result.
            arrays[j] = np.arange(n, dtype=dtype) % 11 + g.rank + j
            if not direct:
                assert got == 0, (n, got)
            elif n * es >= (1 << 20):
                # Everything but this rank's own chunk, which it reduced in place.
                share = n * es * (g.size - 1) / g.size
                assert share - g.size * 4096 <= got <= n * es, (n, got, share)
    # An allgather after allreduce reuses the same landing area: it must copy, never trust a flag.
    m = np.full(200001, g.rank + 1, np.float32)
    out = g.allgather(m)
    assert np.array_equal(np.asarray(out).reshape(g.size, -1), np.repeat(np.arange(1, g.size + 1, dtype=np.float32)[:, None], 200001, 1))
# Max and min reduce on arrival too; random data, against numpy over every rank's array.
for op, f in (("max", np.maximum.reduce), ("min", np.minimum.reduce)):
    for dtype in (np.float32, np.int64):
        n = (1 << 20) + 3
        inputs = [np.random.default_rng(100 * r + n).standard_normal(n).astype(dtype) * 1000 for r in range(g.size)]
        a = inputs[g.rank].copy()
        g.allreduce(a, op=op)
        assert np.array_equal(a, f(inputs)), (op, dtype)
reduced = g._reduced_on_arrival_bytes() - reduced0
assert (reduced > 0) == on_arrival, reduced
g.barrier()
print("ok", g._direct_landed_bytes() > 0)
"""
CODE = "import os\nimport scalefree\n" + CODE


@pytest.mark.parametrize("nhosts,direct,on_arrival", [(2, "1", "1"), (3, "1", "1"), (4, "1", "1"), (3, "0", "1"), (2, "1", "0")])
def test_allreduce_lands_straight_in_the_callers_array(can_simulate, nhosts, direct, on_arrival):  # noqa: F811
    env = dict(os.environ, SCALEFREE_DIRECT_LANDING=direct, SCALEFREE_REDUCE_ON_ARRIVAL=on_arrival)
    with simhosts.SimHosts(nhosts) as h:
        for rc, out in launch_all(h, 1, CODE, env=env, timeout=240):
            assert rc == 0, out[-3000:]
            assert out.strip().endswith(f"ok {direct == '1'}"), out[-2000:]
