"""`scalefree run --encrypt` across simulated hosts (see scalefree.launch.simhosts): sealed
TCP lanes and rendezvous give the same results as plain ones, and a frame changed or replayed
on the way (the lanes' test hook, SCALEFREE_TEST_LANE_FAULT) is an error on the receiving
rank, never silently wrong data. Skipped with the reason where namespaces or UCX are not
available."""

import os

import pytest

from test_hosts import launch_all

simhosts = pytest.importorskip("scalefree.launch.simhosts")

# Every rank: allreduces of several sizes (0, 1, odd, several sealed chunks, a striped
# write's worth) against numpy, then one line saying so.
CHECK = """
import numpy as np, scalefree
g = scalefree.init(timeout=60)
assert g.transport == "ucx", g.transport
for n in (0, 1, 1001, (1 << 18) + 7):
    for dt in (np.float32, np.int64):
        a = (np.arange(n) % 97 + g.rank).astype(dt)
        want = sum((np.arange(n) % 97 + r).astype(dt) for r in range(g.size))
        g.allreduce(a)
        assert np.array_equal(a, want), (n, dt)
# One-sided reads and writes with a rank of the other host, over its sealed lane only.
dev, peer, n = g.device, (g.rank + g.size // 2) % g.size, (1 << 20) + 8
assert g._ucx_transports(peer) == ["lane/sealed"], g._ucx_transports(peer)
pattern = lambda r: ((np.arange(n) * (r + 1)) % 251).astype(np.uint8)
src, dst = dev.alloc_region(n), dev.alloc_region(n)
np.frombuffer(src, np.uint8)[:] = pattern(g.rank)
h = np.frombuffer(src.handle, np.uint8)
remote = dev.attach(bytes(np.asarray(g.allgather(h)).reshape(g.size, -1)[peer]))
ch = dev.channel(peer)
ch.start_read(remote, 5, dst, 0, n - 5).wait()
assert np.array_equal(np.frombuffer(dst, np.uint8)[:n - 5], pattern(peer)[5:])
ch.read(remote, 0, dst, 0, 8)
assert np.array_equal(np.frombuffer(dst, np.uint8)[:8], pattern(peer)[:8])
g.barrier()
print("RIGHT", g.rank, flush=True)
"""

# Every rank: allreduces of 1 MiB until one fails (a sealed record refused ends the lane);
# a result that arrives is checked, so wrong data cannot pass unnoticed.
FAULTY = """
import numpy as np, scalefree
g = scalefree.init(timeout=60)
try:
    for i in range(20):
        a = np.full(1 << 18, g.rank + i, np.float32)
        g.allreduce(a)
        want = sum(r + i for r in range(g.size))
        if not np.all(a == want):
            print("WRONG DATA", g.rank, flush=True)
            raise SystemExit(3)
    print("NO ERROR", g.rank, flush=True)
except scalefree.PeerLostError as e:
    print(f"REFUSED rank {g.rank}: {e}", flush=True)
    raise SystemExit(1)
"""


@pytest.fixture(scope="module")
def hosts(can_simulate):
    with simhosts.SimHosts(2) as h:
        yield h


def _env(**extra):
    env = dict(os.environ)
    env.pop("SCALEFREE_TEST_LANE_FAULT", None)
    env.pop("SCALEFREE_ENCRYPT", None)
    env.update(extra)
    return env


def test_encrypted_collectives_across_hosts_are_right(hosts):
    out = launch_all(hosts, 2, CHECK, env=_env(), port=29631, run_args=("--encrypt",), timeout=180)
    for code, o in out:
        assert code == 0, o[-3000:]
    text = "".join(o for _, o in out)
    assert sorted(int(line.split()[-1]) for line in text.splitlines() if "RIGHT" in line) == [0, 1, 2, 3], text[-2000:]


def test_mixed_encryption_settings_are_refused_by_name(hosts):
    """A host with --encrypt and one without: refused at the rendezvous, saying what to set
    (rank 0 then waits out its bootstrap timeout, as for any rank refused)."""
    procs = []
    import subprocess
    import sys
    for i in range(2):
        run = [sys.executable, "-m", "scalefree.cli", "run", "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
               "--master-addr", hosts.ip(0), "--master-port", "29633", *(["--encrypt"] if i == 0 else []),
               "--", sys.executable, "-c", "import scalefree; scalefree.init(timeout=20, bootstrap_timeout=8)"]
        procs.append(hosts.popen(i, run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), outs
    assert "SCALEFREE_ENCRYPT" in outs[1], outs[1][-2000:]


@pytest.mark.parametrize("fault, named", [("flip:3@0", "failed authentication"),
                                          ("replay:3@0", "replayed or reordered")])
def test_a_changed_or_replayed_frame_is_an_error_on_the_receiving_rank(hosts, fault, named):
    """Rank 0 (host 0) flips one byte of a sealed data record after sealing it, or sends a
    recorded record again: a rank of host 1 that reads it ends with PeerLostError naming
    rank 0 and what was wrong; no rank finishes with wrong data."""
    out = launch_all(hosts, 2, FAULTY, env=_env(SCALEFREE_TEST_LANE_FAULT=fault), port=29635 + (fault[0] == "r"),
                     run_args=("--encrypt",), timeout=180)
    text = "\n".join(o for _, o in out)
    assert "WRONG DATA" not in text, text[-3000:]
    assert "NO ERROR" not in text, text[-3000:]
    refused = [line for line in text.splitlines() if "REFUSED rank" in line and named in line]
    assert refused, text[-3000:]
    # The receiving rank names the sender, rank 0, and its host.
    assert any("rank 0" in line.split(":", 1)[1] and f"host {hosts.ip(0)}" in line for line in refused), refused
    assert any(line.split("REFUSED rank ")[1].split(":")[0] in ("2", "3") for line in refused), refused


def test_encrypt_on_one_host_changes_nothing():
    """`scalefree run --encrypt` on one host: the ranks get SCALEFREE_ENCRYPT=1 and talk over
    shared memory as always (nothing leaves the host)."""
    import subprocess
    import sys
    code = ("import os, numpy as np, scalefree; g = scalefree.init(timeout=30); a = np.ones(1000) * g.rank; "
            "g.allreduce(a); assert a[0] == 1 and g.transport == 'shm', g.transport; "
            "print('ENC', os.environ['SCALEFREE_ENCRYPT'], flush=True)")
    r = subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", "2", "--encrypt", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("ENC 1") == 2, r.stdout
