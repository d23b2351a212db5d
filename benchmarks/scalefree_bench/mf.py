"""``scalefree bench mf --vs libmf``: local-mode MF vs LIBMF (the pip ``libmf`` package).
``scalefree bench mf --vs dsgd-ps``: the ``rima`` ring vs the ``dsgd-ps`` parameter server on
a seeded synthetic matrix (low rank + noise, power-law row and column degrees), ``--ranks``
ranks each, equal iterations: training time, bytes sent per worker, test RMSE, peak RSS per
rank, and the iterations and time each needs to reach a common test RMSE (the worse final one;
with ``--curve-seeds N``, per seed over N seeds of the training and split: mean ± standard error
of the iterations, times the timed runs' median seconds per iteration).
``scalefree bench mf --vs memory-budget --budget-fraction 0.25``: ``rima`` on the same synthetic
matrix in memory and with ``--memory-budget`` = that fraction of the rating data (per rank; the
blocks stay on flash, read ahead in pattern order through the flash runtime's program cache), runs interleaved: training time and their
ratio, test RMSE, rating bytes held per rank, peak RSS per rank. With ``--cold`` the page cache
is dropped before every run. ``--mode local``: ``local`` mode and LIBMF's ``--disk`` instead
(``mf_local_budget.py``).

Both train on the same seeded 90/10 split with the same k, λ (L2 on P and Q, no L1),
iterations and threads; LIBMF runs in a child process (its ctypes wrapper prints on import
and must not share our threads). Reported: fit time (median of --repeat), test RMSE, and
rating updates per second. LIBMF predicts through its own factors (P[u]·Q[i]; the training mean for ids it never saw).

``scalefree bench mf --vs libmf --libmf-bin DIR``: against LIBMF's official command-line tools
(``mf-train`` / ``mf-predict`` built from its source, e.g. ``make`` with ``-DUSEAVX``), from
files on disk: each data set is split once (seeded, 90/10) into a training and a test file in
LIBMF's text format (``u i r``, dense 0-based ids); both sides read those two files. For each λ
in ``--lams`` (default 0.05,0.1), with the same k, η, iterations and threads:
LIBMF's training time is (wall time of ``mf-train -t N`` − wall time of ``mf-train -t 1``)·N/(N−1)
(median of --repeat pairs), its test RMSE ``mf-predict``'s on the model of ``-t N`` (median over
the repeats; ours likewise: with 2 threads neither is bit-for-bit repeatable), and its
per-iteration test RMSE comes from an untimed ``-p TEST`` run. Ours runs in a child process
(with ``OPENBLAS_NUM_THREADS=1``: it calls no BLAS, and numpy's idle pool would spin a core):
load both files, align the test ids to the training ids, build the trainer, then one epoch and
N − 1 epochs timed apart; its training time is the same formula, (time of epochs 2..N)·N/(N−1)
(the time of all N epochs is in the JSON too); the per-epoch test RMSE comes from a second,
untimed trainer with the same seed. Reported: training seconds, ratio,
test RMSE at N iterations, the iteration and training time at which ours first reaches LIBMF's
N-iteration RMSE, end-to-end seconds (process start to model) and peak RSS of each process.
LIBMF's initialisation and block layout come from a fixed seed, so its RMSE on one split file
is one draw: ``--draws N`` also reports the mean test RMSE (± standard error) over N draws of
each side — LIBMF on copies of the split with users and items renumbered by a seeded
permutation, ours on the same copies with seeds 0..N−1.

``scalefree bench mf --vs fold-in``: a seeded 10 % of the users of each rating file are new:
half of each new user's ratings (seeded) are folded into a model trained without them
(``model.fold_in``: a ridge solve per user against the fixed item factors), the other half is
the test set. Reported: test RMSE of the folded-in users, of a model retrained on everything
but the test half (same hyperparameters, seed and threads), and of the training mean (what
the model answers before fold-in); fold-in seconds per user and retraining seconds.

``scalefree bench mf --throughput``: rating updates per second per iteration (training
only, after set-up) on a seeded 6,040 × 3,700 matrix with 1 M training ratings (MovieLens-1M's
shape), on 1 and 2 threads, ours and LIBMF side by side. Ours times the epochs directly
after one warm-up epoch; LIBMF's per-iteration time is (fit with 1 + N iterations − fit with
1 iteration) / N, which removes its set-up the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common, mf_local_budget

BENCH = "mf"
_DEFAULT_DATA = ("movielens-100k/u.data", "ml-latest-small/ratings.csv")

_LIBMF_CHILD = r"""
import sys, json, time, io, contextlib
import numpy as np
with contextlib.redirect_stdout(io.StringIO()):
    from libmf import mf
d = np.load(sys.argv[1]); a = json.loads(sys.argv[2])
tr = np.ascontiguousarray(d["train"]); te = d["test"]
times, rmse = [], None
for _ in range(a["repeat"]):
    e = mf.MF(k=a["k"], nr_threads=a["threads"], nr_iters=a["iterations"], eta=a["eta"],
              lambda_p2=a["lam"], lambda_q2=a["lam"], lambda_p1=0.0, lambda_q1=0.0, quiet=True)
    t0 = time.perf_counter(); e.fit(tr); times.append(time.perf_counter() - t0)
    P, Q = e.p_factors(), e.q_factors()
    u = te[:, 0].astype(np.int64); i = te[:, 1].astype(np.int64)
    pred = np.einsum("ij,ij->i", P[u], Q[i])
    # LIBMF leaves factors of ids absent from training as NaN; answer those with the mean.
    pred = np.where(np.isfinite(pred), pred, float(tr[:, 2].mean()))
    rmse = float(np.sqrt(np.mean((pred - te[:, 2]) ** 2)))
print(json.dumps({"times": times, "rmse": rmse}))
"""


_LIBMF_RATE_CHILD = r"""
import sys, json, time, io, contextlib
import numpy as np
with contextlib.redirect_stdout(io.StringIO()):
    from libmf import mf
d = np.load(sys.argv[1]); a = json.loads(sys.argv[2])
tr = np.ascontiguousarray(d["train"]); te = d["test"]
def fit(iters):
    e = mf.MF(k=a["k"], nr_threads=a["threads"], nr_iters=iters, eta=a["eta"],
              lambda_p2=a["lam"], lambda_q2=a["lam"], lambda_p1=0.0, lambda_q1=0.0, quiet=True)
    t0 = time.perf_counter(); e.fit(tr); return e, time.perf_counter() - t0
per_iter, setup, rmse = [], [], None
for _ in range(a["repeat"]):
    _, t1 = fit(1)
    e, tn = fit(1 + a["iterations"])
    per_iter.append((tn - t1) / a["iterations"]); setup.append(t1 - per_iter[-1])
    P, Q = e.p_factors(), e.q_factors()
    u = te[:, 0].astype(np.int64); i = te[:, 1].astype(np.int64)
    pred = np.einsum("ij,ij->i", P[u], Q[i])
    pred = np.where(np.isfinite(pred), pred, float(tr[:, 2].mean()))
    rmse = float(np.sqrt(np.mean((pred - te[:, 2]) ** 2)))
print(json.dumps({"per_iter": per_iter, "setup": setup, "rmse": rmse}))
"""

_OURS_FILES_CHILD = r"""
import sys, json, time
t_start = time.perf_counter()
from scalefree import _native
from scalefree.mf.model import load_ratings
a = json.loads(sys.argv[3])
t0 = time.perf_counter()
train = load_ratings(sys.argv[1], cache=False)
test, unseen = load_ratings(sys.argv[2], cache=False).align_to(train)
t_load = time.perf_counter() - t0
t0 = time.perf_counter()
tr = _native.MfTrainer(train, k=a["k"], eta=a["eta"], lam=a["lam"], threads=a["threads"], seed=a["seed"])
t_setup = time.perf_counter() - t0
# Timed as LIBMF's --quiet runs, no evaluation in between; the same formula as LIBMF's
# (t_N - t_1)·N/(N-1): the epochs after the first, scaled to N (the first epoch, slow-only and
# cold, is reported apart).
n = a["iterations"]
t0 = time.perf_counter()
tr.epochs(1)
t_first = time.perf_counter() - t0
t0 = time.perf_counter()
tr.epochs(n - 1)
t_rest = time.perf_counter() - t0
t_train = t_rest * n / (n - 1)
final = tr.rmse(test)
t_end = time.perf_counter() - t_start
# Untimed for the total, like LIBMF's -p run: the test RMSE after every epoch, with each
# epoch's own time (one epochs(1) call each, so slightly above the timed run's).
tr = _native.MfTrainer(train, k=a["k"], eta=a["eta"], lam=a["lam"], threads=a["threads"], seed=a["seed"])
cum, curve, times = 0.0, [], []
for it in range(a["iterations"]):
    t0 = time.perf_counter(); tr.epochs(1); cum += time.perf_counter() - t0
    times.append(cum); curve.append(tr.rmse(test))
print(json.dumps({"load_s": t_load, "setup_s": t_setup, "train_s": t_train, "first_epoch_s": t_first,
                  "all_epochs_s": t_first + t_rest, "final_rmse": final, "cum_s": times,
                  "rmse": curve, "unseen": unseen, "isa": tr.isa, "end_to_end_s": t_end}))
"""


_OURS_DRAW_CHILD = r"""
import sys, json
from scalefree import _native
from scalefree.mf.model import load_ratings
a = json.loads(sys.argv[3])
train = load_ratings(sys.argv[1], cache=False)
test, _ = load_ratings(sys.argv[2], cache=False).align_to(train)
tr = _native.MfTrainer(train, k=a["k"], eta=a["eta"], lam=a["lam"], threads=a["threads"], seed=a["seed"])
tr.epochs(a["iterations"])
print(json.dumps({"rmse": tr.rmse(test)}))
"""


def _relabelled(tr: Path, te: Path, draw: int, d: Path) -> tuple[Path, Path]:
    """The split files with users and items renumbered by a seeded permutation (and the
    training lines shuffled): the same ratings, a different draw of LIBMF's fixed-seed
    initialisation and block layout (it has no seed option)."""
    rng = np.random.default_rng([draw, 0x4C49424D])
    a, b = np.loadtxt(tr, ndmin=2), np.loadtxt(te, ndmin=2)
    m = int(max(a[:, 0].max(), b[:, 0].max())) + 1
    n = int(max(a[:, 1].max(), b[:, 1].max())) + 1
    pu, pi = rng.permutation(m), rng.permutation(n)
    out = []
    for name, x in (("train", a[rng.permutation(len(a))]), ("test", b)):
        x = x.copy()
        x[:, 0], x[:, 1] = pu[x[:, 0].astype(np.int64)], pi[x[:, 1].astype(np.int64)]
        path = d / f"draw.{name}.txt"
        np.savetxt(path, x, fmt=["%d", "%d", "%g"])
        out.append(path)
    return out[0], out[1]


def _draws(args, tr: Path, te: Path, lam: float, d: Path) -> dict:
    """Test RMSE at ``--iterations`` over ``--draws`` random draws of each side's
    initialisation: LIBMF on relabelled copies of the split (draw j), ours on the same copy
    with seed j."""
    bin_dir = Path(args.libmf_bin)
    lib, ours = [], []
    for j in range(args.draws):
        rtr, rte = _relabelled(tr, te, j, d)
        model = d / "draw.model"
        _wall_rss([str(bin_dir / "mf-train"), "-f", "0", "-k", str(args.k), "-l1", "0", "-l2", repr(lam),
                   "-r", repr(args.eta), "-s", str(args.threads), "-t", str(args.iterations), "--quiet",
                   str(rtr), str(model)])
        _, _, out = _wall_rss([str(bin_dir / "mf-predict"), "-e", "0", str(rte), str(model), str(d / "draw.pred")])
        lib.append(float(out.strip().split("=")[-1]))
        a = {"k": args.k, "eta": args.eta, "lam": lam, "threads": args.threads, "seed": j, "iterations": args.iterations}
        _, _, out = _wall_rss([sys.executable, "-c", _OURS_DRAW_CHILD, str(rtr), str(rte), json.dumps(a)], env=_NO_BLAS_POOL)
        ours.append(json.loads(out.strip().splitlines()[-1])["rmse"])
    se = lambda x: float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")  # noqa: E731
    return {"libmf": lib, "scalefree": ours, "libmf_mean": float(np.mean(lib)), "scalefree_mean": float(np.mean(ours)),
            "libmf_se": se(lib), "scalefree_se": se(ours)}


# The child that trains ours never calls BLAS, but importing numpy starts OpenBLAS's thread
# pool, whose idle thread spins (sched_yield) for ~0.1 s before it sleeps: on 2 cores that is
# a third runnable thread taking turns with the 2 training threads for the first ~25 ms of
# training (measured: first timed run of a fresh process 25-37 ms, with the pool off 18 ms,
# later runs in the same process 18 ms either way). The same setting as the PS bench's workers.
_NO_BLAS_POOL = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _wall_rss(cmd: list[str], timeout: float = 600, env: dict | None = None) -> tuple[float, int | None, str]:
    """Runs ``cmd``: (wall seconds, the child's peak RSS bytes, stdout) — ``common.child_wall_rss``."""
    wall, rss, out, _ = common.child_wall_rss(cmd, timeout, env)
    return wall, rss, out


def _write_split_files(f: Path, seed: int, d: Path) -> tuple[Path, Path, int, int]:
    """The seeded 90/10 split of ``f`` as two LIBMF text files (dense 0-based ids over both)."""
    from scalefree.mf.model import split_ratings

    train, test = split_ratings(f, 0.1, seed)
    tr, te = _dense(train, test)
    paths = []
    for name, a in (("train", tr), ("test", te)):
        path = d / f"{f.parent.name}.{name}.txt"
        np.savetxt(path, a, fmt=["%d", "%d", "%g"])
        paths.append(path)
    return paths[0], paths[1], len(tr), len(te)


def _libmf_official(args, tr: Path, te: Path, lam: float, d: Path) -> dict:
    """LIBMF's mf-train / mf-predict on the split files (see the module doc)."""
    bin_dir = Path(args.libmf_bin)
    train_bin, predict_bin = str(bin_dir / "mf-train"), str(bin_dir / "mf-predict")
    model = d / "libmf.model"
    base = [train_bin, "-f", "0", "-k", str(args.k), "-l1", "0", "-l2", repr(lam), "-r", repr(args.eta),
            "-s", str(args.threads)]
    n = args.iterations
    walls = {1: [], n: []}
    rss = 0
    rmses = []
    for _ in range(args.repeat):
        for t in (1, n):
            w, r, _ = _wall_rss([*base, "-t", str(t), "--quiet", str(tr), str(model)])
            walls[t].append(w)
            rss = max(rss, r or 0)
            if t == n:
                _, _, out = _wall_rss([predict_bin, "-e", "0", str(te), str(model), str(d / "libmf.pred")])
                rmses.append(float(out.strip().split("=")[-1]))
    # Untimed: the per-iteration test RMSE (its -p evaluates after every iteration).
    _, _, out = _wall_rss([*base, "-t", str(n), "-p", str(te), str(tr), str(model)])
    curve = [float(line.split()[2]) for line in out.splitlines() if line.strip()[:1].isdigit()]
    pairs = [(b - a) * n / (n - 1) for a, b in zip(walls[1], walls[n])]
    return {"train_s": float(np.median(pairs)), "train_s_all": pairs, "wall_1": walls[1], "wall_n": walls[n],
            "end_to_end_s": float(np.median(walls[n])), "rmse": float(np.median(rmses)), "rmse_all": rmses,
            "curve": curve, "peak_rss_bytes": rss}


def _ours_files(args, tr: Path, te: Path, lam: float) -> dict:
    a = {"k": args.k, "eta": args.eta, "lam": lam, "threads": args.threads, "seed": args.seed,
         "iterations": args.iterations}
    runs, rss = [], 0
    for _ in range(args.repeat):
        _, r, out = _wall_rss([sys.executable, "-c", _OURS_FILES_CHILD, str(tr), str(te), json.dumps(a)], env=_NO_BLAS_POOL)
        runs.append(json.loads(out.strip().splitlines()[-1]))
        rss = max(rss, r or 0)
    med = sorted(runs, key=lambda x: x["train_s"])[len(runs) // 2]
    med["final_rmse"] = float(np.median([x["final_rmse"] for x in runs]))
    return {**med, "train_s_all": [x["train_s"] for x in runs], "rmse_all": [x["final_rmse"] for x in runs],
            "peak_rss_bytes": rss}


def _vs_libmf_official(args) -> int:
    files = [Path(f) for f in args.data] if args.data else _default_data()
    lams = [float(x) for x in str(args.lams).split(",")]
    records, rows = [], []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-mf-") as dd:
        d = Path(dd)
        for f in files:
            tr, te, n_tr, n_te = _write_split_files(f, args.seed, d)
            for lam in lams:
                common.progress(f"{f.parent.name}: λ={lam}: LIBMF mf-train ({args.repeat} x (-t 1, -t {args.iterations})) ...")
                lib = _libmf_official(args, tr, te, lam, d)
                common.progress(f"{f.parent.name}: λ={lam}: scalefree ({args.repeat} runs) ...")
                ours = _ours_files(args, tr, te, lam)
                draws = None
                if args.draws:
                    common.progress(f"{f.parent.name}: λ={lam}: {args.draws} draws of each side's initialisation ...")
                    draws = _draws(args, tr, te, lam, d)
                target = lib["rmse"]
                reach = next((n for n, r in enumerate(ours["rmse"], 1) if r <= target), None)
                t_reach = ours["cum_s"][reach - 1] if reach else None
                speed = lib["train_s"] / ours["train_s"]
                rec = {"bench": BENCH, "vs": "libmf-official", "data": f.parent.name + "/" + f.name,
                       "train": n_tr, "test": n_te, "k": args.k, "lam": lam, "eta": args.eta,
                       "iterations": args.iterations, "threads": args.threads, "seed": args.seed,
                       "libmf": lib, "scalefree": ours,
                       "test_rmse": {"scalefree": ours["final_rmse"], "libmf": target},
                       "train_s": {"scalefree": ours["train_s"], "libmf": lib["train_s"]},
                       "speedup_train": speed,
                       "scalefree_iterations_to_libmf_rmse": reach,
                       "scalefree_seconds_to_libmf_rmse": t_reach,
                       "time_to_libmf_rmse_ratio": (lib["train_s"] / t_reach) if t_reach else None,
                       "draws": draws}
                records.append(rec)
                rows.append([f.parent.name, f"{lam:g}", f"{target:.4f}", f"{ours['final_rmse']:.4f}",
                             f"{lib['train_s'] * 1e3:.1f}", f"{ours['train_s'] * 1e3:.1f}", f"{speed:.2f}x",
                             f"{reach or '-'}", f"{lib['train_s'] / t_reach:.2f}x" if t_reach else "not reached",
                             f"{lib['end_to_end_s']:.3f}", f"{ours['end_to_end_s']:.3f}",
                             f"{lib['peak_rss_bytes'] / 2**20:.0f}", f"{ours['peak_rss_bytes'] / 2**20:.0f}"]
                            + ([f"{draws['libmf_mean']:.4f}±{draws['libmf_se']:.4f}",
                                f"{draws['scalefree_mean']:.4f}±{draws['scalefree_se']:.4f}"] if draws else []))
    print(common.format_table(["data", "λ", "LIBMF RMSE", "ours RMSE", "LIBMF train ms", "ours train ms",
                               "speed-up", "ours it. to LIBMF RMSE", "time-to-RMSE ratio", "LIBMF e2e s",
                               "ours e2e s", "LIBMF RSS MiB", "ours RSS MiB"]
                              + ([f"LIBMF RMSE, {args.draws} draws", f"ours RMSE, {args.draws} draws"] if args.draws else []),
                              rows, left_columns=2))
    if getattr(args, "json", None):
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def _vs_fold_in(args) -> int:
    from scalefree.mf.model import MatrixFactorization, load_ratings

    files = [Path(f) for f in args.data] if args.data else _default_data()
    records, rows = [], []
    for f in files:
        r = load_ratings(f, cache=False)
        u, i, v = (np.frombuffer(b, dt) for b, dt in zip(r.triples(), (np.int64, np.int64, np.float32)))
        rng = np.random.default_rng(args.seed)
        users = np.unique(u)
        new = np.isin(u, rng.choice(users, size=max(1, len(users) // 10), replace=False))
        ev = new & (rng.random(len(u)) < 0.5)
        fold = new & ~ev
        kw = dict(k=args.k, eta=args.eta, lam=args.lam, iterations=args.iterations, threads=args.threads,
                  seed=args.seed)
        rmse = lambda m: float(np.sqrt(np.mean((m.predict(u[ev], i[ev]).astype(np.float64) - v[ev]) ** 2)))
        common.progress(f"{f.parent.name}: training without the new users ...")
        base = MatrixFactorization(**kw).fit((u[~new], i[~new], v[~new]))
        before = rmse(base)
        t0 = time.perf_counter()
        stats = base.fold_in((u[fold], i[fold], v[fold]))
        t_fold = time.perf_counter() - t0
        folded = rmse(base)
        common.progress(f"{f.parent.name}: retraining with the new users' fold-in halves ...")
        t0 = time.perf_counter()
        again = MatrixFactorization(**kw).fit((u[~ev], i[~ev], v[~ev]))
        t_re = time.perf_counter() - t0
        retrained = rmse(again)
        rec = {"bench": BENCH, "vs": "fold-in", "data": f.parent.name + "/" + f.name, "new_users": stats["rows"],
               "fold_ratings": int(fold.sum()), "test_ratings": int(ev.sum()), "k": args.k, "lam": args.lam,
               "iterations": args.iterations, "threads": args.threads, "rmse_fold_in": folded,
               "rmse_retrained": retrained, "rmse_mean": before, "fold_in_s": t_fold,
               "fold_in_s_per_user": t_fold / max(stats["rows"], 1), "retrain_s": t_re}
        records.append(rec)
        rows.append([f.parent.name, str(stats["rows"]), str(int(ev.sum())), f"{folded:.4f}", f"{retrained:.4f}",
                     f"{before:.4f}", f"{rec['fold_in_s_per_user'] * 1e6:.0f}", f"{t_re:.3f}"])
    print(common.format_table(["data", "new users", "test ratings", "RMSE fold-in", "RMSE retrained",
                               "RMSE mean", "fold-in us/user", "retrain s"], rows, left_columns=2))
    if getattr(args, "json", None):
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


# MovieLens-1M's shape for --throughput: users x items, training ratings.
_ML1M_SHAPE = (6040, 3700, 1_000_000)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(BENCH, help="matrix factorization (local mode) vs LIBMF",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vs", default="libmf", choices=("libmf", "dsgd-ps", "memory-budget", "fold-in", "none"))
    p.add_argument("--budget-fraction", type=common.argparse_type(common.positive_float), default=0.25,
                   help="--vs memory-budget: budget per rank as a fraction of the rating data (default 0.25)")
    p.add_argument("--mode", choices=("rima", "local"), default="rima",
                   help="--vs memory-budget: the mode run in memory and budgeted (default rima; local: with "
                        "LIBMF's mf-train in memory and --disk when --libmf-bin is given)")
    common.add_cold_arg(p)
    p.add_argument("--ranks", type=common.argparse_type(common.positive_int), default=4, help="--vs dsgd-ps / memory-budget: ranks per run (default 4)")
    p.add_argument("--users", type=common.argparse_type(common.positive_int), default=100_000, help="--vs dsgd-ps / memory-budget --mode local: synthetic users")
    p.add_argument("--items", type=common.argparse_type(common.positive_int), default=100_000, help="--vs dsgd-ps / memory-budget --mode local: synthetic items")
    p.add_argument("--ratings", type=common.argparse_type(common.positive_int), default=2_000_000, help="--vs dsgd-ps / memory-budget --mode local: synthetic ratings (e.g. 20M: a data set whose blocks are ~0.5 MiB)")
    p.add_argument("--data", nargs="*", default=None,
                   help="rating files (default: MovieLens-100K and ml-latest-small from ../shared/data)")
    p.add_argument("-k", type=common.argparse_type(common.positive_int), default=40)
    p.add_argument("--lam", type=common.argparse_type(common.non_negative_float), default=0.05)
    p.add_argument("--eta", type=common.argparse_type(common.positive_float), default=0.1)
    p.add_argument("--iterations", type=common.argparse_type(common.positive_int), default=20)
    p.add_argument("--threads", type=common.argparse_type(common.positive_int), default=2)
    p.add_argument("--repeat", type=common.argparse_type(common.positive_int), default=3)
    p.add_argument("--draws", type=common.argparse_type(common.non_negative_int), default=0,
                   help="--libmf-bin: also the test RMSE over this many draws of each side's initialisation "
                        "(LIBMF on relabelled copies of the split, ours with seeds 0..N-1): mean ± standard error")
    p.add_argument("--seed", type=common.argparse_type(common.non_negative_int), default=0)
    p.add_argument("--curve-seeds", type=common.argparse_type(common.positive_int), default=1,
                   help="--vs dsgd-ps: evaluated runs per mode with seeds SEED..SEED+N-1; the iterations to "
                        "each seed's common target (the worse final RMSE), mean ± standard error, give the "
                        "time to target (default 1: the timed runs' seed only)")
    p.add_argument("--normalize", choices=("on", "off"), default="on",
                   help="ours trains on ratings divided by their standard deviation, as LIBMF always does, so λ "
                        "means the same for both (default on)")
    p.add_argument("--libmf-bin", type=Path, default=None,
                   help="--vs libmf: directory of LIBMF's official mf-train and mf-predict (built from its "
                        "source); both sides then read the same split files from disk")
    p.add_argument("--lams", default="0.05,0.1", help="--libmf-bin: the λ values to run (default 0.05,0.1)")
    p.add_argument("--libmf-so", type=Path, default=None,
                   help="also run LIBMF from this shared library (e.g. built from the libmf sdist's sources "
                        "with -O3 -march=native -DUSEAVX), as impl 'libmf-src'")
    p.add_argument("--throughput", action="store_true",
                   help="rating updates/s per iteration on a seeded 6,040 x 3,700 matrix with 1 M training "
                        "ratings, 1 and 2 threads, vs LIBMF (--vs none: ours only)")
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _default_data() -> list[Path]:
    for base in (Path.cwd() / "../shared/data", Path(__file__).resolve().parents[2] / "../shared/data"):
        if base.is_dir():
            return [base / d for d in _DEFAULT_DATA if (base / d).exists()]
    raise SystemExit("no data: pass --data FILE (../shared/data not found)")


def _ours(train, test, args) -> dict:
    from scalefree import _native

    times, rmse = [], None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tr = _native.MfTrainer(train, k=args.k, eta=args.eta, lam=args.lam, threads=args.threads, seed=args.seed,
                               normalize=args.normalize == "on")
        tr.epochs(args.iterations)
        times.append(time.perf_counter() - t0)
        rmse = tr.rmse(test)
    return {"times": times, "rmse": rmse}


def _dense(train, test) -> tuple[np.ndarray, np.ndarray]:
    """Both halves as (n, 3) float arrays with dense 0-based ids shared by the two."""
    tu, ti, tv = (np.frombuffer(b, dt) for b, dt in zip(train.triples(), (np.int64, np.int64, np.float32)))
    su, si, sv = (np.frombuffer(b, dt) for b, dt in zip(test.triples(), (np.int64, np.int64, np.float32)))
    _, u = np.unique(np.concatenate([tu, su]), return_inverse=True)
    _, i = np.unique(np.concatenate([ti, si]), return_inverse=True)
    n = len(tu)
    tr = np.stack([u[:n], i[:n], tv], axis=1).astype(np.float32)
    te = np.stack([u[n:], i[n:], sv], axis=1).astype(np.float32)
    return tr, te


def _libmf(train, test, args, child: str = _LIBMF_CHILD, so: Path | None = None) -> dict:
    tr, te = _dense(train, test)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "split.npz"
        np.savez(f, train=tr, test=te)
        a = {k: getattr(args, k) for k in ("k", "lam", "eta", "iterations", "threads", "repeat")}
        env = {**os.environ, "LIBMF_OBJ": str(Path(so).resolve())} if so else None
        out = subprocess.run([sys.executable, "-c", child, str(f), json.dumps(a)],
                             capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise SystemExit(f"libmf failed (pip install libmf): {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def synthetic(path: Path, users: int, items: int, ratings: int, seed: int, rank: int = 10) -> int:
    """Writes a seeded synthetic rating matrix as LIBMF text (``u i r``): ratings
    1 + 4·(u·v)/rank + N(0, 0.1²) with u, v uniform in [0, 1]^rank, user and item degrees
    drawn from power laws (weight ∝ (id + 10)^-0.6). Returns the number of distinct pairs."""
    rng = np.random.default_rng(seed)

    def draw(n: int, size: int) -> np.ndarray:
        w = (np.arange(n) + 10.0) ** -0.6
        return rng.choice(n, size=size, p=w / w.sum())

    u, i = draw(users, ratings), draw(items, ratings)
    key = np.unique(u.astype(np.int64) * items + i)
    u, i = key // items, key % items
    U = rng.random((users, rank), dtype=np.float32)
    V = rng.random((items, rank), dtype=np.float32)
    r = 1 + 4 * np.einsum("ij,ij->i", U[u], V[i]) / rank + rng.normal(0, 0.1, len(u))
    np.savetxt(path, np.stack([u, i, r], axis=1), fmt=["%d", "%d", "%.3f"])
    return len(u)


def _synthetic_files(args, d: str) -> list[Path]:
    files = [Path(f) for f in args.data] if args.data else []
    if not files:
        f = Path(d) / "synthetic.txt"
        common.progress(f"writing a synthetic {args.users} x {args.items} matrix ...")
        nnz = synthetic(f, args.users, args.items, args.ratings, args.seed)
        common.progress(f"{nnz} distinct ratings")
        files = [f]
    return files


def _train_cli(f: Path, mode: str, extra: list[str], args, d: str, seed: int | None = None) -> list[dict]:
    """One ``scalefree mf train`` run (with ``seed``, default ``--seed``); its JSON records."""
    out = Path(d) / f"{mode}.jsonl"
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "mf", "train", str(f), "--mode", mode,
                        "-n", str(args.ranks), "-k", str(args.k), "--lam", repr(args.lam),
                        "--eta", repr(args.eta), "-i", str(args.iterations),
                        "--seed", str(args.seed if seed is None else seed), "--eval-every", "0", "--json", str(out), "-q", *extra],
                       capture_output=True, text=True, timeout=3600,
                       env={"SCALEFREE_CACHE_DIR": d, **os.environ})  # the rating cache goes with the temp dir

    if p.returncode != 0:
        raise SystemExit(f"mf train --mode {mode} {' '.join(extra)} failed: {p.stderr.strip()[-800:]}")
    return [json.loads(line) for line in out.read_text().splitlines()]


def _vs_memory_budget(args) -> int:
    if not 0 < args.budget_fraction:
        raise SystemExit(f"--budget-fraction must be positive, got {args.budget_fraction}")
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-mf-") as d:
        files = _synthetic_files(args, d)
        records, rows = [], []
        cache = common.PageCache(args.cold, BENCH)
        for f in files:
            common.progress(f"{f.name}: rima -n {args.ranks} in memory (sizing the budget) ...")
            data = _train_cli(f, "rima", [], args, d)[-1]["rating_bytes"]
            budget = int(args.budget_fraction * data)
            runs: dict[str, list] = {"memory": [], "budget": []}
            for rep in range(args.repeat):
                for variant in ("memory", "budget"):
                    extra = [] if variant == "memory" else ["--memory-budget", str(budget), "--block-dir", d]
                    common.progress(f"{f.name}: rima -n {args.ranks} {variant} ({rep + 1}/{args.repeat}) ...")
                    cache.drop()
                    runs[variant].append(_train_cli(f, "rima", extra, args, d))
            for variant, rs in runs.items():
                times = [r[-1]["seconds"] for r in rs]
                setup = [max(r[-1]["setup_seconds"]) for r in rs]  # the slowest rank's, per run
                last = rs[-1][-1]
                held = max(max(r["rating_bytes_resident"]) for r in rs[-1])
                # Per rank: the training high-water mark (reset after set-up), over the iterations.
                train_rss = [max(x) for x in zip(*(r["peak_rss_bytes"] for r in rs[-1]))]
                rec = {"bench": BENCH, "vs": "memory-budget", "impl": "scalefree", "variant": variant, "page_cache": cache.state,
                       "data": f.name, "ranks": args.ranks, "blocks_per_side": last["blocks_per_side"],
                       "k": args.k, "iterations": args.iterations, "rating_bytes": data,
                       "memory_budget": budget if variant == "budget" else None,
                       "median_s": float(np.median(times)), "min_s": float(min(times)), "max_s": float(max(times)),
                       "n": len(times), "times": times, "test_rmse": last["test_rmse"],
                       "rating_bytes_resident_max": held, "peak_rss_bytes": train_rss,
                       "setup_peak_rss_bytes": last["setup_peak_rss_bytes"],
                       "peak_rss_bytes_with_setup": [max(a, b) for a, b in zip(train_rss, last["setup_peak_rss_bytes"])],
                       "setup_seconds_median": float(np.median(setup)), "setup_seconds": setup,
                       "ratings_train": last["rating_bytes"] // 12,
                       "preload_wait_seconds": [sum(x) for x in zip(*(r["preload_wait_seconds"] for r in rs[-1]))],
                       "preload_read_seconds": last.get("preload_read_seconds"),
                       "preload_loader_cpu_seconds": last.get("preload_loader_cpu_seconds"),
                       "preload_direct_io": last.get("preload_direct_io"),
                       "bytes_read": last.get("bytes_read")}
                records.append(rec)
                rows.append([f.name, variant, "-" if variant == "memory" else f"{budget / 2**20:.1f}",
                             f"{held / 2**20:.1f}", f"{rec['median_s']:.3f}",
                             f"{max(rec['preload_wait_seconds']):.3f}", f"{max(train_rss) / 2**20:.0f}",
                             f"{rec['setup_seconds_median']:.2f}", f"{max(last['setup_peak_rss_bytes']) / 2**20:.0f}",
                             f"{rec['test_rmse']:.5f}"])
        print(common.format_table(["data", "rima", "budget MiB/rank", "R held MiB/rank (max)", "train s (median)",
                                   "IO wait s (max)", "peak RSS MiB/rank", "set-up s (median)",
                                   "set-up peak RSS MiB/rank", "test RMSE"], rows, left_columns=2))
        for f in files:
            mem, bud = (r for r in records if r["data"] == f.name)
            diff = bud["test_rmse"] - mem["test_rmse"]
            print(f"{f.name}: budget {args.budget_fraction:g} of {mem['rating_bytes'] / 2**20:.1f} MiB rating data "
                  f"per rank: time {bud['median_s'] / mem['median_s']:.2f}x in-memory, "
                  f"RMSE {'identical' if diff == 0 else f'{diff:+.2e}'}; set-up "
                  f"{bud['setup_seconds_median'] / mem['setup_seconds_median']:.2f}x in-memory time, peak RSS per rank "
                  f"with set-up {max(bud['peak_rss_bytes_with_setup']) / 2**20:.0f} MiB "
                  f"(in memory {max(mem['peak_rss_bytes_with_setup']) / 2**20:.0f} MiB)")
    if getattr(args, "json", None):
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def _reach(curve: list, target: float) -> tuple[int | None, float | None]:
    """The first (iteration, training seconds) of ``curve`` [(iteration, test RMSE, seconds)]
    whose RMSE is at most ``target``; (None, None) when none is."""
    return next(((it, secs) for it, rmse, secs in curve if rmse <= target), (None, None))


def _vs_dsgd_ps(args) -> int:
    """Per mode: ``--repeat`` timed runs (no evaluation), taken in turns (one run of each mode,
    then the next round) so that a slow spell of the machine hits every mode alike; then per
    mode and seed one run evaluating the test RMSE after every iteration, for the iterations to
    a common target: the worse of the modes' final test RMSEs of the timed runs. Peak RSS per
    rank: VmHWM at the end (set-up and training), the largest over the repeats."""
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-mf-") as d:
        files = _synthetic_files(args, d)
        records, rows = [], []
        for f in files:
            # rima with 2w x 2w blocks (its default), rima with w x w, the parameter server.
            modes = (("rima", []), ("rima", ["--blocks", str(args.ranks)]), ("dsgd-ps", []))
            timed = {i: ([], [], None) for i in range(len(modes))}  # times, peak RSS, last record
            for rep in range(args.repeat):
                for i, (mode, extra) in enumerate(modes):
                    common.progress(f"{f.name}: {mode} -n {args.ranks} {' '.join(extra)} ({rep + 1}/{args.repeat}) ...")
                    rec = _train_cli(f, mode, extra, args, d)[-1]
                    times, rss, _ = timed[i]
                    times.append(rec["seconds"])
                    rss.append(rec.get("peak_rss_bytes_end") or [])
                    timed[i] = (times, rss, rec)
            for i, (mode, extra) in enumerate(modes):
                times, rss, rec = timed[i]
                curves = {}
                for s in range(args.seed, args.seed + max(1, args.curve_seeds)):
                    common.progress(f"{f.name}: {mode} -n {args.ranks} {' '.join(extra)} (test RMSE every iteration, "
                                    f"seed {s}) ...")
                    hist = _train_cli(f, mode, [*extra, "--eval-every", "1"], args, d, seed=s)
                    curves[s] = [(h["iteration"], h["test_rmse"], h["seconds"])
                                 for h in hist if "test_rmse" in h and "seconds" in h]
                curve = curves[args.seed]
                med = float(np.median(times))
                sent = float(np.mean(rec["bytes_sent"]))
                # Per rank, the largest over the repeats (set-up and training: VmHWM at the end).
                rss_rank = [int(max(x)) for x in zip(*rss)] if all(rss) else []
                records.append({"bench": BENCH, "vs": "dsgd-ps", "impl": mode, "data": f.name, "ranks": args.ranks,
                                "workers": rec["workers"], "blocks_per_side": rec["blocks_per_side"],
                                "k": args.k, "iterations": args.iterations,
                                "median_s": med, "times": times, "bytes_sent_per_worker": sent,
                                "bytes_sent": rec["bytes_sent"], "comm_seconds": rec["comm_seconds"],
                                "test_rmse": rec["test_rmse"], "connections": rec["connections"],
                                "peak_rss_bytes_per_rank": rss_rank, "peak_rss_bytes_per_rank_all": rss,
                                "curve": curve, "curves": {str(s): c for s, c in curves.items()}})
            for r in (r for r in records if r["data"] == f.name):
                r["rmse_target"] = target = max(x["test_rmse"] for x in records if x["data"] == f.name)
                # The training is seeded, so the evaluated run follows the timed runs' RMSE curve
                # (its final RMSE is theirs), but its seconds include the pauses evaluation
                # costs the other ranks: the time to the target is the timed runs' median
                # scaled to the iterations it takes.
                it, r["seconds_to_target_eval_run"] = _reach(r["curve"], target)
                r["iterations_to_target"] = it
                if args.curve_seeds > 1:
                    # Per seed: the iterations to that seed's common target (the worse final
                    # RMSE of its evaluated runs); their mean and standard error.
                    its = []
                    for s, c in r["curves"].items():
                        t = max(x["curves"][s][-1][1] for x in records if x["data"] == f.name)
                        its.append(_reach(c, t)[0] or args.iterations)  # reached by the last iteration
                    r["iterations_to_target_per_seed"] = its
                    r["iterations_to_target"] = it = float(np.mean(its))
                    r["iterations_to_target_se"] = float(np.std(its, ddof=1) / np.sqrt(len(its)))
                r["seconds_to_target"] = r["median_s"] * it / args.iterations if it else None
                nb = r["blocks_per_side"]
                it, secs = r["iterations_to_target"], r["seconds_to_target"]
                if args.curve_seeds > 1:
                    it = f"{it:.1f}±{r['iterations_to_target_se']:.1f}"
                rows.append([f.name, r["impl"], f"{nb}x{nb}", str(r["workers"]), f"{r['median_s']:.3f}",
                             f"{r['bytes_sent_per_worker'] / 2**20:.1f}", f"{max(r['comm_seconds']):.3f}",
                             f"{r['test_rmse']:.4f}",
                             "/".join(f"{x / 2**20:.0f}" for x in r["peak_rss_bytes_per_rank"]) or "-",
                             f"{target:.4f}", str(it or "-"), f"{secs:.3f}" if secs is not None else "not reached"])
        print(common.format_table(["data", "mode", "blocks", "workers", "train s (median)", "MiB sent/worker",
                                   "comm s (max)", "test RMSE", "peak RSS MiB per rank", "RMSE target",
                                   "it. to target", "s to target"], rows, left_columns=2))
        for f in files:
            *ours, b = (r for r in records if r["data"] == f.name)
            for a in ours:
                nb = a["blocks_per_side"]
                to = (f"{a['seconds_to_target'] / b['seconds_to_target']:.2f}x"
                      if a["seconds_to_target"] and b["seconds_to_target"] else "n/a")
                what = (f"each of {args.curve_seeds} seeds' common RMSE" if args.curve_seeds > 1
                        else f"RMSE {a['rmse_target']:.4f}")
                print(f"{f.name}: rima {nb}x{nb} / dsgd-ps: time {a['median_s'] / b['median_s']:.2f}x, bytes per worker "
                      f"{a['bytes_sent_per_worker'] / b['bytes_sent_per_worker']:.2f}x, RMSE "
                      f"{100 * (a['test_rmse'] / b['test_rmse'] - 1):+.2f} %, time to {what} {to}, "
                      f"peak RSS (largest rank) {max(a['peak_rss_bytes_per_rank'], default=0) / 2**20:.0f} / "
                      f"{max(b['peak_rss_bytes_per_rank'], default=0) / 2**20:.0f} MiB")
    if getattr(args, "json", None):
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def synthetic_ratings(users: int, items: int, ratings: int, seed: int, rank: int = 10):
    """A seeded in-memory rating matrix: ``ratings`` distinct cells drawn uniformly, values
    1 + 4·(u·v)/rank + N(0, 0.1²) with u, v uniform in [0, 1]^rank → (users, items, values)."""
    rng = np.random.default_rng(seed)
    cells = rng.choice(users * items, size=ratings, replace=False)
    u, i = cells // items, cells % items
    U = rng.random((users, rank), dtype=np.float32)
    V = rng.random((items, rank), dtype=np.float32)
    r = 1 + 4 * np.einsum("ij,ij->i", U[u], V[i]) / rank + rng.normal(0, 0.1, len(u))
    return u.astype(np.int64), i.astype(np.int64), r.astype(np.float32)


def _throughput(args) -> int:
    from scalefree import _native

    m, n, nnz = _ML1M_SHAPE
    total = round(nnz / 0.9)
    common.progress(f"generating {total} ratings over {m} x {n} ...")
    u, i, r = synthetic_ratings(m, n, total, args.seed)
    train, test = _native.MfRatings.from_bytes(u.tobytes(), i.tobytes(), r.tobytes()).split(0.1, args.seed)
    data = f"synthetic {m}x{n}"
    records, rows = [], []
    for threads in (1, 2):
        per_iter, setup, rmse, isa = [], [], None, None
        common.progress(f"{data}: scalefree, {threads} thread(s) ...")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tr = _native.MfTrainer(train, k=args.k, eta=args.eta, lam=args.lam, threads=threads, seed=args.seed,
                                   normalize=args.normalize == "on")
            setup.append(time.perf_counter() - t0)
            tr.epochs(1)  # warm-up: first touch of the factor pages
            t0 = time.perf_counter()
            tr.epochs(args.iterations)
            per_iter.append((time.perf_counter() - t0) / args.iterations)
            rmse, isa = tr.rmse(test), tr.isa
        res = {"scalefree": {"per_iter": per_iter, "setup": setup, "rmse": rmse, "isa": isa}}
        if args.vs == "libmf":
            common.progress(f"{data}: libmf, {threads} thread(s) ...")
            a = argparse.Namespace(**{**vars(args), "threads": threads})
            res["libmf"] = _libmf(train, test, a, child=_LIBMF_RATE_CHILD)
            if args.libmf_so:
                common.progress(f"{data}: libmf-src, {threads} thread(s) ...")
                res["libmf-src"] = _libmf(train, test, a, child=_LIBMF_RATE_CHILD, so=args.libmf_so)
        for impl, v in res.items():
            med = float(np.median(v["per_iter"]))
            ups = len(train) / med
            records.append({"bench": BENCH, "variant": "throughput", "impl": impl, "data": data, "train": len(train),
                            "test": len(test), "k": args.k, "lam": args.lam, "iterations": args.iterations,
                            "threads": threads, "median_s": med, "min_s": float(min(v["per_iter"])),
                            "n": len(v["per_iter"]), "setup_s": float(np.median(v["setup"])),
                            "updates_per_s": ups, "test_rmse": v["rmse"],
                            **({"isa": v["isa"], "normalize": args.normalize} if "isa" in v else {})})
            rows.append([data, impl + (f" ({v['isa']})" if "isa" in v else ""), str(threads),
                         f"{np.median(v['setup']):.3f}", f"{med * 1e3:.2f}", f"{ups / 1e6:.1f}", f"{v['rmse']:.4f}"])
    print(common.format_table(["data", "impl", "threads", "setup s", "ms / iteration (median)", "M updates/s",
                               f"test RMSE ({args.iterations + 1} it.)"], rows, left_columns=2))
    if getattr(args, "json", None):
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def run(args) -> int:
    if args.throughput:
        return _throughput(args)
    from scalefree.mf.model import split_ratings

    if args.vs == "dsgd-ps":
        return _vs_dsgd_ps(args)
    if args.vs == "memory-budget" and args.mode == "local":
        return mf_local_budget.run(args, mf_local_budget.Helpers(wall_rss=_wall_rss, split_files=_write_split_files,
                                                                 data_files=_synthetic_files, child_env=_NO_BLAS_POOL))
    if args.vs == "memory-budget":
        return _vs_memory_budget(args)
    if args.vs == "fold-in":
        return _vs_fold_in(args)
    if args.vs == "libmf" and args.libmf_bin:
        return _vs_libmf_official(args)
    files = [Path(f) for f in args.data] if args.data else _default_data()
    records, rows = [], []
    for f in files:
        train, test = split_ratings(f, 0.1, args.seed)
        impls = [("scalefree", _ours)] + ([("libmf", _libmf)] if args.vs == "libmf" else [])
        if args.vs == "libmf" and args.libmf_so:
            impls.append(("libmf-src", lambda tr, te, a: _libmf(tr, te, a, so=args.libmf_so)))
        for name, fn in impls:
            common.progress(f"{f.name}: {name} ...")
            res = fn(train, test, args)
            med = float(np.median(res["times"]))
            ups = len(train) * args.iterations / med
            rec = {"bench": BENCH, "impl": name, "data": str(f.name), "train": len(train), "test": len(test),
                   "k": args.k, "lam": args.lam, "iterations": args.iterations, "threads": args.threads,
                   "median_s": med, "min_s": float(min(res["times"])), "n": len(res["times"]),
                   "test_rmse": res["rmse"], "updates_per_s": ups, **({"normalize": args.normalize} if name == "scalefree" else {})}
            records.append(rec)
            rows.append([f.name, name, f"{med:.4f}", f"{res['rmse']:.4f}", f"{ups / 1e6:.1f}"])
    print(common.format_table(["data", "impl", "fit s (median)", "test RMSE", "M updates/s"], rows, left_columns=2))
    if getattr(args, "json", None):
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0
