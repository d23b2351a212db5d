"""``rima`` under bounded staleness (``mf/modes/rima_ssp.py``) with real rank processes on
MovieLens-100K: slack 0 is today's Rima bit for bit; with a slack and a straggler every block
update reaches the final model exactly once (a counting "training" that adds 1 per visit);
the CLI's --slack and its errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import scalefree.mf.model as mf
from ranks import collect, spawn_ranks

_REPO = Path(__file__).resolve().parents[2]
DATA = next((a / "shared/data" for a in _REPO.parents if (a / "shared/data").exists()), _REPO / "../shared/data")
ML100K = DATA / "movielens-100k/u.data"

pytestmark = pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")

SETUP = f"""
import sys
import numpy as np
import scalefree
import scalefree.mf.model as mf
from scalefree.mf.modes import rima, rima_ssp
from scalefree.mf.data.blocks import Partition
g = scalefree.init(timeout=120)
tr, te = mf.split_ratings({str(ML100K)!r}, 0.1, 0)
def opts(c, **kw):
    o = dict(k=8, eta=0.1, lam=0.1, schedule="adagrad", iterations=3, seed=5, init_max=None, blocks_per_worker=c)
    o.update(kw)
    return o
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path))


def _run(n: int, code: str, tmp_path) -> list:
    res = collect(spawn_ranks(n, SETUP + code, extra_env={"SCALEFREE_CACHE_DIR": str(tmp_path)}), timeout=240)
    for r in res:
        assert r.returncode == 0 and "ok" in r.stdout, f"rank {r.rank}:\n{r.stderr[-3000:]}"
    return res


def test_slack_zero_is_bit_identical_to_synchronous_rima(tmp_path):
    """The stale ring at slack 0 (a straggler too) against rima's own loop, with w x w and
    2w x 2w blocks: the same P and Q, bit for bit, and the same training loss."""
    _run(3, """
for c in (1, 2):
    a = rima.train(g, tr, opts(c))
    b = rima.train(g, tr, opts(c, slack=0, straggler_ms=5))
    if g.rank == 0:
        assert np.array_equal(a["p"], b["p"]) and np.array_equal(a["q"], b["q"]), c
        assert a["train_mse"] == b["train_mse"], (a["train_mse"], b["train_mse"])
        assert b["stale_steps"] == [0, 0, 0]
print("ok", flush=True)
""", tmp_path)


def test_every_update_is_merged_exactly_once(tmp_path):
    """Training replaced by "add 1 to every factor": after `iterations` x V steps each block
    was visited iterations x V times, so the final model must be the initial one plus that,
    whatever was trained stale and merged later (a lost update is off by 1, a doubled one too).
    The straggler makes stale steps happen; the test checks that they did."""
    _run(4, """
def count(part, ru, ri, p, q, opts, rng, entries=None, first=False):
    p.factors += 1.0
    q.factors += 1.0
    return 0.0
rima_ssp.train_block = count
for c, slack in ((1, 2), (2, 1), (1, 5)):
    res = rima.train(g, tr, opts(c, slack=slack, straggler_ms=15, iterations=8))
    if g.rank == 0:
        V = 4 * c
        part = Partition(tr, V, 8, 5, None)
        n = 8 * V
        want_p, want_q = part.dense_factors({b: part.p_block(b).flat + n for b in range(V)},
                                            {b: part.q_block(b).flat + n for b in range(V)})
        err = max(np.abs(res["p"] - want_p).max(), np.abs(res["q"] - want_q).max())
        assert err < 1e-2, (c, slack, err)
        assert sum(res["stale_steps"]) > 0, res["stale_steps"]
print("ok", flush=True)
""", tmp_path)


def test_cli_slack_trains_and_reports(tmp_path):
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", "rima",
                        "-n", "3", "-i", "4", "-k", "8", "--slack", "2", "--json", str(out), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [1, 2, 3, 4]
    assert all(0.8 < r["test_rmse"] < 1.3 for r in recs), [r["test_rmse"] for r in recs]
    assert recs[-1]["blocks_per_side"] == 3  # a positive slack: w x w blocks unless --blocks says otherwise


def test_default_blocks():
    """Slack 0 keeps rima's 2w x 2w blocks (the same run as without --slack); a positive slack
    cuts w x w unless --blocks says otherwise (the CLI run above); dsgd-ps w x w."""
    assert [mf.default_blocks("rima", 4, s) for s in (None, 0, 1, 8)] == [8, 8, 4, 4]
    assert mf.default_blocks("dsgd-ps", 3) == 3 and mf.default_blocks("rima", 1, 2) == 1


@pytest.mark.parametrize("argv,msg", [
    (["--mode", "local", "--slack", "2"], "--slack is for --mode rima"),
    (["--mode", "rima", "-n", "2", "--slack", "2", "--memory-budget", "1M"], "--slack does not combine"),
])
def test_cli_slack_errors(argv, msg):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), *argv],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and msg in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_cli_negative_slack_is_a_usage_error():
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", "rima", "-n", "2",
                        "--slack", "-1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "argument --slack" in p.stderr, p.stderr
