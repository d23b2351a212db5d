"""scalefree.mf: explicit test sets (files or arrays numbered on their own), ``mf predict``
(formats, RMSE/MAE, unknown ids, closed pipe), the thread default and the scikit-learn-style API."""

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree.errors import InvalidArgumentError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))


def _data(seed=0, users=60, items=40, n=4000):
    rng = np.random.default_rng(seed)
    u, i = rng.integers(0, users, n) * 7 + 1000, rng.integers(0, items, n) * 3 + 5  # sparse, large ids
    key = np.unique(u * 10**6 + i)
    u, i = key // 10**6, key % 10**6
    v = (1 + (u % 5) + (i % 3) * 0.5).astype(np.float32)
    return u, i, v


def _files(tmp_path):
    """A training file (LIBMF text) and a test file (CSV with a header, gzip) whose first lines
    hold ids in another order, plus one user and one item never seen in training."""
    u, i, v = _data()
    perm = np.random.default_rng(1).permutation(len(u))
    te_idx, tr_idx = perm[:400], perm[400:]
    tr = tmp_path / "train.txt"
    tr.write_text("".join(f"{a} {b} {c:g}\n" for a, b, c in zip(u[tr_idx], i[tr_idx], v[tr_idx])))
    te_u = np.concatenate([[999_999], u[te_idx][::-1], [u[0]]])
    te_i = np.concatenate([[i[0]], i[te_idx][::-1], [888_888]])
    te_v = np.concatenate([[3.0], v[te_idx][::-1], [2.0]]).astype(np.float32)
    te = tmp_path / "test.csv.gz"
    te.write_bytes(gzip.compress(("userId,movieId,rating\n" + "".join(
        f"{a},{b},{c:g}\n" for a, b, c in zip(te_u, te_i, te_v))).encode()))
    return tr, te, (te_u, te_i, te_v)


def _rmse(m, u, i, v):
    return float(np.sqrt(np.mean((m.predict(u, i).astype(np.float64) - v) ** 2)))


def test_fit_with_separately_numbered_test_sets(tmp_path):
    tr, te, (u, i, v) = _files(tmp_path)
    for train, test in ((tr, te), (mf.load_ratings(tr), mf.load_ratings(te)), (tr, (u, i, v))):
        m = mf.MatrixFactorization(k=8, iterations=15, threads=2, lam=0.02).fit(train, test)
        got = m.history[-1]["test_rmse"]
        assert got == pytest.approx(_rmse(m, u, i, v), rel=1e-4)
        assert got < 0.5
        assert m.test_unseen == {"users": 1, "items": 1, "ratings": 2}
        # Native ratings numbered on their own are an error for rmse(), never a wrong number.
        with pytest.raises(InvalidArgumentError, match="id maps"):
            m.rmse(mf.load_ratings(te))
        ev = m.evaluate(te)
        assert ev["rmse"] == pytest.approx(got, rel=1e-4) and ev["unknown"] == 2 and ev["n"] == len(v)
        assert m.score(te) == pytest.approx(-got, rel=1e-4)


def test_params_and_thread_default():
    m = mf.MatrixFactorization(k=8)
    assert m.threads == len(os.sched_getaffinity(0))
    assert m.get_params()["k"] == 8 and m.get_params()["normalize"] is True
    m.set_params(k=4, mode="rima")
    assert (m.k, m.mode, m.normalize) == (4, "rima", True)
    with pytest.raises(InvalidArgumentError):
        m.set_params(nope=1)


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", *map(str, args)],
                          capture_output=True, text=True, **kw)


def test_cli_train_test_file_and_predict(tmp_path):
    tr, te, (u, i, v) = _files(tmp_path)
    model = tmp_path / "m.sfmf"
    out = _cli("train", tr, "--test", te, "-k", "8", "-i", "15", "--lam", "0.02", "-t", "2", "-o", model, "-q")
    assert out.returncode == 0, out.stderr
    rmse = float(out.stdout.split("final test RMSE")[1].split()[0])
    assert "2 test ratings have ids unseen" in out.stderr
    # predict reads the same gzip CSV with a header, reports RMSE / MAE and the unknown ids.
    pred = tmp_path / "pred.txt"
    out = _cli("predict", model, te, "-o", pred)
    assert out.returncode == 0, out.stderr
    assert f"RMSE {rmse:.4f}" in out.stdout and "MAE" in out.stdout
    assert "2 of 402 pairs" in out.stderr
    lines = pred.read_text().splitlines()
    assert len(lines) == 402 and lines[1].startswith(f"{u[1]} {i[1]} ")
    m = mf.MatrixFactorization.load(model)
    np.testing.assert_allclose([float(x.split()[2]) for x in lines], m.predict(u, i), atol=1e-4)
    # --format libmf: one prediction per line, in order, as LIBMF's mf-predict writes them.
    out = _cli("predict", model, te, "--format", "libmf", "-o", pred)
    assert out.returncode == 0, out.stderr
    libmf_lines = pred.read_text().splitlines()
    assert len(libmf_lines) == 402 and all(len(x.split()) == 1 for x in libmf_lines)
    np.testing.assert_allclose([float(x) for x in libmf_lines], m.predict(u, i), rtol=1e-5)
    # Pairs without ratings: predictions only; a closed pipe ends quietly.
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("".join(f"{a} {b}\n" for a, b in zip(u, i)) * 50)
    out = subprocess.run(f"{sys.executable} -m scalefree.cli mf predict {model} {pairs} | head -n 2",
                         shell=True, capture_output=True, text=True)
    assert len(out.stdout.splitlines()) == 2 and "Traceback" not in out.stderr and "RMSE" not in out.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3\n1 2\n")
    out = _cli("predict", model, bad)
    assert out.returncode == 2 and out.stderr.startswith("scalefree mf predict: error:") and "bad.txt" in out.stderr


def test_fold_in_new_users_close_to_retraining(tmp_path):
    rng = np.random.default_rng(3)
    users, items, k = 300, 120, 4
    U, V = rng.random((users, k)), rng.random((items, k))
    u, i = rng.integers(0, users, 20000), rng.integers(0, items, 20000)
    key = np.unique(u * items + i)
    u, i = key // items, key % items
    v = (U[u] * V[i]).sum(1) + rng.normal(0, 0.05, len(u))
    new = u >= 270  # 30 users unseen in training
    half = rng.random(len(u)) < 0.5
    fold, ev = new & half, new & ~half
    kw = dict(k=8, iterations=25, threads=2, lam=0.02)
    base = mf.MatrixFactorization(**kw).fit((u[~new], i[~new], v[~new]))
    before = _rmse(base, u[ev], i[ev], v[ev])  # the mean for every new user
    known_before = base.predict(u[~new], i[~new])
    stats = base.fold_in((u[fold], i[fold], v[fold]))
    assert stats["rows"] == 30 and stats["new_rows"] == 30
    folded = _rmse(base, u[ev], i[ev], v[ev])
    retrained = mf.MatrixFactorization(**kw).fit((u[~ev], i[~ev], v[~ev]))
    again = _rmse(retrained, u[ev], i[ev], v[ev])
    assert folded < before / 3 and folded < again * 1.5, (before, folded, again)
    # Known users are unchanged; the CLI verb writes a grown model.
    np.testing.assert_array_equal(base.predict(u[~new], i[~new]), known_before)
    m0, f = tmp_path / "m0.sfmf", tmp_path / "new.txt"
    mf.MatrixFactorization(**kw).fit((u[~new], i[~new], v[~new])).save(m0)
    f.write_text("".join(f"{a} {b} {c}\n" for a, b, c in zip(u[fold], i[fold], v[fold])))
    out = _cli("fold-in", m0, f, "--lam", "0.02", "-o", tmp_path / "m1.sfmf")
    assert out.returncode == 0 and "folded in 30 users (30 new)" in out.stdout, out.stderr
    m1 = mf.MatrixFactorization.load(tmp_path / "m1.sfmf")
    assert _rmse(m1, u[ev], i[ev], v[ev]) < before / 3


def test_early_stopping_keeps_the_best_iteration():
    u, i, v = _data(5)
    v = v + np.random.default_rng(0).normal(0, 0.7, len(v)).astype(np.float32)  # noise: it overfits
    m = mf.MatrixFactorization(k=32, iterations=60, threads=1, lam=0.0, eta=0.3)
    m.fit((u, i, v), validation_fraction=0.2, patience=3)
    h = m.history
    assert m.stopped_at == len(h) < 60
    vals = [r["valid_rmse"] for r in h]
    assert min(vals) < min(vals[-3:])
    with pytest.raises(InvalidArgumentError):
        mf.MatrixFactorization(k=4).fit((u, i, v), patience=2)
