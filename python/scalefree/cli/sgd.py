"""``scalefree sgd``: sparse logistic regression on the sparse allreduce (``logreg``) and
the seeded power-law data generator (``generate``).

    scalefree sgd generate data.svm --rows 200000 --dim 1000000
    scalefree sgd logreg data.svm -n 4 --test test.svm
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .._atomic import atomic_path, write_json
from .._rss import peak_rss_bytes
from ..errors import DataError
from ..sgd.logreg import (
    concat_rows,
    generate_rows,
    hash_split,
    load_rows,
    local_rows,
    predict,
    read_svmlight,
    sklearn_baseline,
    train,
    write_svmlight,
)
from .common import (add_checkpoint, add_quiet, add_ranks, add_slack, add_text_dialect, check_checkpoint, checkpoints, count, fail,
                     number, relaunch, show_progress, stopped_line)


def _checkpoint_record(args) -> dict:
    """What a resumed ``sgd logreg`` must share with its checkpoint: the input (files by path,
    size and mtime; the generator's parameters) and the options that change the weights
    (``--epochs`` may grow)."""
    from ..checkpoint import files_fingerprint

    if args.data == "synthetic":
        data = [args.rows, args.dim, args.nnz, args.zipf, args.data_seed]
    else:
        data = files_fingerprint([args.data])
    return {"input": data, "test": files_fingerprint([args.test]) if args.test else args.test_fraction,
            "batch": args.batch, "lr": args.lr, "alpha": args.alpha, "optimizer": args.optimizer, "seed": args.seed,
            "zero_based": args.zero_based}


def _logreg_cmd(args) -> int:
    import scalefree

    g = scalefree.init()
    t0 = time.perf_counter()
    zb = {"auto": "auto", "yes": True, "no": False}[args.zero_based]
    data = local_rows(g, args.data, zb, rows=args.rows, dim=args.dim, nnz=args.nnz, zipf=args.zipf,
                      data_seed=args.data_seed)
    if args.test:
        train_rows, test_rows = data, load_rows(g, args.test, zb)
        dim = max(train_rows.dim, test_rows.dim)
        train_rows.dim = test_rows.dim = dim
    else:
        tr, te = hash_split(data, args.test_fraction, args.seed)
        train_rows, test_rows = data.take(tr), data.take(te)
    del data
    counts = g.allreduce(np.array([len(train_rows), len(test_rows)], np.int64))
    if counts[0] == 0:
        raise DataError(f"{args.data}: no training rows")
    if counts[1] == 0 and (args.test or args.test_fraction > 0):
        raise DataError(f"{args.test or args.data}: no test rows"
                         + ("" if args.test else f" (the {args.test_fraction:g} split of {counts[0]} rows held none; "
                                                  "pass --test FILE)"))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ck = checkpoints(g, args, _checkpoint_record(args), "logreg")
    w, b, st = train(g, train_rows, args.epochs, args.batch, args.lr, args.alpha, args.seed, progress=show_progress(args),
                     optimizer=args.optimizer, checkpoints=ck, fixed=args.fixed_features, slack=args.slack,
                     straggler_ms=args.straggler)
    if ck is not None and ck.stopped:
        if g.rank == 0:
            stopped_line(ck, "epoch")
        return 0
    fit_s = time.perf_counter() - t0

    def hits(x):
        return float(((predict(w, b, x) > 0.5) == (x.labels > 0.5)).sum()) if len(x) else 0.0

    right = g.allreduce(np.array([hits(test_rows), hits(train_rows)]))
    rss = g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1)
    if g.rank == 0 and args.output:
        with atomic_path(args.output) as tmp, open(tmp, "wb") as f:  # a file object: no ".npz" added
            np.savez(f, w=np.asarray(w), b=np.asarray(b))
    if g.rank == 0:
        test_acc = right[0] / counts[1] if counts[1] else None
        print(f"{int(counts.sum())} rows ({counts[0]} train, {counts[1]} test), {train_rows.dim} features, "
              f"{g.size} ranks, batch {args.batch}/rank, {st['steps']} steps (load {load_s:.2f} s)")
        print(f"scalefree: test accuracy {'n/a' if test_acc is None else f'{test_acc:.4f}'}, "
              f"train accuracy {right[1] / counts[0]:.4f}, fit {fit_s:.2f} s, {st['step_s'] * 1e3:.2f} ms/step "
              f"(config_reduce {st['config_reduce_s'] * 1e3:.2f} ms)")
        if args.json:
            write_json(args.json, {
                "rows": int(counts.sum()), "train_rows": int(counts[0]), "test_rows": int(counts[1]),
                "features": int(train_rows.dim), "ranks": g.size, "batch": args.batch, "epochs": args.epochs,
                "steps": int(st["steps"]), "test_accuracy": test_acc, "train_accuracy": float(right[1] / counts[0]),
                "load_s": load_s, "fit_s": fit_s, "step_s": float(st["step_s"]),
                "slack": args.slack, "fixed_features": bool(args.fixed_features or args.slack is not None),
                "straggler_ms": args.straggler, "mean_age_diff": st.get("mean_age_diff"),
                "peak_rss_bytes": [int(x) for x in rss]})
        if "sklearn" in args.vs:
            _sklearn_row(args, zb)
    return 0


def _sklearn_row(args, zb) -> None:
    """The scikit-learn baseline on the same split; it reads the whole data into rank 0."""
    if args.data == "synthetic":
        data = concat_rows(generate_rows(args.rows, args.dim, args.nnz, args.zipf, args.data_seed), args.dim)
    else:
        data = read_svmlight(args.data, zb, header=args.header)
    if args.test:
        test = read_svmlight(args.test, zb, header=args.header)
        dim = max(data.dim, test.dim)
        trn, tst = data, test
        trn.dim = tst.dim = dim
    else:
        tr, te = hash_split(data, args.test_fraction, args.seed)
        trn, tst = data.take(tr), data.take(te)
    base = sklearn_baseline(trn, tst, args.epochs, args.alpha, args.seed)
    if base is None:
        print("sklearn: skipped (scikit-learn is not installed)")
    else:
        print(f"sklearn SGDClassifier(log_loss): test accuracy {base[0]:.4f}, fit {base[1]:.2f} s")


def _generate_cmd(args) -> int:
    blocks = generate_rows(args.rows, args.dim, args.nnz, args.zipf, args.seed)
    n = write_svmlight(args.out, blocks, header=f"power-law rows={args.rows} dim={args.dim} nnz={args.nnz} "
                                                  f"zipf={args.zipf} seed={args.seed} (planted logistic model)")
    print(f"wrote {n} rows to {args.out}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("sgd", help="mini-batch SGD (sparse logistic regression) on the sparse allreduce",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="sgd_command", metavar="COMMAND")
    s.required = True
    q = s.add_parser("logreg", help="train and evaluate sparse logistic regression",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("data", help="svmlight/libsvm file (.gz allowed) or a directory of part files, or 'synthetic' for "
                                "the seeded generator")
    add_ranks(q)
    add_text_dialect(q, delimiter=False)
    q.add_argument("--epochs", type=count(1), default=5)
    q.add_argument("--batch", type=count(1), default=256, help="rows per rank per step")
    q.add_argument("--lr", type=number(0, low_open=True), default=0.5, help="learning rate (AdaGrad's base step for adagrad)")
    q.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    q.add_argument("--alpha", type=number(0), default=1e-6, help="L2 regularization")
    q.add_argument("--test", metavar="FILE", help="held-out svmlight file (else --test-fraction of the rows, by a "
                                                  "seeded hash of each row)")
    q.add_argument("--test-fraction", type=number(0, 1, high_open=True), default=0.2)
    q.add_argument("--seed", type=count(0), default=0, help="seed of the split, the partition and the shuffles")
    q.add_argument("--zero-based", choices=["auto", "yes", "no"], default="auto", help="svmlight index base")
    q.add_argument("--vs", choices=["none", "sklearn"], default="none",
                   help="'sklearn' to compare with SGDClassifier (it reads the whole data into rank 0), 'none' not to")
    q.add_argument("--rows", type=count(1), default=100_000, help="synthetic: rows")
    q.add_argument("--dim", type=count(1), default=1_000_000, help="synthetic: features")
    q.add_argument("--nnz", type=count(1), default=20, help="synthetic: features per row")
    q.add_argument("--zipf", type=number(1, low_open=True), default=1.3, help="synthetic: Zipf exponent of the features")
    q.add_argument("--data-seed", type=count(0), default=0, help="synthetic: seed of the data and planted model")
    q.add_argument("-o", "--output", metavar="MODEL.npz", help="save the weights w and bias b (written atomically)")
    q.add_argument("--json", metavar="OUT", help="write accuracies, times and peak RSS per rank here")
    q.add_argument("--fixed-features", action="store_true",
                   help="one sparse allreduce configured once on each rank's features (cumulative gradient sums) "
                        "instead of a config_reduce per mini-batch")
    add_slack(q, "gradient sums", "implies --fixed-features; nothing is lost (a flush at the end applies the "
                                  "rest); the --straggler schedule's seed is --seed")
    q.add_argument("--progress", action="store_true", help="per-epoch progress (also when not a terminal)")
    add_checkpoint(q, "epoch")
    add_quiet(q)
    q.set_defaults(func=_launch)
    r = s.add_parser("generate", help="write a seeded power-law data set with a planted model (svmlight)",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("out", help="output file (.gz compresses)")
    r.add_argument("--rows", type=count(0), default=100_000)
    r.add_argument("--dim", type=count(1), default=1_000_000)
    r.add_argument("--nnz", type=count(1), default=20)
    r.add_argument("--zipf", type=number(1, low_open=True), default=1.3)
    r.add_argument("--seed", type=count(0), default=0)
    r.set_defaults(func=_generate_cmd)


def _launch(args) -> int:
    from pathlib import Path

    prog = "scalefree sgd logreg"
    for f in (args.data, args.test):
        if f and f != "synthetic" and not Path(f).exists():
            fail(prog, f"{f}: no such file or directory")
    check_checkpoint(prog, args)
    if args.checkpoint and (args.slack is not None or args.fixed_features):
        fail(prog, "--checkpoint needs the per-mini-batch reduce (no --fixed-features, no --slack)")
    return relaunch(args, _logreg_cmd, args.ranks)
