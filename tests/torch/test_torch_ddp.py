"""DDP with the "scalefree" backend against gloo: the same training script, only the backend
name differs; real rank processes. Each launch trains once per backend in turn (a new
process group each time), which keeps the test short (torch's import is most of its time)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _launch import free_port, run_torch_ranks, torch_env

HERE = Path(__file__).parent


def _check(out: Path, n: int):
    import torch

    ours = [torch.load(out / f"scalefree-rank{r}.pt") for r in range(n)]
    ref = [torch.load(out / f"gloo-rank{r}.pt") for r in range(n)]
    exact = n <= 2  # two ranks sum in one order; more may round differently
    for r in range(n):
        if exact:
            assert ours[r]["losses"] == ref[r]["losses"]
        else:
            assert ours[r]["losses"] == pytest.approx(ref[r]["losses"], rel=1e-5, abs=1e-6)
        for k, v in ref[r]["state"].items():
            if exact:
                assert torch.equal(ours[r]["state"][k], v), k
            else:
                torch.testing.assert_close(ours[r]["state"][k], v, rtol=1e-5, atol=1e-6)
    # DDP keeps replicas identical: every rank ends with the same weights.
    for r in range(1, n):
        for k, v in ours[0]["state"].items():
            assert torch.equal(ours[r]["state"][k], v)
    assert ours[0]["mean_loss"] == pytest.approx(ref[0]["mean_loss"], rel=1e-6)
    # The buckets above the inline size (32 KiB: the 64 x 4100 weight's, 1 MiB, and the 4100 x 5
    # weight's, 82 KB) were moved to shared memory and registered (peers map them) on every
    # rank (allocation-site tracing, on by default; without it only the first).
    assert all(o["shared_buckets"] == 2 for o in ours), [o["shared_buckets"] for o in ours]


def test_ddp_matches_gloo_2_ranks(tmp_path):
    """2 ranks, started with torch's env:// variables (what torchrun sets)."""
    run_torch_ranks(2, [str(HERE / "ddp_script.py"), "scalefree,gloo", str(tmp_path), "5"])
    _check(tmp_path, 2)


def test_ddp_under_torchrun_4_ranks(tmp_path):
    """torchrun itself (its elastic agent and TCPStore), 4 ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(HERE / "ddp_script.py"), "scalefree,gloo", str(tmp_path), "3"]
    env = torch_env(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and its ranks
        p.communicate()
        raise AssertionError("torchrun hung past 180 s") from None
    assert p.returncode == 0, err[-4000:]
    _check(tmp_path, 4)
