"""A rank that dies makes the others' collectives raise torch's DistBackendError (no hang)."""

from _launch import run_torch_ranks

CODE = """
import os, sys, torch, torch.distributed as dist
import scalefree.torch
dist.init_process_group("scalefree")
rank = dist.get_rank()
t = torch.ones(1000)
dist.all_reduce(t)
if rank == 1:
    os._exit(3)
try:
    for _ in range(3):
        dist.all_reduce(t)
except dist.DistBackendError as e:
    print("raised DistBackendError:", e)
    sys.exit(0)
print("no error")
sys.exit(1)
"""


def test_dead_peer_raises_on_every_rank():
    res = run_torch_ranks(3, ["-c", CODE], timeout=60, check=False)
    assert res[1].returncode == 3
    for r in (0, 2):
        assert res[r].returncode == 0, res[r].stdout + res[r].stderr[-3000:]
        assert "raised DistBackendError" in res[r].stdout
