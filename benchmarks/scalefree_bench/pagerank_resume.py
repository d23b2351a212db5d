"""``scalefree bench pagerank-resume``: what checkpoints cost and what a resume saves
(issue 39): ``scalefree graph pagerank`` end to end on one edge file (a seeded R-MAT graph
unless ``--edges``), three ways, in one invocation:

* ``straight``: no checkpoints (the peer every other row is compared with);
* ``checkpointed``: ``--checkpoint-every E``: the seconds and bytes each checkpoint costs a
  rank;
* ``killed + resume``: ``--checkpoint-every E`` with rank K SIGKILLed before iteration
  ``--kill-at`` (the command's ``--fail-rank``), then ``--resume``; its time is the sum of
  both jobs (the killed job ends when the launcher sees the death);
* ``restarted`` (``--restart``): the same kill under ``scalefree run --max-restarts 1``,
  which stops the other ranks and starts every rank again with ``--resume``: one command,
  its wall time, against the bound ``straight + E iterations + load+set-up`` (the
  uninterrupted time plus one checkpoint interval plus the restart), in ``bound_s``.

Every job runs ``--tol 0 --max-iter I`` and saves its scores (``--save-scores``); ``same``
says whether each rank's scores are bit-identical to the straight run's. Wall times are the
jobs' own (process start to exit: reading, set-up and iterations included); ``load+set-up``
is the (last) job's reading and set-up, which a resumed job does again.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import common
from .common import human_time, progress

BENCH = "pagerank-resume"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("pagerank-resume", help="PageRank checkpoints: their cost, and a resume after a killed rank",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=2)
    p.add_argument("--edges", type=Path, help="edge file (default: a seeded R-MAT graph, --rmat-scale/--rmat-edges)")
    p.add_argument("--rmat-scale", type=arg(common.positive_int), default=20)
    p.add_argument("--rmat-edges", type=arg(common.parse_size), default="8M")
    p.add_argument("--iters", type=arg(common.positive_int), default=40)
    p.add_argument("--every", type=arg(common.positive_int), default=10, help="--checkpoint-every")
    p.add_argument("--kill-rank", type=arg(common.non_negative_int), default=1)
    p.add_argument("--kill-at", type=arg(common.non_negative_int), default=0, help="iteration before which the rank dies (0: half-way)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--restart", action="store_true",
                   help="also the 'restarted' row: the kill under scalefree run --max-restarts 1 with --resume")
    p.add_argument("--timeout", type=arg(common.positive_float), default=3600)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _job(args, edges: Path, out: Path, extra: list[str], label: str, launcher: list[str] = ()) -> tuple[common.JobOutcome, dict | None]:
    cmd = [*launcher, sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(edges), "-n", str(args.ranks), "--tol", "0",
           "--max-iter", str(args.iters), "--dtype", args.dtype, "--top", "10", "-q", "--save-scores", str(out / "scores"),
           "--json", str(out / "run.json"), *extra]
    progress(f"{BENCH}: {label}")
    res = common.run_job(cmd, timeout_s=args.timeout)
    rec = json.loads((out / "run.json").read_text()) if res.returncode == 0 and (out / "run.json").exists() else None
    return res, rec


def _same(a: Path, b: Path, ranks: int) -> bool:
    for r in range(ranks):
        x, y = np.load(a / f"scores.rank{r}.npz"), np.load(b / f"scores.rank{r}.npz")
        if not (np.array_equal(x["owned"], y["owned"]) and np.array_equal(x["scores"], y["scores"])):
            return False
    return True


def run(args) -> int:
    kill_at = args.kill_at or args.iters // 2 + 1
    records = []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        tmp = Path(tmp)
        edges, graph = common.edges_or_rmat(args.edges, args.rmat_scale, args.rmat_edges, tmp, BENCH)
        jobs = {}
        for name in ("straight", "checkpointed", "killed", "restarted"):
            (tmp / name).mkdir()
        jobs["straight"] = _job(args, edges, tmp / "straight", [], "straight")
        ck = ["--checkpoint", str(tmp / "checkpointed" / "ck"), "--checkpoint-every", str(args.every)]
        jobs["checkpointed"] = _job(args, edges, tmp / "checkpointed", ck, f"checkpoint every {args.every}")
        ck = ["--checkpoint", str(tmp / "killed" / "ck"), "--checkpoint-every", str(args.every)]
        killed, _ = _job(args, edges, tmp / "killed", [*ck, "--fail-rank", f"{args.kill_rank}:{kill_at}"],
                         f"rank {args.kill_rank} killed before iteration {kill_at}")
        if killed.returncode == 0:
            progress(f"{BENCH}: the job with a killed rank exited 0")
            return 1
        resumed, rec = _job(args, edges, tmp / "killed", [*ck, "--resume"], "resumed")
        jobs["killed"] = (common.JobOutcome(resumed.returncode, resumed.timed_out, resumed.output_tail,
                                            killed.elapsed_s + resumed.elapsed_s), rec)
        if args.restart:
            ck = ["--checkpoint", str(tmp / "restarted" / "ck"), "--checkpoint-every", str(args.every), "--resume"]
            run = [sys.executable, "-m", "scalefree.cli", "run", "-n", str(args.ranks), "--max-restarts", "1", "--"]
            jobs["restarted"] = _job(args, edges, tmp / "restarted", [*ck, "--fail-rank", f"{args.kill_rank}:{kill_at}"],
                                     f"rank {args.kill_rank} killed before iteration {kill_at} under "
                                     "scalefree run --max-restarts 1", launcher=run)
        base = jobs["straight"][0].elapsed_s
        srec = jobs["straight"][1]
        bound = None if srec is None else base + args.every * srec["per_iteration_s"] + srec["load_s"] + srec["setup_s"]
        for name, (res, rec) in jobs.items():
            if rec is None:
                progress(f"{BENCH}: {name} failed (exit {res.returncode})")
                continue
            cks = rec.get("checkpoints") or {}
            records.append(common.make_record(
                bench=BENCH, impl="scalefree", variant=name, ranks=args.ranks, nbytes=8 * rec["vertices"],
                dtype=args.dtype, stats=common.Stats.of([res.elapsed_s]), gbps=0.0, graph=graph,
                vertices=rec["vertices"], edges=rec["edges"], iterations=args.iters, every=args.every,
                kill_at=kill_at if name == "killed" else None, wall_s=res.elapsed_s,
                killed_job_s=killed.elapsed_s if name == "killed" else None,
                bound_s=bound if name in ("killed", "restarted") else None,
                within_bound=(res.elapsed_s <= bound) if bound is not None and name in ("killed", "restarted") else None,
                vs_straight=res.elapsed_s / base, per_iteration_s=rec["per_iteration_s"],
                startup_s=rec["load_s"] + rec["setup_s"],
                checkpoint_s_per_rank=cks.get("median_s_per_rank"), checkpoint_bytes_per_rank=cks.get("bytes_per_rank"),
                peak_rss_bytes=rec["peak_rss_bytes"],
                same=_same(tmp / "straight" / "scores", tmp / name / "scores", args.ranks),
                top=rec["top"]))
    rows = [[x["graph"], str(x["ranks"]), x["variant"], human_time(x["wall_s"]), f"{x['vs_straight']:.2f}x",
             human_time(x["per_iteration_s"]), human_time(x["startup_s"]),
             human_time(max(x["checkpoint_s_per_rank"])) if x["checkpoint_s_per_rank"] else "-",
             f"{max(x['checkpoint_bytes_per_rank']) / 2**20:.1f} MiB" if x["checkpoint_bytes_per_rank"] else "-",
             f"{max(x['peak_rss_bytes']) / 2**30:.2f} GiB", "yes" if x["same"] else "NO",
             human_time(x["bound_s"]) if x.get("bound_s") else "-", "top10 " + ("same" if x["top"] == records[0]["top"] else "DIFFERS")]
            for x in records]
    print(common.format_table(["graph", "ranks", "variant", "wall", "vs straight", "median/iter", "load+set-up",
                               "per checkpoint",
                               "bytes/rank", "peak RSS/rank", "same", "bound", "top"], rows, left_columns=3))
    if args.json:
        common.write_json(args.json, records)
    return 0 if len(records) == 3 + args.restart and all(x["same"] for x in records) else 1
