"""Allreduce between hosts by recursive halving and doubling (`dense/halving.rs`), taken by
4 simulated hosts (one rank each) from `SCALEFREE_NET_HALVING_MIN` to `..._MAX` bytes (here
widened to every size, so the sweep of sizes runs through it): results against numpy
with direct landing and reduction on arrival on and off (the checks of
`test_direct_landing.py`, sizes 0, 1, odd and large, sum, max and min), and ranks that
disagree on the threshold get a `MismatchError` on every rank instead of waiting for each
other's pieces."""

import os

import pytest

from test_direct_landing import CODE
from test_hosts import ACROSS, launch_all, simhosts  # noqa: F401


@pytest.mark.parametrize("direct,on_arrival,halving_max", [("1", "1", "64M"), ("0", "1", "64M"), ("1", "0", "64M"), ("1", "1", "0")])
def test_halving_allreduce_across_four_hosts(can_simulate, direct, on_arrival, halving_max):  # noqa: F811
    env = dict(os.environ, SCALEFREE_DIRECT_LANDING=direct, SCALEFREE_REDUCE_ON_ARRIVAL=on_arrival,
               SCALEFREE_NET_HALVING_MIN="0", SCALEFREE_NET_HALVING_MAX=halving_max)
    with simhosts.SimHosts(4) as h:
        for rc, out in launch_all(h, 1, CODE, env=env, timeout=240):
            assert rc == 0, out[-3000:]
            assert out.strip().endswith(f"ok {direct == '1'}"), out[-2000:]


DISAGREE = "import os\nimport scalefree\n" + ACROSS.replace("{per_host}", "1") + """
import numpy as np
# Rank 0 alone turns halving off (read at its first large allreduce).
if g.rank == 0:
    os.environ["SCALEFREE_NET_HALVING_MAX"] = "0"
a = np.ones(1 << 18, np.float32)
try:
    g.allreduce(a)
    print("no error")
except scalefree.MismatchError as e:
    assert "halving" in str(e), e
    print("mismatch")
# Small calls do not depend on it: the group is still usable.
b = np.ones(8, np.float32)
g.allreduce(b)
assert (b == g.size).all()
print("done")
"""


def test_ranks_that_disagree_on_halving_get_a_mismatch(can_simulate):  # noqa: F811
    with simhosts.SimHosts(4) as h:
        for rc, out in launch_all(h, 1, DISAGREE, timeout=180):
            assert rc == 0 and "mismatch" in out and "done" in out, out[-2000:]
