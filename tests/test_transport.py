"""The one-sided device API from Python: regions as numpy views, write/read between
ranks, and notifications that arrive only after the data."""

from ranks import run_ranks

ORDERING = r"""
import numpy as np, scalefree
g = scalefree.init(timeout=60)
dev = g.device
me, n = g.rank, g.size
peer = (me + 1) % n
src_rank = (me - 1) % n
region = dev.alloc_region(1 << 20)
view = region.array(np.uint8)
assert view.nbytes == region.nbytes == 1 << 20
# Exchange region handles with our own allgather (bytes move as uint8).
handles = g.allgather(np.frombuffer(region.handle, np.uint8))
remote = dev.attach(handles[peer].tobytes())
assert remote.owner == peer and remote.nbytes == 1 << 20
ch = dev.channel(peer)
rng = np.random.default_rng(me)
local = dev.alloc_region(1 << 20)
lv = local.array(np.uint8)
for it in range(1, 301):
    nbytes = int(rng.integers(0, 1 << 19))
    off = int(rng.integers(0, (1 << 20) - nbytes))
    lv[:nbytes] = (np.arange(nbytes) + it) % 251
    # write the data, then the notification (value = iteration); the peer checks it saw
    # every byte before the notification, then acknowledges so we may reuse buffers.
    hdr = np.array([off, nbytes], np.int64)
    ch.write_notify(local, 0, remote, off, nbytes, slot=1, value=it).wait()
    ch.notify(2, off + 1); ch.notify(3, nbytes + 1)
    v = dev.wait(1, timeout=30)
    o = dev.wait(2, timeout=30) - 1
    k = dev.wait(3, timeout=30) - 1
    assert v == it, (v, it)
    got = view[o:o + k]
    assert (got == (np.arange(k) + it) % 251).all(), it
    g.barrier()
assert dev.test(1) is None
# One-sided read of the peer's region.
view[:16] = me
g.barrier()
ch.read(remote, 0, local, 100, 16).wait()
assert (lv[100:116] == peer).all()
# Bounds are checked.
for bad in [lambda: ch.write(local, 0, remote, (1 << 20) - 1, 2),
            lambda: ch.read(remote, 0, local, 1 << 20, 1),
            lambda: ch.notify(5, 0),
            lambda: dev.wait(10 ** 6),
            lambda: dev.channel(n),
            lambda: dev.attach(b"short")]:
    try:
        bad()
    except ValueError:
        pass
    else:
        raise SystemExit("no error")
g.barrier()
print("ok")
"""


def test_write_notify_ordering_and_reads():
    for n in (2, 3):
        res = run_ranks(n, ORDERING, timeout=120)
        assert all(r.stdout.strip() == "ok" for r in res)


def test_region_is_a_zero_copy_numpy_view():
    res = run_ranks(1, r"""
import numpy as np, scalefree
dev = scalefree.init().device
r = dev.alloc_region(4096)
a = r.array(np.float64, (16, 32))
b = np.frombuffer(r, np.float64)
a[3, 4] = 7.5
assert b[3 * 32 + 4] == 7.5
assert a.flags.writeable and not a.flags.owndata
print("ok")
""")
    assert res[0].stdout.strip() == "ok"
