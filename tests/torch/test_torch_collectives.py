"""Every collective DDP and FSDP use, on the scalefree backend and on gloo in the same
processes with the same inputs (the script checks they agree); 3 ranks (an odd world size; the DDP tests cover 2 and 4)."""

from pathlib import Path

import pytest

from _launch import run_torch_ranks

HERE = Path(__file__).parent


@pytest.mark.parametrize("n", [3])
def test_collectives_match_gloo(n):
    res = run_torch_ranks(n, [str(HERE / "collectives_script.py")], timeout=180)
    for r, c in enumerate(res):
        assert "all collectives agree with gloo" in c.stdout, c.stderr[-3000:]
