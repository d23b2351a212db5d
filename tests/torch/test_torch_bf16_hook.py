"""The ``bf16`` DDP comm hook (``scalefree.torch.hooks.bf16``) against gloo: 2 real rank
processes on simulated hosts (every rank its own, UCX between), so the hook's allreduce
rounds what crosses between them to bfloat16."""

from pathlib import Path

import pytest

from _launch import run_torch_ranks

HERE = Path(__file__).parent


def test_bf16_hook_matches_gloo_within_bf16_rounding(tmp_path):
    import torch

    from scalefree.errors import UnsupportedError
    from scalefree.launch.ucx import info

    try:
        info()
    except UnsupportedError as e:
        pytest.skip(f"UCX is not installed here: {e}")

    run_torch_ranks(2, [str(HERE / "bf16_script.py"), str(tmp_path), "16"], timeout=180,
                    extra={"SCALEFREE_SIMULATE_HOSTS": "1"})
    curves = torch.load(tmp_path / "losses.pt")
    # Trains as gloo does: the last losses within 1 %.
    last = sum(curves["bf16"][-5:]) / 5
    want = sum(curves["gloo"][-5:]) / 5
    assert last == pytest.approx(want, rel=0.01), (curves["bf16"][-5:], curves["gloo"][-5:])
    assert curves["bf16"][-1] < curves["bf16"][0]
