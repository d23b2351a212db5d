"""``--checkpoint/--checkpoint-every/--resume/--stop-after`` of ``graph pagerank``, ``graph
diameter``, ``sgd logreg`` (the shared :mod:`scalefree.checkpoint`), with real ranks at 1, 2
and 3 (and the SSP MF worker's sgd and bpmf models), and ``flash topics`` (one process, after
its SVD and k-means steps): a run in slices and a run resumed after a rank was SIGKILLed give the uninterrupted
run's answer bit for bit (its files compared byte for byte, its printed results line for
line); a checkpoint of other data, options or rank count is refused (one line, exit 2)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scalefree.graph.rmat import write_rmat

KILL = str(Path(__file__).with_name("checkpoint_kill.py"))


def cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def results(text: str) -> list[str]:
    """The printed answer without the timing lines."""
    timed = ("ms/iteration", "ms/hop", "ms/step", "scores written")
    return [line for line in text.splitlines() if not any(t in line for t in timed)]


def killed_then_resumed(ranks, rank, step, args, ckpt):
    """Runs ``scalefree ARGS --checkpoint CKPT`` under ``scalefree run`` with ``rank`` SIGKILLed
    right after its checkpoint of ``step``; then ``--resume``. Returns the resumed run."""
    proc = subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", str(ranks), "--", sys.executable, KILL,
                           str(rank), str(step), *map(str, args), "--checkpoint", ckpt],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0, "the job with a killed rank succeeded:\n" + proc.stdout[-2000:]
    assert Path(f"{ckpt}.rank{rank}-of-{ranks}").exists()
    return ok(cli(*args, "-n", ranks, "--checkpoint", ckpt, "--resume"))


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "g.txt"
    write_rmat(path, 10, 12000, seed=3, progress=False)
    return path


def same_scores(a: Path, b: Path, ranks: int):
    for r in range(ranks):
        x, y = np.load(a / f"scores.rank{r}.npz"), np.load(b / f"scores.rank{r}.npz")
        assert np.array_equal(x["owned"], y["owned"]) and np.array_equal(x["scores"], y["scores"]), r


PR = ["--tol", "0", "--max-iter", "14", "--top", "5", "-q"]


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_pagerank_in_slices_is_the_straight_run(tmp_path, graph, ranks):
    straight = ok(cli("graph", "pagerank", graph, "-n", ranks, *PR, "--save-scores", tmp_path / "a",
                      "-o", tmp_path / "a.tsv"))
    ck = tmp_path / "ck"
    first = ok(cli("graph", "pagerank", graph, "-n", ranks, *PR, "--checkpoint", ck, "--stop-after", 5))
    assert f"stopped after iteration 5; checkpoint {ck}" in first.stdout
    assert sorted(p.name for p in tmp_path.glob("ck*")) == [f"ck.rank{r}-of-{ranks}" for r in range(ranks)]
    ok(cli("graph", "pagerank", graph, "-n", ranks, *PR, "--checkpoint", ck, "--resume", "--stop-after", 9,
           "--checkpoint-every", 2))
    resumed = ok(cli("graph", "pagerank", graph, "-n", ranks, *PR, "--checkpoint", ck, "--resume",
                     "--save-scores", tmp_path / "b", "-o", tmp_path / "b.tsv"))
    same_scores(tmp_path / "a", tmp_path / "b", ranks)
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()
    assert results(resumed.stdout) == results(straight.stdout)


@pytest.mark.parametrize("ranks,rank", [(2, 1), (3, 0), (3, 2)])
def test_pagerank_resumes_after_a_killed_rank(tmp_path, graph, ranks, rank):
    ok(cli("graph", "pagerank", graph, "-n", ranks, *PR, "--save-scores", tmp_path / "a"))
    args = ["graph", "pagerank", graph, *PR, "--checkpoint-every", 3, "--save-scores", tmp_path / "b"]
    killed_then_resumed(ranks, rank, 6, args, tmp_path / "ck")
    same_scores(tmp_path / "a", tmp_path / "b", ranks)


def test_pagerank_killed_by_its_fault_option_resumes(tmp_path, graph):
    """``--fail-rank`` (SIGKILL before an iteration, between checkpoints), then ``--resume``."""
    ok(cli("graph", "pagerank", graph, "-n", 2, *PR, "-o", tmp_path / "a.tsv"))
    ck = tmp_path / "ck"
    args = ["graph", "pagerank", graph, "-n", 2, *PR, "--checkpoint", ck, "--checkpoint-every", 4]
    assert cli(*args, "--fail-rank", "1:7").returncode != 0
    ok(cli(*args, "--resume", "-o", tmp_path / "b.tsv"))
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()


def refused(proc, *words):
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln or "Traceback" in ln]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    for w in words:
        assert w in line, line


def test_pagerank_refuses_another_runs_checkpoint(tmp_path, graph):
    ck = tmp_path / "ck"
    base = ["graph", "pagerank", graph, "-n", 2, *PR, "--checkpoint", ck]
    ok(cli(*base, "--stop-after", 3))
    refused(cli(*base, "--resume", "--damping", "0.8"), "does not match", "damping 0.85 (now 0.8)")
    refused(cli(*base, "--resume", "--dtype", "float32"), "dtype")
    refused(cli("graph", "pagerank", graph, "-n", 3, *PR, "--checkpoint", ck, "--resume"), "does not exist")
    other = tmp_path / "other.txt"
    other.write_bytes(graph.read_bytes())
    refused(cli("graph", "pagerank", other, "-n", 2, *PR, "--checkpoint", ck, "--resume"), "input")
    # The same file rewritten (another mtime) is other data too.
    os.utime(other, ns=(0, 0))
    refused(cli("graph", "pagerank", other, "-n", 2, *PR, "--checkpoint", ck, "--resume"), "input")
    refused(cli("graph", "pagerank", graph, "--resume"), "need --checkpoint")
    refused(cli(*base, "--collective", "dense"), "--collective sparse")
    # --resume before any checkpoint (a restarted job's command line) starts from the beginning.
    fresh = ok(cli(*base, "--resume", "--checkpoint", tmp_path / "none", "--stop-after", 2))
    assert "no checkpoint" in fresh.stderr and (tmp_path / "none.rank1-of-2").exists()
    # Another --tol or --max-iter continues the same run.
    ok(cli(*base, "--resume", "--max-iter", 20, "--tol", "1e-6", "--stop-after", 6))
    (tmp_path / "ck.rank1-of-2").write_bytes(b"not a checkpoint")
    refused(cli(*base, "--resume"), "not a scalefree PageRank checkpoint")


HADI = ["-q", "--max-hops", "12"]


@pytest.mark.parametrize("ranks,method", [(r, m) for m in ("exact", "fm") for r in (1, 2, 3)] + [(2, "hll")])
def test_diameter_in_slices_is_the_straight_run(tmp_path, graph, ranks, method):
    args = ["graph", "diameter", graph, "-n", ranks, "--method", method, *HADI]
    straight = ok(cli(*args))
    ck = tmp_path / "ck"
    first = ok(cli(*args, "--checkpoint", ck, "--stop-after", 2))
    assert "stopped after hop 2" in first.stdout
    resumed = ok(cli(*args, "--checkpoint", ck, "--resume", "--checkpoint-every", 1))
    assert results(resumed.stdout) == results(straight.stdout)
    assert len(results(straight.stdout)) > 5


@pytest.mark.parametrize("ranks,rank", [(1, 0), (3, 1)])
def test_diameter_resumes_after_a_killed_rank(tmp_path, graph, ranks, rank):
    args = ["graph", "diameter", graph, "--method", "fm", *HADI]
    straight = ok(cli(*args, "-n", ranks))
    resumed = killed_then_resumed(ranks, rank, 3, [*args, "--checkpoint-every", 1], tmp_path / "ck")
    assert results(resumed.stdout) == results(straight.stdout)


def test_diameter_refuses_other_options(tmp_path, graph):
    ck = tmp_path / "ck"
    args = ["graph", "diameter", graph, "-n", 2, *HADI, "--checkpoint", ck]
    ok(cli(*args, "--method", "fm", "--stop-after", 2))
    refused(cli(*args, "--method", "fm", "--fm-seed", "3", "--resume"), "fm_seed")
    refused(cli(*args, "--method", "exact", "--resume"), "method")
    refused(cli(*args, "--method", "fm", "--undirected", "--resume"), "undirected")


LR = ["synthetic", "--rows", "2000", "--dim", "3000", "--epochs", "4", "--batch", "128", "-q"]


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_logreg_in_slices_is_the_straight_run(tmp_path, ranks, optimizer):
    args = ["sgd", "logreg", *LR, "-n", ranks, "--optimizer", optimizer]
    straight = ok(cli(*args, "-o", tmp_path / "a.npz"))
    ck = tmp_path / "ck"
    first = ok(cli(*args, "--checkpoint", ck, "--stop-after", 1))
    assert "stopped after epoch 1" in first.stdout
    ok(cli(*args, "--checkpoint", ck, "--resume", "--stop-after", 3))
    resumed = ok(cli(*args, "--checkpoint", ck, "--resume", "-o", tmp_path / "b.npz"))
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert np.array_equal(a["w"], b["w"]) and np.array_equal(a["b"], b["b"])
    accuracy = [ln.split(", fit")[0] for ln in straight.stdout.splitlines() if "accuracy" in ln]
    assert accuracy and [ln.split(", fit")[0] for ln in resumed.stdout.splitlines() if "accuracy" in ln] == accuracy


def test_logreg_resumes_after_a_killed_rank(tmp_path):
    args = ["sgd", "logreg", *LR]
    ok(cli(*args, "-n", 3, "-o", tmp_path / "a.npz"))
    killed_then_resumed(3, 2, 2, [*args, "--checkpoint-every", 1, "-o", tmp_path / "b.npz"], tmp_path / "ck")
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert np.array_equal(a["w"], b["w"]) and np.array_equal(a["b"], b["b"])


def test_logreg_refuses_other_data_and_options(tmp_path):
    ck = tmp_path / "ck"
    args = ["sgd", "logreg", *LR, "-n", 2, "--checkpoint", ck]
    ok(cli(*args, "--stop-after", 2))
    refused(cli(*args, "--resume", "--lr", "0.3"), "lr 0.5 (now 0.3)")
    refused(cli(*args, "--resume", "--data-seed", "1"), "input")
    refused(cli(*args, "--resume", "--epochs", "1"), "past --epochs 1")


@pytest.fixture(scope="module")
def docword(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "docword.planted.txt"
    ok(cli("flash", "corpus", "--docs", 2500, "--words", 1500, "--topics", 6, "-o", path))
    return path


@pytest.mark.parametrize("memory", [None, "256K"])
@pytest.mark.parametrize("step", [2, 3])
def test_topics_in_slices_is_the_straight_run(tmp_path, docword, memory, step):
    """Resumed after the SVD or the k-means step, B in memory or on flash: the same topics."""
    args = ["flash", "topics", docword, "-k", 6, "-q", *(["--memory", memory] if memory else [])]
    ok(cli(*args, "-o", tmp_path / "a.npz"))
    ck = tmp_path / "ck"
    first = ok(cli(*args, "--checkpoint", ck, "--stop-after", step))
    assert f"stopped after step {step}" in first.stdout
    ok(cli(*args, "--checkpoint", ck, "--resume", "-o", tmp_path / "b.npz"))
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert np.array_equal(a["topic_word"], b["topic_word"]) and np.array_equal(a["labels"], b["labels"])


def test_topics_resumes_after_a_kill_and_refuses_other_options(tmp_path, docword):
    args = ["flash", "topics", docword, "-k", 6, "-q"]
    ok(cli(*args, "-o", tmp_path / "a.npz"))
    ck = tmp_path / "ck"
    proc = subprocess.run([sys.executable, KILL, "0", "3", *map(str, args), "--checkpoint", ck], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == -9, proc.stderr[-2000:]
    ok(cli(*args, "--checkpoint", ck, "--resume", "-o", tmp_path / "b.npz"))
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert np.array_equal(a["topic_word"], b["topic_word"]) and np.array_equal(a["labels"], b["labels"])
    refused(cli(*args, "--checkpoint", ck, "--resume", "--seed", 4), "seed 0 (now 4)")
    refused(cli(*args[:3], "-k", 5, "-q", "--checkpoint", ck, "--resume"), "k 6 (now 5)")
    refused(cli(*args, "--resume"), "need --checkpoint")


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    path = tmp_path_factory.mktemp("r") / "ratings.txt"
    rng = np.random.default_rng(7)
    pairs = rng.choice(300 * 200, 6000, replace=False)  # distinct (user, item) pairs
    u, i = pairs // 200, pairs % 200
    r = np.clip(np.round(3 + (u % 5 - 2) * 0.5 + (i % 3 - 1) + rng.normal(0, 0.5, 6000)), 1, 5)
    path.write_text("".join(f"{a}\t{b}\t{c:g}\n" for a, b, c in zip(u, i, r)))
    return path


def ssp_mf(ranks, ratings, *args, kill=None, model="sgd"):
    """The SSP MF worker (``model`` sgd or bpmf, ``sharded`` variant: deterministic at slack 0)
    under ``scalefree run``; ``kill=(rank, step)`` runs it through checkpoint_kill.py."""
    pytest.importorskip("scalefree_bench")
    pre = [KILL, str(kill[0]), str(kill[1])] if kill else []
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", str(ranks), "--", sys.executable, *pre,
                           "-m", "scalefree_bench._worker_ssp_mf", model, str(ratings), "--iters", "10", "-k", "4",
                           "--variant", "sharded", *map(str, args)], capture_output=True, text=True, timeout=240)


def histories(out, ranks):
    import json

    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(ranks)]


def same_ssp(a, b, ranks):
    for x, y in zip(histories(a, ranks), histories(b, ranks)):
        assert x.get("final_rmse") == y.get("final_rmse")
        assert [h[2] for h in x["history"]] == [h[2] for h in y["history"]]  # test RMSE (sgd), SSE (bpmf)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("model", ["sgd", "bpmf"])
def test_ssp_mf_in_slices_is_the_straight_run(tmp_path, ratings, ranks, model):
    ck = tmp_path / "ck"
    every = ["--checkpoint-every", 3]
    ok(ssp_mf(ranks, ratings, *every, "--checkpoint", tmp_path / "straight", "--out", tmp_path / "a", model=model))
    first = ok(ssp_mf(ranks, ratings, *every, "--checkpoint", ck, "--stop-after", 3, model=model))
    assert "stopped after iteration 3" in first.stdout
    refused(ssp_mf(ranks, ratings, *every, "--checkpoint", ck, "--resume", "--stop-after", 4, model=model),
            "multiple of N")
    ok(ssp_mf(ranks, ratings, *every, "--checkpoint", ck, "--resume", "--out", tmp_path / "b", model=model))
    same_ssp(tmp_path / "a", tmp_path / "b", ranks)
    # Without checkpoints the run differs only by the rounding of the rebased sums.
    ok(ssp_mf(ranks, ratings, "--out", tmp_path / "c", model=model))
    for x, y in zip(histories(tmp_path / "a", ranks), histories(tmp_path / "c", ranks)):
        assert x["history"][-1][2] == pytest.approx(y["history"][-1][2], rel=1e-5)


def test_ssp_mf_resumes_after_a_killed_rank_and_refuses_other_options(tmp_path, ratings):
    ck = tmp_path / "ck"
    every = ["--checkpoint-every", 3]
    ok(ssp_mf(3, ratings, *every, "--checkpoint", tmp_path / "straight", "--out", tmp_path / "a"))
    assert ssp_mf(3, ratings, *every, "--checkpoint", ck, kill=(1, 6)).returncode != 0
    ok(ssp_mf(3, ratings, *every, "--checkpoint", ck, "--resume", "--out", tmp_path / "b"))
    same_ssp(tmp_path / "a", tmp_path / "b", 3)
    refused(ssp_mf(3, ratings, *every, "--checkpoint", ck, "--resume", "--eta", 0.2), "eta 0.5 (now 0.2)")
    refused(ssp_mf(3, ratings, "--checkpoint-every", 2, "--checkpoint", ck, "--resume"), "every 3 (now 2)")
    refused(ssp_mf(3, ratings, *every, "--checkpoint", ck, "--resume", model="bpmf"), "model 'sgd' (now 'bpmf')")
