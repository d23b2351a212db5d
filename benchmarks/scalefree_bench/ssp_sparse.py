"""``scalefree bench ssp-sparse``: the applications of the sparse allreduce with slack
(bounded staleness) under a straggler, against their synchronous runs, in one invocation.

Before every iteration (step) one seeded-random rank sleeps uniform(0, ``--delay``) ms: the
straggler schedule of ``bench ssp`` (:class:`scalefree.ssp.straggler.StragglerSchedule`),
passed to the commands as ``--straggler``. Both rows of an application run the same command
and schedule, once without and once with ``--slack``:

* ``pagerank`` — ``scalefree graph pagerank`` on a seeded R-MAT graph (``--rmat-scale``,
  ``--rmat-edges``) to ``--tol``. The synchronous run stops when the L1 change of an
  iteration is below it; the one with slack when the mean L1 change per iteration of the
  exact (flushed) scores between two checks is (checked every ``--check-every``
  iterations). ``time`` is the iterations' time (reading and set-up are the same for both);
  ``L1 vs sync`` is the L1 distance of the final scores to the synchronous run's, ``top-10``
  whether both rank the same ten vertices first;
* ``logreg`` — ``scalefree sgd logreg synthetic`` with ``--fixed-features`` (one sparse
  allreduce configured once on each rank's features, cumulative gradient sums) against
  ``--slack``; ``time`` is the fit, ``accuracy`` the held-out accuracy.

``speed-up`` is the synchronous row's time over each row's. The ``sync, no straggler`` row
(the same synchronous command without the straggler) is the floor: no slack can make the
run faster than that (the straggler's sleeps only add), so its speed-up bounds the slack's.

``--hosts H``: every job runs across H simulated hosts (:mod:`scalefree.launch.simhosts`,
needs root; ``-n / H`` ranks on each, shared memory within a host, UCX and TCP between), the
same hosts for every row: the reduce with slack reaches members on the other hosts through
posted mailboxes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import common
from .common import human_time, progress

BENCH = "ssp-sparse"
APPS = ("pagerank", "logreg")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ssp-sparse", help="PageRank and logistic regression with slack under a straggler vs synchronous",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=4)
    p.add_argument("--apps", type=arg(lambda s: common.parse_choice_list(s, APPS, "application")),
                   default="pagerank,logreg", metavar="APP[,APP...]")
    p.add_argument("--delay", type=arg(common.non_negative_float), default=20.0, metavar="MS",
                   help="straggler: one seeded-random rank sleeps up to MS ms before every iteration")
    p.add_argument("--seed", type=arg(common.non_negative_int), default=0, help="seed of the straggler schedule")
    p.add_argument("--edges", type=Path, help="PageRank edge file (default: a seeded R-MAT graph)")
    p.add_argument("--rmat-scale", type=arg(common.positive_int), default=22)
    p.add_argument("--rmat-edges", type=arg(common.parse_size), default="16M")
    p.add_argument("--tol", type=arg(common.positive_float), default=1e-8, help="PageRank L1 tolerance")
    p.add_argument("--pr-slack", type=arg(common.non_negative_int), default=2, help="PageRank --slack")
    p.add_argument("--check-every", type=arg(common.positive_int), default=8, help="PageRank --check-every")
    p.add_argument("--lr-rows", type=arg(common.positive_int), default=100_000, help="logreg: synthetic rows")
    p.add_argument("--lr-dim", type=arg(common.positive_int), default=20_000, help="logreg: synthetic features")
    p.add_argument("--lr-epochs", type=arg(common.positive_int), default=3)
    p.add_argument("--lr-slack", type=arg(common.non_negative_int), default=4, help="logreg --slack")
    p.add_argument("--hosts", type=arg(common.non_negative_int), default=0,
                   help="run every job across this many simulated hosts (network namespaces, UCX and TCP between; "
                        "needs root), -n / H ranks on each; 0: one host")
    p.add_argument("--timeout", type=arg(common.positive_float), default=1800.0)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _job(args, cmd: list[str], out: Path, label: str) -> tuple[common.JobOutcome, dict | None]:
    """Runs the command on ``-n`` ranks: relaunched by itself on one host, or as the ranks of a
    ``scalefree run`` on every simulated host (``args.sim``)."""
    progress(f"{BENCH}: {label}")
    argv = [sys.executable, "-m", "scalefree.cli", *cmd, "--json", str(out)]
    if args.sim is None:
        res = common.run_job([*argv, "-n", str(args.ranks)], timeout_s=args.timeout)
    else:
        from . import hosts

        res = hosts.run_all(hosts.scalefree_cmds(args.sim, args.ranks // args.sim.n, args.sim.port(), argv),
                            timeout_s=args.timeout)
    rec = json.loads(out.read_text()) if res.ok and out.exists() else None
    if rec is None:
        progress(f"{BENCH}: {label} failed (exit {res.returncode}):\n" + "\n".join(res.output_tail))
    return res, rec


def _scores(d: Path, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    parts = [np.load(d / f"scores.rank{r}.npz") for r in range(ranks)]
    ids = np.concatenate([p["owned"] for p in parts])
    s = np.concatenate([p["scores"] for p in parts])
    o = np.argsort(ids, kind="stable")
    return ids[o], s[o]


def _pagerank(args, tmp: Path) -> list[dict]:
    edges, graph = common.edges_or_rmat(args.edges, args.rmat_scale, args.rmat_edges, tmp, BENCH)
    base = ["graph", "pagerank", str(edges), "--tol", repr(args.tol), "--max-iter", "1000",
            "--top", "10", "-q", "--straggler-seed", str(args.seed)]
    delay = ["--straggler", repr(args.delay)]
    runs = {}
    for name, extra in (("sync", delay), (f"slack {args.pr_slack}", [*delay, "--slack", str(args.pr_slack),
                                                                      "--check-every", str(args.check_every)]),
                        ("sync, no straggler", [])):
        d = tmp / name.replace(" ", "")
        res, rec = _job(args, [*base, *extra, "--save-scores", str(d)], tmp / f"{name.replace(' ', '')}.json",
                        f"pagerank {name}")
        if rec is not None:
            runs[name] = (res, rec, d)
    if "sync" not in runs:
        return []
    _, sync, sync_dir = runs["sync"]
    ids0, s0 = _scores(sync_dir, args.ranks)
    out = []
    for name, (res, rec, d) in runs.items():
        ids, s = _scores(d, args.ranks)
        same_ids = np.array_equal(ids, ids0)
        out.append(common.make_record(
            bench=BENCH, impl="scalefree", variant=f"pagerank {name}", ranks=args.ranks, hosts=args.hosts or 1,
            nbytes=8 * rec["vertices"],
            dtype="float64", stats=common.Stats.of([rec["iterate_s"]]), gbps=0.0, app="pagerank", graph=graph,
            vertices=rec["vertices"], edges=rec["edges"], delay_ms=rec.get("straggler_ms"), seed=args.seed, tol=args.tol,
            slack=rec.get("slack"), iterations=rec["iterations"], time_s=rec["iterate_s"], wall_s=res.elapsed_s,
            speedup=sync["iterate_s"] / rec["iterate_s"],
            l1_vs_sync=float(np.abs(s - s0).sum()) if same_ids else None,
            top10_equal=[v for v, _ in rec["top"]] == [v for v, _ in sync["top"]],
            peak_rss_bytes=rec["peak_rss_bytes"]))
    return out


def _logreg(args, tmp: Path) -> list[dict]:
    base = ["sgd", "logreg", "synthetic", "--rows", str(args.lr_rows), "--dim", str(args.lr_dim),
            "--epochs", str(args.lr_epochs), "-q", "--seed", str(args.seed)]
    delay = ["--straggler", repr(args.delay)]
    runs = {}
    for name, extra in (("sync", [*delay, "--fixed-features"]), (f"slack {args.lr_slack}", [*delay, "--slack",
                                                                                             str(args.lr_slack)]),
                        ("sync, no straggler", ["--fixed-features"])):
        res, rec = _job(args, [*base, *extra], tmp / f"lr{name.replace(' ', '')}.json", f"logreg {name}")
        if rec is not None:
            runs[name] = (res, rec)
    if "sync" not in runs:
        return []
    sync = runs["sync"][1]
    return [common.make_record(
        bench=BENCH, impl="scalefree", variant=f"logreg {name}", ranks=args.ranks, hosts=args.hosts or 1,
        nbytes=8 * rec["features"],
        dtype="float64", stats=common.Stats.of([rec["fit_s"]]), gbps=0.0, app="logreg", rows=rec["rows"],
        features=rec["features"], epochs=rec["epochs"], steps=rec["steps"], delay_ms=rec.get("straggler_ms"), seed=args.seed,
        slack=rec.get("slack"), time_s=rec["fit_s"], wall_s=res.elapsed_s, speedup=sync["fit_s"] / rec["fit_s"],
        test_accuracy=rec["test_accuracy"], accuracy_vs_sync=rec["test_accuracy"] - sync["test_accuracy"],
        mean_age_diff=rec.get("mean_age_diff"), peak_rss_bytes=rec["peak_rss_bytes"]) for name, (res, rec) in runs.items()]


def run(args) -> int:
    if args.hosts and args.ranks % args.hosts:
        print(f"scalefree bench {BENCH}: --hosts {args.hosts} does not divide {args.ranks} ranks", file=sys.stderr)
        return 2
    records = []
    with contextlib.ExitStack() as stack:
        args.sim = None
        if args.hosts:
            from scalefree.launch import simhosts

            why = simhosts.available()
            if why:
                print(f"scalefree bench {BENCH} --hosts: simulated hosts are not possible here: {why}", file=sys.stderr)
                return 2
            args.sim = stack.enter_context(simhosts.SimHosts(args.hosts))
        # Absolute: the ranks on simulated hosts write their records and scores here too.
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir="."))).resolve()
        if "pagerank" in args.apps:
            records += _pagerank(args, tmp)
        if "logreg" in args.apps:
            records += _logreg(args, tmp)
    rows = []
    for x in records:
        if x["app"] == "pagerank":
            quality = (f"L1 vs sync {x['l1_vs_sync']:.1e}" if x["l1_vs_sync"] is not None else "ids differ") + (
                ", top-10 equal" if x["top10_equal"] else ", TOP-10 DIFFERS")
            what = f"{x['graph']}: {x['edges']} edges, {x['iterations']} iterations"
        else:
            quality = f"accuracy {x['test_accuracy']:.4f} ({100 * x['accuracy_vs_sync']:+.2f} %)"
            what = f"{x['rows']} rows x {x['features']} features, {x['steps']} steps"
        rows.append([x["variant"], what, human_time(x["time_s"]), f"{x['speedup']:.2f}x", quality,
                     f"{max(x['peak_rss_bytes']) / 2**30:.2f} GiB"])
    where = f" on {args.hosts} simulated hosts" if args.hosts else ""
    print(f"{BENCH}: {args.ranks} ranks{where}, straggler up to {args.delay:g} ms per iteration (seed {args.seed})")
    print(common.format_table(["run", "workload", "time", "speed-up", "result", "peak RSS/rank"], rows, left_columns=2))
    if args.json:
        common.write_json(args.json, records)
    want = 3 * len(args.apps)
    return 0 if len(records) == want else 1
