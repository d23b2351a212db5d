"""`mf train --test FILE` in every mode (local, rima, dsgd-ps at several rank counts): the test
RMSE reported is the RMSE of the saved model's predictions on that file (numpy), ids matched to
the training file's and unseen ones counted and answered with the training mean; in the
multi-rank modes each rank reads only its share of the test file. And `fold-in --side item`
against a ridge solve written out in numpy."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

import scalefree.mf.model as mf


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A training file (text) and a test file (gzip CSV with a header) on sparse ids, numbered on
    their own: the test file's lines in another order, plus a user and an item never trained."""
    d = tmp_path_factory.mktemp("testfile")
    rng = np.random.default_rng(4)
    users, items, n = 400, 150, 12_000
    a, b = rng.normal(0, 1, (users, 2)), rng.normal(0, 1, (items, 2))
    u, i = rng.integers(0, users, n), rng.integers(0, items, n)
    v = np.clip(3 + (a[u] * b[i]).sum(1) + rng.normal(0, 0.3, n), 1, 5).astype(np.float32)
    u, i = u * 7 + 11, i * 5 + 2
    te = rng.random(n) < 0.15
    train = d / "train.txt"
    train.write_text("".join(f"{x} {y} {z:.3f}\n" for x, y, z in zip(u[~te], i[~te], v[~te])))
    tu = np.concatenate([[999_999], u[te][::-1], [u[0]]])
    ti = np.concatenate([[i[0]], i[te][::-1], [888_888]])
    tv = np.concatenate([[3.0], np.round(v[te][::-1], 3), [2.0]]).astype(np.float32)
    test = d / "test.csv"
    test.write_text("userId,movieId,rating\n" + "".join(f"{x},{y},{z:.3f}\n" for x, y, z in zip(tu, ti, tv)))
    (d / "test.csv.gz").write_bytes(gzip.compress(test.read_bytes()))
    return train, test, (tu, ti, tv), float(np.mean(np.round(v[~te], 3).astype(np.float64)))


@pytest.mark.parametrize("mode,n,gz", [("local", 1, False), ("local", 1, True), ("rima", 1, False),
                                       ("rima", 2, False), ("rima", 3, False), ("rima", 2, True),
                                       ("dsgd-ps", 2, False), ("dsgd-ps", 3, False)])
def test_test_file_in_every_mode(files, tmp_path, mode, n, gz):
    train, test, (tu, ti, tv), mean = files
    if gz:  # a .gz is not split by bytes: every rank decompresses it and parses its own chunks
        test = test.with_name(test.name + ".gz")
    model, js = tmp_path / "m.sfmf", tmp_path / "h.jsonl"
    extra = ("-t", "2") if mode == "local" else ("--mode", mode, "-n", n)
    out = _cli("train", train, "--test", test, "-k", "6", "-i", "20", "-o", model, "--json", js, "-q", *extra)
    assert out.returncode == 0, out.stderr
    assert f"/ {len(tv)} test ratings" in out.stdout, out.stdout
    reported = float(out.stdout.split("final test RMSE")[1].split()[0])
    m = mf.MatrixFactorization.load(model)
    pred = m.predict(tu, ti).astype(np.float64)
    assert pred[0] == pytest.approx(mean, rel=1e-5) and pred[-1] == pytest.approx(mean, rel=1e-5)
    want = float(np.sqrt(np.mean((pred - tv) ** 2)))
    assert reported == pytest.approx(want, abs=1.5e-4), (reported, want)  # printed with 4 decimals
    assert want < 0.5 * float(np.std(tv))  # learnt: well under the spread of the ratings
    assert "2 test ratings have ids unseen in training (1 users, 1 items)" in out.stderr, out.stderr
    last = [json.loads(x) for x in js.read_text().splitlines()][-1]
    assert last["test_rmse"] == pytest.approx(want, rel=1e-4)
    if mode != "local":
        read = last["test_file_ratings_read"]  # each rank its share of the test file
        assert len(read) == n and sum(read) == len(tv)
        assert gz or all(r <= len(tv) / n * 1.1 + 30 for r in read), read
        assert sum(last["test_ratings_kept"]) == 0  # all of the training file trains


@pytest.mark.parametrize("mode,n,extra", [("rima", 2, ["--slack", "2"]), ("rima", 2, ["--memory-budget", "1M"]),
                                          ("dsgd-ps", 3, ["--memory-budget", "1M"]), ("local", 1, ["--memory-budget", "1M"])])
def test_test_file_with_slack_and_budget(files, tmp_path, mode, n, extra):
    """The variants of the modes (rima's stale ring, blocks on flash): `--test` is scored on the
    saved model as in the plain modes."""
    train, test, (tu, ti, tv), mean = files
    model = tmp_path / "m.sfmf"
    ranks = ("-t", "2") if mode == "local" else ("--mode", mode, "-n", n)
    out = _cli("train", train, "--test", test, "-k", "6", "-i", "20", "-o", model, "-q", *ranks, *extra)
    assert out.returncode == 0, out.stderr
    assert f"/ {len(tv)} test ratings" in out.stdout, out.stdout
    reported = float(out.stdout.split("final test RMSE")[1].split()[0])
    pred = mf.MatrixFactorization.load(model).predict(tu, ti).astype(np.float64)
    want = float(np.sqrt(np.mean((pred - tv) ** 2)))
    assert reported == pytest.approx(want, abs=1.5e-4), (reported, want)
    assert want < 0.5 * float(np.std(tv))  # learnt


@pytest.mark.parametrize("mode,n", [("rima", 3), ("dsgd-ps", 3)])
def test_bad_test_file_is_one_line_exit_2(files, tmp_path, mode, n):
    train = files[0]
    bad = tmp_path / "bad_test.txt"
    lines = [f"{u * 7 + 11} {u % 40 * 5 + 2} {u % 5 + 1}\n" for u in range(300)]
    lines[280] = "11 two 3\n"  # in the last rank's share
    bad.write_text("".join(lines))
    for test, needle in ((bad, "bad_test.txt:281"), (tmp_path / "missing.txt", "missing.txt")):
        out = _cli("train", train, "--test", test, "--mode", mode, "-n", n, "-i", "1", "-q", timeout=120)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count(needle) == 1 and out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr


def test_fold_in_items_is_the_ridge_solve(tmp_path):
    """`fold-in --side item`: each new item's row is (P_Uᵀ P_U + λ n I)⁻¹ P_Uᵀ r over the known
    users U that rate it; ratings by unknown users are ignored; the users and old items keep
    their rows."""
    rng = np.random.default_rng(8)
    users, items, k = 120, 60, 4
    A, B = rng.random((users, k)), rng.random((items, k))
    u, i = rng.integers(0, users, 5000), rng.integers(0, items, 5000)
    v = (A[u] * B[i]).sum(1) + rng.normal(0, 0.05, len(u))
    new = i >= 50
    base = mf.MatrixFactorization(k=5, iterations=20, threads=1, lam=0.02).fit((u[~new], i[~new], v[~new]))
    m0 = tmp_path / "m0.sfmf"
    base.save(m0)
    # The new items' ratings, plus three by a user the model never saw (ignored).
    fu = np.concatenate([u[new], [10_000, 10_000, 10_000]])
    fi = np.concatenate([i[new], [50, 51, 52]])
    fv = np.concatenate([v[new], [9.0, 9.0, 9.0]])
    f = tmp_path / "new_items.txt"
    f.write_text("".join(f"{a} {b} {c:.6f}\n" for a, b, c in zip(fu, fi, fv)))
    lam = 0.03
    out = _cli("fold-in", m0, f, "--side", "item", "--lam", lam, "-o", tmp_path / "m1.sfmf")
    assert out.returncode == 0, out.stderr
    assert f"folded in 10 items (10 new) from {int(new.sum())} ratings (3 on unknown ids ignored)" in out.stdout
    m1 = mf.MatrixFactorization.load(tmp_path / "m1.sfmf")
    p, q, uid, iid, mean, ku, ki = m1._need().parts()
    P = np.frombuffer(p, np.float32).reshape(-1, 5).astype(np.float64)
    Q = np.frombuffer(q, np.float32).reshape(-1, 5)
    uid, iid = np.frombuffer(uid, np.int64), np.frombuffer(iid, np.int64)
    row_of = {int(x): r for r, x in enumerate(uid)}
    rv = np.fromiter((float(f"{x:.6f}") for x in v[new]), np.float64)
    for item in range(50, 60):
        sel = i[new] == item
        Pu = P[[row_of[int(x)] for x in u[new][sel]]]
        want = np.linalg.solve(Pu.T @ Pu + lam * sel.sum() * np.eye(5), Pu.T @ rv[sel])
        got = Q[int(np.flatnonzero(iid == item)[0])]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(m1.predict(u[~new], i[~new]), base.predict(u[~new], i[~new]))
    folded = float(np.sqrt(np.mean((m1.predict(u[new], i[new]) - v[new]) ** 2)))
    assert folded < float(np.std(v[new])) / 3  # the items now predict, not the mean


_API = """
import sys, json
import numpy as np
import scalefree.mf.model as mf
train, test, out = sys.argv[1:4]
m = mf.MatrixFactorization(k=6, mode="rima", iterations=10).fit(train, test)
if m.rank == 0:
    m.save(out)
    print(json.dumps({"rmse": m.history[-1]["test_rmse"], "unseen": m.test_unseen}))
"""


def test_test_file_through_the_python_api(files, tmp_path):
    """``fit(path, test_path)`` in a multi-rank mode: the ranks read their shares of both files."""
    from ranks import collect, spawn_ranks

    train, test, (tu, ti, tv), _ = files
    res = collect(spawn_ranks(2, _API, args=[str(train), str(test), str(tmp_path / "m.sfmf")]), timeout=180)
    assert all(r.returncode == 0 for r in res), [r.stderr for r in res]
    got = json.loads(res[0].stdout)
    pred = mf.MatrixFactorization.load(tmp_path / "m.sfmf").predict(tu, ti).astype(np.float64)
    assert got["rmse"] == pytest.approx(float(np.sqrt(np.mean((pred - tv) ** 2))), rel=1e-4)
    assert got["unseen"] == {"users": 1, "items": 1, "ratings": 2}
