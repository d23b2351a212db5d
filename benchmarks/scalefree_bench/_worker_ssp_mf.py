"""One rank of an SSP matrix-factorization job (``scalefree bench ssp-mf`` starts it under
the launcher): ``MODEL DATA [options]`` with MODEL ``sgd`` (:mod:`scalefree.ssp.mf`) or
``bpmf`` (:mod:`scalefree.ssp.bpmf`). Each rank writes its history to ``OUT.rank<r>.json``.

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
DEFAULTS = {"sgd": (32, 100, "sharded_async_thread"), "bpmf": (10, 40, "sharded_thread")}


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
    p.add_argument("--lam", type=float, default=0.1, help="sgd only")
    p.add_argument("--eta", type=float, default=0.5, help="sgd only")
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
    from scalefree.mf.shares import ShareFailedElsewhere

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
    ck = checkpoints(g, args, {"model": args.model, "input": files_fingerprint([args.data]), "k": k,
                               "slack": args.slack, "variant": variant, "lam": args.lam, "eta": args.eta,
                               "seed": args.seed, "every": args.checkpoint_every}, "SSP MF") if args.checkpoint else None
    if args.model == "sgd":
        from scalefree.ssp import mf

        res = mf.train(g, args.data, k=k, iters=iters, slack=args.slack, variant=variant,
                       straggler_ms=args.straggler, lam=args.lam, eta=args.eta, seed=args.seed, checkpoints=ck)
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
    from scalefree.ssp import bpmf

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


if __name__ == "__main__":
    sys.exit(main())
