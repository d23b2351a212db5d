"""Partitioned input for `mf train --mode rima|dsgd-ps` (scalefree.mf.data.shares), with real rank
processes: every rating of the file used exactly once across the ranks (train + test), the
split independent of the number of ranks, no rank reading, receiving or holding much more than
its share (rima: the blocks it trains, about 2/w of R), the budgeted run equal to the in-memory
one, and a bad line in one rank's share named once with a non-zero exit and no hang."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from scalefree.mf.data.shares import in_test_set

from ranks import collect, spawn_ranks

TEXT_LINE = "{} {} {}\n"


def _write(path: Path, n: int, users: int, items: int, seed: int, header: str = "") -> None:
    """n ratings of a rank-2 model plus noise on sparse ids, as text (``u i r`` lines); mildly
    skewed user degrees (weights 1/(rank + 30)), so blocks hold similar numbers of ratings."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 1, (users, 2)), rng.normal(0, 1, (items, 2))
    w = 1 / (np.arange(users) + 30.0)
    u = rng.choice(users, n, p=w / w.sum())
    i = rng.integers(0, items, n)
    r = np.clip(np.round(3 + (a[u] * b[i]).sum(1) + rng.normal(0, 0.3, n)), 1, 5)
    with open(path, "w") as f:
        f.write(header)
        f.write("".join(TEXT_LINE.format(x * 7 + 3, y * 5 + 1, int(z)) for x, y, z in zip(u, i, r)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    p = tmp_path_factory.mktemp("shares") / "r.txt"
    _write(p, 40_000, 3_000, 800, seed=1)
    return p


def _file_ratings(path: Path) -> Counter:
    out = Counter()
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) >= 3 and not line.startswith(("#", "%")):
            out[(int(f[0]), int(f[1]), float(f[2]))] += 1
    return out


_DUMP = """
import sys
import numpy as np
import scalefree
from scalefree.mf.data.shares import ShareRatings
path, out, nb = sys.argv[1], sys.argv[2], 3
g = scalefree.init()
tr = ShareRatings(path, 0.2, 7)
trains = np.zeros((g.size, nb * nb), bool)
for b in range(nb * nb):
    trains[b % g.size, b] = True          # every block on exactly one rank
part = tr.partition(g, nb, 4, 7, None, trains=trains)
inv_u, inv_i = np.argsort(part.upos), np.argsort(part.ipos)
users, items, vals = [], [], []
for b, ent in enumerate(part.blocks):
    if ent is None:
        continue
    ru, ri = divmod(b, nb)
    users.append(tr.user_ids[inv_u[part.ustart[ru] + ent[:, 0].astype(np.int64)]])
    items.append(tr.item_ids[inv_i[part.istart[ri] + ent[:, 1].astype(np.int64)]])
    vals.append(ent[:, 2].view(np.float32))
tu, ti, tv = tr._test
np.savez(f"{out}.{g.rank}.npz", u=np.concatenate(users or [np.zeros(0, np.int64)]),
         i=np.concatenate(items or [np.zeros(0, np.int64)]),
         v=np.concatenate(vals or [np.zeros(0, np.float32)]),
         tu=tr.user_ids[tu], ti=tr.item_ids[ti], tv=tv, n_train=len(tr), n_test=len(tr.test),
         read=tr.stats["ratings_read"][g.rank])
"""


def _dump(data: Path, n: int, tmp_path: Path):
    out = tmp_path / f"d{n}"
    res = collect(spawn_ranks(n, _DUMP, args=[str(data), str(out)]), timeout=180)
    for r in res:
        assert r.returncode == 0, r.stderr
    return [dict(np.load(f"{out}.{r}.npz")) for r in range(n)]


def _triples(u, i, v) -> Counter:
    return Counter(zip(u.tolist(), i.tolist(), np.asarray(v, np.float64).tolist()))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_rating_used_once_and_the_split_does_not_depend_on_the_ranks(data, n, tmp_path):
    ranks = _dump(data, n, tmp_path)
    want = _file_ratings(data)
    train, test = Counter(), Counter()
    for d in ranks:
        train += _triples(d["u"], d["i"], d["v"])
        test += _triples(d["tu"], d["ti"], d["tv"])
    assert train + test == want  # each rating once, train or test
    assert sum(int(d["read"]) for d in ranks) == sum(want.values())
    assert all(int(d["n_train"]) == sum(train.values()) and int(d["n_test"]) == sum(test.values()) for d in ranks)
    # The split is a function of (user, item, seed) only: the same test set for any number of ranks.
    keys = np.array([k for k in want.elements()])
    in_test = in_test_set(keys[:, 0].astype(np.int64), keys[:, 1].astype(np.int64), 0.2, 7)
    assert test == _triples(keys[in_test, 0].astype(np.int64), keys[in_test, 1].astype(np.int64), keys[in_test, 2])
    assert 0.17 < sum(test.values()) / sum(want.values()) < 0.23
    # Each rank read about 1/n of the lines.
    for d in ranks:
        assert int(d["read"]) <= sum(want.values()) / n * 1.1 + 50


def test_hash_split_is_seeded_and_near_the_fraction():
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 10**12, 200_000), rng.integers(0, 10**6, 200_000)
    for frac in (0.0, 0.1, 0.5):
        m = in_test_set(u, i, frac, 3)
        assert abs(m.mean() - frac) < 0.005
    assert not np.array_equal(in_test_set(u, i, 0.1, 3), in_test_set(u, i, 0.1, 4))
    assert np.array_equal(in_test_set(u[:10], i[:10], 0.1, 3), in_test_set(u, i, 0.1, 3)[:10])


def _cli(data: Path, mode: str, n: int, tmp_path: Path, extra=(), iters: int = 3, timeout: float = 300):
    out = tmp_path / f"{mode}{n}-{len(list(tmp_path.glob('*.jsonl')))}.jsonl"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(data), "--mode", mode, "-n", str(n),
                        "-k", "8", "-i", str(iters), "--json", str(out), "-q", *extra],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


# (2V − 1)/V² of R per virtual worker, the union over a rank's c virtual workers: measured
# fractions of R a rima rank trains (tests/mf/test_mf_partitioned: trained_blocks).
@pytest.mark.parametrize("mode,n", [("rima", 1), ("rima", 2), ("rima", 3), ("rima", 5),
                                    ("dsgd-ps", 2), ("dsgd-ps", 3), ("dsgd-ps", 5)])
def test_no_rank_holds_much_more_than_its_share(data, mode, n, tmp_path):
    from scalefree.mf.modes import dsgd_ps, rima

    last = _cli(data, mode, n, tmp_path)[-1]
    total = sum(last["ratings_read"])
    n_train = sum(last["train_ratings_read"])
    assert total == sum(_file_ratings(data).values())
    assert sum(last["train_ratings_read"]) + sum(last["test_ratings_kept"]) == total
    assert len(last["ratings_read"]) == n
    for r in range(n):
        assert last["ratings_read"][r] <= total / n * 1.1 + 50  # its 1/n of the bytes
    if mode == "rima":
        V = last["blocks_per_side"]
        bp, bq = rima.block_states(V, rima.directions(3, 0))
        frac = rima.trained_blocks(n, V // n, bp, bq).mean(axis=1)  # (2V − 1)/V²-ish per rank
        for r in range(n):
            assert last["records_received"][r] == last["ratings_held"][r]
            assert last["ratings_held"][r] <= frac[r] * n_train * 1.25 + 100, (r, frac[r], last["ratings_held"])
        if n >= 3:
            assert max(last["ratings_held"]) < 0.7 * n_train
        assert sum(last["records_sent"]) == sum(last["records_received"])
    else:
        assert last["ratings_held"][0] == 0 and last["records_received"][0] == 0  # the server holds no ratings
        assert sum(last["ratings_held"]) == n_train  # each rating on exactly one worker
        w = n - 1
        for r in range(1, n):
            assert last["ratings_held"][r] <= n_train / w * 1.5 + 100
        assert dsgd_ps.trained_blocks(w).sum() == w * w
    assert len(last["load_peak_rss_bytes"]) == n and len(last["peak_rss_bytes_end"]) == n
    assert np.isfinite(last["test_rmse"]) and last["test_rmse"] < 1.5


@pytest.mark.parametrize("n", [2, 3])
def test_budgeted_run_is_the_in_memory_run(data, n, tmp_path):
    """Under a budget the share is read in pieces (several alltoallv rounds) and the blocks go
    through a spill file to the block file: same blocks, same losses, same test RMSE."""
    mem = _cli(data, "rima", n, tmp_path)
    bdir = tmp_path / "blocks"
    bdir.mkdir()
    disk = _cli(data, "rima", n, tmp_path, ("--memory-budget", "300K", "--block-dir", str(bdir)))
    assert disk[-1]["load_rounds"][0] > 1  # read in pieces
    assert [r["train_mse"] for r in disk] == [r["train_mse"] for r in mem]
    assert [r.get("test_rmse") for r in disk] == [r.get("test_rmse") for r in mem]
    assert disk[-1]["ratings_held"] == mem[-1]["ratings_held"]
    assert all(0 < x <= 300 << 10 for r in disk for x in r["rating_bytes_resident"])
    assert os.listdir(bdir) == []


def test_rank_count_changes_blocks_not_quality(data, tmp_path):
    """Same file, same split at 2 and 4 ranks: the test RMSE of the model is close."""
    a = _cli(data, "rima", 2, tmp_path, iters=10)[-1]
    b = _cli(data, "rima", 4, tmp_path, iters=10)[-1]
    assert sum(a["test_ratings_kept"]) == sum(b["test_ratings_kept"])
    assert abs(a["test_rmse"] - b["test_rmse"]) / a["test_rmse"] < 0.05, (a["test_rmse"], b["test_rmse"])


@pytest.mark.parametrize("mode,n", [("rima", 3), ("dsgd-ps", 4), ("rima", 5)])
@pytest.mark.parametrize("bad,needle", [("11 22 nan", "not finite"), ("11 two 3", "")])
def test_bad_line_in_one_share_is_named_once(tmp_path, mode, n, bad, needle):
    """The bad line sits in the last rank's share: one message naming the file and line, a
    non-zero exit, no traceback and no hang."""
    src = tmp_path / "bad.txt"
    lines = [f"{u} {u % 17 + 1} {u % 5 + 1}\n" for u in range(1, 3001)]
    at = 2900  # 1-based line number, in the last 1/n of the bytes
    lines[at - 1] = bad + "\n"
    src.write_text("".join(lines))
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(src), "--mode", mode, "-n", str(n),
                        "-i", "1", "-q"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert p.stderr.count(f"bad.txt:{at}") == 1, p.stderr
    assert "scalefree mf train: " in p.stderr and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
