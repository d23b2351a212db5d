"""Streaming set-up of rima with a memory budget (``mf_stream``): no rank ever holds all ratings.

Checked: the split's test indices computed in O(test) memory are those of ``MfRatings.split``;
the streamed partition (chunked, through a spill file) has the in-memory partition's blocks,
record order, counts, initial factors, test set and model parts; a rating cache is a rating
file; and, in real processes, a rating file many times the budget trains under the budget with
peak RSS (set-up and training, every process of the job) far below the ratings' in-memory size
and the in-memory run's test RMSE and losses exactly.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree import _native
from scalefree.errors import DataError, InvalidArgumentError
from scalefree.mf.data.blocks import ENTRY_BYTES, Partition
from scalefree.mf.data.preload import BlockFile
from scalefree.mf.data.stream import StreamedRatings, chunk_ratings


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path / "cache"))


def _write_text(path: Path, n: int, users: int, items: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    u = rng.integers(0, users, n) * 7 + 100  # sparse original ids
    i = rng.integers(0, items, n) * 3 + 5
    r = rng.integers(1, 11, n) / 2
    path.write_text("".join(f"{a} {b} {c}\n" for a, b, c in zip(u, i, r)))


def write_cache(path: Path, n: int, users: int, items: int, seed: int) -> None:
    """A rating cache (the binary format ``MfRatings.load`` keeps) written directly, a chunk at
    a time: a + b + noise ratings, power-law-ish degrees."""
    rng = np.random.default_rng(seed)
    a = rng.normal(3, 0.5, users).astype(np.float32)
    b = rng.normal(0, 0.5, items).astype(np.float32)
    with open(path, "wb") as f:
        f.write(b"SFMFRAT1" + np.array([n, users, items], "<u8").tobytes())
        f.write((np.arange(users, dtype="<u8") * 11 + 1).tobytes())
        f.write((np.arange(items, dtype="<u8") * 13 + 2).tobytes())
        cols = {}
        step = 1 << 20
        for s in range(0, n, step):
            c = min(step, n - s)
            cols.setdefault("u", []).append((rng.random(c) ** 2 * users).astype("<u4"))
            cols.setdefault("i", []).append((rng.random(c) ** 2 * items).astype("<u4"))
        for name in ("u", "i"):
            for x in cols[name]:
                f.write(x.tobytes())
        for x, y in zip(cols["u"], cols["i"]):
            f.write((a[x] + b[y] + rng.normal(0, 0.3, len(x)).astype(np.float32)).astype("<f4").tobytes())


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 1001, 100_003])
@pytest.mark.parametrize("frac", [0.0, 0.1, 0.5, 0.75])
def test_split_test_indices_are_the_split(n, frac):
    r = _native.MfRatings.from_bytes(np.arange(n, dtype=np.int64).tobytes(), np.zeros(n, np.int64).tobytes(),
                                     np.arange(n, dtype=np.float32).tobytes())
    for seed in (0, 3):
        _, te = r.split(frac, seed)
        want = np.frombuffer(te.triples()[2], np.float32).astype(np.uint32)  # rating = its index
        got = np.frombuffer(_native.mf_split_test_indices(n, frac, seed), np.uint32)
        assert np.array_equal(got, want), (n, frac, seed)


def test_split_test_indices_of_nothing_and_bad_fractions():
    assert _native.mf_split_test_indices(0, 0.3, 0) == b""
    with pytest.raises(Exception, match="test fraction"):
        _native.mf_split_test_indices(10, 1.0, 0)


@pytest.mark.parametrize("nb,frac,chunk", [(1, 0.1, 1 << 20), (2, 0.0, 999), (3, 0.2, 1000), (6, 0.1, 4097)])
def test_streamed_partition_is_the_in_memory_partition(tmp_path, nb, frac, chunk):
    src = tmp_path / "r.txt"
    _write_text(src, 20_011, 300, 200, seed=nb)
    tr, te = mf.split_ratings(src, frac, 7)
    k = 5
    mem = Partition(tr, nb, k, 11)
    st = StreamedRatings(src, frac, 7)
    bf = BlockFile(tmp_path)
    needed = {b for b in range(nb * nb) if b % 2 == 0}
    seen = []
    part = st.partition(nb, k, 11, None, needed=needed, spill_to=bf, budget_check=lambda p: seen.append(1),
                        collect_test=True, chunk=chunk)
    bf.finish()
    assert seen == [1]
    assert len(st) == len(tr) == part.n_ratings and len(st.test) == len(te)
    assert (st.n_users, st.n_items) == (tr.n_users, tr.n_items)
    assert np.array_equal(part.counts, mem.counts)
    assert np.array_equal(part.p0, mem.p0) and np.array_equal(part.q0, mem.q0)
    # Only some blocks' initial factors kept (drawn a slab at a time): the same factors.
    bf2 = BlockFile(tmp_path)
    kept = st.partition(nb, k, 11, None, needed=[0], spill_to=bf2, chunk=chunk, keep=([nb - 1], [0]))
    bf2.close()
    assert kept.p0 is None and kept.q0 is None
    assert np.array_equal(kept.p_block(nb - 1).flat, mem.p_block(nb - 1).flat)
    assert np.array_equal(kept.q_block(0).flat, mem.q_block(0).flat)
    if nb > 1:
        with pytest.raises(InvalidArgumentError, match="not kept"):
            kept.p_block(0)
    assert np.array_equal(part.upos, mem.upos) and np.array_equal(part.ipos, mem.ipos)
    assert part.resident_bytes() == 0
    assert sorted(bf.index) == sorted(needed)
    for b in needed:
        off, m = bf.index[b]
        got = np.empty((m, 3), np.uint32)
        os.preadv(bf.fd, [memoryview(got.reshape(-1).view(np.uint8))], off)
        assert np.array_equal(got, mem.blocks[b]), b  # same records, same order
    bf.close()
    assert [np.frombuffer(x, np.uint8).tobytes() for x in st.test.ratings.triples()] == \
        [np.frombuffer(x, np.uint8).tobytes() for x in te.triples()]
    rng = np.random.default_rng(0)
    p = rng.random((tr.n_users, k), dtype=np.float32)
    q = rng.random((tr.n_items, k), dtype=np.float32)
    a = mf._model_of(st, k, p, q)
    b = _native.MfModel.from_factors(tr, k, p.tobytes(), q.tobytes())
    if len(te):
        assert a.rmse(st.test.ratings) == b.rmse(te)
    uu = np.frombuffer(tr.triples()[0], np.int64)[:50]
    ii = np.frombuffer(te.triples()[1], np.int64)[:50] if len(te) else uu
    ids = (np.concatenate([uu, [999999]]), np.concatenate([ii[:len(uu)], [5]]))  # unknown ids: the mean
    assert a.predict(*(x.tobytes() for x in ids)) == b.predict(*(x.tobytes() for x in ids))
    assert sorted(os.listdir(tmp_path)) == ["cache", "r.txt"]  # spill and block files are anonymous


def test_a_rating_cache_is_a_rating_file(tmp_path):
    c = tmp_path / "r.sfr"
    write_cache(c, 5000, 70, 40, seed=1)
    r = _native.MfRatings.load(str(c), str(tmp_path / "cache"))
    assert len(r) == 5000 and (r.n_users, r.n_items) == (70, 40)
    assert not (tmp_path / "cache").exists()  # nothing to cache
    assert _native.mf_cache_header(str(c)) == (5000, 70, 40)
    c.write_bytes(c.read_bytes()[:-4])
    with pytest.raises(DataError, match="r.sfr"):
        _native.mf_cache_header(str(c))


def test_malformed_file_under_a_budget_names_file_and_line(tmp_path):
    src = tmp_path / "bad.txt"
    src.write_text("1 2 3\n" * 10 + "4 5 nan\n")
    bdir = tmp_path / "blocks"
    bdir.mkdir()
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(src), "--mode", "rima", "-n", "2",
                        "-i", "1", "-q", "--memory-budget", "1M", "--block-dir", str(bdir)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "scalefree mf train: " in p.stderr and "bad.txt:11" in p.stderr and "not finite" in p.stderr, p.stderr
    assert "DataError" not in p.stderr  # a message, not rank 0's traceback
    assert os.listdir(bdir) == []
    cache = tmp_path / "cache" / "mf"
    assert not cache.exists() or os.listdir(cache) == []  # no half-written cache


def _train(data, tmp_path, tag, extra=(), n=2, iters=2, every=1):
    """``scalefree mf train`` under a parent that reports the job's peak RSS after set-up: the
    ranks restart their high-water mark after set-up (having reported it as
    ``setup_peak_rss_bytes``), so ru_maxrss of the parent's children — the largest of every
    process of the job, launcher and ranks, as each exits — covers training and what follows."""
    out = tmp_path / f"{tag}.jsonl"
    cmd = [sys.executable, "-m", "scalefree.cli", "mf", "train", str(data), "--mode", "rima", "-n", str(n),
           "-k", "8", "-i", str(iters), "--eval-every", str(every), "--json", str(out), "-q", *extra]
    wrap = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", wrap, *cmd], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in out.read_text().splitlines()], int(p.stdout.split()[-1])


def test_ratings_many_times_the_budget_train_in_bounded_memory(tmp_path):
    """20 M ratings (229 MiB as records) as a rating cache, 3 ranks, 6 x 6 blocks (a budget
    holds two of the largest block: the flash runtime's cache and the scratch copy), budget
    16 MiB per rank: every process's peak RSS, set-up and training, stays far below the
    ratings' in-memory size, and per-iteration losses and the test RMSE are the in-memory
    run's exactly."""
    n = 20_000_000
    data = tmp_path / "big.sfr"
    write_cache(data, n, 150_000, 80_000, seed=2)
    records = n * ENTRY_BYTES  # the ratings in memory as records (the native ratings hold as much)
    budget = 16 << 20
    assert records > 12 * budget
    bdir = tmp_path / "blocks"
    bdir.mkdir()
    disk, disk_after = _train(data, tmp_path, "disk", ("--memory-budget", str(budget), "--block-dir", str(bdir)),
                              n=3, every=0)
    last = disk[-1]
    setup = max(last["setup_peak_rss_bytes"])  # per rank, from the start to the end of set-up
    training = max(max(r["peak_rss_bytes"]) for r in disk)  # per rank, per iteration
    peak = max(setup, training, disk_after)
    assert peak < 0.65 * records, (setup, training, disk_after, records)
    assert all(0 < x <= budget for r in disk for x in r["rating_bytes_resident"])
    assert os.listdir(bdir) == []
    mem, _ = _train(data, tmp_path, "mem", n=3, every=0)
    # In memory: the rank's share (half) with the set-up's transient copies.
    assert max(mem[-1]["setup_peak_rss_bytes"]) > records
    assert [r["train_mse"] for r in disk] == [r["train_mse"] for r in mem]
    assert last["test_rmse"] == mem[-1]["test_rmse"] and np.isfinite(last["test_rmse"])


def test_text_file_under_a_budget_is_the_in_memory_run(tmp_path):
    """The CLI reads a text file in shares (mf_shares) with or without a budget: no rating cache
    is written (it used to be, by rank 0), and the budgeted run is the in-memory one."""
    src = tmp_path / "r.txt"
    _write_text(src, 60_000, 900, 700, seed=5)
    bdir = tmp_path / "blocks"
    bdir.mkdir()
    disk, _ = _train(src, tmp_path, "disk", ("--memory-budget", "200K", "--block-dir", str(bdir)), n=2, iters=3)
    assert not (tmp_path / "cache").exists()  # nothing cached, no temporaries
    mem, _ = _train(src, tmp_path, "mem", n=2, iters=3)
    assert [r["train_mse"] for r in disk] == [r["train_mse"] for r in mem]
    assert [r["test_rmse"] for r in disk] == [r["test_rmse"] for r in mem]
    assert os.listdir(bdir) == []


def test_chunk_size_follows_the_budget():
    assert chunk_ratings(None) == 1 << 20
    assert chunk_ratings(1 << 10) == 1 << 16
    assert chunk_ratings(16 << 20) == (16 << 20) // 64
    assert chunk_ratings(1 << 40) == 1 << 20
