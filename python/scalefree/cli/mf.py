"""``scalefree mf``: matrix factorization by SGD (``train``, ``predict``).

    scalefree mf train ratings.csv                      # one machine, threads
    scalefree mf train train.txt --test test.txt -o m   # an explicit test file (LIBMF's -p)
    scalefree mf train ratings.csv --mode rima -n 4     # a ring of 4 ranks
    scalefree mf predict m test.txt -o pred.txt         # predictions; RMSE / MAE when rated
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from .._atomic import atomic_path
from ..errors import InvalidArgumentError
from ..mf.data.checkpoint import nothing_to_resume
from ..mf.model import BUDGET_MODES, MODES, MatrixFactorization, split_ratings, split_ratings_partitioned
from .common import EXIT_USAGE, add_columns, add_text_dialect, count, fail, number, relaunch, show_progress

PROG = "scalefree mf train"


def _check_ranks(args) -> None:
    n = args.ranks
    if args.memory_budget is not None:
        if args.mode not in BUDGET_MODES:
            fail(PROG, f"--memory-budget is for --mode {', '.join(BUDGET_MODES)} (got --mode {args.mode})")
        from .._units import parse_bytes

        try:
            parse_bytes(args.memory_budget)
        except InvalidArgumentError as e:
            fail(PROG, f"--memory-budget: {e}")
    if (args.resume or args.checkpoint_every or args.stop_after is not None) and not args.checkpoint:
        fail(PROG, "--resume, --checkpoint-every and --stop-after need --checkpoint PATH")
    if args.checkpoint_every < 0 or (args.stop_after is not None and args.stop_after < 1):
        fail(PROG, "--checkpoint-every must be >= 0 and --stop-after >= 1")
    if args.patience is not None and not args.validation_fraction:
        fail(PROG, "--patience needs --validation-fraction")
    if args.slack is not None:
        if args.mode != "rima":
            fail(PROG, f"--slack is for --mode rima (got --mode {args.mode})")
        if args.memory_budget is not None or args.checkpoint or args.validation_fraction:
            fail(PROG, "--slack does not combine with --memory-budget, --checkpoint or --validation-fraction")
    if args.mode == "local" and n > 1:
        fail(PROG, "--mode local runs in one process; -n is for --mode rima or dsgd-ps")
    if args.mode == "dsgd-ps" and n < 2:
        fail(PROG, "--mode dsgd-ps needs -n 2 or more (rank 0 is the parameter server)")
    b = args.blocks
    if b is not None and args.mode == "rima" and b not in (n, 2 * n):
        fail(PROG, f"--mode rima -n {n} cuts R into {2 * n} x {2 * n} or {n} x {n} blocks; --blocks {b} is neither")
    if b is not None and args.mode == "dsgd-ps" and b != n - 1:
        fail(PROG, f"--mode dsgd-ps -n {n} cuts R into {n - 1} x {n - 1} blocks (one per worker); --blocks {b} differs")


def _ckpt_args(args) -> dict:
    # Under `scalefree run --max-restarts` every start has --resume; the first has no checkpoint yet.
    resume = args.resume and not nothing_to_resume(args.checkpoint)
    return dict(checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, resume=resume,
                stop_after=args.stop_after)


def _launch(args) -> int:
    _check_ranks(args)
    if args.mode == "local":
        return _train(args)
    return relaunch(args, _train_ranks_quiet_elsewhere, args.ranks)


def _train_ranks_quiet_elsewhere(args) -> int:
    from ..mf.data.shares import ShareFailedElsewhere

    try:
        return _train_ranks(args)
    except ShareFailedElsewhere:
        return EXIT_USAGE  # the rank whose share was bad says why


def _train_ranks(args) -> int:
    """One rank of ``--mode rima`` / ``dsgd-ps``; rank 0 reports. Every rank reads only its share
    of the file and no rank holds all ratings, with or without ``--memory-budget`` (``mf_shares``)."""
    t_start = time.perf_counter()
    train, test = split_ratings_partitioned(args.data, 0.0 if args.test else args.test_fraction, args.seed,
                                            args.delimiter, args.header, columns=args.columns, test_file=args.test)
    model = MatrixFactorization(k=args.k, mode=args.mode, eta=args.eta, lam=args.lam,
                                iterations=args.iterations, schedule=args.schedule, seed=args.seed, blocks=args.blocks,
                                memory_budget=args.memory_budget, block_dir=args.block_dir, normalize=args.normalize,
                                slack=args.slack)
    model._t_start = t_start  # set-up time counts the loading too
    model.fit(train, test, progress=show_progress(args), eval_every=args.eval_every, **_ckpt_args(args),
              validation_fraction=args.validation_fraction, patience=args.patience)
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
        model.save(args.output, format=args.format)
    sent = last["bytes_sent"]
    print(f"{len(train)} train / {len(test)} test ratings, {train.n_users} users, {train.n_items} items; "
          f"{args.mode} with {last['workers']} workers, {last['blocks_per_side']}x{last['blocks_per_side']} blocks "
          f"({max(last['connections'], default=0)} connections per worker at most, measured): "
          f"{len(h)} iterations in {last['seconds']:.3f} s; "
          f"bytes sent per worker {sum(sent) / len(sent):.0f} (max {max(sent)}); "
          f"final test RMSE {last['test_rmse']:.4f}")
    _report_early_stop(model, args)
    _warn_unseen(model)
    if "peak_rss_bytes" in last:
        held = max(max(rec["rating_bytes_resident"]) for rec in h)
        budget = f"budget {last['memory_budget'] / 2**20:.1f} MiB, " if last.get("memory_budget") else "in memory, "
        print(f"rating blocks: {last['rating_bytes'] / 2**20:.1f} MiB in all; {budget}at most "
              f"{held / 2**20:.1f} MiB held by a rank; peak RSS per rank while training "
              f"{max(max(rec['peak_rss_bytes']) for rec in h) / 2**20:.0f} MiB "
              f"(set-up {max(last['setup_peak_rss_bytes']) / 2**20:.0f} MiB, {max(last['setup_seconds']):.2f} s)")
    return 0


def _report_early_stop(model, args) -> None:
    if model.stopped_at:
        best = min(r["valid_rmse"] for r in model.history if "valid_rmse" in r)
        print(f"early stop after iteration {model.stopped_at}: validation RMSE did not improve for {args.patience} "
              f"iterations (best {best:.4f}); the model is the best iteration's")


def _train(args) -> int:
    if args.test is not None:
        from ..mf.model import load_ratings

        kw = dict(delimiter=args.delimiter, header=args.header, columns=args.columns)
        train, test = load_ratings(args.data, **kw), load_ratings(args.test, **kw)
    else:
        train, test = split_ratings(args.data, args.test_fraction, args.seed, args.delimiter, args.header,
                                    columns=args.columns)
    if args.output and args.format == "libmf":
        _check_libmf_ids(train, test)
    model = MatrixFactorization(k=args.k, mode=args.mode, eta=args.eta, lam=args.lam,
                                iterations=args.iterations, schedule=args.schedule,
                                threads=args.threads, blocks=args.blocks, seed=args.seed, normalize=args.normalize,
                                memory_budget=args.memory_budget, block_dir=args.block_dir)
    out = open(args.json, "w") if args.json else None
    try:
        def log(rec):
            if out:
                out.write(json.dumps({**rec, "mode": args.mode, "k": args.k}) + "\n")
                out.flush()
        model.fit(train, test, progress=show_progress(args), on_iteration=log, eval_every=args.eval_every,
                  validation_fraction=args.validation_fraction, patience=args.patience, **_ckpt_args(args))
    finally:
        if out:
            out.close()
    h = model.history
    if args.plot:
        _plot(h, args.plot)
    if args.output:
        model.save(args.output, format=args.format)
    rmse = h[-1].get("test_rmse", float("nan"))
    print(f"{len(train)} train / {len(test)} test ratings, {train.n_users} users, {train.n_items} items; "
          f"{len(h)} iterations in {h[-1]['seconds']:.3f} s ({model.threads} threads); "
          f"final test RMSE {rmse:.4f}")
    if "memory_budget" in h[-1]:
        print(f"rating blocks on flash: budget {h[-1]['memory_budget'] / 2**20:.1f} MiB, at most "
              f"{h[-1]['rating_bytes_resident'] / 2**20:.1f} MiB held, {h[-1]['bytes_read'] / 2**20:.1f} MiB read, "
              f"{h[-1]['preload_wait_seconds']:.3f} s waiting for reads")
    _report_early_stop(model, args)
    _warn_unseen(model)
    return 0


def _warn_unseen(model) -> None:
    if model.test_unseen and model.test_unseen["ratings"]:
        u = model.test_unseen
        print(f"{PROG}: warning: {u['ratings']} test ratings have ids unseen in training ({u['users']} users, "
              f"{u['items']} items); they are predicted as the training mean", file=sys.stderr)


def _check_libmf_ids(*ratings) -> None:
    """Refuse before training the ids LIBMF's file cannot hold (``mf/libmf.py``)."""
    from ..mf import libmf

    for side, c in (("user", 0), ("item", 1)):
        ids = np.unique(np.concatenate([np.frombuffer(r.triples()[c], np.uint64) for r in ratings]))
        try:
            libmf.check_ids(side, ids)
        except InvalidArgumentError as e:
            fail(PROG, f"--format libmf: {e}")


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
    """Predictions for every `user item [rating]` line of FILE (any format train reads), to -o
    or stdout; RMSE and MAE when the lines carry ratings; a warning counts unknown ids."""
    from .. import _native

    from .. import _columnar

    model = MatrixFactorization.load(args.model, format=args.model_format)
    parts = _columnar.columnar_parts(args.pairs)
    if parts is not None:
        u, i, v = _columnar.read_pairs(parts, args.columns)
    elif args.columns is not None:
        fail("scalefree mf predict", f"{args.pairs}: --columns is for Parquet and Arrow IPC input")
    else:
        u, i, v = (np.frombuffer(b, dt) for b, dt in
                   zip(_native.mf_read_pairs(str(args.pairs)), (np.int64, np.int64, np.float32)))
    pred = model.predict(u, i)
    known = np.frombuffer(model._need().known(u.tobytes(), i.tobytes()), np.uint8).astype(bool)
    if args.format == "libmf":  # LIBMF's mf-predict: the prediction alone, as a C++ stream prints a float
        lines = "".join(f"{p:g}\n" for p in pred.tolist())
    else:
        lines = "".join(f"{a} {b} {p:.4f}\n" for a, b, p in zip(u.tolist(), i.tolist(), pred.tolist()))
    if args.output:
        with atomic_path(args.output) as tmp, open(tmp, "w") as out:
            out.write(lines)
    else:
        sys.stdout.write(lines)
        sys.stdout.flush()
    unknown = int((~known).sum())
    if unknown:
        print(f"scalefree mf predict: warning: {unknown} of {len(u)} pairs have a user or item unseen in "
              f"training; predicted as the training mean", file=sys.stderr)
    if len(v) and not np.isnan(v[0]):
        err = pred.astype(np.float64) - v
        msg = f"{len(v)} ratings: RMSE {np.sqrt(np.mean(err ** 2)):.4f}, MAE {np.mean(np.abs(err)):.4f}"
        print(msg, file=sys.stdout if args.output else sys.stderr)
    return 0


def _fold_in(args) -> int:
    """New users (or items) of FILE folded into MODEL by ridge solves; the grown model to -o."""
    from ..mf import libmf

    model = MatrixFactorization.load(args.model, format=args.model_format)
    t0 = time.perf_counter()
    stats = model.fold_in(args.data, side=args.side, lam=args.lam, columns=args.columns, delimiter=args.delimiter,
                          header=args.header)
    secs = time.perf_counter() - t0
    fmt = args.format
    if fmt is None:  # as the model read
        fmt = "libmf" if args.model_format == "libmf" or (args.model_format == "auto" and
                                                          libmf.is_libmf_model(args.model)) else "native"
    model.save(args.output, format=fmt)
    per = secs / max(stats["rows"], 1)
    print(f"folded in {stats['rows']} {args.side}s ({stats['new_rows']} new) from {stats['ratings_used']} ratings "
          f"({stats['ratings_ignored']} on unknown ids ignored) in {secs:.3f} s ({per * 1e6:.0f} us per {args.side}); "
          f"model written to {args.output}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("mf", help="matrix factorization by SGD (train, predict)",
                       description="Matrix factorization by SGD.")
    msub = p.add_subparsers(dest="mf_command", metavar="COMMAND")
    msub.required = True
    t = msub.add_parser("train", help="train on a rating file and report test RMSE on a held-out split")
    t.add_argument("data", help="rating file (u.data, ratings.dat, ratings.csv, LIBMF text, .mtx; .gz ok; Parquet, "
                                "Arrow IPC / Feather) or a directory of part files")
    add_text_dialect(t)
    add_columns(t, "ratings")
    t.add_argument("--mode", default="local", choices=MODES,
                   help="local (threads), rima (ring of -n ranks) or dsgd-ps (rank 0 serves, -n − 1 workers)")
    t.add_argument("-n", "--ranks", type=count(1), default=1, help="ranks for rima / dsgd-ps (started with the launcher)")
    t.add_argument("-k", type=count(1), default=40, help="rank (default 40)")
    t.add_argument("--eta", type=number(0, low_open=True), default=0.1, help="learning rate (default 0.1)")
    t.add_argument("--lam", "--lambda", type=number(0), default=0.05, help="L2 regularisation (default 0.05)")
    t.add_argument("--iterations", "-i", type=count(1), default=20)
    t.add_argument("--schedule", default="adagrad", choices=("adagrad", "constant"))
    t.add_argument("--threads", "-t", type=count(1), default=None, help="local: threads (default: all cores this process may use)")
    t.add_argument("--blocks", type=count(1), default=None, help="blocks per side (local: default max(20, 2×threads + 1); rima: 2w (default) or w, w by default with "
                        "--slack S > 0; dsgd-ps: w)")
    t.add_argument("--memory-budget", default=None, metavar="BYTES",
                   help="rating bytes a rank (local: the process) may hold (e.g. 64M); the blocks stay on flash "
                        "and the flash runtime's program cache reads them ahead in schedule order "
                        "(rima, dsgd-ps, local; default: all in memory)")
    t.add_argument("--block-dir", default=None,
                   help="with --memory-budget: directory of the (anonymous) block files (default: the temp directory)")
    t.add_argument("--slack", type=count(0), default=None, metavar="S",
                   help="rima: bounded staleness — a worker may train up to S ring steps ahead on its copy of a "
                        "block its predecessor still owes, merged by delta when it arrives (0: synchronous, "
                        "the same result as without --slack); S > 0 cuts w x w blocks unless --blocks says otherwise")
    t.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="train on ratings divided by their standard deviation with λ divided by it, as "
                        "LIBMF does (default on, every mode)")
    t.add_argument("--test", default=None, metavar="FILE",
                   help="evaluate on this rating file (ids matched to the training file's; unseen ids "
                        "get the training mean) instead of a --test-fraction split (like LIBMF's -p); rima, "
                        "dsgd-ps: each rank reads its share of it")
    t.add_argument("--test-fraction", type=number(0, 1, high_open=True), default=0.1)
    t.add_argument("--validation-fraction", type=number(0, 1, high_open=True), default=0.0,
                   help="hold this share of the training ratings out as a validation set (RMSE per iteration; rima, "
                        "dsgd-ps: a seeded hash of (user, item), each rank keeps the share it read)")
    t.add_argument("--patience", type=count(1), default=None,
                   help="with --validation-fraction: stop after this many iterations without a better "
                        "validation RMSE and keep the best iteration's model")
    t.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="write the training state here atomically every --checkpoint-every iterations and at the "
                        "end (rima, dsgd-ps: one file per rank, PATH.rankR-of-N)")
    t.add_argument("--checkpoint-every", type=count(0), default=0, metavar="N",
                   help="with --checkpoint: every N iterations (default 0: at the end only)")
    t.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint (same data and hyperparameters; --iterations may grow)")
    t.add_argument("--stop-after", type=count(1), default=None, metavar="N",
                   help="with --checkpoint: end after N iterations in all, with a checkpoint (a job in slices)")
    t.add_argument("--seed", type=count(0), default=0)
    t.add_argument("--eval-every", type=count(0), default=1, help="test RMSE every N iterations (0: at the end only)")
    t.add_argument("--json", help="write one JSON line per iteration to this file")
    t.add_argument("--plot", help="draw test RMSE vs iteration and time to this PNG")
    t.add_argument("--output", "-o", help="save the model here (atomic write)")
    t.add_argument("--format", choices=("native", "libmf"), default="native",
                   help="the model file of -o: native (every id kept) or libmf (LIBMF's text model, as "
                        "mf-train writes it: row N is id N, gaps in the ids written as LIBMF's 'F' rows) "
                        "(default native)")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress bar (drawn only on a terminal)")
    t.set_defaults(func=_launch)
    pr = msub.add_parser("predict", help="predict ratings for `user item [rating]` lines with a saved model")
    pr.add_argument("model")
    pr.add_argument("pairs", metavar="FILE",
                    help="`user item [rating]` lines (original ids; every format train reads, headers and gzip ok), "
                         "or Parquet / Arrow IPC with user, item and optional rating columns")
    add_columns(pr, "pairs")
    pr.add_argument("--output", "-o", default=None, help="write `user item prediction` lines here (atomic); "
                    "default stdout")
    pr.add_argument("--format", choices=("text", "libmf"), default="text",
                    help="text: `user item prediction` lines; libmf: one prediction per line in the pairs' "
                         "order, as LIBMF's mf-predict writes them (default text)")
    pr.add_argument("--model-format", choices=("auto", "native", "libmf"), default="auto",
                    help="MODEL's format: auto tells ours from LIBMF's text model (mf-train's) by its first "
                         "line (default auto)")
    pr.set_defaults(func=_predict)
    fi = msub.add_parser("fold-in", help="add factors for new users (or items) of a rating file without retraining")
    fi.add_argument("model")
    fi.add_argument("data", metavar="FILE", help="ratings of the new users (items); every format train reads")
    add_text_dialect(fi)
    add_columns(fi, "ratings")
    fi.add_argument("--side", choices=("user", "item"), default="user", help="which side to fold in (default user)")
    fi.add_argument("--lam", "--lambda", type=number(0), default=0.05, help="ridge λ per rating (default 0.05, "
                    "as train's)")
    fi.add_argument("--output", "-o", required=True, help="write the grown model here (atomic)")
    fi.add_argument("--model-format", choices=("auto", "native", "libmf"), default="auto",
                    help="MODEL's format: auto tells ours from LIBMF's text model by its first line (default auto)")
    fi.add_argument("--format", choices=("native", "libmf"), default=None,
                    help="the grown model's format (default: MODEL's)")
    fi.set_defaults(func=_fold_in)
