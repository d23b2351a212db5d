"""DDP with the scalefree ``bf16`` comm hook against gloo, in one launch:

    python bf16_script.py OUT_DIR STEPS

The default process group is scalefree's (``SCALEFREE_SIMULATE_HOSTS=1``: every rank its own
host, so the hook's allreduce rounds between hosts); a gloo group over the same ranks
trains a twin of the model from the same weights on the same data. After the first
backward pass each rank checks the hook's averaged gradients against gloo's within the
documented bound of the compressed allreduce, computed from every rank's own gradients;
then both train STEPS steps. Rank 0 writes both loss curves to OUT_DIR/losses.pt.
"""

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import scalefree.torch  # noqa: F401  (registers the backend)
from scalefree.torch import hooks

out_dir, steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("scalefree")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
torch.manual_seed(1234)
base = nn.Sequential(nn.Linear(37, 64), nn.ReLU(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 5))
ours = DDP(copy.deepcopy(base))
ours.register_comm_hook(None, hooks.bf16)
ref = DDP(copy.deepcopy(base), process_group=gloo)
lone = copy.deepcopy(base)  # this rank's own gradients, for the bound
g = torch.Generator().manual_seed(99 + rank)
teacher = torch.randn(37, 5, generator=torch.Generator().manual_seed(7))  # a task to learn
xs = [torch.randn(32, 37, generator=g) for _ in range(steps)]
data = [(x, (x @ teacher).argmax(1)) for x in xs]

# One backward pass: the averaged gradients against gloo's.
x, y = data[0]
for m in (ours, ref, lone):
    nn.functional.cross_entropy(m(x), y).backward()
mine = torch.cat([p.grad.view(-1) for p in lone.parameters()])
abs_sum = mine.abs().double()
dist.all_reduce(abs_sum, group=gloo)
got = torch.cat([p.grad.view(-1) for p in ours.parameters()]).double()
want = torch.cat([p.grad.view(-1) for p in ref.parameters()]).double()
u = 2.0 ** -8
bound = (2 * u + size * 2.0 ** -24) * (1 + u) * abs_sum / size + 1e-12
err = (got - want).abs()
assert bool((err <= bound).all()), f"largest error {float((err / bound).max()):.3f} of the bound"
assert bool((got != want).any()), "nothing was rounded: the hook did not compress"

# Training: the same loss within 1 %.
curves = {}
for name, m in (("bf16", ours), ("gloo", ref)):
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    curves[name] = losses
if rank == 0:
    torch.save(curves, f"{out_dir}/losses.pt")
dist.destroy_process_group()
