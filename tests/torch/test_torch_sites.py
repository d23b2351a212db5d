"""Allocation-site tracing for torch tensors (scalefree.tensors.torch_sites): a training-style
loop with no site names sends fresh torch tensors (an operator's result and a factory's)
through a dynamic channel: the first iteration stages them, their sites are traced, and from
the second iteration on torch's operators at those sites write into registered memory, so
nothing is copied and the values arrive unchanged. Static slots write from the caller's
tensor (they never stage): 0 bytes from the first iteration. The parameter server's slot
transport stages a pushed gradient that is not in registered memory and traces its site, as
the channel does: the first push copies, later ones do not. Real rank processes."""

from ranks import run_ranks


def test_torch_tensors_traced_without_names():
    res = run_ranks(2, r"""
import numpy as np, torch, scalefree
from scalefree import tensors
from scalefree.tensors import torch_sites
from scalefree.tensors.ps import ParameterServer
torch.set_num_threads(1)
g = scalefree.init(timeout=60)
n = 50_000                                            # 200 KB of float32
chan = tensors.dynamic_channels(g, [(0, 1)])[(0, 1)]
slot = tensors.static_slots(g, [dict(name="g", src=0, dst=1, shape=(n,), dtype="float32")])["g"]
w0 = np.linspace(-1, 1, n, dtype=np.float32)
ps = ParameterServer(g, {"w": w0}, lr=0.5, n_servers=1, mode="slots")

def gradient(w, it):
    return torch.tanh(w * (it + 1)) * 0.5              # fresh tensors every call, no site named

def other(it):
    return torch.full((n // 2,), float(it), dtype=torch.float64)   # a factory: another site

w = torch.from_numpy(w0.copy())
for it in range(4):
    if g.rank == 0:
        before = chan.stats()["bytes_copied"] + slot.stats()["bytes_copied"]
        grad = gradient(w, it)
        chan.send(grad)
        chan.send(other(it))
        slot.send(gradient(w, it))
        copied = chan.stats()["bytes_copied"] + slot.stats()["bytes_copied"] - before
        assert copied == (2 * 4 * n if it == 0 else 0), (it, copied)
    else:
        want = torch.tanh(w * (it + 1)) * 0.5
        assert torch.equal(torch.from_numpy(chan.recv()), want)
        assert (chan.recv() == it).all()
        assert torch.equal(torch.from_numpy(slot.recv()), want)
        slot.release()
# The parameter server: rank 1 pushes fresh torch gradients.
if ps.is_server:
    ps.serve(3)
else:
    for it in range(3):
        before = ps.stats()["bytes_copied"]
        p = torch.from_numpy(ps.pull()["w"])
        ps.push({"w": torch.sin(p) * 0.1})
        copied = ps.stats()["bytes_copied"] - before
        assert copied == (4 * n if it == 0 else 0), (it, copied)
if g.rank == 0:
    assert torch_sites.traced_count() == 2 and torch_sites.arena_allocations() == 6, \
        (torch_sites.traced_count(), torch_sites.arena_allocations())
print("ok", flush=True)
""", timeout=90)
    for r in res:
        assert "ok" in r.stdout, r.stderr[-3000:]
