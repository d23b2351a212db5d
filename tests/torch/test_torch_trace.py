"""Allocation-site tracing in the ``"scalefree"`` backend (``trace_script.py``, 2 real rank
processes; a group with tracing and one with ``SCALEFREE_TRACE=0`` in the same processes):
send/recv of odd sizes and dtypes arrive equal; a tensor sent from the same line is copied
once with tracing and every time without (``pg.stats()``); DDP trains to identical
parameters either way and, on one host, copies at most half as much per step once its
buckets are registered. On one host and across 2 simulated hosts (UCX between them)."""

import json
from pathlib import Path

import pytest

from _launch import run_torch_ranks

HERE = Path(__file__).parent
SENT = 50_000 * 4  # bytes of the tensor the script sends five times


def _run(tmp_path, extra=None) -> list[dict]:
    run_torch_ranks(2, [str(HERE / "trace_script.py"), str(tmp_path)], timeout=240, extra=extra)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def _check_p2p(res, one_host: bool):
    sender = res[0]
    # Staged until the site is traced, then born in registered memory: the thread left the
    # dispatch mode once the script's earlier sends were learned, so a new site is staged
    # three times (the staged send, the call that turns the mode on again, the send that
    # traces the site), then never again.
    assert sender["p2p_on"] == [SENT, SENT, SENT, 0, 0], sender["p2p_on"]
    assert sender["p2p_off"] == [SENT] * 5, sender["p2p_off"]      # staged every time
    # A gradient sent from a backward pass: staged while the mode is turned on and learns
    # its operator, then not at all, with no dispatch mode left in the thread and no
    # torch._dynamo imported.
    grad = res[1]["backward_on"]
    assert grad[0] == 256 * 64 * 4 and grad[-2:] == [0, 0], grad
    assert [r["dispatch_modes"] for r in res] == [0, 0] and not any(r["dynamo"] for r in res), res
    # The collectives' staging as the transport counts it.
    assert [r["bcast_staged"] for r in res] == ([5 << 20, 0] if one_host else [0, 0]), res
    assert [r["small_staged"] for r in res] == [12, 12], res


def test_trace_on_one_host(tmp_path):
    res = _run(tmp_path)
    assert res[0]["transport"] == "shm"
    _check_p2p(res, True)
    for r in res:
        # Steps 4-6: the bucket (51,620 bytes) is registered with tracing (DDP rebuilds its
        # buckets after the first step; a storage moves on its second allreduce), staged without
        # (the part peers read: the transport copies about half of it, the other rank's share).
        on, off = sum(r["ddp_on"][3:]), sum(r["ddp_off"][3:])
        assert off >= 3 * 25_000 and on <= off / 2, (r["ddp_on"], r["ddp_off"])


def test_trace_across_simulated_hosts(tmp_path):
    from scalefree.errors import UnsupportedError
    from scalefree.launch.ucx import info

    try:
        info()
    except UnsupportedError as e:
        pytest.skip(f"UCX is not installed here: {e}")
    res = _run(tmp_path, {"SCALEFREE_SIMULATE_HOSTS": "1"})
    assert res[0]["transport"] == "ucx"
    _check_p2p(res, False)
    for r in res:
        # Across hosts the collectives write from the bucket itself: nothing is staged
        # either way (only calls small enough to travel inline are copied).
        assert sum(r["ddp_on"][3:]) <= sum(r["ddp_off"][3:]), (r["ddp_on"], r["ddp_off"])
