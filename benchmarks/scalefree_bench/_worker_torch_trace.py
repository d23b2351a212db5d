"""One rank of ``scalefree bench torch-trace`` (started by ``scalefree run``; torch's env://
variables come from ``import scalefree.torch``). Tracing on or off by ``SCALEFREE_TRACE``.

    python -m scalefree_bench._worker_torch_trace WORKLOAD STEPS WARMUP BATCH WIDTH OUT

``ddp``: an MLP (WIDTH -> WIDTH -> WIDTH -> 10) under DDP, BATCH rows per rank per step.
``pipeline``: 2 ranks, the same MLP split in two: rank 0 runs the first layer and sends its
activations (BATCH x WIDTH float32) to rank 1, which runs the rest, the loss and the backward
pass and sends the activations' gradient back; rank 0 finishes the backward pass. Both
take an SGD step. Writes OUT.rank{R}.json: the timed steps' seconds, this rank's bytes copied per step
(``pg.stats()``), peak RSS, and after the timed steps the dispatch modes left in this thread
and whether ``torch._dynamo`` was imported (SGD's ``step`` imports it, tracing or not)."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import scalefree.torch  # noqa: F401  (registers the backend, fills torch's env://)
from scalefree._rss import peak_rss_bytes
from scalefree.tensors import torch_sites


def main() -> int:
    workload, steps, warmup, batch, width, out = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
    torch.set_num_threads(1)
    dist.init_process_group("scalefree")
    pg = dist.group.WORLD
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, width, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    if workload == "ddp":
        model = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 10))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            return float(loss.detach())
        samples = batch * size
    else:
        if size != 2:
            raise SystemExit("pipeline: 2 ranks")
        first = nn.Linear(width, width)
        rest = nn.Sequential(nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 10))
        mine = first if rank == 0 else rest
        opt = torch.optim.SGD(mine.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            if rank == 0:
                h = first(x)
                dist.send(h.detach(), 1)
                grad = torch.empty_like(h)
                dist.recv(grad, 1)
                h.backward(grad)
                loss = 0.0
            else:
                h = torch.empty(batch, width)
                dist.recv(h, 0)
                h.requires_grad_(True)
                out = nn.functional.cross_entropy(rest(h), y)
                out.backward()
                dist.send(h.grad, 0)
                loss = float(out.detach())
            opt.step()
            return loss
        samples = batch

    # Untimed and timed steps are called from one line: allocation sites are keyed by the
    # caller's frames, so what tracing learned in the untimed steps holds in the timed ones.
    losses = []
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            before = pg.stats()
            t = time.perf_counter()
        losses.append(step())
    dist.barrier()
    secs = time.perf_counter() - t
    after = pg.stats()
    per = {k: (after[k] - before[k]) / steps for k in ("bytes_copied", "bytes_staged", "bytes_copied_recv",
                                                       "bytes_zero_copy")}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "seconds": secs, "samples_per_s": samples * steps / secs, "loss": losses[-1],
                   "trace": pg.trace, "transport": pg.group.transport, "per_step": per,
                   "peak_rss_bytes": peak_rss_bytes(),
                   # after the timed steps: dispatch modes left in this thread, tensors torch's
                   # operators made in the arena, whether torch._dynamo was imported
                   "dispatch_modes": torch._C._len_torch_dispatch_stack(),
                   "arena_allocations": torch_sites.arena_allocations(),
                   "dynamo_imported": "torch._dynamo" in sys.modules}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
