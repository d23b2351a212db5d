"""DDP with the "scalefree" backend against gloo: the same script, only the backend name
differs; real rank processes with torch's env:// variables (what torchrun sets)."""

import subprocess
import sys
from pathlib import Path

import pytest

from _launch import free_port, run_torch_ranks

HERE = Path(__file__).parent


def _train(backend: str, n: int, out: Path, steps: int = 5):
    out.mkdir()
    run_torch_ranks(n, [str(HERE / "ddp_script.py"), backend, str(out), str(steps)])
    import torch

    return [torch.load(out / f"rank{r}.pt") for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_gloo(tmp_path, n):
    import torch

    ours = _train("scalefree", n, tmp_path / "sf")
    ref = _train("gloo", n, tmp_path / "gloo")
    for r in range(n):
        assert ours[r]["losses"] == pytest.approx(ref[r]["losses"], rel=1e-5, abs=1e-6)
        for k, v in ref[r]["state"].items():
            torch.testing.assert_close(ours[r]["state"][k], v, rtol=1e-5, atol=1e-6)
    # DDP keeps replicas identical: every rank ends with rank 0's weights.
    for r in range(1, n):
        for k, v in ours[0]["state"].items():
            assert torch.equal(ours[r]["state"][k], v)
    assert ours[0]["mean_loss"] == pytest.approx(ref[0]["mean_loss"], rel=1e-5)


def test_ddp_four_ranks(tmp_path):
    res = _train("scalefree", 4, tmp_path / "sf", steps=3)
    import torch

    for r in range(1, 4):
        for k, v in res[0]["state"].items():
            assert torch.equal(res[r]["state"][k], v)


def test_ddp_under_torchrun(tmp_path):
    """torchrun itself (its elastic agent and TCPStore), 2 ranks."""
    out = tmp_path / "tr"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(HERE / "ddp_script.py"), "scalefree", str(out), "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (out / "rank0.pt").exists() and (out / "rank1.pt").exists()
