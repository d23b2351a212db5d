"""Rima with a memory budget (``mf_preload``): the R blocks stay in an anonymous block file and the
flash runtime's program cache (``_native.FlashBlockReader``) reads them ahead in pattern order.
Checked: the preloader hands back every block intact in order with at most ``budget`` bytes
held (cache and scratch copy); budgeted training is the same run as in memory (same seed:
identical losses and RMSE) with a budget below the data; a budget smaller than one block is
refused with the block size; no block file is left behind, even after ``kill -9``."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalefree.mf.model as mf
from scalefree import _native
from scalefree.errors import InvalidArgumentError, OutOfBudgetError
from scalefree.mf.data.blocks import ENTRY_BYTES
from scalefree.mf.data.preload import BlockFile, Preloader, min_budget, parse_bytes, retention_plan
from scalefree.mf.modes.rima import block_states, directions

_REPO = Path(__file__).resolve().parents[2]
DATA = next((a / "shared/data" for a in _REPO.parents if (a / "shared/data").exists()), _REPO / "../shared/data")
ML100K = DATA / "movielens-100k/u.data"
ITERS = 4


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SCALEFREE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "mfcache"))


def _blocks(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**32, size=(n, 3), dtype=np.uint32) for n in sizes]


def _file(tmp_path, blocks):
    bf = BlockFile(tmp_path)
    for b, ent in enumerate(blocks):
        bf.append(b, ent)
    bf.finish()
    return bf


@pytest.mark.parametrize("budget_blocks", [1, 1.5, 3, 100])
def test_preloader_hands_back_every_block_in_order_within_budget(tmp_path, budget_blocks):
    """Repeats, empty blocks, odd sizes; the cache at 1, 1.5, 3 and 100 of the largest block."""
    sizes = [0, 1, 7, 500, 333, 64, 500, 2, 499, 341, 342]
    blocks = _blocks(sizes)
    bf = _file(tmp_path, blocks)
    rng = np.random.default_rng(1)
    seq = [int(x) for x in rng.integers(0, len(sizes), 200)] + [3, 3, 6, 6, 0, 9, 10, 1, 1]
    scratch = max(sizes) * ENTRY_BYTES
    budget = int(budget_blocks * bf.span(3)) + scratch  # cache (whole pages) + the scratch copy
    pre = Preloader(bf, seq, budget)
    try:
        for n, b in enumerate(seq):
            got = pre.get(n)
            assert got.shape == (sizes[b], 3)
            assert np.array_equal(got, blocks[b]), (n, b)
            if sizes[b]:
                assert not got.flags.writeable  # the cache's copy: trained through a scratch copy
                assert got.ctypes.data % 4096 == 0  # cache buffers are page-aligned
            assert pre.resident <= budget
            del got  # no view left when the cache takes the block back
            pre.release(n)
        assert scratch < pre.take_peak() <= budget
        # Ratings, not padding; what was not read was handed out again from a kept block.
        assert pre.bytes_read + pre.bytes_reused == sum(sizes[b] for b in seq) * ENTRY_BYTES
        st = pre.stats()
        assert st["peak_resident_bytes"] <= budget - scratch and st["budget_bytes"] == budget - scratch
        if budget_blocks == 100:
            assert st["bytes_read"] == sum(bf.span(b) for b in set(seq))  # every block read once, then kept
            assert pre.bytes_read == sum(sizes[b] for b in set(seq)) * ENTRY_BYTES
        with pytest.raises(InvalidArgumentError, match="in order"):
            pre.release(0)
    finally:
        pre.close()
        pre.close()
    if budget_blocks == 100:
        # keep=False: nothing kept between visits, every visit is read (or a cache hit).
        pre = Preloader(bf, seq, budget, keep=False)
        try:
            for n, b in enumerate(seq):
                assert np.array_equal(pre.get(n), blocks[b]), (n, b)
                pre.release(n)
            assert pre.bytes_reused == 0 and pre.bytes_read == sum(sizes[b] for b in seq) * ENTRY_BYTES
        finally:
            pre.close()
    bf.close()
    assert os.listdir(tmp_path) == []


def _replay(seq, spans, room):
    """Replays a retention plan: checks that a hit finds its block kept, that at most ``room``
    bytes are kept at any time, and that only kept blocks are dropped; returns the reads."""
    hit, keep, drop = retention_plan(seq, spans, room)
    kept, reads = set(), 0
    for n, b in enumerate(seq):
        if hit[n]:
            assert b in kept, (n, b)
            kept.remove(b)
        else:
            reads += 1
        if keep[n]:
            kept.add(b)
        for d in drop[n]:
            assert d in kept, (n, d)
            kept.remove(d)
        assert sum(spans[x] for x in kept) <= room, n
    return reads


@pytest.mark.parametrize("room", [0, 1, 4, 9, 15, 16, 100])
def test_retention_plan_keeps_what_fits_and_reads_the_rest(room):
    """A rima rank's iteration: 16 distinct blocks in a cycle. Belady's rule with bypass keeps
    ``room`` of them for the next lap and reads the other 16 − room each lap (least recently
    used, refilled in order, would read all 16)."""
    seq = list(range(16)) * 5
    spans = {b: 1 for b in range(16)}
    reads = _replay(seq, spans, room)
    kept = min(room, 16)
    assert reads == 16 + 4 * (16 - kept)


def test_retention_plan_random_sequences_and_sizes():
    """Odd sizes (empty blocks, blocks larger than the room), repeats in a row: the replay's
    invariants hold and the reads never exceed those of keeping nothing."""
    rng = np.random.default_rng(5)
    for trial in range(50):
        nb = int(rng.integers(1, 12))
        spans = {b: int(rng.choice([0, 1, 2, 3, 7])) for b in range(nb)}
        seq = [int(x) for x in rng.integers(0, nb, int(rng.integers(0, 60)))]
        room = int(rng.integers(0, 12))
        assert _replay(seq, spans, room) <= len(seq)
    assert retention_plan([], {}, 10) == ([], [], [])


def test_a_view_alive_keeps_the_block_until_it_goes(tmp_path):
    """release() with an array of the block still alive hands it back only when the array goes:
    the memory stays valid while it is used."""
    blocks = _blocks([700, 700, 700], seed=2)
    bf = _file(tmp_path, blocks)
    pre = Preloader(bf, [0, 1, 2], 10 << 20)
    try:
        a = pre.get(0)
        pre.release(0)
        before = pre.resident
        assert np.array_equal(a, blocks[0])  # still readable
        del a
        for n in (1, 2):
            assert np.array_equal(pre.get(n), blocks[n])
            pre.release(n)
        assert pre.resident <= before + bf.span(1)
    finally:
        pre.close()
        bf.close()


def test_the_loader_is_registered_as_a_helper_thread_while_it_runs(tmp_path):
    """While a preloader runs, the process's waits skip their yield phase (the runtime's IO
    threads need the cores; `wait::yield_phase` is tested in Rust): it registers, and close()
    ends that once, however often it is called."""
    bf = _file(tmp_path, _blocks([3, 4]))
    before = _native.helper_thread_count()
    pre = Preloader(bf, [0, 1], 1 << 20)
    try:
        assert _native.helper_thread_count() == before + 1
        assert np.array_equal(pre.get(0), _blocks([3, 4])[0])
    finally:
        pre.close()
        pre.close()
        bf.close()
    assert _native.helper_thread_count() == before


def test_layout_is_page_aligned_with_zero_padding(tmp_path):
    """Odd block sizes (0 and 1 rating, one short of and one past a page): every block starts
    on a 4 KiB boundary and takes whole pages; the gaps read as zeros."""
    sizes = [0, 1, 341, 342, 0, 1, 1000, 2]  # 341 × 12 = 4092 bytes, 342 × 12 = 4104
    blocks = _blocks(sizes, seed=3)
    bf = _file(tmp_path, blocks)
    try:
        raw = os.pread(bf.fd, bf.size + 10, 0)
        assert len(raw) == bf.size and bf.size % 4096 == 0
        end = 0
        for b, n in enumerate(sizes):
            off, m = bf.index[b]
            assert m == n and off % 4096 == 0 and off == end
            assert bf.span(b) == -(-n * ENTRY_BYTES // 4096) * 4096
            assert raw[off:off + n * ENTRY_BYTES] == blocks[b].tobytes()
            assert not any(raw[off + n * ENTRY_BYTES:off + bf.span(b)])  # zero padding
            end = off + bf.span(b)
        assert end == bf.size
        assert [bf.span(b) for b in range(len(sizes))] == [0, 4096, 4096, 8192, 0, 4096, 12288, 4096]
    finally:
        bf.close()


def test_block_file_on_tmpfs():
    """On /dev/shm (tmpfs: O_DIRECT refused on older kernels, accepted on newer; the runtime
    falls back to buffered reads) the blocks come back intact whichever path is taken."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    sizes = [5, 0, 1, 341, 700]
    blocks = _blocks(sizes, seed=7)
    bf = _file("/dev/shm", blocks)
    try:
        seq = [4, 3, 2, 1, 0, 4, 4]
        pre = Preloader(bf, seq, 2 * bf.span(4) + 700 * ENTRY_BYTES)
        try:
            for n, b in enumerate(seq):
                assert np.array_equal(pre.get(n), blocks[b]), (n, b)
                pre.release(n)
        finally:
            pre.close()
    finally:
        bf.close()


def test_preloader_refuses_a_budget_below_two_blocks(tmp_path):
    """1200 bytes of ratings: a whole 4 KiB page in the cache and a 1200-byte scratch copy."""
    bf = BlockFile(tmp_path)
    bf.append(0, _blocks([100])[0])
    bf.finish()
    assert min_budget(1200) == 4096 + 1200
    with pytest.raises(OutOfBudgetError, match=r"1200 bytes\) \(4096 bytes as whole 4 KiB pages.*at least 5296 bytes"):
        Preloader(bf, [0], 5295)
    Preloader(bf, [0], 5296).close()
    bf.close()


def test_block_file_has_no_name(tmp_path):
    bf = BlockFile(tmp_path)
    bf.append(0, _blocks([10])[0])
    assert os.listdir(tmp_path) == []
    assert os.readlink(f"/proc/self/fd/{bf.fd}").endswith("(deleted)")
    bf.close()


def test_no_block_file_left_after_kill_9(tmp_path):
    code = (f"from scalefree.mf.data.preload import BlockFile, Preloader\nimport numpy as np, time\n"
            f"bf = BlockFile({str(tmp_path)!r}); bf.append(0, np.ones((1000, 3), np.uint32)); bf.finish()\n"
            f"pre = Preloader(bf, [0, 0], 1 << 20); pre.get(0)\n"
            f"print(bf.fd, flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        fd = p.stdout.readline().strip()
        link = os.readlink(f"/proc/{p.pid}/fd/{fd}")
        assert link.startswith(str(tmp_path)) and link.endswith("(deleted)")
        assert os.listdir(tmp_path) == []
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text,n", [("64M", 64 << 20), ("1.5k", 1536), ("4096", 4096), (300, 300), ("2 GiB", 2 << 30)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "-1", "0", "12Q", "lots"])
def test_parse_bytes_rejects(text):
    with pytest.raises(InvalidArgumentError):
        parse_bytes(text)


def test_memory_budget_for_every_mode():
    for mode in mf.MODES:
        assert mf.MatrixFactorization(mode=mode, memory_budget="1M").memory_budget == 1 << 20
    with pytest.raises(InvalidArgumentError, match="64Q"):
        mf.MatrixFactorization(mode="rima", memory_budget="64Q")


@pytest.mark.parametrize("V,iters", [(1, 3), (2, 2), (6, 3), (8, 5)])
def test_block_states_visit_every_block_once_per_iteration(V, iters):
    """The predefined pattern sequence: every step's pattern is interchangeable (distinct row and
    column blocks) and each iteration covers all V² blocks."""
    bp, bq = block_states(V, directions(iters, 7))
    for it in range(iters):
        seen = set()
        for s in range(it * V, (it + 1) * V):
            assert sorted(bp[s]) == list(range(V)) and sorted(bq[s]) == list(range(V))
            seen |= set(zip(bp[s].tolist(), bq[s].tolist()))
        assert len(seen) == V * V


def _train(n, tmp_path, tag, extra=(), mode="rima"):
    out = tmp_path / f"{tag}.jsonl"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", mode,
                        "-n", str(n), "-k", "8", "-i", str(ITERS), "--eval-every", "2", "--json", str(out), "-q",
                        *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in out.read_text().splitlines()], p.stdout


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
@pytest.mark.parametrize("n,blocks", [(1, None), (2, None), (3, None), (3, 3)])
def test_budgeted_training_is_the_in_memory_run(n, blocks, tmp_path):
    """Same seed, budget well below the rating data: identical per-iteration losses, test RMSE
    curve and bytes sent; every rank's resident rating bytes within the budget; block dir
    empty afterwards."""
    b = () if blocks is None else ("--blocks", str(blocks))
    mem, _ = _train(n, tmp_path, "mem", b)
    data = mem[-1]["rating_bytes"]
    V = mem[-1]["blocks_per_side"]
    budget = int(data * 3 / V**2)  # room for about 3 blocks (cache and scratch copy): 8 % – 75 % of R
    bdir = tmp_path / "blocks"
    bdir.mkdir()
    disk, out = _train(n, tmp_path, "disk", (*b, "--memory-budget", str(budget), "--block-dir", str(bdir)))
    assert [r["train_mse"] for r in disk] == [r["train_mse"] for r in mem]
    assert [r.get("test_rmse") for r in disk] == [r.get("test_rmse") for r in mem]
    assert disk[-1]["bytes_sent"] == mem[-1]["bytes_sent"]
    assert disk[-1]["memory_budget"] == budget
    # In memory a rank holds the blocks it trains (its rows and columns of blocks, mf_shares),
    # all of R only on one rank; it used to be all of R on every rank.
    held = [x * ENTRY_BYTES for x in mem[-1]["ratings_held"]]
    for r in mem:
        assert r["rating_bytes_resident"] == held
        assert n == 1 or max(held) < data
    for r in disk:
        assert all(0 < x <= budget for x in r["rating_bytes_resident"]), r
        assert all(x > 0 for x in r["peak_rss_bytes"])
    # Each rank read what it trained, or kept it from an earlier visit: 1/n of R per iteration.
    assert sum(disk[-1]["bytes_read"]) <= data * ITERS
    assert len(disk[-1]["preload_loader_cpu_seconds"]) == n
    assert "budget" in out and "peak RSS" in out
    assert os.listdir(bdir) == []


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
@pytest.mark.parametrize("blocks,hint", [("3", "--blocks 6"), ("6", "more ranks")])
def test_budget_smaller_than_a_block_is_refused(blocks, hint, tmp_path):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", "rima",
                        "-n", "3", "--blocks", blocks, "-i", "1", "-q", "--memory-budget", "10K",
                        "--block-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "smaller than one R block" in p.stderr and "bytes)" in p.stderr and hint in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
def test_missing_block_dir_is_a_clear_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", "rima",
                        "-n", "2", "-i", "1", "-q", "--memory-budget", "1M", "--block-dir", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "block directory" in p.stderr and "does not exist" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.skipif(not ML100K.exists(), reason="MovieLens-100K not in ../shared/data")
def test_dsgd_ps_budgeted_training_is_the_in_memory_run(tmp_path):
    """dsgd-ps's workers read their block rows through the flash runtime in step order: the
    same run as in memory (losses, test RMSE curve), within the budget."""
    mem, _ = _train(4, tmp_path, "mem", mode="dsgd-ps")
    tr, _ = mf.split_ratings(ML100K, 0.1, 0)
    budget = int(len(tr) * ENTRY_BYTES * 0.3)  # 3 workers, 3 x 3 blocks: a worker's row is 1/3 of R
    bdir = tmp_path / "blocks"
    bdir.mkdir()
    disk, _ = _train(4, tmp_path, "disk", ("--memory-budget", str(budget), "--block-dir", str(bdir)), mode="dsgd-ps")
    assert [r["train_mse"] for r in disk] == [r["train_mse"] for r in mem]
    assert [r.get("test_rmse") for r in disk] == [r.get("test_rmse") for r in mem]
    assert os.listdir(bdir) == []
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", "dsgd-ps",
                        "-n", "3", "-i", "1", "-q", "--memory-budget", "10K", "--block-dir", str(bdir)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "dsgd-ps: memory budget" in p.stderr and "smaller than one R block" in p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def test_cli_rejects_a_bad_budget():
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(ML100K), "--mode", "rima",
                        "-n", "2", "--memory-budget", "lots"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--memory-budget" in p.stderr and "lots" in p.stderr


def test_python_api_single_rank_budget(tmp_path):
    """memory_budget through MatrixFactorization (one rank, in this process) gives the in-memory model."""
    if not ML100K.exists():
        pytest.skip("MovieLens-100K not in ../shared/data")
    tr, te = mf.split_ratings(ML100K, 0.1, 0)
    a = mf.MatrixFactorization(k=8, mode="rima", iterations=2, seed=5).fit(tr, te)
    budget = len(tr) * ENTRY_BYTES * 2 // 3  # 2 x 2 blocks: two blocks and a page or so
    b = mf.MatrixFactorization(k=8, mode="rima", iterations=2, seed=5, memory_budget=budget,
                               block_dir=tmp_path).fit(tr, te)
    assert a.history[-1]["test_rmse"] == b.history[-1]["test_rmse"]
    assert np.array_equal(a.predict([1, 2, 3], [4, 5, 6]), b.predict([1, 2, 3], [4, 5, 6]))
    assert max(b.history[-1]["rating_bytes_resident"]) <= budget
    assert os.listdir(tmp_path) == []


def test_bench_vs_memory_budget_on_a_small_synthetic_matrix(tmp_path):
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "bench", "mf", "--vs", "memory-budget", "--ranks", "2",
                        "--users", "1500", "--items", "1200", "--ratings", "20000", "--iterations", "2",
                        "--repeat", "1", "-k", "8", "--budget-fraction", "0.3", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    mem, bud = json.loads(out.read_text())
    assert (mem["variant"], bud["variant"]) == ("memory", "budget")
    assert bud["memory_budget"] == int(0.3 * mem["rating_bytes"])
    # In memory a rank holds the blocks it trains (mf_shares), no longer all of R.
    assert 0 < mem["rating_bytes_resident_max"] <= mem["rating_bytes"]
    assert 0 < bud["rating_bytes_resident_max"] <= bud["memory_budget"]
    assert bud["test_rmse"] == mem["test_rmse"] and np.isfinite(mem["test_rmse"])
    assert "x in-memory, RMSE identical" in p.stdout


def _records_and_factors(rng, n: int, k: int, rows_p: int, rows_q: int):
    """n random packed records (user row, item row, rating bits) and random P, Q."""
    ent = np.empty((n, 3), np.uint32)
    ent[:, 0] = rng.integers(0, rows_p, n)
    ent[:, 1] = rng.integers(0, rows_q, n)
    ent[:, 2] = rng.uniform(1, 5, n).astype(np.float32).view(np.uint32)
    return ent, rng.random((rows_p, k), dtype=np.float32), rng.random((rows_q, k), dtype=np.float32)


@pytest.mark.parametrize("n,seed", [(0, 1), (1, 2), (7, None), (1001, 3)])
def test_entries_binding_matches_the_block_binding(n, seed):
    """mf_sgd_entries (packed records, shuffled in place) does what mf_sgd_block does on the
    records in the order they end up in; the shuffle is a permutation fixed by the seed."""
    from scalefree import _native

    k, rows_p, rows_q = 8, 13, 11
    ent, p0, q0 = _records_and_factors(np.random.default_rng(n), n, k, rows_p, rows_q)
    a = [p0.copy(), q0.copy(), np.ones(rows_p, np.float32), np.ones(rows_q, np.float32)]
    b = [p0.copy(), q0.copy(), np.ones(rows_p, np.float32), np.ones(rows_q, np.float32)]
    before = ent.copy()
    la = _native.mf_sgd_entries(ent, *a, k, shuffle_seed=seed)
    if seed is None or n < 2:
        assert np.array_equal(ent, before)
    else:
        assert not np.array_equal(ent, before)
        assert sorted(map(tuple, ent.tolist())) == sorted(map(tuple, before.tolist()))
        again = before.copy()
        _native.mf_sgd_entries(again, p0.copy(), q0.copy(), np.ones(rows_p, np.float32), np.ones(rows_q, np.float32),
                               k, shuffle_seed=seed)
        assert np.array_equal(again, ent)
    u, i, r = (np.ascontiguousarray(ent[:, 0]).view(np.int32), np.ascontiguousarray(ent[:, 1]).view(np.int32),
               np.ascontiguousarray(ent[:, 2]).view(np.float32))
    lb = _native.mf_sgd_block(u, i, r, *b, k)
    assert la == lb
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("n,seed,scale", [(0, 1, 1.0), (1, 2, 2.0), (7, None, 1.5), (7, None, 1.0), (1001, 3, 1.0),
                                          (1001, 4, 0.7)])
def test_entries_from_a_source_equal_a_copy_trained_in_place(n, seed, scale):
    """With ``source`` the kernel fills the scratch records in its fresh order (scaled) in one
    pass: the records, factors and loss equal copying the source and training in place; the
    source keeps its order."""
    from scalefree import _native

    k, rows_p, rows_q = 8, 13, 11
    src, p0, q0 = _records_and_factors(np.random.default_rng(n + 17), n, k, rows_p, rows_q)
    kept = src.copy()
    runs = []
    for use_source in (True, False):
        f = [p0.copy(), q0.copy(), np.ones(rows_p, np.float32), np.ones(rows_q, np.float32)]
        if use_source:
            ent = np.full((n, 3), 0xFFFF, np.uint32)  # stale scratch contents
            loss = _native.mf_sgd_entries(ent, *f, k, shuffle_seed=seed, scale=scale, source=src)
        else:
            ent = src.copy()
            loss = _native.mf_sgd_entries(ent, *f, k, shuffle_seed=seed, scale=scale)
        runs.append((ent, f, loss))
    (ea, fa, la), (eb, fb, lb) = runs
    assert np.array_equal(ea, eb) and la == lb
    for x, y in zip(fa, fb):
        assert np.array_equal(x, y)
    assert np.array_equal(src, kept)
    if seed is not None and n > 50:
        assert not np.array_equal(ea[:, :2], src[:, :2])
    assert sorted(map(tuple, ea[:, :2].tolist())) == sorted(map(tuple, src[:, :2].tolist()))


def test_entries_binding_checks_its_arguments():
    from scalefree import _native

    p, q = np.zeros((4, 2), np.float32), np.zeros((3, 2), np.float32)
    pg, qg = np.ones(4, np.float32), np.ones(3, np.float32)
    with pytest.raises(InvalidArgumentError, match="outside p"):
        _native.mf_sgd_entries(np.array([[4, 0, 0]], np.uint32), p, q, pg, qg, 2)
    with pytest.raises(InvalidArgumentError, match="uint32 records"):
        _native.mf_sgd_entries(np.zeros((1, 3), np.int64), p, q, pg, qg, 2)
    with pytest.raises(InvalidArgumentError, match="uint32 records"):
        _native.mf_sgd_entries(np.zeros(4, np.uint32), p, q, pg, qg, 2)
    with pytest.raises(InvalidArgumentError, match="source must be uint32 records"):
        _native.mf_sgd_entries(np.zeros((2, 3), np.uint32), p, q, pg, qg, 2, source=np.zeros((1, 3), np.uint32))
    with pytest.raises(InvalidArgumentError, match="overlap"):
        both = np.zeros((2, 3), np.uint32)
        _native.mf_sgd_entries(both, p, q, pg, qg, 2, source=both)
    with pytest.raises(InvalidArgumentError, match="read-only"):
        ro = np.zeros((1, 3), np.uint32)
        ro.flags.writeable = False
        _native.mf_sgd_entries(ro, p, q, pg, qg, 2)
    with pytest.raises(InvalidArgumentError, match="schedule"):
        _native.mf_sgd_entries(np.zeros((1, 3), np.uint32), p, q, pg, qg, 2, schedule="adam")


def _split_adagrad_reference(ent, p, q, pg, qg, k, eta, lam, scale, slow_only):
    """LIBMF's split AdaGrad in plain numpy: accumulators 2u (lanes 0..8) and 2u + 1 (the rest),
    each adding its lanes' mean squared gradient; ratings divided by ``scale``."""
    w = -(-k // 8) * 8
    parts = [(slice(0, 8), 0, 8)] + ([] if slow_only or w <= 8 else [(slice(8, k), 1, w - 8)])
    loss = 0.0
    for u, i, bits in ent:
        r = np.float32(np.uint32(bits).view(np.float32)) / np.float32(scale)
        e = r - p[u] @ q[i]
        loss += float(e) ** 2
        po, qo = p[u].copy(), q[i].copy()
        for sl, a, width in parts:
            gp, gq = lam * po[sl] - e * qo[sl], lam * qo[sl] - e * po[sl]
            p[u, sl] = po[sl] - eta / np.sqrt(pg[2 * u + a]) * gp
            q[i, sl] = qo[sl] - eta / np.sqrt(qg[2 * i + a]) * gq
            pg[2 * u + a] += (gp @ gp) / width
            qg[2 * i + a] += (gq @ gq) / width
    return loss


@pytest.mark.parametrize("schedule", ["adagrad-split", "adagrad-split-slow"])
def test_split_adagrad_entries_match_a_numpy_reference(schedule):
    from scalefree import _native

    rng = np.random.default_rng(4)
    k, rows_p, rows_q, n = 16, 7, 5, 61
    ent = np.empty((n, 3), np.uint32)
    ent[:, 0], ent[:, 1] = rng.integers(0, rows_p, n), rng.integers(0, rows_q, n)
    ent[:, 2] = rng.uniform(1, 5, n).astype(np.float32).view(np.uint32)
    p0 = rng.uniform(0, 0.25, (rows_p, k)).astype(np.float32)
    q0 = rng.uniform(0, 0.25, (rows_q, k)).astype(np.float32)
    pg0 = np.ones(2 * rows_p, np.float32)
    qg0 = np.ones(2 * rows_q, np.float32)
    want = [a.astype(np.float64) for a in (p0, q0, pg0, qg0)]
    lw = _split_adagrad_reference(ent, *want, k, 0.1, 0.05, 1.3, schedule.endswith("slow"))
    got = [a.copy() for a in (p0, q0, pg0, qg0)]
    lg = _native.mf_sgd_entries(ent.copy(), *got, k, eta=0.1, lam=0.05, schedule=schedule, scale=1.3)
    assert lg == pytest.approx(lw, rel=1e-4)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-4, atol=1e-5)
    if schedule.endswith("slow"):
        np.testing.assert_array_equal(got[0][:, 8:], p0[:, 8:])  # the fast lanes do not move
    with pytest.raises(InvalidArgumentError, match="2 accumulator"):
        _native.mf_sgd_entries(ent.copy(), p0.copy(), q0.copy(), np.ones(rows_p, np.float32),
                               np.ones(rows_q, np.float32), k, schedule=schedule)
