"""Tensor transfer with real rank processes: static slots and dynamic channels, bit for bit,
many shapes and dtypes, several threads, a slow receiver, bad input, a dead peer."""

import signal
import time

import pytest

from ranks import collect, run_ranks, spawn_ranks

RANDOMIZED = r"""
import threading, time, zlib
import numpy as np, scalefree
from scalefree import tensors
g = scalefree.init(timeout=20)
rng = np.random.default_rng(123)           # the same specs on both ranks
dtypes = ["float32", "float64", "int8", "uint16", "int64", "bool", "complex64"]
specs = []
for k in range(12):
    shape = tuple(int(d) for d in rng.integers(0, 40, size=int(rng.integers(0, 4))))
    specs.append(dict(name=f"s{k}", src=k % 2, dst=1 - k % 2, shape=shape, dtype=dtypes[k % len(dtypes)]))
slots = tensors.static_slots(g, specs)
chans = tensors.dynamic_channels(g, [(0, 1), (1, 0), (0, 1)])

def payload(seed, shape, dtype):
    r = np.random.default_rng(seed)
    return (r.random(shape) * 200 - 100).astype(dtype)

def static_worker(name, spec):
    s = slots[name]
    for m in range(30):
        want = payload(zlib.crc32(f"{name}/{m}".encode()), spec["shape"], spec["dtype"])
        if s.is_sender:
            s.send(want)
        else:
            got = s.recv()
            if m % 9 == 0:
                time.sleep(0.003)      # a slow receiver: the sender must wait, not overwrite
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tobytes() == want.tobytes(), (name, m)

def dynamic_worker(idx, pair):
    c = chans.get(pair)
    if c is None:
        return
    r = np.random.default_rng(1000 + idx)
    for m in range(25):
        nd = int(r.integers(0, 4))
        shape = tuple(int(d) for d in r.integers(0, 300, size=nd))
        dtype = dtypes[int(r.integers(0, len(dtypes)))]
        want = payload(idx * 100 + m, shape, dtype)
        if c.is_sender:
            c.send(want)
        else:
            got = c.recv()
            assert got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()

threads = [threading.Thread(target=static_worker, args=(s["name"], s)) for s in specs if s["name"] in slots]
# Two channels share the pair (0, 1): their messages must not mix.
keys = list(chans)
threads += [threading.Thread(target=dynamic_worker, args=(i, p)) for i, p in enumerate([(0, 1), (1, 0)])]
errors = []
def guard(t):
    try:
        t._target(*t._args)
    except BaseException as e:
        errors.append(e)
threads = [threading.Thread(target=guard, args=(t,)) for t in threads]
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
print("ok", flush=True)
"""


def test_randomized_static_and_dynamic_bit_for_bit():
    res = run_ranks(2, RANDOMIZED, timeout=120)
    for r in res:
        assert "ok" in r.stdout, r.stderr[-3000:]


def test_zero_copy_accounting_and_tracing():
    res = run_ranks(2, r"""
import numpy as np, scalefree
from scalefree import tensors
g = scalefree.init(timeout=60)
c = tensors.dynamic_channels(g, [(0, 1)])[(0, 1)]
for it in range(3):
    if g.rank == 0:
        big = np.ones(1 << 18, np.float32)                 # arena: registered
        small = tensors.empty((10,), np.float32, site="bias")  # traced after the first iteration
        small[...] = it
        before = c.stats()["bytes_copied"]
        c.send(big, site="weights")
        c.send(small, site="bias")
        copied = c.stats()["bytes_copied"] - before
        assert copied == (40 if it == 0 else 0), (it, copied)
    else:
        assert c.recv().sum() == 1 << 18
        assert (c.recv() == it).all()
if g.rank == 0:
    assert tensors.traced_sites() == {"bias"}
    s = c.stats()
    assert s["bytes_copied"] == 40 and s["bytes_zero_copy"] >= 3 * (1 << 20)
print("ok", flush=True)
""", timeout=60)
    for r in res:
        assert "ok" in r.stdout, r.stderr[-3000:]


def test_bad_input_is_refused_before_any_write():
    res = run_ranks(2, r"""
import numpy as np, scalefree
from scalefree import tensors
g = scalefree.init(timeout=30)
slots = tensors.static_slots(g, [dict(name="w", src=0, dst=1, shape=(4, 4), dtype="float32")])
c = tensors.dynamic_channels(g, [(0, 1)])[(0, 1)]
if g.rank == 0:
    s = slots["w"]
    for bad, frag in [(np.zeros((4, 5), np.float32), "(4, 4)"), (np.zeros((4, 4), np.float64), "float32"),
                      (np.zeros((4, 8), np.float32)[:, ::2], "contiguous"), ([1, 2], "numpy array")]:
        try:
            s.send(bad)
        except scalefree.InvalidArgumentError as e:
            assert frag in str(e), (frag, str(e))
        else:
            raise SystemExit(f"no error for {frag}")
    try:
        c.send(np.zeros(3, dtype="datetime64[s]"))
    except scalefree.InvalidArgumentError as e:
        assert "not supported" in str(e)
    s.send(np.full((4, 4), 3, np.float32))
else:
    assert (slots["w"].recv() == 3).all()
    try:
        tensors.static_slots(g, [dict(name="x", src=1, dst=1, shape=(1,), dtype="int8")])
    except scalefree.InvalidArgumentError:
        pass
print("ok", flush=True)
""", timeout=60, check=False)
    for r in res:
        assert "ok" in r.stdout, r.stderr[-3000:]


KILL = r"""
import os, signal, sys, time
import numpy as np, scalefree
from scalefree import tensors
g = scalefree.init(timeout=60)
slots = tensors.static_slots(g, [dict(name="w", src=0, dst=1, shape=(1 << 20,), dtype="float32")])
x = np.ones(1 << 20, np.float32)
for i in range(1000000):
    t0 = time.monotonic()
    try:
        if g.rank == 0:
            slots["w"].send(x)
        else:
            if i == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            slots["w"].recv()
    except scalefree.PeerLostError as e:
        print(f"PeerLostError after {time.monotonic() - t0:.3f}s: {e}", flush=True)
        sys.exit(3)
"""


def test_dead_receiver_is_an_error_not_a_hang():
    res = collect(spawn_ranks(2, KILL), timeout=60)
    assert res[1].returncode == -signal.SIGKILL
    assert res[0].returncode == 3, res[0].stderr[-2000:]
    line = [l for l in res[0].stdout.splitlines() if l.startswith("PeerLostError")][0]
    assert float(line.split()[2].rstrip("s:")) < 5.0


def test_futures_callbacks_and_asyncio():
    res = run_ranks(2, r"""
import asyncio, threading
import numpy as np, scalefree
from scalefree import tensors
g = scalefree.init(timeout=30)
slots = tensors.static_slots(g, [dict(name=f"s{i}", src=0, dst=1, shape=(1000,), dtype="int32") for i in range(4)])
chan = tensors.dynamic_channels(g, [(0, 1)])[(0, 1)]
if g.rank == 0:
    done = threading.Event()
    futs = [slots[f"s{i}"].send_async(np.full(1000, i, np.int32)) for i in range(4)]
    futs[0].add_done_callback(lambda f: done.set())
    for f in futs:
        f.result(timeout=20)
    assert done.wait(5) and all(f.done() for f in futs)
    chan.send_async(np.arange(7.0)).result(timeout=20)
else:
    async def main():
        got = await asyncio.gather(*(tensors.aio(slots[f"s{i}"].recv_async()) for i in range(4)))
        assert [int(a[0]) for a in got] == [0, 1, 2, 3]
        y = await tensors.aio(chan.recv_async())
        assert (y == np.arange(7.0)).all()
    asyncio.run(main())
print("ok", flush=True)
""", timeout=60)
    for r in res:
        assert "ok" in r.stdout, r.stderr[-3000:]


def test_allocation_sites_traced_without_names():
    """A training loop with no site names: gradients below the arena threshold are copied
    once; the channel traces where they were allocated, and from the second iteration on
    numpy allocates them in registered memory, so nothing is copied."""
    res = run_ranks(2, r"""
import numpy as np, scalefree
from scalefree import tensors
g = scalefree.init(timeout=60)
c = tensors.dynamic_channels(g, [(0, 1)])[(0, 1)]
w = np.linspace(-1, 1, 4096, dtype=np.float32)       # 16 KiB: below the 64 KiB arena threshold

def gradient(w, it):
    return np.tanh(w * (it + 1)) * 0.5                # a new 16 KiB array every call

for it in range(4):
    if g.rank == 0:
        before = c.stats()["bytes_copied"]
        grad = gradient(w, it)
        c.send(grad)
        bias = np.full(2048, it, np.float64)          # 16 KiB, another site
        c.send(bias)
        copied = c.stats()["bytes_copied"] - before
        assert copied == (2 * 16384 if it == 0 else 0), (it, copied)
    else:
        np.testing.assert_allclose(c.recv(), np.tanh(w * (it + 1)) * 0.5, rtol=1e-6)
        assert (c.recv() == it).all()
if g.rank == 0:
    assert tensors.traced_allocation_sites() == 2 and tensors.traced_sites() == set()
    small = np.ones(16, np.float32)                   # below 4 KiB: never traced
    c.send(small)
    assert c.stats()["bytes_copied"] == 2 * 16384 + 64
else:
    assert c.recv().sum() == 16
print("ok", flush=True)
""", timeout=60)
    for r in res:
        assert "ok" in r.stdout, r.stderr[-3000:]
