"""One rank of an SSP matrix-factorization job (``scalefree bench ssp-mf`` starts it under
the launcher): ``MODEL DATA [options]`` with MODEL ``sgd`` (:mod:`scalefree.mf.modes.ssp_gd`) or
``bpmf`` (:mod:`scalefree.mf.modes.ssp_bpmf`), or ``rima`` (the ring of :mod:`scalefree.mf.modes.rima`
with ``--slack``: :mod:`scalefree.mf.modes.rima_ssp`; the straggler sleeps before each ring step).
Each rank writes its history to ``OUT.rank<r>.json``.

    scalefree run -n 2 -- python -m scalefree_bench._worker_ssp_mf sgd u.data --slack 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from scalefree._atomic import atomic_path

# (k, iterations, variant) by default, per model
DEFAULTS = {"sgd": (32, 100, "sharded_async_thread"), "bpmf": (10, 40, "sharded_thread"), "rima": (32, 20, "ring")}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scalefree_bench._worker_ssp_mf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=sorted(DEFAULTS))
    p.add_argument("data")
    p.add_argument("-k", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--slack", type=int, default=0)
    p.add_argument("--variant", default=None)
    p.add_argument("--straggler", type=float, default=0.0, metavar="MS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blocks", type=int, default=None, help="rima: blocks per side (mf train's default: 2w at slack 0, w at slack > 0; or w, 2w)")
    p.add_argument("--lam", type=float, default=0.1, help="sgd and rima")
    p.add_argument("--eta", type=float, default=None, help="sgd (default 0.5) and rima (default 0.1)")
    p.add_argument("--out", type=Path, help="write each rank's history to OUT.rank<r>.json")
    from scalefree.cli.common import add_checkpoint

    add_checkpoint(p)
    return p


def write_rank_result(out, rank: int, res: dict) -> None:
    """Writes ``res`` to ``OUT.rank<r>.json`` atomically."""
    if out:
        with atomic_path(f"{out}.rank{rank}.json") as tmp:
            tmp.write_text(json.dumps(res))


def main(argv=None) -> int:
    from scalefree.errors import InvalidArgumentError
    from scalefree.mf.data.shares import ShareFailedElsewhere

    try:
        return _main(argv)
    except ShareFailedElsewhere:
        return 2  # the rank that failed says why
    except InvalidArgumentError as e:  # a checkpoint of another run: one line
        print(f"scalefree_bench._worker_ssp_mf: error: {e}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    args = parser().parse_args(argv)
    from scalefree.cli.common import check_checkpoint

    check_checkpoint("scalefree_bench._worker_ssp_mf", args)
    # A checkpoint rebases the sums (the arithmetic changes there): stops only at checkpoint steps.
    if args.checkpoint and (not args.checkpoint_every or (args.stop_after or 0) % args.checkpoint_every):
        if os.environ.get("SCALEFREE_RANK", "0") == "0":  # (before init: every rank checks, rank 0 says)
            print("scalefree_bench._worker_ssp_mf: error: --checkpoint needs --checkpoint-every N and a --stop-after "
                  "that is a multiple of N", file=sys.stderr)
        return 2
    k, iters, variant = DEFAULTS[args.model]
    k, iters, variant = args.k or k, args.iters or iters, args.variant or variant
    import scalefree

    g = scalefree.init()
    from scalefree.checkpoint import files_fingerprint
    from scalefree.cli.common import checkpoints, stopped_line

    # The checkpoint steps change the arithmetic (the sums are rebased there): a resumed run
    # must take them where the first one did.
    eta = args.eta if args.eta is not None else (0.1 if args.model == "rima" else 0.5)
    ck = checkpoints(g, args, {"model": args.model, "input": files_fingerprint([args.data]), "k": k,
                               "slack": args.slack, "variant": variant, "lam": args.lam, "eta": eta,
                               "seed": args.seed, "every": args.checkpoint_every}, "SSP MF") if args.checkpoint else None
    if args.model == "rima":
        return _rima(g, args, k, iters)
    if args.model == "sgd":
        from scalefree.mf.modes import ssp_gd as mf

        res = mf.train(g, args.data, k=k, iters=iters, slack=args.slack, variant=variant,
                       straggler_ms=args.straggler, lam=args.lam, eta=eta, seed=args.seed, checkpoints=ck)
        if res.get("stopped"):
            if g.rank == 0:
                stopped_line(ck)
            return 0
        write_rank_result(args.out, g.rank, res)
        if g.rank == 0:
            h = res["history"]
            print(f"slack {args.slack}: {len(h)} iterations in {res['loop_s']:.2f} s, test RMSE "
                  f"{h[-1][2]:.4f} (rank 0's view), {res['final_rmse']:.4f} after flush", flush=True)
        return 0
    from scalefree.mf.modes import ssp_bpmf as bpmf

    res = bpmf.train(g, args.data, k=k, iters=iters, slack=args.slack, variant=variant,
                     straggler_ms=args.straggler, seed=args.seed, checkpoints=ck)
    if res.get("stopped"):
        if g.rank == 0:
            stopped_line(ck)
        return 0
    write_rank_result(args.out, g.rank, res)
    # Test RMSE over every rank's users (a dense allreduce, after the timed loop).
    last = np.array([res["history"][-1][2], res["history"][-1][3]], np.float64)
    g.allreduce(last)
    if g.rank == 0:
        print(f"slack {args.slack}: {iters} iterations in {res['loop_s']:.2f} s, "
              f"test RMSE {np.sqrt(last[0] / max(last[1], 1)):.4f}", flush=True)
    return 0


def _rima(g, args, k: int, iters: int) -> int:
    """Rima on a 90/10 split with a test RMSE after every iteration (scored after training
    from each iteration's blocks, see ``rima_ssp``); rank 0 writes the history."""
    import scalefree.mf.model as mfm

    if args.checkpoint:
        print("scalefree_bench._worker_ssp_mf: error: rima takes no --checkpoint here", file=sys.stderr)
        return 2
    tr, te = mfm.split_ratings(args.data, 0.1, args.seed)
    m = mfm.MatrixFactorization(k=k, mode="rima", iterations=iters, seed=args.seed, lam=args.lam,
                                eta=0.1 if args.eta is None else args.eta, slack=args.slack,
                                straggler_ms=args.straggler, blocks=args.blocks)
    m.fit(tr, te, eval_every=1)
    if g.rank != 0:
        write_rank_result(args.out, g.rank, {"history": [], "loop_s": m.history[-1]["seconds"]})
        return 0
    h = m.history
    res = {"history": [(r["seconds"], r["iteration"], r["test_rmse"], 0) for r in h],
           "loop_s": h[-1]["seconds"], "final_rmse": h[-1]["test_rmse"],
           "stale_steps": h[-1].get("stale_steps"), "wait_seconds": h[-1].get("wait_seconds"),
           "blocks_per_side": h[-1].get("blocks_per_side")}
    write_rank_result(args.out, 0, res)
    print(f"rima slack {args.slack}: {len(h)} iterations in {res['loop_s']:.2f} s, test RMSE {res['final_rmse']:.4f}, "
          f"stale steps per worker {res['stale_steps']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
