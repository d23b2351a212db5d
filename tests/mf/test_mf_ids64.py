"""User and item ids past 2**32 through scalefree.mf and the SSP rating reader: every rating
format keeps them as written (a plain-Python parse is the reference), training on them equals
training on the same ratings with small ids (local, rima over 2 ranks, dsgd-ps over 3, fold-in
of users and of items), and the streamed split's positions match the in-memory split, with
64-bit positions past 2**32 ratings."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree import _native

# Every reader takes ids up to 2**63 - 1; the in-memory one up to 2**64 - 1 (see below).
BIG = [0, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 3, 2**53 + 1, 2**62 + 9, 2**63 - 1]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))


def ratings(n_users=40, n_items=30, m=600, seed=0):
    """Small ids (0..n) and a rating per (user, item) pair, every pair at most once."""
    rng = np.random.default_rng(seed)
    pairs = rng.choice(n_users * n_items, m, replace=False)
    u, i = pairs // n_items, pairs % n_items
    r = rng.integers(1, 11, m) / 2
    return u, i, r


def widen(ids, off=2**32 + 5, step=2**20):
    """An order-keeping map of small ids onto ids past 2**32."""
    return [off + step * int(x) for x in ids]


def write(path, u, i, r, style):
    rows = list(zip(u, i, r))
    if style == "u.data":
        body = "".join(f"{a}\t{b}\t{c:g}\t0\n" for a, b, c in rows)
    elif style == "ratings.dat":
        body = "".join(f"{a}::{b}::{c:g}::0\n" for a, b, c in rows)
    elif style == "ratings.csv":
        body = "userId,movieId,rating,timestamp\n" + "".join(f"{a},{b},{c:g},0\n" for a, b, c in rows)
    elif style == "r.txt":
        body = "".join(f"{a} {b} {c:g}\n" for a, b, c in rows)
    else:  # Matrix Market: ids as written (1-based)
        top = max(max(u), max(i))
        body = f"%%MatrixMarket matrix coordinate real general\n{top} {top} {len(rows)}\n" \
            + "".join(f"{a} {b} {c:g}\n" for a, b, c in rows)
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(body.encode()))
    else:
        path.write_text(body)


@pytest.mark.parametrize("style", ["u.data", "ratings.dat", "ratings.csv", "r.txt", "r.mtx"])
@pytest.mark.parametrize("gz", [False, True])
def test_rating_readers_keep_ids_past_2_to_the_32(tmp_path, style, gz):
    from scalefree.mf.modes.ssp_gd import load_ratings as ssp_load

    rng = np.random.default_rng(1)
    big = np.array(BIG, np.uint64)
    u = [int(x) or 1 for x in rng.choice(big, 200)]  # 1-based in .mtx: no 0
    i = [int(x) or 1 for x in rng.choice(big[::-1], 200)]
    r = list(rng.integers(1, 11, 200) / 2)
    p = tmp_path / (style + (".gz" if gz else ""))
    write(p, u, i, r, style)
    for cache in (False, True, True):  # the last load comes from the rating cache
        got = mf.load_ratings(p, cache=cache)
        gu, gi, gr = (np.frombuffer(b, t) for b, t in zip(got.triples(), (np.uint64, np.uint64, np.float32)))
        assert gu.tolist() == u and gi.tolist() == i
        np.testing.assert_array_equal(gr, np.float32(r))
    # Shares at 3 ranks (the multi-rank modes' reader) hold every rating once, ids as written.
    if not gz:
        shares = [_native.read_ratings_share(str(p), k, 3) for k in range(3)]
        have = sorted((int(a), int(b)) for s in shares
                      for a, b in zip(np.asarray(s[0]).astype(np.uint64).tolist(), np.asarray(s[1]).astype(np.uint64).tolist()))
        assert have == sorted(zip(u, i))
    # The SSP reader: dense indices in id order (2**53 + 1 kept apart from 2**53, as floats would not).
    su, si, sr = ssp_load(p)
    np.testing.assert_array_equal(su, np.unique(np.array(u, np.uint64), return_inverse=True)[1])
    np.testing.assert_array_equal(si, np.unique(np.array(i, np.uint64), return_inverse=True)[1])
    np.testing.assert_array_equal(sr, np.float32(r))


def test_ids_past_int64(tmp_path):
    """The in-memory reader keeps ids up to 2**64 - 1; the share reader of the multi-rank modes
    (int64 arrays) refuses 2**63 and past with the file and line."""
    from scalefree.errors import DataError

    p = tmp_path / "r.txt"
    p.write_text(f"1 2 3\n{2**64 - 1} {2**63} 4\n")
    got = mf.load_ratings(p, cache=False)
    assert np.frombuffer(got.triples()[0], np.uint64).tolist() == [1, 2**64 - 1]
    assert np.frombuffer(got.triples()[1], np.uint64).tolist() == [2, 2**63]
    with pytest.raises(DataError, match=r"r\.txt:2: user id"):
        _native.read_ratings_share(str(p), 0, 1)


def test_local_training_on_ids_past_2_to_the_32_equals_small_ids(tmp_path):
    u, i, r = ratings()
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    write(small, u.tolist(), i.tolist(), r.tolist(), "r.txt")
    write(big, widen(u), widen(i, off=2**63 + 11, step=2**40), r.tolist(), "r.txt")
    preds = []
    for f, wu, wi in ((small, u, i), (big, widen(u), widen(i, off=2**63 + 11, step=2**40))):
        tr, te = mf.split_ratings(f, 0.2, 3)
        m = mf.MatrixFactorization(k=8, iterations=4, threads=1, seed=2).fit(tr, te)
        preds.append((m.history[-1]["test_rmse"], m.predict(np.array(wu, np.uint64), np.array(wi, np.uint64))))
    assert preds[0][0] == preds[1][0]
    np.testing.assert_array_equal(preds[0][1], preds[1][1])


def test_rima_on_ids_past_2_to_the_32_equals_small_ids(tmp_path):
    """rima over 2 ranks (no test set: its split hashes the ids) on the same ratings with small
    ids and with order-keeping ids past 2**32: the same training error."""
    u, i, r = ratings(seed=4)
    runs = []
    for name, wu, wi in (("small", u.tolist(), i.tolist()), ("big", widen(u), widen(i, off=2**40, step=2**33))):
        train = tmp_path / f"{name}.txt"
        write(train, wu, wi, r.tolist(), "r.txt")
        out = tmp_path / f"{name}.jsonl"
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(train), "--test-fraction", "0",
                            "--mode", "rima", "-n", "2", "-k", "8", "-i", "3", "--json", str(out), "-q"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(out.read_text().splitlines()[-1]))
    assert runs[0]["train_mse"] == runs[1]["train_mse"], runs


def test_dsgd_ps_on_ids_past_2_to_the_32_equals_small_ids(tmp_path):
    """dsgd-ps (a server and 2 workers) on the same ratings with small ids and with ids past
    2**32 (items past 2**62): the same training error."""
    u, i, r = ratings(seed=6)
    runs = []
    for name, wu, wi in (("small", u.tolist(), i.tolist()), ("big", widen(u), widen(i, off=2**62, step=2**33))):
        train = tmp_path / f"{name}.txt"
        write(train, wu, wi, r.tolist(), "r.txt")
        out = tmp_path / f"{name}.jsonl"
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(train), "--test-fraction", "0",
                            "--mode", "dsgd-ps", "-n", "3", "-k", "8", "-i", "3", "--json", str(out), "-q"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(out.read_text().splitlines()[-1]))
    assert runs[0]["train_mse"] == runs[1]["train_mse"], runs


@pytest.mark.parametrize("side", ["user", "item"])
def test_fold_in_on_ids_past_2_to_the_32_equals_small_ids(tmp_path, side):
    """Fold-in of new users (items) whose ids, like the model's, sit past 2**32 (items past
    2**63): the folded rows predict what they do with small ids."""
    u, i, r = ratings(seed=7)
    rng = np.random.default_rng(8)
    if side == "user":  # new users 40..49 rating known items
        nu, ni = rng.integers(40, 50, 80), rng.integers(0, 30, 80)
    else:  # new items 30..35 rated by known users
        nu, ni = rng.integers(0, 40, 80), rng.integers(30, 36, 80)
    nr = rng.integers(1, 11, 80) / 2
    preds = []
    for name, fu, fi in (("small", lambda x: [int(a) for a in x], lambda x: [int(a) for a in x]),
                         ("big", widen, lambda x: widen(x, off=2**63 + 11, step=2**40))):
        train, new = tmp_path / f"{name}.txt", tmp_path / f"{name}-new.txt"
        write(train, fu(u), fi(i), r.tolist(), "r.txt")
        write(new, fu(nu), fi(ni), nr.tolist(), "r.txt")
        m = mf.MatrixFactorization(k=8, iterations=3, threads=1, seed=2).fit(train)
        stats = m.fold_in(new, side=side)
        assert stats["new_rows"] == len(np.unique(nu if side == "user" else ni)) and stats["ratings_ignored"] == 0
        preds.append(m.predict(np.array(fu(nu), np.uint64), np.array(fi(ni), np.uint64)))
    np.testing.assert_array_equal(preds[0], preds[1])


def test_streamed_split_on_ids_past_2_to_the_32_is_the_in_memory_split(tmp_path):
    u, i, r = ratings(seed=5)
    f = tmp_path / "big.csv"
    write(f, widen(u), widen(i, off=2**50), r.tolist(), "ratings.csv")
    _, want = mf.split_ratings(f, 0.25, 7)
    train, _ = mf.split_ratings_streamed(f, 0.25, 7)
    train.prepare()
    assert train.test_idx.dtype == np.uint32 and len(train.test_idx) == 150
    # The 8-byte positions (what a split past 2**32 ratings hands over) read the same ratings.
    got = _native.MfRatings.load_cache_subset(str(train.cache), train.test_idx.astype(np.uint64).tobytes(), 8)
    for a, b, t in zip(got.triples(), want.triples(), (np.uint64, np.uint64, np.float32)):
        np.testing.assert_array_equal(np.frombuffer(a, t), np.frombuffer(b, t))


def test_split_positions_are_64_bit_past_2_to_the_32_ratings():
    # Positions of 2**32 ratings fit 4 bytes; one more rating needs 8 (no test set: no O(n) walk).
    assert _native.mf_split_test_indices(2**32, 0.0, 1) == b""
    assert _native.mf_split_test_indices(2**32 + 1, 0.0, 1) == b""
    small = np.frombuffer(_native.mf_split_test_indices(1000, 0.1, 3), np.uint32)
    assert len(small) == 100 and (np.diff(small.astype(np.int64)) > 0).all()
