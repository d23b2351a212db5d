"""scalefree.mf.model: readers (incl. malformed input), cache, local training on MovieLens-100K,
save/load/predict, and the CLI."""

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree import _native
from scalefree.errors import DataError, InvalidArgumentError

DATA = Path(__file__).resolve().parents[2] / "../shared/data"
ML100K = DATA / "movielens-100k/u.data"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))


def _triples(r):
    u, i, v = r.triples()
    return np.frombuffer(u, np.int64), np.frombuffer(i, np.int64), np.frombuffer(v, np.float32)


@pytest.mark.parametrize("name,body", [
    ("u.data", "1\t10\t4\t5\n2\t10\t3.5\t5\n1\t30\t1\t5\n"),
    ("ratings.dat", "1::10::4::5\n2::10::3.5::5\n1::30::1::5\n"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,10,4,5\n2,10,3.5,5\n1,30,1,5\n"),
    ("r.txt", "1 10 4\n2 10 3.5\n1 30 1\n"),
    ("r.mtx", "%%MatrixMarket matrix coordinate real general\n2 30 3\n1 10 4\n2 10 3.5\n1 30 1\n"),
])
@pytest.mark.parametrize("gz", [False, True])
def test_readers(tmp_path, name, body, gz):
    p = tmp_path / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(body.encode()) if gz else body.encode())
    for _ in range(2):  # second load comes from the cache
        r = mf.load_ratings(p)
        u, i, v = _triples(r)
        assert list(u) == [1, 2, 1] and list(i) == [10, 10, 30]
        np.testing.assert_allclose(v, [4, 3.5, 1])
        assert (r.n_users, r.n_items) == (2, 2)


@pytest.mark.parametrize("body,needle", [
    ("1 2 3\n1 2\n", ":2:"),
    ("1 2 3\n1 2 nan\n", ":2: rating"),
    ("1 2 3\n-1 2 3\n", ":2: negative user"),
    ("1 123456789012345678901234 3\n", ":1: item id"),
    ("", "empty"),
])
def test_malformed(tmp_path, body, needle):
    p = tmp_path / "bad.txt"
    p.write_text(body)
    with pytest.raises(DataError) as e:
        mf.load_ratings(p, cache=False)
    assert "bad.txt" in str(e.value) and needle in str(e.value)


@pytest.mark.skipif(not ML100K.exists(), reason="../shared/data/movielens-100k absent")
def test_local_movielens_save_load_predict(tmp_path):
    train, test = mf.split_ratings(ML100K, 0.1, 0)
    assert (len(train), len(test)) == (90000, 10000)
    m = mf.MatrixFactorization(k=16, iterations=8, threads=2).fit(train, test)
    rmse = m.history[-1]["test_rmse"]
    assert rmse < 1.0, rmse
    assert m.history[0]["test_rmse"] > rmse
    u, i, v = _triples(test)
    pred = m.predict(u, i)
    np.testing.assert_allclose(np.sqrt(np.mean((pred - v) ** 2)), rmse, rtol=1e-4)
    path = tmp_path / "m.sfmf"
    m.save(path)
    m2 = mf.MatrixFactorization.load(path)
    np.testing.assert_array_equal(m2.predict(u, i), pred)
    assert not list(tmp_path.glob(".*tmp*"))
    # unknown ids get the training mean
    mean = float(np.mean(_triples(train)[2]))
    assert abs(m2.predict([10**12], [1])[0] - mean) < 1e-3


def test_arrays_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 30, 3000), rng.integers(0, 20, 3000)
    v = (u % 5 + i % 3).astype(np.float32)
    train, test = mf.split_ratings((u, i, v), 0.2, 1)
    m = mf.MatrixFactorization(k=8, iterations=30, threads=2, lam=0.01).fit(train, test)
    assert m.history[-1]["test_rmse"] < 0.5
    with pytest.raises(InvalidArgumentError):
        mf.MatrixFactorization(mode="nope")
    with pytest.raises(InvalidArgumentError):
        mf.MatrixFactorization().predict([1], [1])
    with pytest.raises(DataError):
        mf.MatrixFactorization.load(tmp_path / "missing")


@pytest.mark.skipif(not ML100K.exists(), reason="../shared/data/movielens-100k absent")
def test_cli(tmp_path):
    import importlib.util

    js, png, model = tmp_path / "h.jsonl", tmp_path / "p.png", tmp_path / "m.sfmf"
    have_mpl = importlib.util.find_spec("matplotlib") is not None  # optional (the bench extra)
    out = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "-k", "8",
                          "-i", "3", "--json", str(js), *(["--plot", str(png)] if have_mpl else []),
                          "-o", str(model), "-q"],
                         capture_output=True, text=True, check=True)
    assert "final test RMSE" in out.stdout
    lines = js.read_text().splitlines()
    assert len(lines) == 3 and "test_rmse" in lines[-1]
    if have_mpl:
        assert png.stat().st_size > 1000
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("196 242\n186 302\n")
    out = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "predict", str(model), str(pairs)],
                         capture_output=True, text=True, check=True)
    assert len(out.stdout.splitlines()) == 2 and out.stdout.startswith("196 242 ")
