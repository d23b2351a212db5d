"""``scalefree mf``: matrix factorization by SGD (``train``, ``predict``).

    scalefree mf train ratings.csv                      # one machine, threads
    scalefree mf train ratings.csv --mode rima -n 4     # a ring of 4 ranks
"""

from __future__ import annotations

import json
import time

import numpy as np

from .._atomic import atomic_path
from ..errors import InvalidArgumentError
from ..mf.model import MODES, MatrixFactorization, split_ratings, split_ratings_partitioned
from .common import EXIT_USAGE, fail, relaunch

PROG = "scalefree mf train"


def _check_ranks(args) -> None:
    n = args.ranks
    if args.memory_budget is not None:
        if args.mode != "rima":
            fail(PROG, f"--memory-budget is for --mode rima (got --mode {args.mode})")
        from .._units import parse_bytes

        try:
            parse_bytes(args.memory_budget)
        except InvalidArgumentError as e:
            fail(PROG, f"--memory-budget: {e}")
    if n < 1:
        fail(PROG, f"-n must be at least 1, got {n}")
    if args.normalize and args.mode != "local":
        fail(PROG, f"--normalize is for --mode local, not {args.mode}")
    if args.mode == "local" and n > 1:
        fail(PROG, "--mode local runs in one process; -n is for --mode rima or dsgd-ps")
    if args.mode == "dsgd-ps" and n < 2:
        fail(PROG, "--mode dsgd-ps needs -n 2 or more (rank 0 is the parameter server)")
    b = args.blocks
    if b is not None and args.mode == "rima" and b not in (n, 2 * n):
        fail(PROG, f"--mode rima -n {n} cuts R into {2 * n} x {2 * n} or {n} x {n} blocks; --blocks {b} is neither")
    if b is not None and args.mode == "dsgd-ps" and b != n - 1:
        fail(PROG, f"--mode dsgd-ps -n {n} cuts R into {n - 1} x {n - 1} blocks (one per worker); --blocks {b} differs")


def _launch(args) -> int:
    _check_ranks(args)
    if args.mode == "local":
        return _train(args)
    return relaunch(args, _train_ranks_quiet_elsewhere, args.ranks)


def _train_ranks_quiet_elsewhere(args) -> int:
    from ..mf.shares import ShareFailedElsewhere

    try:
        return _train_ranks(args)
    except ShareFailedElsewhere:
        return EXIT_USAGE  # the rank whose share was bad says why


def _train_ranks(args) -> int:
    """One rank of ``--mode rima`` / ``dsgd-ps``; rank 0 reports. Every rank reads only its share
    of the file and no rank holds all ratings, with or without ``--memory-budget`` (``mf_shares``)."""
    t_start = time.perf_counter()
    train, test = split_ratings_partitioned(args.data, args.test_fraction, args.seed)
    model = MatrixFactorization(k=args.k, mode=args.mode, eta=args.eta, lam=args.lam,
                                iterations=args.iterations, schedule=args.schedule, seed=args.seed, blocks=args.blocks,
                                memory_budget=args.memory_budget, block_dir=args.block_dir)
    model._t_start = t_start  # set-up time counts the loading too
    model.fit(train, test, progress=not args.quiet, eval_every=args.eval_every)
    if model.rank != 0:
        return 0
    h = model.history
    last = h[-1]
    if args.json:
        with atomic_path(args.json) as tmp, open(tmp, "w") as out:
            for rec in h:
                out.write(json.dumps({**rec, "mode": args.mode, "k": args.k}) + "\n")
    if args.plot:
        _plot(h, args.plot)
    if args.output:
        model.save(args.output)
    sent = last["bytes_sent"]
    print(f"{len(train)} train / {len(test)} test ratings, {train.n_users} users, {train.n_items} items; "
          f"{args.mode} with {last['workers']} workers, {last['blocks_per_side']}x{last['blocks_per_side']} blocks "
          f"({max(last['connections'], default=0)} connections per worker at most, measured): "
          f"{args.iterations} iterations in {last['seconds']:.3f} s; "
          f"bytes sent per worker {sum(sent) / len(sent):.0f} (max {max(sent)}); "
          f"final test RMSE {last['test_rmse']:.4f}")
    if "peak_rss_bytes" in last:
        held = max(max(rec["rating_bytes_resident"]) for rec in h)
        budget = f"budget {last['memory_budget'] / 2**20:.1f} MiB, " if last.get("memory_budget") else "in memory, "
        print(f"rating blocks: {last['rating_bytes'] / 2**20:.1f} MiB in all; {budget}at most "
              f"{held / 2**20:.1f} MiB held by a rank; peak RSS per rank while training "
              f"{max(max(rec['peak_rss_bytes']) for rec in h) / 2**20:.0f} MiB "
              f"(set-up {max(last['setup_peak_rss_bytes']) / 2**20:.0f} MiB, {max(last['setup_seconds']):.2f} s)")
    return 0


def _train(args) -> int:
    train, test = split_ratings(args.data, args.test_fraction, args.seed)
    model = MatrixFactorization(k=args.k, mode=args.mode, eta=args.eta, lam=args.lam,
                                iterations=args.iterations, schedule=args.schedule,
                                threads=args.threads, blocks=args.blocks, seed=args.seed, normalize=args.normalize)
    out = open(args.json, "w") if args.json else None
    try:
        def log(rec):
            if out:
                out.write(json.dumps({**rec, "mode": args.mode, "k": args.k}) + "\n")
                out.flush()
        model.fit(train, test, progress=not args.quiet, on_iteration=log, eval_every=args.eval_every)
    finally:
        if out:
            out.close()
    h = model.history
    if args.plot:
        _plot(h, args.plot)
    if args.output:
        model.save(args.output)
    rmse = h[-1].get("test_rmse", float("nan"))
    print(f"{len(train)} train / {len(test)} test ratings, {train.n_users} users, {train.n_items} items; "
          f"{args.iterations} iterations in {h[-1]['seconds']:.3f} s; final test RMSE {rmse:.4f}")
    return 0


def _plot(history, path) -> None:
    try:
        import matplotlib
    except ImportError:
        fail(PROG, "--plot needs matplotlib (pip install matplotlib)")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["iteration"], r["seconds"], r["test_rmse"]) for r in history if "test_rmse" in r]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot([p[0] for p in pts], [p[2] for p in pts], marker="o")
    ax[0].set_xlabel("iteration")
    ax[1].plot([p[1] for p in pts], [p[2] for p in pts], marker="o")
    ax[1].set_xlabel("seconds")
    for a in ax:
        a.set_ylabel("test RMSE")
        a.grid(True, alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100)


def _predict(args) -> int:
    model = MatrixFactorization.load(args.model)
    pairs = np.loadtxt(args.pairs, dtype=np.int64, ndmin=2, usecols=(0, 1),
                       delimiter="," if str(args.pairs).endswith(".csv") else None)
    pred = model.predict(pairs[:, 0], pairs[:, 1])
    for (u, i), p in zip(pairs, pred):
        print(f"{u} {i} {p:.4f}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("mf", help="matrix factorization by SGD (train, predict)",
                       description="Matrix factorization by SGD.")
    msub = p.add_subparsers(dest="mf_command", metavar="COMMAND")
    msub.required = True
    t = msub.add_parser("train", help="train on a rating file and report test RMSE on a held-out split")
    t.add_argument("data", help="rating file (u.data, ratings.dat, ratings.csv, LIBMF text, .mtx; .gz ok)")
    t.add_argument("--mode", default="local", choices=MODES,
                   help="local (threads), rima (ring of -n ranks) or dsgd-ps (rank 0 serves, -n − 1 workers)")
    t.add_argument("-n", "--ranks", type=int, default=1, help="ranks for rima / dsgd-ps (started with the launcher)")
    t.add_argument("-k", type=int, default=40, help="rank (default 40)")
    t.add_argument("--eta", type=float, default=0.1, help="learning rate (default 0.1)")
    t.add_argument("--lam", "--lambda", type=float, default=0.05, help="L2 regularisation (default 0.05)")
    t.add_argument("--iterations", "-i", type=int, default=20)
    t.add_argument("--schedule", default="adagrad", choices=("adagrad", "constant"))
    t.add_argument("--threads", "-t", type=int, default=None)
    t.add_argument("--blocks", type=int, default=None, help="blocks per side (local: default 2×threads; rima: 2w (default) or w; dsgd-ps: w)")
    t.add_argument("--memory-budget", default=None, metavar="BYTES",
                   help="rima: rating bytes each rank may hold (e.g. 64M); the blocks stay on disk and are "
                        "read ahead in pattern order (default: all in memory)")
    t.add_argument("--block-dir", default=None,
                   help="with --memory-budget: directory of the (anonymous) block files (default: the temp directory)")
    t.add_argument("--normalize", action="store_true",
                   help="local: train on ratings divided by their standard deviation, as LIBMF does")
    t.add_argument("--test-fraction", type=float, default=0.1)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--eval-every", type=int, default=1, help="test RMSE every N iterations (0: at the end only)")
    t.add_argument("--json", help="write one JSON line per iteration to this file")
    t.add_argument("--plot", help="draw test RMSE vs iteration and time to this PNG")
    t.add_argument("--output", "-o", help="save the model here (atomic write)")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    t.set_defaults(func=_launch)
    pr = msub.add_parser("predict", help="predict ratings for `user item` pairs with a saved model")
    pr.add_argument("model")
    pr.add_argument("pairs", help="text file of `user item` lines (original ids)")
    pr.set_defaults(func=_predict)
