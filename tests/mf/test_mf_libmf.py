"""LIBMF's text model both ways (``mf/libmf.py``): ours written as LIBMF's and read back, LIBMF's
read as LIBMF predicts with it (checked against a reference reader written from the format), bad
model files as one line and exit 2, and — where LIBMF's ``mf-train`` / ``mf-predict`` are built
(``LIBMF_BIN_DIR`` or on PATH) — models moved through LIBMF's own binaries."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree.errors import DataError, InvalidArgumentError
from scalefree.mf import libmf


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", *map(str, args)],
                          capture_output=True, text=True)


def _ratings(users=30, items=20, n=500, seed=0, user_ids=None, item_ids=None):
    rng = np.random.default_rng(seed)
    U, V = rng.random((users, 3)), rng.random((items, 3))
    u, i = rng.integers(0, users, n), rng.integers(0, items, n)
    v = ((U[u] * V[i]).sum(1) + rng.normal(0, 0.05, n)).astype(np.float32)
    if user_ids is not None:
        u = np.asarray(user_ids)[u]
    if item_ids is not None:
        i = np.asarray(item_ids)[i]
    return u.astype(np.int64), i.astype(np.int64), v


def _write(path, u, i, v):
    path.write_text("".join(f"{a} {b} {c:.4f}\n" for a, b, c in zip(u, i, v)))
    return path


def _reference(path):
    """LIBMF's mf_load_model + mf_predict, written from the format (whitespace tokens)."""
    tok = Path(path).read_text().split()
    fun, m, n, k, b = int(tok[1]), int(tok[3]), int(tok[5]), int(tok[7]), float(tok[9])
    at = 10
    sides = []
    for count in (m, n):
        rows = np.full((count, k), np.nan)
        for r in range(count):
            if tok[at + 1] == "T":
                rows[r] = [float(x) for x in tok[at + 2:at + 2 + k]]
            at += k + 2
        sides.append(rows)
    P, Q = sides

    def predict(u, v):
        out = []
        for a, c in zip(u, v):
            z = float(P[a] @ Q[c]) if 0 <= a < m and 0 <= c < n else b
            out.append(b if np.isnan(z) else z)
        return np.array(out)
    return predict, (fun, m, n, k, b)


def _probe(user_ids, item_ids):
    """Every pair of a few known ids, ids in the gaps and ids past the end."""
    us = np.unique(np.concatenate([user_ids, user_ids + 1, [0, max(user_ids) + 5]]))
    it = np.unique(np.concatenate([item_ids, item_ids + 1, [0, max(item_ids) + 7]]))
    uu, ii = np.meshgrid(us, it, indexing="ij")
    return uu.ravel(), ii.ravel()


@pytest.mark.parametrize("ids", ["dense", "gaps"])
def test_round_trip_ours_through_libmf_text(tmp_path, ids):
    """Ours → LIBMF's text → ours: the same predictions for every id (known, gap, past the end),
    and LIBMF's reading of the file (the reference) agrees with ours."""
    kw = {} if ids == "dense" else dict(user_ids=np.arange(30) * 3 + 2, item_ids=np.arange(20) * 2)
    u, i, v = _ratings(**kw)
    m = mf.MatrixFactorization(k=5, iterations=8, threads=1).fit((u, i, v))
    path = tmp_path / "model.txt"
    m.save(path, format="libmf")
    assert libmf.is_libmf_model(path) and not libmf.is_libmf_model(_save_native(m, tmp_path))
    predict, (fun, rows_m, rows_n, k, b) = _reference(path)
    assert (fun, k) == (0, 5)
    assert (rows_m, rows_n) == (max(u) + 1, max(i) + 1)  # row N is id N; gaps are "F" rows
    back = mf.MatrixFactorization.load(path)
    pu, pi = _probe(np.unique(u), np.unique(i))
    ours = m.predict(pu, pi)
    np.testing.assert_array_equal(back.predict(pu, pi), ours)  # 9 digits: float32 exactly
    np.testing.assert_allclose(predict(pu, pi), ours, rtol=1e-6, atol=1e-6)
    assert b == pytest.approx(float(np.mean(v)), rel=1e-5)
    lines = path.read_text().splitlines()
    assert len(lines) == 5 + rows_m + rows_n
    assert (sum(x.split()[1] == "F" for x in lines[5:]) == (rows_m - len(np.unique(u))) + (rows_n - len(np.unique(i))))
    # And back out again: the same file.
    back.save(tmp_path / "again.txt", format="libmf")
    assert (tmp_path / "again.txt").read_text() == path.read_text()


def _save_native(m, tmp_path):
    p = tmp_path / "model.sfmf"
    m.save(p)
    return p


@pytest.mark.parametrize("m_rows,n_rows,k", [(0, 0, 1), (1, 1, 1), (3, 5, 2), (7, 4, 9)])
def test_libmf_model_read_as_libmf_predicts(tmp_path, m_rows, n_rows, k):
    """A LIBMF model as mf-train writes it (6 digits, "F" rows, any size) predicts as LIBMF does:
    p·q for rows both "T", b for "F" rows and ids past the model."""
    rng = np.random.default_rng(m_rows * 31 + n_rows)
    text = [f"f 0\nm {m_rows}\nn {n_rows}\nk {k}\nb 3.25\n"]
    for prefix, count in (("p", m_rows), ("q", n_rows)):
        for r in range(count):
            if r % 3 == 1:
                text.append(f"{prefix}{r} F " + "0 " * k + "\n")
            else:
                text.append(f"{prefix}{r} T " + "".join(f"{x:g} " for x in rng.normal(size=k)) + "\n")
    path = tmp_path / "libmf_model.txt"
    path.write_text("".join(text))
    predict, _ = _reference(path)
    model = mf.MatrixFactorization.load(path)
    assert model.k == k
    pu, pi = np.arange(m_rows + 2), np.arange(n_rows + 2)
    uu, ii = (x.ravel() for x in np.meshgrid(pu, pi, indexing="ij"))
    np.testing.assert_allclose(model.predict(uu, ii), predict(uu, ii), rtol=1e-6, atol=1e-6)
    # The CLI reads it too (detected by its first line), and writes it back unchanged in meaning.
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("".join(f"{a} {b}\n" for a, b in zip(uu, ii)))
    out = _cli("predict", path, pairs, "--format", "libmf")
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose([float(x) for x in out.stdout.split()], predict(uu, ii), rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "w.txt", format="libmf")
    again, hdr = _reference(tmp_path / "w.txt")
    assert hdr[1:4] == (m_rows, n_rows, k)
    np.testing.assert_allclose(again(uu, ii), predict(uu, ii), rtol=1e-6, atol=1e-6)


def test_ids_libmf_cannot_hold_are_refused(tmp_path):
    u, i, v = _ratings(users=3, items=3, n=20, user_ids=[0, 5, 2**31 - 2])
    m = mf.MatrixFactorization(k=2, iterations=2, threads=1).fit((u, i, v))
    with pytest.raises(InvalidArgumentError, match="user id 2147483646 does not fit LIBMF's 32-bit"):
        m.save(tmp_path / "m.txt", format="libmf")
    u, i, v = _ratings(users=3, items=3, n=20, item_ids=[1, 2, 5_000_000])
    m = mf.MatrixFactorization(k=2, iterations=2, threads=1).fit((u, i, v))
    with pytest.raises(InvalidArgumentError, match="item ids are sparse: 3 items with ids up to 5000000"):
        m.save(tmp_path / "m.txt", format="libmf")
    assert not (tmp_path / "m.txt").exists() and not list(tmp_path.glob(".*tmp*"))
    # The CLI refuses before training, in one line, exit 2.
    data = _write(tmp_path / "r.txt", u, i, v)
    out = _cli("train", data, "-k", "2", "-i", "2", "-o", tmp_path / "m.txt", "--format", "libmf")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--format libmf: item ids are sparse" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "m.txt").exists()


_GOOD = "f 0\nm 2\nn 1\nk 2\nb 1.5\np0 T 1 2 \np1 F 0 0 \nq0 T 0.5 0.25 \n"


@pytest.mark.parametrize("text,where,words", [
    ("", ":1:", "ends in its header"),
    ("f 0\nm 2\n", ":3:", "ends in its header"),
    ("f 0\nm 2\nx 1\nk 2\nb 1.5\n", ":3:", "expected 'n <value>'"),
    ("f 0\nm two\nn 1\nk 2\nb 1.5\n", ":2:", "needs a number"),
    ("f 4\nm 2\nn 1\nk 2\nb 1.5\n", ":1:", "unknown LIBMF loss f 4"),
    ("f 0\nm 2\nn 1\nk 0\nb 1.5\n", ":4:", "k 0"),
    (_GOOD[:_GOOD.index("q0")], ":8:", "ends after 0 of 1 'q' rows"),
    (_GOOD[:-8], ":8:", "row q0 has 1 values, the header says k 2"),
    (_GOOD.replace("p1 F", "p3 F"), ":7:", "expected LIBMF model row 'p1', found 'p3'"),
    (_GOOD.replace("p1 F", "p1 X"), ":7:", "expected 'T' or 'F'"),
    (_GOOD.replace("0.25", "zero"), ":8:", "'zero' is not a number"),
    (_GOOD + "p2 T 1 1\n", ":9:", "text after the LIBMF model"),
    ("f 0\nm 900000\nn 1\nk 2\nb 1.5\np0 T 1 2\n", ":2:", "truncated?"),
])
def test_bad_libmf_models_are_one_line_and_exit_2(tmp_path, text, where, words):
    path = tmp_path / "bad_model.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=None) as e:
        libmf.read_model(path)
    assert f"bad_model.txt{where}" in str(e.value) and words in str(e.value), str(e.value)
    pairs = _write(tmp_path / "pairs.txt", [0], [0], [1.0])
    for cmd in (("predict", path, pairs, "--model-format", "libmf"),
                ("fold-in", path, pairs, "--model-format", "libmf", "-o", tmp_path / "o.txt")):
        out = _cli(*cmd)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and f"bad_model.txt{where}" in out.stderr and words in out.stderr
    assert not (tmp_path / "o.txt").exists()
    # The good file reads; detection goes by the first line, a native model's header is another.
    path.write_text(_GOOD)
    assert mf.MatrixFactorization.load(path).predict([0, 1, 0, 9], [0, 0, 1, 0]).tolist() == [1.0, 1.5, 1.5, 1.5]
    out = _cli("predict", path, pairs, "--model-format", "native")
    assert out.returncode == 2 and "not a scalefree MF model" in out.stderr


def test_fold_in_keeps_the_model_format(tmp_path):
    """fold-in of a LIBMF model writes LIBMF's text (new ids as rows, gaps "F"), unless --format."""
    u, i, v = _ratings()
    base = tmp_path / "base.txt"
    mf.MatrixFactorization(k=4, iterations=10, threads=1).fit((u, i, v)).save(base, format="libmf")
    nu, ni, nv = _ratings(seed=5, n=60, user_ids=np.arange(30) + 40)  # users 40..69: new
    new = _write(tmp_path / "new.txt", nu, ni, nv)
    out = _cli("fold-in", base, new, "-o", tmp_path / "grown.txt")
    assert out.returncode == 0, out.stderr
    predict, hdr = _reference(tmp_path / "grown.txt")
    assert hdr[1] == max(nu) + 1
    grown = mf.MatrixFactorization.load(tmp_path / "grown.txt")
    np.testing.assert_allclose(predict(nu, ni), grown.predict(nu, ni), rtol=1e-6, atol=1e-6)
    assert not np.allclose(grown.predict(nu, ni), hdr[4])  # solved, not the mean
    out = _cli("fold-in", base, new, "-o", tmp_path / "grown.sfmf", "--format", "native")
    assert out.returncode == 0 and not libmf.is_libmf_model(tmp_path / "grown.sfmf"), out.stderr
    np.testing.assert_array_equal(mf.MatrixFactorization.load(tmp_path / "grown.sfmf").predict(nu, ni),
                                  grown.predict(nu, ni))


def _libmf_bin(name):
    d = os.environ.get("LIBMF_BIN_DIR")
    path = Path(d) / name if d else shutil.which(name)
    return str(path) if path and Path(path).is_file() and os.access(path, os.X_OK) else None


needs_libmf = pytest.mark.skipif(not (_libmf_bin("mf-train") and _libmf_bin("mf-predict")),
                                 reason="LIBMF's mf-train / mf-predict not built (set LIBMF_BIN_DIR)")


def _libmf_predict(model, pairs, out):
    r = subprocess.run([_libmf_bin("mf-predict"), str(pairs), str(model), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.loadtxt(out, ndmin=1), r.stdout


@needs_libmf
@pytest.mark.parametrize("ids", ["dense", "gaps"])
def test_ours_predicted_by_libmf_mf_predict(tmp_path, ids):
    kw = {} if ids == "dense" else dict(user_ids=np.arange(30) * 3 + 2, item_ids=np.arange(20) * 2)
    u, i, v = _ratings(**kw)
    data = _write(tmp_path / "train.txt", u, i, v)
    model = tmp_path / "ours.txt"
    out = _cli("train", data, "-k", "6", "-i", "10", "-t", "1", "--test-fraction", "0.2", "-o", model,
               "--format", "libmf", "-q")
    assert out.returncode == 0, out.stderr
    pu, pi = _probe(np.unique(u), np.unique(i))
    pairs = _write(tmp_path / "pairs.txt", pu, pi, np.ones(len(pu)))
    theirs, _ = _libmf_predict(model, pairs, tmp_path / "theirs.txt")
    ours = mf.MatrixFactorization.load(model).predict(pu, pi)
    np.testing.assert_allclose(theirs, ours, rtol=6e-6, atol=1e-6)  # mf-predict prints 6 digits
    out = _cli("predict", model, pairs, "--format", "libmf")
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose([float(x) for x in out.stdout.split()], theirs, rtol=1.1e-5, atol=1e-6)


@needs_libmf
def test_libmf_mf_train_model_predicted_and_folded_by_us(tmp_path):
    u, i, v = _ratings(users=40, items=35, n=2000, user_ids=np.arange(40) * 2)  # odd users never rated
    later = i >= 25  # items folded in afterwards
    nu, ni, nv = u[later], i[later], v[later]
    u, i, v = u[~later], i[~later], v[~later]
    data = _write(tmp_path / "train.txt", u, i, v)
    model = tmp_path / "libmf_model.txt"
    r = subprocess.run([_libmf_bin("mf-train"), "-k", "5", "-t", "15", "-s", "1", "--quiet", str(data), str(model)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    pu, pi = _probe(np.unique(u), np.unique(i))
    pairs = _write(tmp_path / "pairs.txt", pu, pi, np.ones(len(pu)))
    theirs, _ = _libmf_predict(model, pairs, tmp_path / "theirs.txt")
    out = _cli("predict", model, pairs, "--format", "libmf")
    assert out.returncode == 0, out.stderr
    # Both print 6 digits: one step of the last digit apart at most (a value near a rounding edge).
    np.testing.assert_allclose([float(x) for x in out.stdout.split()], theirs, rtol=1.1e-5, atol=1e-6)
    np.testing.assert_allclose(mf.MatrixFactorization.load(model).predict(pu, pi), theirs, rtol=6e-6, atol=1e-6)
    # Fold-in by item into LIBMF's model; LIBMF's mf-predict reads the grown file as we predict.
    new = _write(tmp_path / "new_items.txt", nu, ni, nv)
    out = _cli("fold-in", model, new, "--side", "item", "-o", tmp_path / "grown.txt")
    assert out.returncode == 0 and "folded in 10 items (10 new)" in out.stdout, out.stdout + out.stderr
    pairs2 = _write(tmp_path / "pairs2.txt", nu, ni, nv)
    theirs, text = _libmf_predict(tmp_path / "grown.txt", pairs2, tmp_path / "theirs2.txt")
    ours = mf.MatrixFactorization.load(tmp_path / "grown.txt").predict(nu, ni)
    np.testing.assert_allclose(theirs, ours, rtol=6e-6, atol=1e-6)
    rmse = float(np.sqrt(np.mean((ours.astype(np.float64) - nv) ** 2)))
    spread = float(np.std(nv))  # the RMSE of answering every rating with one number
    assert f"RMSE = {rmse:.4f}" in text and rmse < spread / 2, (rmse, spread)
