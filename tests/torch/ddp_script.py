"""A plain DDP training script: the backend name is its only scalefree-specific input.

    python ddp_script.py BACKEND[,BACKEND...] OUT_DIR [STEPS]

Trains a small MLP for a few steps on fixed random data and writes each rank's losses and
final weights to OUT_DIR/BACKEND-rank{R}.pt. Rank and size come from torch's env://
variables. With several backends, the same training runs once per backend in turn (a new
process group each time), so one launch compares them.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

backends, out_dir = sys.argv[1].split(","), sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
torch.set_num_threads(1)


def train(backend):
    if backend == "scalefree":
        import scalefree.torch  # noqa: F401  (registers the backend)

    dist.init_process_group(backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)  # different initial weights per rank: DDP must broadcast rank 0's
    # The middle weight (64 x 4100 floats) is a bucket of over 1 MiB: the scalefree backend
    # moves it to shared memory on its second allreduce.
    model = nn.Sequential(nn.Linear(37, 64), nn.ReLU(), nn.Linear(64, 4100), nn.ReLU(), nn.Linear(4100, 5))
    # Small buckets so that several allreduces overlap the backward pass.
    ddp = DDP(model, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(99 + rank)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 37, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # The average loss over ranks, through the backend too.
    total = torch.tensor([sum(losses)], dtype=torch.float64)
    dist.all_reduce(total)
    # Outside a backward pass a storage is never moved (a caller may hold its address).
    plain = torch.ones(300_000)
    before = plain.data_ptr()
    for _ in range(3):
        dist.all_reduce(plain)
    assert plain.data_ptr() == before and plain[0].item() == size ** 3
    shared = 0
    if backend == "scalefree":
        from scalefree.torch.backend import _live

        shared = sum(len(pg._shared._held) for pg in _live if pg._shared is not None)
    torch.save({"losses": losses, "mean_loss": total.item() / size, "shared_buckets": shared,
                "state": {k: v.clone() for k, v in model.state_dict().items()}}, f"{out_dir}/{backend}-rank{rank}.pt")
    dist.destroy_process_group()


port = int(os.environ["MASTER_PORT"])
for i, b in enumerate(backends):
    if i:  # a fresh store for each process group, hosted by rank 0 (not torchrun's agent)
        os.environ["MASTER_PORT"] = str(port + i)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    train(b)
