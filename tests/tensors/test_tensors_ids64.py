"""One static-slot message across 2 simulated hosts whose bytes carry their position (byte i
is i % 251), every byte checked, over the TCP lanes and over UCX alone. CI sends 3 MiB + 5
bytes; ``SCALEFREE_TEST_BIG_N`` sets the element count for the run past 2**32 elements
(docs/benchmarks/tensors.md: 4.4e9 uint8, about 10 GB across the two ranks; run it under
the exclusive lock)."""

import os
import subprocess
import sys

import pytest

simhosts = pytest.importorskip("scalefree.launch.simhosts")

N = int(os.environ.get("SCALEFREE_TEST_BIG_N", str((3 << 20) + 5)))

CODE = r"""
import os, resource, time
import numpy as np, scalefree
from scalefree import tensors

N = int(os.environ["BIG_N"])
g = scalefree.init(timeout=600)
assert g.transport == "ucx", g.transport
tile = np.arange(251, dtype=np.uint8)
s = tensors.static_slots(g, [dict(name="big", src=0, dst=1, shape=(N,), dtype="uint8")])["big"]
t0 = time.perf_counter()
if s.is_sender:
    s.send(np.resize(tile, N))
else:
    got = s.recv()
    assert got.shape == (N,) and got.dtype == np.uint8
    step = 251 * (1 << 20)
    block = np.resize(tile, min(step, N))
    for lo in range(0, N, step):
        hi = min(N, lo + step)
        bad = np.flatnonzero(got[lo:hi] != block[:hi - lo])
        assert len(bad) == 0, f"byte {lo + int(bad[0])} is {got[lo + int(bad[0])]}, want {(lo + int(bad[0])) % 251}"
dt = time.perf_counter() - t0
g.barrier()
print(f"rank {g.rank}: {N} bytes in {dt:.2f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB", flush=True)
print("ok", flush=True)
"""


@pytest.mark.parametrize("lanes", ["auto", "0"])
def test_one_message_with_its_positions_across_hosts(can_simulate, lanes):
    env = dict(os.environ, BIG_N=str(N))
    if lanes != "auto":
        env["SCALEFREE_TCP_LANES"] = lanes
    with simhosts.SimHosts(2) as h:
        procs = [h.popen(i, [sys.executable, "-m", "scalefree.cli", "run", "--nnodes", "2", "--node-rank", str(i),
                             "--nproc-per-node", "1", "--master-addr", h.ip(0), "--master-port", "29573",
                             "--", sys.executable, "-c", CODE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                h.close()
                raise AssertionError("a host's rank hung")
            outs.append(out)
            assert p.returncode == 0 and "ok" in out, out[-3000:]
    print("\n".join(outs))
