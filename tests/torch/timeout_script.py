"""Deadlines of the "scalefree" torch backend with a stopped rank. Rank and size from torch's
env:// variables.

    python timeout_script.py MODE PG_TIMEOUT_S

The last rank stops itself (SIGSTOP) after a first barrier; every other rank then runs, by MODE:

- ``collective``: a blocking all_reduce (the process group's timeout must end it);
- ``wait``: an async all_reduce and ``work.wait(timeout=2 s)``, the group's timeout far longer;
- ``ddp``: one DDP training step (its bucket allreduces wait on the group's timeout).

Each of those ranks prints one JSON line: the seconds the call took and the error it raised, then
exits at once (the group is out of step). The test resumes or kills the stopped rank.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import scalefree.torch  # noqa: F401

mode, pg_timeout = sys.argv[1], float(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("scalefree", timeout=timedelta(seconds=pg_timeout))
rank, n = dist.get_rank(), dist.get_world_size()
model = None
if mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
dist.barrier()
if rank == n - 1:
    os.kill(os.getpid(), signal.SIGSTOP)
    # Resumed by the test only to be killed; nothing more to do.
    os._exit(0)
time.sleep(0.5)  # the stopped rank is stopped by now (its SIGSTOP follows the barrier)
t0 = time.monotonic()
error = None
try:
    if mode == "collective":
        dist.all_reduce(torch.ones(1000))
    elif mode == "wait":
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        work.wait(timeout=timedelta(seconds=2))
    elif mode == "ddp":
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
    else:
        raise SystemExit(f"unknown mode {mode}")
except Exception as e:  # noqa: BLE001 - reported to the test
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"rank": rank, "seconds": time.monotonic() - t0, "error": error}), flush=True)
os._exit(0)
