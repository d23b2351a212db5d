"""scalefree.mf.model multi-rank modes (rima, dsgd-ps) with real rank processes on MovieLens-100K:
RMSE close to `local` at equal iterations, rima sends fewer bytes per worker than dsgd-ps,
the block kernel binding, and the errors for bad -n / mode."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree import _native
from scalefree.errors import InvalidArgumentError
from scalefree.mf.data.blocks import Partition, train_block

from ranks import collect, spawn_ranks

# ../shared/data next to the checkout (or next to a folder holding it, for a worktree).
_REPO = Path(__file__).resolve().parents[2]
DATA = next((a / "shared/data" for a in _REPO.parents if (a / "shared/data").exists()), _REPO / "../shared/data")
ML100K = DATA / "movielens-100k/u.data"
ITERS = 20
# λ = 0.1 (LIBMF's default). Every mode runs LIBMF's update (ratings / σ, λ / σ, split AdaGrad
# with a slow-only first pass); the CLI's multi-rank runs split the file by hash, not as
# `split_ratings` does, so their test set differs from `local_rmse`'s: 2 % apart at most.
# test_same_update_as_local compares on the same split.
LAM = "0.1"

pytestmark = pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mfcache")


@pytest.fixture(autouse=True)
def _cache(cache_dir, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(cache_dir))


@pytest.fixture(scope="module")
def local_rmse(cache_dir):
    import os

    os.environ["SCALEFREE_CACHE_DIR"] = str(cache_dir)
    tr, te = mf.split_ratings(ML100K, 0.1, 0)
    m = mf.MatrixFactorization(k=40, iterations=ITERS, threads=2, lam=float(LAM)).fit(tr, te)
    return m.history[-1]["test_rmse"]


_runs: dict = {}


def _cli(mode: str, n: int, tmp_path: Path, extra=()) -> dict:
    """`scalefree mf train --mode MODE -n N`; the last JSON record (rank 0's report)."""
    if (mode, n, *extra) not in _runs:
        out = tmp_path / f"{mode}{n}.jsonl"
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", mode,
                            "-n", str(n), "-i", str(ITERS), "--lam", LAM, "--json", str(out), "-q", *extra],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert "final test RMSE" in p.stdout and "bytes sent per worker" in p.stdout
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["iteration"] for r in recs] == list(range(1, ITERS + 1))
        _runs[(mode, n, *extra)] = recs[-1]
    return _runs[(mode, n, *extra)]


@pytest.mark.parametrize("mode,n", [("rima", 1), ("rima", 2), ("rima", 3), ("rima", 4),
                                    ("dsgd-ps", 2), ("dsgd-ps", 3), ("dsgd-ps", 4)])
def test_rmse_close_to_local(mode, n, tmp_path, local_rmse):
    rec = _cli(mode, n, tmp_path)
    workers = n if mode == "rima" else n - 1
    assert rec["workers"] == workers and len(rec["bytes_sent"]) == workers
    assert rec["blocks_per_side"] == (2 * n if mode == "rima" else n - 1)
    assert rec["test_rmse"] < 0.95
    assert abs(rec["test_rmse"] - local_rmse) / local_rmse < 0.02, (rec["test_rmse"], local_rmse)
    assert rec["train_mse"] < 0.8  # at λ = 0.1


@pytest.mark.parametrize("n", [2, 3])
def test_rima_with_w_by_w_blocks(n, tmp_path, local_rmse):
    rec = _cli("rima", n, tmp_path, ("--blocks", str(n)))
    assert rec["blocks_per_side"] == n
    assert abs(rec["test_rmse"] - local_rmse) / local_rmse < 0.02, (rec["test_rmse"], local_rmse)


def test_rima_sends_fewer_bytes_than_dsgd_ps(tmp_path):
    rima, ps = _cli("rima", 4, tmp_path), _cli("dsgd-ps", 4, tmp_path)
    assert rima["connections"] == [3, 2, 3, 2]  # the ring's two, plus rank 0 for the gather
    assert max(rima["block_bytes_sent"]) < min(ps["bytes_sent"])
    # Per iteration a rima worker sends one kind of block around the ring (≈ all of P or all
    # of Q); a dsgd-ps worker pushes its P and Q blocks every step (≈ all of P and Q).
    assert np.mean(rima["block_bytes_sent"]) < 0.75 * np.mean(ps["bytes_sent"])


@pytest.mark.parametrize("args,msg", [
    (["--mode", "dsgd-ps", "-n", "1"], "needs -n 2 or more"),
    (["--mode", "rima", "-n", "0"], "argument -n/--ranks: must be at least 1"),
    (["-n", "3"], "--mode local runs in one process"),
    (["--mode", "ring", "-n", "2"], "invalid choice"),
    (["--mode", "rima", "-n", "3", "--blocks", "5"], "--blocks 5 is neither"),
    (["--mode", "dsgd-ps", "-n", "3", "--blocks", "3"], "--blocks 3 differs"),
])
def test_bad_ranks_or_mode(args, msg):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "-q", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert msg in p.stderr


def test_bad_mode_in_python():
    with pytest.raises(InvalidArgumentError, match="ring"):
        mf.MatrixFactorization(mode="ring")


def test_python_api_on_three_rima_ranks(tmp_path, cache_dir):
    """MatrixFactorization(mode="rima").fit on 3 real ranks: rank 0 holds a model that
    predicts, saves and loads; the others report their bytes."""
    code = f"""
import sys
import numpy as np
import scalefree.mf.model as mf
tr, te = mf.split_ratings({str(ML100K)!r}, 0.1, 0)
m = mf.MatrixFactorization(k=16, mode="rima", iterations=5, seed=3).fit(tr, te)
if m.rank == 0:
    m.save({str(tmp_path / "m.bin")!r})
    back = mf.MatrixFactorization.load({str(tmp_path / "m.bin")!r})
    p = back.predict([1, 2, 10**9], [1, 2, 1])
    assert p.shape == (3,) and np.isfinite(p).all()
    print("rmse", m.history[-1]["test_rmse"], back.rmse(te))
else:
    print("sent", m.history[-1]["bytes_sent"])
"""
    res = collect(spawn_ranks(3, code, extra_env={"SCALEFREE_CACHE_DIR": str(cache_dir)}))
    for r in res:
        assert r.returncode == 0, r.stderr
    a, b = (float(x) for x in res[0].stdout.split()[1:3])
    assert a == pytest.approx(b, rel=1e-5) and a < 1.2
    assert all(int(r.stdout.split()[1]) > 0 for r in res[1:])


def test_same_update_as_local(cache_dir):
    """rima and dsgd-ps on 2 real ranks run `local` mode's (LIBMF's) update: on the same split,
    with the same hyperparameters (λ = 0.05, where a different update shows within a few
    iterations), their test RMSE is within 1 % of local mode's."""
    code = f"""
import scalefree.mf.model as mf
tr, te = mf.split_ratings({str(ML100K)!r}, 0.1, 0)
out = []
for mode in ("rima", "dsgd-ps"):
    m = mf.MatrixFactorization(k=40, mode=mode, iterations=6, lam=0.05, seed=0).fit(tr, te)
    if m.rank == 0:
        out.append(m.history[-1]["test_rmse"])
        out.append(m.history[-1]["train_mse"])
print(*out)
"""
    res = collect(spawn_ranks(2, code, extra_env={"SCALEFREE_CACHE_DIR": str(cache_dir)}))
    for r in res:
        assert r.returncode == 0, r.stderr
    rima, rima_mse, ps, ps_mse = (float(x) for x in res[0].stdout.split())
    tr, te = mf.split_ratings(ML100K, 0.1, 0)
    loc = mf.MatrixFactorization(k=40, iterations=6, lam=0.05, threads=2, seed=0).fit(tr, te).history[-1]
    for got, mse in ((rima, rima_mse), (ps, ps_mse)):
        assert abs(got - loc["test_rmse"]) / loc["test_rmse"] < 0.01, (rima, ps, loc["test_rmse"])
        # the training MSE is reported in rating units, as local mode's
        assert abs(mse - loc["train_mse"]) / loc["train_mse"] < 0.1, (rima_mse, ps_mse, loc["train_mse"])


def test_rating_scale_is_the_standard_deviation():
    from scalefree.mf.data.blocks import rating_scale

    r = np.random.default_rng(0).integers(1, 6, 1001).astype(np.float64)
    assert rating_scale(len(r), r.sum(), r @ r) == pytest.approx(np.std(r), rel=1e-6)
    assert rating_scale(3, 12.0, 48.0) == pytest.approx(1e-4)  # constant ratings: the floor
    assert rating_scale(0, 0.0, 0.0) == 1.0


def test_partition_covers_every_rating_once():
    tr, _ = mf.split_ratings(ML100K, 0.1, 0)
    part = Partition(tr, 3, 8, 0)
    assert sum(len(b) for b in part.blocks) == len(tr)
    for b in range(9):
        u, i = part.blocks[b][:, 0], part.blocks[b][:, 1]
        assert (u >= 0).all() and (u < part.urows(b // 3)).all()
        assert (i >= 0).all() and (i < part.irows(b % 3)).all()
    with pytest.raises(InvalidArgumentError, match="cannot be cut"):
        Partition(tr, 5000, 8, 0)


def test_block_kernel_binding_checks_its_arguments():
    tr, _ = mf.split_ratings(ML100K, 0.1, 0)
    part = Partition(tr, 2, 8, 0)
    p, q = part.p_block(0), part.q_block(1)
    before = p.factors.copy()
    loss = train_block(part, 0, 1, p, q, dict(eta=0.1, lam=0.05, schedule="adagrad"), np.random.default_rng(0))
    assert loss > 0 and not np.array_equal(before, p.factors)
    one = np.ones(1, np.float32)
    with pytest.raises(InvalidArgumentError, match="outside p"):
        _native.mf_sgd_block(np.array([10**6], np.int32), np.zeros(1, np.int32), one, p.factors, q.factors, p.acc, q.acc, 8)
    with pytest.raises(InvalidArgumentError, match="int32"):
        _native.mf_sgd_block(np.zeros(1, np.int64), np.zeros(1, np.int32), one, p.factors, q.factors, p.acc, q.acc, 8)
    with pytest.raises(InvalidArgumentError, match="schedule"):
        _native.mf_sgd_block(np.zeros(1, np.int32), np.zeros(1, np.int32), one, p.factors, q.factors, p.acc, q.acc, 8,
                             schedule="adam")


@pytest.mark.parametrize("first", [True, False])
def test_train_block_is_the_scaled_split_update(first):
    """train_block = mf_sgd_entries on the ratings / σ with λ / σ and the split schedule (slow
    lanes only in the first iteration); the partition's stored block is left as it was."""
    tr, _ = mf.split_ratings(ML100K, 0.1, 0)
    part = Partition(tr, 2, 12, 0)
    r = np.frombuffer(tr.dense()[2], np.float32).astype(np.float64)
    assert part.scale == pytest.approx(np.std(r), rel=1e-5) and part.scale != 1.0
    stored = part.block(0, 1).copy()
    p, q = part.p_block(0), part.q_block(1)
    p2, q2 = part.p_block(0), part.q_block(1)
    opts = dict(eta=0.1, lam=0.05, schedule="adagrad")
    loss = train_block(part, 0, 1, p, q, opts, None, first=first)
    np.testing.assert_array_equal(part.block(0, 1), stored)
    ent = stored.copy()
    ent[:, 2] = (ent[:, 2].view(np.float32) / np.float32(part.scale)).view(np.uint32)
    want = _native.mf_sgd_entries(ent, p2.factors, q2.factors, p2.acc, q2.acc, 12, eta=0.1, lam=0.05 / part.scale,
                                  schedule="adagrad-split-slow" if first else "adagrad-split")
    assert loss == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(p.factors, p2.factors, rtol=1e-6, atol=1e-7)
    # slow-only: lanes 8.. untouched in the first iteration
    assert np.array_equal(p.factors[:, 8:], part.p_block(0).factors[:, 8:]) == first
    # the factors leave the blocks scaled by √σ
    dp, _ = part.dense_factors({0: p.flat}, {})
    np.testing.assert_allclose(dp[part.upos < part.ustart[1]],
                               p.factors[part.upos[part.upos < part.ustart[1]]] * np.sqrt(np.float32(part.scale)),
                               rtol=1e-6)


def test_bench_vs_dsgd_ps_on_a_small_synthetic_matrix(tmp_path):
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "mf", "--vs", "dsgd-ps", "--ranks", "3",
                        "--users", "2000", "--items", "1500", "--ratings", "30000", "--iterations", "3",
                        "--repeat", "1", "-k", "8", "--curve-seeds", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())
    assert [(r["impl"], r["blocks_per_side"], r["workers"]) for r in recs] == [("rima", 6, 3), ("rima", 3, 3),
                                                                               ("dsgd-ps", 2, 2)]
    # Two seeds: each seed's target is the worse final RMSE of its evaluated runs; the time to
    # target is the median seconds per iteration times the mean iterations to it.
    for s in ("0", "1"):
        t = max(r["curves"][s][-1][1] for r in recs)
        for r in recs:
            it = r["iterations_to_target_per_seed"][int(s)]
            assert r["curves"][s][it - 1][1] <= t and all(c[1] > t for c in r["curves"][s][:it - 1])
    for r in recs:
        assert r["iterations_to_target"] == pytest.approx(np.mean(r["iterations_to_target_per_seed"]))
        assert r["seconds_to_target"] == pytest.approx(r["median_s"] * r["iterations_to_target"] / 3)
    assert all(np.isfinite(r["test_rmse"]) for r in recs)
    assert recs[0]["bytes_sent_per_worker"] < recs[2]["bytes_sent_per_worker"]
    assert "rima 6x6 / dsgd-ps" in p.stdout
    # Peak RSS of each of the 3 ranks; the common target is the worse final RMSE, which every
    # mode reaches (at the latest at its last iteration) on a curve ending at its final RMSE.
    target = max(r["test_rmse"] for r in recs)
    for r in recs:
        assert len(r["peak_rss_bytes_per_rank"]) == 3 and min(r["peak_rss_bytes_per_rank"]) > 10 * 2**20
        assert r["rmse_target"] == target
        assert [c[0] for c in r["curve"]] == [1, 2, 3]
        assert r["curve"][-1][1] == pytest.approx(r["test_rmse"], rel=1e-6)
        it = r["iterations_to_target_per_seed"][0]  # seed 0's, the timed runs' seed
        assert 1 <= it <= 3 and r["curve"][it - 1][1] <= target


@pytest.mark.parametrize("mode,n", [("rima", 3), ("dsgd-ps", 3)])
def test_rmse_curve_does_not_change_training(mode, n, tmp_path):
    """--eval-every 5 gives test RMSE at 5, 10, 15, 20; gathering for it changes neither the
    result nor the counted bytes (same seed: same run)."""
    out = tmp_path / "c.jsonl"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", mode, "-n", str(n),
                        "-i", str(ITERS), "--lam", LAM, "--eval-every", "5", "--json", str(out), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    curve = [(r["iteration"], r["test_rmse"]) for r in recs if "test_rmse" in r]
    assert [it for it, _ in curve] == [5, 10, 15, 20]
    assert curve[0][1] > curve[-1][1]
    plain = _cli(mode, n, tmp_path)
    assert recs[-1]["test_rmse"] == pytest.approx(plain["test_rmse"], rel=1e-6)
    assert recs[-1]["bytes_sent"] == plain["bytes_sent"]


def test_reports_count_bytes_and_connections_at_the_transport(cache_dir):
    """The bytes and connections in the MF reports are what the transport counted (training
    steps and the final gather): on every rank they match the transport's own counters
    around fit() less what fit() moves outside training (the stats sent to rank 0, the
    barriers); rima's ring plus the gather gives ranks 0 and 2 of 4 three peers."""
    code = f"""
import json, numpy as np, scalefree
import scalefree.mf.model as mf
g = scalefree.init()
tr, _ = mf.split_ratings({str(ML100K)!r}, 0.1, 0)
out = {{}}
for mode in ("rima", "dsgd-ps"):
    g.barrier()
    t0 = g.traffic()
    g.barrier()
    barrier = (g.traffic() - t0)[:, 0].sum()
    t0 = g.traffic()
    m = mf.MatrixFactorization(k=8, mode=mode, iterations=3, seed=1).fit(tr)
    window = int((g.traffic() - t0)[:, 0].sum())
    out[mode] = dict(window=window, barrier=int(barrier), last=m.history[-1] if m.rank == 0 else None)
print(json.dumps(out))
"""
    res = collect(spawn_ranks(4, code, extra_env={"SCALEFREE_CACHE_DIR": str(cache_dir)}), timeout=180)
    for r in res:
        assert r.returncode == 0, r.stderr
    outs = [json.loads(r.stdout.strip().splitlines()[-1]) for r in res]
    rima, ps = outs[0]["rima"]["last"], outs[0]["dsgd-ps"]["last"]
    # rima: the ring (predecessor, successor) and the gather to rank 0.
    assert rima["connected_to"] == [[1, 2, 3], [0, 2], [0, 1, 3], [0, 2]]
    assert rima["connections"] == [3, 2, 3, 2]
    gather = [s - b for s, b in zip(rima["bytes_sent"], rima["block_bytes_sent"])]
    assert gather[0] == 0 and gather[1] > 0 and gather[1] == gather[2] == gather[3]
    # dsgd-ps: every worker talks to the server only.
    assert ps["connected_to"] == [[0], [0], [0]] and ps["connections"] == [1, 1, 1]
    assert ps["server_connections"] == 3
    assert ps["bytes_sent"] == ps["block_bytes_sent"]
    iters, w = 3, 4
    stats = {"rima": (9 + 4 * iters + 3 * w) * 8, "dsgd-ps": (3 + iters + 3 * w) * 8}
    for mode, rep in (("rima", rima), ("dsgd-ps", ps)):
        sent = rep["bytes_sent"] if mode == "rima" else [None] + rep["bytes_sent"]
        for r in range(4):
            o = outs[r][mode]
            if sent[r] is None:  # the server: what it sent is reported once
                sent_r = rep["server_bytes_sent"]
            else:
                sent_r = sent[r]
            extra = (stats[mode] if r != 0 else 0) + 2 * o["barrier"]
            assert o["window"] == sent_r + extra, (mode, r, o, sent_r)
