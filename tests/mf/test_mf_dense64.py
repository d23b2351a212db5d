"""Dense user and item ids past 2**32 (issue 41). More than 2**32 distinct users cannot be held
here, so the test knob ``SCALEFREE_TEST_MF_DENSE_BASE=B`` numbers the dense ids from B instead
of 0: with B past 2**32 every dense id that the in-memory ratings, the rating cache (written
whole or streamed), the streamed and the file-share readers of the cache store or pass on is
past 2**32 and 8 bytes wide, on a few hundred ratings. Each path is run with and without the
knob and must give the same result, bit for bit: loading, caching, splitting and aligning;
``local`` mode with ``--test``, a checkpoint, ``--resume``, save/load, predict and fold-in;
``rima`` and ``dsgd-ps`` on a rating cache; the streamed partition of ``rima --memory-budget``."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree import _native
from scalefree.mf.data.blocks import Partition
from scalefree.mf.data.preload import BlockFile
from scalefree.mf.data.stream import StreamedRatings

BASE = 2**32 + 12_345  # dense ids from here under the knob
KNOB = "SCALEFREE_TEST_MF_DENSE_BASE"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(KNOB, raising=False)


def _write(path, m=600, users=40, items=30, seed=0, ids=(7, 3)):
    """``m`` ratings of distinct (user, item) pairs, sparse original ids."""
    rng = np.random.default_rng(seed)
    pairs = rng.choice(users * items, m, replace=False)
    u, i = pairs // items * ids[0] + 100, pairs % items * ids[1] + 5
    r = rng.integers(1, 11, m) / 2
    path.write_text("".join(f"{a} {b} {c:g}\n" for a, b, c in zip(u, i, r)))


def _bytes(triple):
    return [bytes(x) for x in triple]


def test_ratings_and_caches_carry_dense_ids_past_2_to_the_32(tmp_path, monkeypatch):
    src = tmp_path / "r.txt"
    _write(src)
    plain = mf.load_ratings(src, cache=False)
    assert (plain.dense_base, plain.dense_widths) == (0, (4, 4))
    monkeypatch.setenv(KNOB, str(BASE))
    for cache in (False, True, True):  # the last from the cache written by the one before
        r = mf.load_ratings(src, cache=cache)
        assert (r.dense_base, r.dense_widths) == (BASE, (8, 8))
        du, di, dv = (np.frombuffer(b, t) for b, t in zip(r.dense(), ("<u8", "<u8", np.float32)))
        assert du.min() == di.min() == BASE and du.max() < BASE + r.n_users
        np.testing.assert_array_equal(du - BASE, np.frombuffer(plain.dense()[0], np.uint32))
        np.testing.assert_array_equal(di - BASE, np.frombuffer(plain.dense()[1], np.uint32))
        assert _bytes(r.triples()) == _bytes(plain.triples())
    (cached,) = (tmp_path / "cache" / "mf").iterdir()
    assert cached.read_bytes()[:8] == b"SFMFRAT2"
    assert _native.mf_cache_layout(str(cached)) == (40, 8, BASE)
    assert _native.mf_cache_header(str(cached)) == (600, plain.n_users, plain.n_items)
    # The streamed cache writer writes the same file; a cache is itself a rating file.
    out = tmp_path / "streamed.sfr"
    _native.mf_write_cache(str(src), str(out))
    assert out.read_bytes() == cached.read_bytes()
    assert _bytes(mf.load_ratings(out, cache=False).triples()) == _bytes(plain.triples())
    # Split, test subset read from the cache, alignment: the same ratings as with ids from 0.
    tr, te = r.split(0.2, 3)
    ptr, pte = plain.split(0.2, 3)
    assert _bytes(tr.triples()) == _bytes(ptr.triples()) and _bytes(te.triples()) == _bytes(pte.triples())
    idx = np.frombuffer(_native.mf_split_test_indices(600, 0.2, 3), np.uint32)
    sub = _native.MfRatings.load_cache_subset(str(out), idx.tobytes(), 4)
    assert sub.dense_base == BASE and _bytes(sub.triples()) == _bytes(pte.triples())
    other = tmp_path / "other.txt"
    _write(other, m=50, users=45, items=33, seed=1)  # some users and items unseen in r
    al, unseen = mf.load_ratings(other, cache=False).align_to(r)
    monkeypatch.delenv(KNOB)
    pal, punseen = mf.load_ratings(other, cache=False).align_to(plain)
    assert unseen == punseen and unseen[2] > 0 and al.dense_base == BASE
    np.testing.assert_array_equal(np.frombuffer(al.dense()[0], "<u8") - BASE, np.frombuffer(pal.dense()[0], np.uint32))
    assert al.shares_ids_with(r) and _bytes(al.triples()) == _bytes(pal.triples())


def _cli(*args, env=None, timeout=120):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr
    return p


def test_local_mode_test_file_checkpoint_resume_save_predict_fold_in(tmp_path):
    """One local-mode life cycle, with and without dense ids past 2**32: trained against a test
    file, stopped after 2 iterations with a checkpoint, resumed to 4 (its ratings from the rating
    cache the first run wrote), saved; a fold-in of new users and predictions of the grown model.
    Every output is the same bytes."""
    src, test, new, pairs = (tmp_path / n for n in ("r.txt", "t.txt", "new.txt", "pairs.txt"))
    _write(src)
    _write(test, m=80, seed=2)
    _write(new, m=60, users=50, items=30, seed=3)  # users 40..49 are new
    pairs.write_text("".join(f"{u} {i}\n" for u, i in ((100, 5), (107, 8), (100 + 7 * 45, 11), (1, 2))))
    outs = []
    for tag, env in (("plain", {}), ("wide", {KNOB: str(BASE)})):
        d = tmp_path / tag
        d.mkdir()
        common = ["train", src, "--test", test, "-k", "8", "-i", "4", "--threads", "1", "--seed", "3",
                  "--checkpoint", d / "ck", "--checkpoint-every", "1", "--json", d / "h.jsonl", "-q"]
        _cli(*common, "--stop-after", "2", env=env)
        _cli(*common, "--resume", "-o", d / "m.bin", env=env)
        _cli("fold-in", d / "m.bin", new, "-o", d / "m2.bin", env=env)
        _cli("predict", d / "m2.bin", pairs, "-o", d / "pred.txt", env=env)
        hist = [json.loads(x) for x in (d / "h.jsonl").read_text().splitlines()]
        outs.append(([(h.get("train_mse"), h.get("test_rmse")) for h in hist],
                     *((d / n).read_bytes() for n in ("m.bin", "m2.bin", "pred.txt"))))
    assert len(outs[0][0]) == 2 and outs[0][0][-1][1] is not None  # iterations 3 and 4 (resumed)
    assert outs[0] == outs[1]
    # The wide run's rating caches (of the training and the test file) are version 2, apart from
    # the plain run's (the knob is part of the cache key).
    magics = sorted(p.read_bytes()[:8] for p in (tmp_path / "cache" / "mf").iterdir())
    assert magics == [b"SFMFRAT1"] * 2 + [b"SFMFRAT2"] * 2, magics


@pytest.mark.parametrize("mode,n", [("rima", 2), ("dsgd-ps", 3)])
def test_multi_rank_modes_on_a_cache_of_dense_ids_past_2_to_the_32(tmp_path, mode, n):
    """A version-2 rating cache (dense ids from 2**32 + 12345) as the input of rima and dsgd-ps:
    every rank reads its share of the 8-byte columns; the same training and test errors as on
    the version-1 cache of the same ratings."""
    src = tmp_path / "r.txt"
    _write(src, seed=4)
    runs = []
    for tag, env in (("plain", {}), ("wide", {KNOB: str(BASE)})):
        cache = tmp_path / f"{tag}.sfr"
        os.environ.update(env)
        try:
            _native.mf_write_cache(str(src), str(cache))
        finally:
            os.environ.pop(KNOB, None)
        assert cache.read_bytes()[:8] == (b"SFMFRAT2" if env else b"SFMFRAT1")
        out = tmp_path / f"{tag}.jsonl"
        _cli("train", cache, "--mode", mode, "-n", n, "-k", "8", "-i", "3", "--json", out, "-q")
        runs.append([(h["train_mse"], h.get("test_rmse")) for h in map(json.loads, out.read_text().splitlines())])
    assert runs[0] == runs[1] and runs[0][-1][1] is not None


def test_streamed_and_in_memory_partitions_of_dense_ids_past_2_to_the_32(tmp_path, monkeypatch):
    """The partition of rima / dsgd-ps from native ratings (dense ids read as 8-byte words minus
    the base) and the streamed one of ``rima --memory-budget`` (from the version-2 cache) have
    the blocks, counts and initial factors of the partition of ids from 0; so do the test set
    and the model built from the streamed split."""
    src = tmp_path / "r.txt"
    _write(src, m=900, users=60, items=40, seed=5)
    tr0, te0 = mf.split_ratings(src, 0.2, 7)
    want = Partition(tr0, 3, 5, 11)
    monkeypatch.setenv(KNOB, str(BASE))
    tr, te = mf.split_ratings(src, 0.2, 7)
    assert tr.dense_base == BASE
    mem = Partition(tr, 3, 5, 11)
    st = StreamedRatings(src, 0.2, 7)
    bf = BlockFile(tmp_path)
    part = st.partition(3, 5, 11, None, needed=range(9), spill_to=bf, collect_test=True, chunk=128)
    bf.finish()
    assert st.cache.read_bytes()[:8] == b"SFMFRAT2"
    for p in (mem, part):
        assert np.array_equal(p.counts, want.counts) and np.array_equal(p.p0, want.p0) and p.scale == want.scale
    for b in range(9):
        off, m = bf.index[b]
        got = np.empty((m, 3), np.uint32)
        os.preadv(bf.fd, [memoryview(got.reshape(-1).view(np.uint8))], off)
        assert np.array_equal(got, want.blocks[b]) and np.array_equal(mem.blocks[b], want.blocks[b]), b
    bf.close()
    assert st.test.ratings.dense_base == BASE
    assert _bytes(st.test.ratings.triples()) == _bytes(te0.triples())
    rng = np.random.default_rng(0)
    p, q = rng.random((tr.n_users, 5), dtype=np.float32), rng.random((tr.n_items, 5), dtype=np.float32)
    a = mf._model_of(st, 5, p, q)
    b = _native.MfModel.from_factors(tr0, 5, p.tobytes(), q.tobytes())
    assert a.rmse(st.test.ratings) == b.rmse(te0) == _native.MfModel.from_factors(tr, 5, p.tobytes(), q.tobytes()).rmse(te)


@pytest.mark.parametrize("budget", [None, 1 << 20])
@pytest.mark.parametrize("m,users,items", [(1, 1, 1), (31, 3, 40), (555, 37, 23)])
def test_local_mode_rows_and_block_starts_past_2_to_the_32(tmp_path, monkeypatch, budget, m, users, items):
    """``local`` mode numbers its rows from the dense base: under the knob every block row and
    column starts past 2**32 (the entries hold 32-bit offsets from those starts), and training
    in memory and from flash (``memory_budget``) gives the losses, RMSE, state and model of ids
    from 0, bit for bit. One rating; fewer users than blocks; odd counts."""
    src = tmp_path / "r.txt"
    _write(src, m=m, users=users, items=items, seed=m)
    runs = []
    for base in (0, BASE):
        monkeypatch.setenv(KNOB, str(base))
        r = mf.load_ratings(src, cache=False)
        assert r.dense_base == base
        tr = _native.MfTrainer(r, k=5, threads=1, blocks=5, seed=3, memory_budget=budget,
                               flash_dir=None if budget is None else str(tmp_path))
        us, its = tr.block_starts()
        assert (us[0], us[-1], its[0], its[-1]) == (base, base + r.n_users, base, base + r.n_items)
        assert len(us) == len(its) == 6 and all(a <= b for a, b in zip(us, us[1:]))
        mse = [tr.epochs(1) for _ in range(3)]
        runs.append((mse, tr.rmse(r), tr.state(), tr.model().parts(), [b - base for b in us + its]))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("threads", [1, 2])
def test_local_mode_memory_budget_cli_past_2_to_the_32(tmp_path, threads):
    """``mf train --memory-budget`` (the blocks on flash) with dense ids past 2**32: one thread
    gives the plain run's history and model bytes; two threads (an order that varies run to
    run) the same RMSE within 10 %."""
    src, test = tmp_path / "r.txt", tmp_path / "t.txt"
    _write(src, m=700, users=50, items=40, seed=6)
    _write(test, m=90, users=50, items=40, seed=7)
    outs = []
    for tag, env in (("plain", {}), ("wide", {KNOB: str(BASE)})):
        d = tmp_path / tag
        d.mkdir()
        _cli("train", src, "--test", test, "-k", "8", "-i", "3", "--threads", threads, "--seed", "2",
             "--memory-budget", "1M", "-o", d / "m.bin", "--json", d / "h.jsonl", "-q", env=env)
        hist = [json.loads(x) for x in (d / "h.jsonl").read_text().splitlines()]
        assert hist[-1]["memory_budget"] == 1 << 20
        outs.append(([(h["train_mse"], h.get("test_rmse")) for h in hist], (d / "m.bin").read_bytes()))
    if threads == 1:
        assert outs[0] == outs[1]
    else:
        a, b = outs[0][0][-1][1], outs[1][0][-1][1]
        assert a is not None and abs(a - b) <= 0.1 * a, (a, b)
