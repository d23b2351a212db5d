"""``scalefree bench ssp-mf``: time to a target RMSE of matrix factorization on the SSP
allreduce, with one random rank delayed before each iteration (the SSP paper's Fig. 6):
data-parallel gradient descent (``--model sgd``) or BPMF Gibbs sampling (``--model bpmf``,
which needs a consistent variant, as in section 4.5), or the Rima ring (``--model rima``:
``mf train --mode rima --slack S``, the straggler before each ring step; slack 0 is
synchronous Rima).

The target is the test RMSE that slack 0 reaches after ``--iters`` iterations; every slack
then runs up to ``--budget`` times as many iterations, and the table shows when rank 0's
model first reaches the target, against slack 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from . import common
from .common import progress

BENCH = "ssp-mf"
DEFAULT_DATA = "../shared/data/movielens-100k/u.data"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ssp-mf", help="SGD matrix factorization on the SSP allreduce: time to a target RMSE",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("data", nargs="?", default=DEFAULT_DATA, help="ratings: 'user item rating' per line")
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=2)
    p.add_argument("--slack", type=arg(lambda s: common.parse_int_list(s, "slack", minimum=0)), default="0,4,8")
    p.add_argument("--model", choices=("sgd", "bpmf", "rima"), default="sgd")
    p.add_argument("--variant", default=None,
                   help="SSP variant (default: sharded_async_thread for sgd, sharded_thread for bpmf)")
    p.add_argument("--iters", type=arg(common.positive_int), default=60, help="iterations of the slack-0 run that sets the target")
    p.add_argument("--budget", type=arg(common.positive_float), default=2.0, help="other slacks run this many times --iters")
    p.add_argument("--target", choices=("slack0", "common"), default="slack0",
                   help="slack0: the RMSE slack 0 ends at; common: the best RMSE every run reaches (the largest "
                        "of the runs' minima), for a model whose test RMSE turns up again before the end")
    p.add_argument("--straggler", type=arg(common.non_negative_float), default=20.0, metavar="MS")
    p.add_argument("-k", type=arg(common.positive_int), default=None, help="rank of the factorization (sgd 32, bpmf 10, rima 32)")
    p.add_argument("--seed", type=common.argparse_type(common.non_negative_int), default=0)
    p.add_argument("--blocks", type=arg(common.positive_int), default=None,
                   help="rima: blocks per side (default: mf train's, 2 x ranks at slack 0 and ranks at slack > 0; "
                        "or give ranks or 2 x ranks for every slack)")
    p.add_argument("--timeout", type=arg(common.positive_float), default=600.0)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _train(args, slack: int, iters: int, tmp: Path) -> dict:
    """Runs one training job; returns ``{"history": [(seconds, iteration, test_rmse), ...],
    "loop_s": ..., "final_rmse": ...}`` (BPMF: RMSE over every rank's test ratings)."""
    out = tmp / f"slack{slack}"
    argv = [sys.executable, "-m", "scalefree_bench._worker_ssp_mf", args.model, str(args.data), "--slack", str(slack),
            "--iters", str(iters), "--variant", args.variant, "--straggler", repr(args.straggler),
            "-k", str(args.k), "--seed", str(args.seed), "--out", str(out)]
    if args.blocks:
        argv += ["--blocks", str(args.blocks)]
    outcome = common.run_job(common.launcher_cmd(args.ranks, argv), timeout_s=args.timeout)
    if not outcome.ok:
        raise RuntimeError(f"slack {slack}: {outcome.describe()}")
    docs = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(args.ranks)]
    if args.model in ("sgd", "rima"):
        h = docs[0]["history"]
        return {"history": [(t, it, e) for t, it, e, _ in h], "loop_s": docs[0]["loop_s"],
                "final_rmse": docs[0]["final_rmse"], "blocks_per_side": docs[0].get("blocks_per_side")}
    hist = []
    for rows in zip(*(d["history"] for d in docs)):
        sse = sum(row[2] for row in rows)
        cnt = sum(row[3] for row in rows)
        hist.append((max(row[0] for row in rows), rows[0][1], (sse / max(cnt, 1)) ** 0.5))
    return {"history": hist, "loop_s": max(d["loop_s"] for d in docs), "final_rmse": hist[-1][2]}


def run(args) -> int:
    if args.variant is None:
        args.variant = {"sgd": "sharded_async_thread", "bpmf": "sharded_thread", "rima": "ring"}[args.model]
    if args.k is None:
        args.k = 10 if args.model == "bpmf" else 32
    if not Path(args.data).is_file():
        progress(f"bench ssp-mf: {args.data}: no such file")
        return 2
    records = []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-sspmf-") as tmp:
        tmp = Path(tmp)
        progress(f"ssp-mf: {args.ranks} ranks, slack 0 for {args.iters} iterations sets the target")
        base = _train(args, 0, args.iters, tmp)
        target = base["history"][-1][2]
        runs = {0: base}
        for s in args.slack:
            if s != 0:
                progress(f"ssp-mf: slack {s}")
                runs[s] = _train(args, s, int(args.iters * args.budget), tmp)
    if args.target == "common":
        target = max(min(e for _, _, e in res["history"]) for res in runs.values())
    t_base = next(t for t, _, e in base["history"] if e <= target)
    curves = {}
    for s, res in sorted(runs.items()):
        hit = next(((t, it) for t, it, e in res["history"] if e <= target), None)
        t_hit, it_hit = hit if hit else (float("nan"), -1)
        per_iter = res["loop_s"] / len(res["history"])
        # At slack 0's iteration count, for "final RMSE within x %" at equal work.
        at_iters = next((e for t, it, e in res["history"] if it == args.iters), float("nan"))
        stats = common.Stats(per_iter, per_iter, per_iter, len(res["history"]))
        records.append(common.make_record(
            bench=BENCH, impl="scalefree", variant=args.variant, ranks=args.ranks, nbytes=0,
            dtype="float32", stats=stats, gbps=0.0, slack=s, target_rmse=target,
            time_to_target_s=t_hit, iters_to_target=it_hit, speedup_vs_slack0=t_base / t_hit if hit else 0.0,
            final_rmse=res["final_rmse"], rmse_at_iters=at_iters, straggler_ms=args.straggler, model=args.model,
            blocks_per_side=res.get("blocks_per_side"),
        ))
        curves[s] = res["history"]
    headers = ["slack", "target RMSE", "time to target", "iterations", "vs slack 0", "s/iteration",
               f"RMSE at {args.iters}", "final RMSE"] + (["blocks"] if args.model == "rima" else [])
    rows = [[str(r["slack"]), f"{r['target_rmse']:.4f}", f"{r['time_to_target_s']:.3f} s",
             str(r["iters_to_target"]), f"{r['speedup_vs_slack0']:.2f}x", f"{r['median_s'] * 1e3:.2f} ms",
             f"{r['rmse_at_iters']:.4f}", f"{r['final_rmse']:.4f}"]
            + ([f"{r['blocks_per_side']} x {r['blocks_per_side']}"] if args.model == "rima" else []) for r in records]
    print(common.format_table(headers, rows, left_columns=1))
    if args.json:
        common.write_json(args.json, records)
    if args.plot:
        _plot(records, curves, args)
        progress(f"ssp-mf: wrote {args.plot}")
    missed = [r["slack"] for r in records if r["iters_to_target"] < 0]
    if missed:
        progress(f"ssp-mf: slack {missed} did not reach the target within the budget")
    return 0


def _plot(records, curves, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in records:
        t = [c[0] for c in curves[r["slack"]]]
        it = [c[1] for c in curves[r["slack"]]]
        e = [c[2] for c in curves[r["slack"]]]
        axes[0].plot(t, e, label=f"slack {r['slack']}")
        axes[1].plot(it, e, label=f"slack {r['slack']}")
    for ax, xl in ((axes[0], "seconds"), (axes[1], "iteration")):
        ax.axhline(records[0]["target_rmse"], color="k", linestyle=":", label="target")
        ax.set_xlabel(xl)
        ax.set_ylabel("test RMSE")
        ax.set_ylim(records[0]["target_rmse"] - 0.02, records[0]["target_rmse"] + 0.15)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"SSP {args.model.upper()} matrix factorization, {args.ranks} ranks, straggler 0–{args.straggler:g} ms ({args.variant})")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    plt.close(fig)
