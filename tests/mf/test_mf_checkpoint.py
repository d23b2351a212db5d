"""scalefree.mf.data.checkpoint: atomic checkpoints, ``--resume`` and ``--stop-after`` in every mode.
A run stopped after a checkpoint and resumed ends where an uninterrupted run with the same seed
ends (exactly: local with one thread, and rima / dsgd-ps, whose ranks train in a fixed order)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree_bench.mf import synthetic_ratings
from scalefree.errors import InvalidArgumentError

ML100K = Path(__file__).resolve().parents[2] / "../shared/data/movielens-100k/u.data"


@pytest.fixture(scope="module")
def data():
    u, i, r = synthetic_ratings(300, 200, 20_000, seed=3)
    return mf.split_ratings((u, i, r), 0.1, 0)


def _factors(m):
    p, q, *_ = m._model.parts()
    return np.frombuffer(p, np.float32), np.frombuffer(q, np.float32)


@pytest.mark.parametrize("out_of_core", [False, True])
def test_local_resume_equals_an_uninterrupted_run(data, tmp_path, out_of_core):
    """Also out of core (the blocks on flash, the next pass read ahead across calls): the
    resumed trainer's read-ahead starts at the restored pass."""
    tr, te = data
    budget = {"memory_budget": len(tr) * 12 // 4} if out_of_core else {}
    make = lambda: mf.MatrixFactorization(k=8, iterations=6, threads=1, seed=5, **budget)  # noqa: E731
    full = make().fit(tr, te)
    ck = tmp_path / "ck"
    part = make().fit(tr, te, checkpoint=ck, checkpoint_every=2, stop_after=3)
    assert len(part.history) == 3 and ck.exists()
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]  # no temp file left
    back = make().fit(tr, te, checkpoint=ck, resume=True)
    for a, b in zip(_factors(full), _factors(back)):
        np.testing.assert_array_equal(a, b)
    assert [h["train_mse"] for h in back.history] == [h["train_mse"] for h in full.history]
    assert back.history[-1]["test_rmse"] == full.history[-1]["test_rmse"]
    # More iterations than the checkpoint's run: continues.
    longer = mf.MatrixFactorization(k=8, iterations=8, threads=1, seed=5, **budget).fit(tr, te, checkpoint=ck,
                                                                                        resume=True)
    assert len(longer.history) == 8


def test_local_resume_with_early_stopping(data, tmp_path):
    tr, te = data
    make = lambda: mf.MatrixFactorization(k=8, iterations=15, threads=1, lam=0.0)  # noqa: E731
    kw = dict(validation_fraction=0.2, patience=2)
    full = make().fit(tr, te, **kw)
    make().fit(tr, te, **kw, checkpoint=tmp_path / "ck", stop_after=2)
    back = make().fit(tr, te, **kw, checkpoint=tmp_path / "ck", resume=True)
    assert full.stopped_at and back.stopped_at == full.stopped_at
    for a, b in zip(_factors(full), _factors(back)):
        np.testing.assert_array_equal(a, b)


def test_mismatched_or_missing_checkpoint_is_refused(data, tmp_path):
    tr, te = data
    ck = tmp_path / "ck"
    mf.MatrixFactorization(k=8, iterations=2, threads=1).fit(tr, te, checkpoint=ck)
    with pytest.raises(InvalidArgumentError, match="k 8 .now 9"):
        mf.MatrixFactorization(k=9, iterations=2, threads=1).fit(tr, te, checkpoint=ck, resume=True)
    with pytest.raises(InvalidArgumentError, match="data"):
        mf.MatrixFactorization(k=8, iterations=2, threads=1).fit(te, checkpoint=ck, resume=True)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        mf.MatrixFactorization(k=8, iterations=2, threads=1).fit(tr, checkpoint=tmp_path / "no", resume=True)
    with pytest.raises(InvalidArgumentError, match="need a checkpoint"):
        mf.MatrixFactorization(k=8, iterations=2, threads=1).fit(tr, resume=True)


def _train(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "-q", "-k", "16",
                           "-i", "6", "--seed", "1", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def _rmse(p) -> float:
    assert p.returncode == 0, p.stderr
    return float(re.search(r"final test RMSE (\S+)", p.stdout).group(1))


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
@pytest.mark.parametrize("mode,n", [("rima", 2), ("dsgd-ps", 3)])
def test_ranks_stopped_and_resumed_reach_the_uninterrupted_rmse(mode, n, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))
    run = ("--mode", mode, "-n", str(n))
    full = _rmse(_train(tmp_path, *run))
    ck = str(tmp_path / "ck")
    stopped = _train(tmp_path, *run, "--checkpoint", ck, "--checkpoint-every", "2", "--stop-after", "3")
    assert "3 iterations" in stopped.stdout and _rmse(stopped) != full
    assert sorted(f.name for f in tmp_path.glob("ck*")) == sorted(  # one per rank, and the one before
        f"ck.rank{r}-of-{n}{prev}" for r in range(n) for prev in ("", ".prev"))
    assert _rmse(_train(tmp_path, *run, "--checkpoint", ck, "--resume")) == pytest.approx(full, abs=1e-4)
    bad = _train(tmp_path, *run, "-k", "8", "--checkpoint", ck, "--resume")
    assert bad.returncode == 2 and "does not match this run: it has k 16 (now 8)" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_cli_resume_needs_a_checkpoint(tmp_path):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", "x.csv", "--resume"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "need --checkpoint" in p.stderr


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
@pytest.mark.parametrize("mode,n", [("rima", 2), ("dsgd-ps", 3)])
def test_ranks_stop_early_on_a_validation_split(mode, n, tmp_path, monkeypatch):
    """λ small enough to overfit: the validation RMSE turns up, every rank stops at the same
    iteration, and rank 0 keeps the best iteration's model."""
    import json

    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))
    p = _train(tmp_path, "--mode", mode, "-n", str(n), "-i", "40", "--lam", "0.01", "--validation-fraction", "0.1",
               "--patience", "2", "--json", str(tmp_path / "h.jsonl"))
    final = _rmse(p)
    stop = int(re.search(r"early stop after iteration (\d+)", p.stdout).group(1))
    recs = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert len(recs) == stop < 40
    v = [r["valid_rmse"] for r in recs]
    best = int(np.argmin(v))
    assert best == stop - 3 and min(v[best + 1:]) >= v[best]  # two iterations without improvement
    assert final == pytest.approx(recs[best]["test_rmse"], abs=1e-4)  # the best iteration's model
    # Stopped one iteration before the early stop, then resumed: the same stop, the same model.
    args = ("--mode", mode, "-n", str(n), "-i", "40", "--lam", "0.01", "--validation-fraction", "0.1", "--patience", "2",
            "--checkpoint", str(tmp_path / "ck"))
    cut = _train(tmp_path, *args, "--stop-after", str(stop - 1))
    assert _rmse(cut) and "early stop" not in cut.stdout
    back = _train(tmp_path, *args, "--resume")
    assert _rmse(back) == pytest.approx(final, abs=1e-4) and f"early stop after iteration {stop}:" in back.stdout


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
def test_killed_rima_job_resumes_to_the_uninterrupted_rmse(tmp_path, monkeypatch):
    """SIGKILL to every rank once checkpoints exist (wherever the ranks are then, even between
    two ranks' writes), then --resume: the same final RMSE as an uninterrupted run."""
    import os
    import signal
    import time

    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))
    run = ("--mode", "rima", "-n", "2", "-i", "60")
    full = _rmse(_train(tmp_path, *run))
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "-q", "-k", "16", "--seed", "1", *run,
           "--checkpoint", str(ck), "--checkpoint-every", "1"]
    job = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while job.poll() is None and time.monotonic() < deadline:
        if all((tmp_path / f"ck.rank{r}-of-2").exists() for r in range(2)):
            os.killpg(job.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    job.wait(timeout=60)
    assert _rmse(_train(tmp_path, *run, "--checkpoint", str(ck), "--resume")) == pytest.approx(full, abs=1e-4)


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
def test_a_rank_killed_under_max_restarts_resumes_to_the_uninterrupted_rmse(tmp_path, monkeypatch):
    """``scalefree run -n 2 --max-restarts 1 -- mf train --mode rima ... --checkpoint ck --resume``:
    rank 1 SIGKILLs itself in the first start once two checkpoints exist; the launcher stops
    rank 0 and starts both again, which resume from the checkpoint (the first start, with no
    checkpoint yet, began at the start) and end where an uninterrupted run ends."""
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))
    run = ("--mode", "rima", "-n", "2", "-i", "60")
    full = _rmse(_train(tmp_path, *run))
    ck = str(tmp_path / "ck")
    wrapper = f"""
import os, runpy, signal, sys, threading, time
from scalefree.mf.data.checkpoint import nothing_to_resume
start = os.environ["SCALEFREE_RESTART_COUNT"]
print(f"start {{start}} finds a checkpoint: {{not nothing_to_resume({ck!r})}}", flush=True)
if start == "0" and os.environ["SCALEFREE_RANK"] == "1":
    def die_after_two_checkpoints():
        while not all(os.path.exists({ck!r} + f".rank{{r}}-of-2.prev") for r in range(2)):
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=die_after_two_checkpoints, daemon=True).start()
sys.argv = ["scalefree", *sys.argv[1:]]
runpy.run_module("scalefree.cli", run_name="__main__")
"""
    cmd = [sys.executable, "-m", "scalefree.cli", "run", "-n", "2", "--max-restarts", "1", "--grace", "1", "--",
           sys.executable, "-c", wrapper, "mf", "train", str(ML100K), "-q", "-k", "16", "--seed", "1", *run,
           "--checkpoint", ck, "--checkpoint-every", "1", "--resume"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert "rank 1 exited with code 137" in p.stderr and "restart 1 of 1 (--max-restarts)" in p.stderr, p.stderr
    # The first start began at iteration 0; the second resumed (--resume refuses a bad checkpoint).
    assert sorted(re.findall(r"\[\d\] start (\d) finds a checkpoint: (\w+)", p.stdout)) == [
        ("0", "False"), ("0", "False"), ("1", "True"), ("1", "True")], p.stdout
    assert _rmse(p) == pytest.approx(full, abs=1e-4)
