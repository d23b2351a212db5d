"""Allocation-site tracing in the ``"scalefree"`` torch backend, 2 ranks (torch's env://).

    python trace_script.py OUT_DIR

Writes OUT_DIR/rank{R}.json with what it measured; asserts on the way:
send/recv of sizes 0, 1, 7, 1001, 65537 and 1 MiB + 3 elements in float32, float64, int64 and
bfloat16 (both directions, tags of 32 and 64 bits, a non-contiguous tensor) arrive equal;
a tensor sent from the same line every iteration is staged (copied) once, then born in
registered memory (tracing on) or staged every time (a group with tracing off); DDP trained
the same way on a group with tracing and one without ends with identical parameters.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import scalefree.torch  # noqa: F401  (registers the backend)

out_dir = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("scalefree")
on = dist.group.WORLD
os.environ["SCALEFREE_TRACE"] = "0"
off = dist.new_group(backend="scalefree")
rank = dist.get_rank()
peer = 1 - rank
assert on.trace and not off.trace
res = {"transport": on.group.transport}


def expected(n, dtype, salt):
    x = torch.arange(n, dtype=torch.float64).mul_(0.37).add_(salt).remainder_(1000.0)
    if dtype == torch.int64:
        return (x * 1e6).to(torch.int64) - 7
    return x.to(dtype)


# Odd sizes and dtypes, the direction alternating; tags of 32 bits and one past them.
tags = [3, -5, 1 << 40]
for i, (n, dtype) in enumerate((n, d) for n in (0, 1, 7, 1001, 65537, (1 << 20) + 3)
                               for d in (torch.float32, torch.float64, torch.int64, torch.bfloat16)):
    tag, src = tags[i % 3], i % 2
    want = expected(n, dtype, i)
    if rank == src:
        dist.send(want, peer, tag=tag)
    else:
        got = torch.full((n,), 9, dtype=dtype)
        dist.recv(got, src, tag=tag)
        assert torch.equal(got, want), (n, dtype, src)
# A non-contiguous tensor (a transposed view) and a 2-D receive.
base = expected(35, torch.float32, 1).view(5, 7)
if rank == 0:
    dist.send(base.t(), 1, tag=9)
else:
    got = torch.empty(7, 5)
    dist.recv(got, 0, tag=9)
    assert torch.equal(got, base.t()), got

# A sent tensor made on the same line every iteration: with tracing, the first staged send
# turns on the tracing of torch's sites (at the next call), the next one traces the site,
# and from then on the tensor is born in registered memory.
n = 50_000  # 200 KB of float32
w = expected(n, torch.float32, 0)
for name, pg in (("on", on), ("off", off)):
    copied = []
    for it in range(5):
        before = pg.stats()["bytes_staged"]
        if rank == 0:
            dist.send(torch.tanh(w * (it + 1)), 1, group=pg)
        else:
            got = torch.empty(n)
            dist.recv(got, 0, group=pg)
            assert torch.equal(got, torch.tanh(w * (it + 1))), it
        copied.append(pg.stats()["bytes_staged"] - before)
    res[f"p2p_{name}"] = copied

# A gradient made in a backward pass and sent (a pipeline's stage): its operator
# (tanh_backward, called at the backward() line) is learned under the dispatch mode, which is
# then left; from then on that operator's own kernel puts it in registered memory.
torch.manual_seed(7)
lin = nn.Linear(64, 64)  # the same on both ranks


def grad_of(it):
    x = (w[:256 * 64].view(256, 64) * (0.01 * (it + 1))).requires_grad_(True)
    lin(torch.tanh(x)).square().sum().backward()
    return x.grad


copied = []
for it in range(6):
    before = on.stats()["bytes_staged"]
    if rank == 1:
        dist.send(grad_of(it), 0, group=on)
    else:
        got = torch.empty(256, 64)
        dist.recv(got, 1, group=on)
        assert torch.equal(got, grad_of(it)), it
    copied.append(on.stats()["bytes_staged"] - before)
res["backward_on"] = copied
res["dispatch_modes"] = torch._C._len_torch_dispatch_stack()
res["dynamo"] = "torch._dynamo" in sys.modules

# The collectives' staging is the transport's own count: a broadcast from rank 0 of a buffer
# outside registered memory is staged on one host (at any size: broadcasts never read by
# cross-memory attach), written from where it is across hosts; a small allreduce travels
# with the call's header (copied once per peer).
big = torch.arange((5 << 20) // 4, dtype=torch.float32)  # 5 MiB, past SCALEFREE_STAGE_MAX
before = off.stats()["bytes_staged"]
dist.broadcast(big, 0, group=off)
res["bcast_staged"] = off.stats()["bytes_staged"] - before
small = torch.ones(3)
before = off.stats()["bytes_staged"]
dist.all_reduce(small, group=off)
res["small_staged"] = off.stats()["bytes_staged"] - before
assert torch.equal(small, torch.full((3,), 2.0))


def train(pg, steps=6):
    """DDP on ``pg``: the per-step bytes the group copied and the final parameters."""
    torch.manual_seed(1234 + rank)  # DDP broadcasts rank 0's weights
    model = nn.Sequential(nn.Linear(37, 300), nn.ReLU(), nn.Linear(300, 5))  # one bucket of 51,620 bytes
    ddp = DDP(model, process_group=pg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(99 + rank)
    per_step = []
    for _ in range(steps):
        x = torch.randn(16, 37, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        before = pg.stats()["bytes_copied"]
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        per_step.append(pg.stats()["bytes_copied"] - before)
    return per_step, [p.detach().clone() for p in model.parameters()]


res["ddp_on"], p_on = train(on)
res["ddp_off"], p_off = train(off)
assert all(torch.equal(a, b) for a, b in zip(p_on, p_off)), "tracing changed the training"
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
print("ok", flush=True)
