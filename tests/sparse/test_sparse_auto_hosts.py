"""degrees="auto" across simulated hosts (``SCALEFREE_SIMULATE_HOSTS``: shared memory within
a host, UCX between) where the probe used to be skipped or flat: replicated jobs (the
replicated collective is probed itself) and hosts of different sizes (costs within a host
and between hosts, each layer priced by whether its groups cross hosts); results against a
dense reference."""

import pytest

from ranks import run_ranks
from scalefree.sparse.plan import Costs, choose_uneven, crossing_layers
from test_collectives import _ucx_or_skip

CODE = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
assert g.transport == "ucx", g.transport
R = {replication}
m = g.size // R
me = g.rank % m
dim, nnz = 50_000, 2_000
outs = [np.random.default_rng([r, 5]).integers(0, dim, nnz) for r in range(m)]
vals = [np.random.default_rng([r, 6]).random(nnz) for r in range(m)]
dense = np.zeros(dim)
for r in range(m):
    np.add.at(dense, outs[r], vals[r])
want_i = np.arange(dim, dtype=np.int64)[::7]
sa = g.sparse_allreduce(dim, replication=R)
sa.config(outs[me], want_i)
assert sa.plan is not None and sa.plan["degrees"] == sa.degrees, (sa.plan, sa.degrees)
assert int(np.prod(sa.degrees)) == m
assert ("local_costs" in sa.plan) == {uneven}, sa.plan
for _ in range(2):
    np.testing.assert_allclose(sa.reduce(vals[me]), dense[want_i], rtol=1e-12)
print("ok", sa.degrees)
"""


@pytest.mark.parametrize("layout,replication,uneven", [("2", 2, False), ("1,2,3", 1, True)])
def test_auto_probes_replicated_and_uneven_hosts(layout, replication, uneven):
    _ucx_or_skip()
    n = 4 if layout == "2" else 6
    code = CODE.format(replication=replication, uneven=uneven)
    res = run_ranks(n, code, timeout=240, extra_env={"SCALEFREE_SIMULATE_HOSTS": layout})
    assert all("ok" in r.stdout for r in res), [r.stderr[-2000:] for r in res]


def test_crossing_layers_and_uneven_choice():
    hosts = [0, 1, 1, 2, 2, 2]  # hosts of 1, 2 and 3 ranks
    assert crossing_layers([6], hosts) == [True]
    assert crossing_layers([2, 3], hosts) == [True, True]
    assert crossing_layers([3, 2], [0, 0, 0, 1, 1, 1]) == [False, True]
    assert crossing_layers([2, 2], [0, 0, 1, 1]) == [False, True]
    assert crossing_layers([2, 2], [0, 1, 0, 1]) == [True, False]
    # Within a host free, between hosts dear per round: the host layer first, as few
    # crossing rounds as possible.
    local, net = Costs(round_s=0.0, msg_s=0.0, s_per_byte=1e-12), Costs(round_s=1e-3, msg_s=0.0, s_per_byte=1e-9)
    got = choose_uneven([0, 0, 0, 1, 1, 1], 1000, 100_000, 8, local, net)
    assert got["degrees"] in ([6], [3, 2]) and got["local_costs"] is local
    assert got["predicted_s"]["3x2"] < got["predicted_s"]["2x3"]
