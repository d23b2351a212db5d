"""``scalefree bench ssp``: the stale-synchronous allreduce under stragglers, against
``MPI_Allreduce`` and our own dense allreduce, in one run.

Before each of ``--calls`` calls one seeded-random rank sleeps uniform(0, ``--delay``) ms
(the same schedule for every implementation). MPI must wait for the delayed rank on every
call; an SSP loop can only be as fast as the rank whose delays add up to the most: that
*bound* is printed beside each result. For each (ranks, variant, slack) the table shows the
loop's wall time (slowest rank), the time spent inside the collective (mean over ranks), the
time blocked waiting for fresh data, the mean age difference of the data used, and ratios to
MPI. *ideal* is the loop's wall time with a collective that costs nothing at that slack (a
rank may start call ``i`` once every rank finished call ``i - slack``): what the slack
allows at best. *ideal slept* is the same loop with the delays each rank actually slept
(``time.sleep`` wakes late on a busy machine; every late wake-up adds to the loop whatever
the collective does): *vs ideal* and *vs slept* are the loop's wall time over each, the
second the collective's own share. ``--delay 0`` rows compare the variants with the dense
allreduce without stragglers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import human_bytes, progress

BENCH = "ssp"
VARIANTS = ("hypercube", "sharded", "sharded_async", "sharded_thread", "sharded_async_thread", "ring", "auto")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "ssp",
        help="stale-synchronous allreduce under stragglers vs MPI_Allreduce",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__,
    )
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")),
                   default="2,4", metavar="N[,N...]")
    p.add_argument("--size", type=arg(common.parse_sizes), default="1M", metavar="BYTES[,BYTES...]",
                   help="vector bytes (float32); several sizes measure where the variants cross over")
    p.add_argument("--calls", type=arg(common.positive_int), default=200)
    p.add_argument("--delay", type=arg(lambda s: [float(x) for x in s.split(",")]), default="20,0",
                   metavar="MS[,MS...]", help="straggler delay bounds to run (0: no stragglers)")
    p.add_argument("--slack", type=arg(lambda s: common.parse_int_list(s, "slack", minimum=0)),
                   default="0,1,2,4,8,255", metavar="S[,S...]")
    p.add_argument("--variant", type=arg(lambda s: common.parse_choice_list(s, VARIANTS, "variant")),
                   default="sharded_async_thread,sharded_thread,sharded,hypercube", metavar="V[,V...]",
                   help=f"SSP variants ({', '.join(VARIANTS)})")
    p.add_argument("--push-order", type=arg(lambda s: common.parse_choice_list(s, ("cyclic", "fixed"), "push order")),
                   default="cyclic", metavar="ORDER[,ORDER...]",
                   help="sharded variants' push order: cyclic (rank r starts at shard r+1), fixed (0..p-1)")
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, ("mpi", "dense"), "peer")),
                   default="mpi,dense", metavar="PEER[,PEER...]",
                   help="baselines: mpi (MPI_Allreduce via mpi4py), dense (our allreduce)")
    p.add_argument("--seed", type=common.argparse_type(common.non_negative_int), default=0)
    p.add_argument("--timeout", type=arg(common.positive_float), default=900.0)
    p.add_argument("--metrics", type=Path, metavar="OUT.jsonl",
                   help="write every call's time, wait and age difference as JSON lines")
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    bad = [s for s in args.size if s % 4]
    if bad:
        progress(f"bench ssp: --size {human_bytes(bad[0])} is not a whole number of float32 elements")
        return 2
    peers = list(args.vs)
    if "mpi" in peers and (importlib.util.find_spec("mpi4py") is None or common.find_mpiexec() is None):
        progress("bench ssp: skipping mpi: mpi4py or mpiexec not found (pip install ./benchmarks)")
        peers.remove("mpi")
    delays = ",".join(f"{d:g}" for d in args.delay)
    progress(f"ssp: ranks {args.ranks}, {', '.join(human_bytes(s) for s in args.size)}, {args.calls} calls, delays {delays} ms, "
             f"slacks {args.slack}, variants {args.variant}, {common.usable_cores()} cores")
    records, failures, metrics = [], [], []
    for n, size in [(n, size) for n in args.ranks for size in args.size]:
        jobs = [("scalefree", [f"{v}:{s}:{o}" for v in args.variant for s in args.slack
                               for o in (("cyclic",) if v == "hypercube" else args.push_order)]
                 + (["dense:0"] if "dense" in peers else []))]
        if "mpi" in peers:
            jobs.append(("mpi", ["allreduce:0"]))
        for impl, configs in jobs:
            with tempfile.TemporaryDirectory(prefix="scalefree-bench-ssp-") as tmp:
                argv = [sys.executable, "-m", "scalefree_bench._worker_ssp", "--impl", impl,
                        "--out-dir", tmp, "--bytes", str(size), "--calls", str(args.calls),
                        "--delays", delays, "--configs", ",".join(configs), "--seed", str(args.seed)]
                if impl == "mpi":
                    cmd, env = common.mpiexec_cmd(common.find_mpiexec(), n, argv), common.mpi_env()
                else:
                    cmd, env = common.launcher_cmd(n, argv), {}
                progress(f"ssp: {impl} on {n} ranks, {human_bytes(size)} ({len(configs)} configurations x {len(args.delay)} delays)")
                outcome = common.run_job(cmd, timeout_s=args.timeout, env_extra=env)
                docs = []
                for r in range(n):
                    f = Path(tmp) / f"rank{r}.json"
                    docs.append(json.loads(f.read_text()) if f.exists() else {"rows": []})
                if not outcome.ok:
                    failures.append(f"{impl} on {n} ranks, {human_bytes(size)}: {outcome.describe()}")
            nrows = min(len(d["rows"]) for d in docs)
            for i in range(nrows):
                rows = [d["rows"][i] for d in docs]
                records.append(_record(impl, n, size, args, rows))
                for r, row in enumerate(rows):
                    for k, t in enumerate(row["times_s"]):
                        metrics.append({"impl": impl, "variant": row["variant"], "ranks": n, "bytes": size, "rank": r,
                                        "slack": row["slack"], "delay_ms": row["delay_ms"], "call": k + 1,
                                        "seconds": t, "wait_seconds": row.get("wait_s", [0] * (k + 1))[k],
                                        "age_diff": row.get("age_diff", [0] * (k + 1))[k]})
    print(render_table(records))
    sys.stdout.flush()
    if args.json:
        common.write_json(args.json, records)
        progress(f"ssp: wrote {len(records)} records to {args.json}")
    if args.metrics:
        args.metrics.write_text("".join(json.dumps(m) + "\n" for m in metrics))
        progress(f"ssp: wrote {len(metrics)} per-call metrics to {args.metrics}")
    if args.plot:
        try:
            plot(records, args.plot)
            progress(f"ssp: wrote {args.plot}")
        except Exception as e:  # matplotlib missing or failing must not lose the table
            failures.append(f"plot: {e}")
    for f in failures:
        progress(f"ssp: FAILED {f}")
    return 1 if failures else 0


def ideal_wall_s(delay_ms: float, seed: int, ranks: int, calls: int, slack: int) -> float:
    """Wall time of the straggler loop with a collective that costs nothing and a result
    that may be ``slack`` calls old: call ``i`` of any rank can start only once every rank
    has finished its call ``i - slack``. With an unbounded slack it is the bound."""
    sched = common.StragglerSchedule(delay_ms, seed, ranks)
    return ideal_of_delays([sched.delays_s(r, calls) for r in range(ranks)], slack)


def ideal_of_delays(d: list[list[float]], slack: int) -> float:
    """:func:`ideal_wall_s` for the delays ``d[rank][call]`` (seconds): the schedule's, or
    those the ranks actually slept."""
    ranks, calls = len(d), min(len(x) for x in d)
    done = [[0.0] * (calls + 1) for _ in range(ranks)]
    for i in range(1, calls + 1):
        gate = max(done[q][i - slack] for q in range(ranks)) if i - slack >= 1 else 0.0
        for r in range(ranks):
            done[r][i] = max(done[r][i - 1] + d[r][i - 1], gate)
    return max(done[r][calls] for r in range(ranks))


def _record(impl: str, n: int, size: int, args, rows: list[dict]) -> dict:
    per_call = [max(ts) for ts in zip(*(r["times_s"] for r in rows))]
    stats = common.Stats.of(per_call)
    row0 = rows[0]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    variant = row0["variant"] if impl == "scalefree" else "allreduce"
    order = row0.get("push_order", "") if impl == "scalefree" and variant not in ("dense", "hypercube", "ring") else ""
    slack = int(row0["slack"]) if impl == "scalefree" and variant != "dense" else 0
    rec = common.make_record(
        push_order=order,
        bench=BENCH, impl=impl, variant=variant, ranks=n, nbytes=size, dtype="float32",
        stats=stats, gbps=0.0,
        slack=int(row0["slack"]), delay_ms=float(row0["delay_ms"]), calls=args.calls,
        wall_s=max(r["wall_s"] for r in rows),
        coll_s=mean([sum(r["times_s"]) for r in rows]),
        wait_s=mean([sum(r.get("wait_s", [])) for r in rows]),
        age_diff_mean=mean([statistics.fmean(r["age_diff"]) if r.get("age_diff") else 0.0 for r in rows]),
        bound_s=float(row0["bound_s"]),
        ideal_s=ideal_wall_s(row0["delay_ms"], args.seed, n, args.calls, slack),
        flush_s=max(r.get("flush_s", 0.0) for r in rows),
    )
    if all(r.get("slept_s") for r in rows):
        rec["ideal_slept_s"] = ideal_of_delays([r["slept_s"] for r in rows], slack)
        # How much later than asked the ranks' sleeps ended, the largest total of one rank.
        rec["oversleep_s"] = max(sum(r["slept_s"]) - r["my_delay_s"] for r in rows)
    return rec


def render_table(records: list[dict]) -> str:
    headers = ["ranks", "size", "delay", "impl", "variant", "order", "slack", "loop wall", "bound", "ideal", "ideal slept",
               "wall vs ideal", "wall vs slept", "in coll", "waiting", "age diff", "wall vs mpi", "coll vs mpi",
               "per call vs dense"]
    mpi = {(r["ranks"], r["bytes"], r["delay_ms"]): r for r in records if r["impl"] == "mpi"}
    dense = {(r["ranks"], r["bytes"], r["delay_ms"]): r for r in records if r["variant"] == "dense"}
    rows = []
    for r in sorted(records, key=lambda r: (r["ranks"], r["bytes"], -r["delay_ms"], r["impl"] != "mpi",
                                            r["variant"], r["slack"], r.get("push_order", ""))):
        key = (r["ranks"], r["bytes"], r["delay_ms"])
        m, d = mpi.get(key), dense.get(key)
        rows.append([
            str(r["ranks"]), human_bytes(r["bytes"]), f"{r['delay_ms']:g} ms", r["impl"], r["variant"], r.get("push_order", ""),
            "" if r["impl"] == "mpi" or r["variant"] == "dense" else str(r["slack"]),
            f"{r['wall_s']:.3f} s", f"{r['bound_s']:.3f} s", f"{r['ideal_s']:.3f} s",
            f"{r['ideal_slept_s']:.3f} s" if "ideal_slept_s" in r else "",
            f"{r['wall_s'] / r['ideal_s']:.2f}x" if r["ideal_s"] > 0 else "",
            f"{r['wall_s'] / r['ideal_slept_s']:.2f}x" if r.get("ideal_slept_s") else "", f"{r['coll_s']:.3f} s",
            f"{r['wait_s']:.3f} s", f"{r['age_diff_mean']:.2f}",
            f"{m['wall_s'] / r['wall_s']:.2f}x" if m else "",
            f"{m['coll_s'] / r['coll_s']:.2f}x" if m and r["coll_s"] > 0 else "",
            f"{r['coll_s'] / d['coll_s']:.2f}" if d and r["delay_ms"] == 0 and d["coll_s"] > 0 else "",
        ])
    return common.format_table(headers, rows, left_columns=7)


def plot(records: list[dict], path: Path) -> None:
    """Time in the collective per call and time waiting per call against slack, one line
    per (variant, ranks), with MPI as a flat line (the paper's Fig. 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strag = [r for r in records if r["delay_ms"] > 0] or records
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    slacks = sorted({r["slack"] for r in strag if r["impl"] == "scalefree" and r["variant"] != "dense"})
    xs = list(range(len(slacks)))
    for (ax, field, title) in ((axes[0], "coll_s", "time in the collective per call"),
                               (axes[1], "wait_s", "time waiting for fresh data per call")):
        for key in sorted({(r["variant"], r["ranks"]) for r in strag if r["impl"] == "scalefree" and r["variant"] != "dense"}):
            pts = {r["slack"]: r[field] / r["calls"] for r in strag
                   if (r["variant"], r["ranks"]) == key and r["impl"] == "scalefree"}
            ax.plot(xs, [pts.get(s, float("nan")) * 1e3 for s in slacks], marker="o", label=f"{key[0]} ({key[1]} ranks)")
        if field == "coll_s":
            for r in strag:
                if r["impl"] == "mpi":
                    ax.axhline(r["coll_s"] / r["calls"] * 1e3, linestyle="--", color="k" if r["ranks"] == 2 else "gray",
                               label=f"MPI_Allreduce ({r['ranks']} ranks)")
        ax.set_xticks(xs, [str(s) for s in slacks])
        ax.set_xlabel("slack")
        ax.set_ylabel("ms per call")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    d = strag[0]["delay_ms"] if strag else 0
    fig.suptitle(f"SSP allreduce, {human_bytes(strag[0]['bytes']) if strag else ''}, one random rank delayed 0–{d:g} ms per call")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
