"""``scalefree bench torch-trace``: the ``"scalefree"`` torch backend across simulated hosts
with allocation-site tracing on and off (``SCALEFREE_TRACE``), in one run: bytes copied per
step (``pg.stats()``: staged into the transport's registered buffers, and copied out of the
receive mailbox) and samples/s, with peak RSS per rank.

Workloads (``--workload``): ``pipeline`` (2 ranks, an MLP split in two: activations and their
gradients go by ``dist.send``/``dist.recv`` every step) and ``ddp`` (the same MLP under
DistributedDataParallel, one rank per host unless ``-n`` says more). Each setting runs
``--rounds`` times, alternating; the table gives the median round's samples/s."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import progress

BENCH = "torch-trace"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("torch-trace", help="torch backend across simulated hosts: tracing on vs off",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("--workload", type=arg(lambda s: common.parse_choice_list(s, ("pipeline", "ddp"), "workload")),
                   default="pipeline,ddp", metavar="W[,W...]")
    p.add_argument("--hosts", type=arg(common.positive_int), default=2)
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=None, help="DDP ranks (default: --hosts)")
    p.add_argument("--width", type=arg(common.positive_int), default=2048)
    p.add_argument("--batch", type=arg(common.positive_int), default=64)
    p.add_argument("--steps", type=arg(common.positive_int), default=30)
    p.add_argument("--warmup", type=arg(common.positive_int), default=3)
    p.add_argument("--rounds", type=arg(common.positive_int), default=1, help="runs of each setting, alternating")
    p.add_argument("--timeout", type=arg(common.positive_float), default=900.0)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _job(workload: str, trace: str, ranks: int, args, tmp: Path) -> list[dict]:
    from scalefree.launch import simhosts

    from . import hosts

    out = tmp / f"{workload}-{trace}"
    argv = [sys.executable, "-m", "scalefree_bench._worker_torch_trace", workload, str(args.steps), str(args.warmup),
            str(args.batch), str(args.width), str(out)]
    env = dict(SCALEFREE_TRACE="1" if trace == "on" else "0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    with simhosts.SimHosts(args.hosts) as sim:
        cmds = hosts.scalefree_cmds(sim, ranks // args.hosts, sim.port(), argv)
        outcome = hosts.run_all(cmds, timeout_s=args.timeout, env_extra=env)
    if not outcome.ok:
        raise RuntimeError(f"{workload}, tracing {trace}: {outcome.describe()}")
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(ranks)]


def run(args) -> int:
    from scalefree.launch import simhosts

    why = simhosts.available()
    if why:
        print(f"scalefree bench torch-trace: simulated hosts are not possible here: {why}", file=sys.stderr)
        return 2
    ddp_ranks = args.ranks or args.hosts
    if ddp_ranks % args.hosts:
        print(f"scalefree bench torch-trace: -n {ddp_ranks} is not a multiple of --hosts {args.hosts}", file=sys.stderr)
        return 2
    if "pipeline" in args.workload and args.hosts != 2:
        print("scalefree bench torch-trace: the pipeline workload runs on 2 hosts (--hosts 2)", file=sys.stderr)
        return 2
    records = []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-torch-trace-") as tmp:
        for workload in args.workload:
            ranks = 2 if workload == "pipeline" else ddp_ranks
            runs: dict = {"on": [], "off": []}
            for rnd in range(args.rounds):
                for trace in (("on", "off") if rnd % 2 == 0 else ("off", "on")):
                    progress(f"torch-trace: {workload}, tracing {trace}, round {rnd + 1}/{args.rounds}")
                    runs[trace].append(_job(workload, trace, ranks, args, Path(tmp)))
            for trace, rs in runs.items():
                sps = [min(r["samples_per_s"] for r in res) for res in rs]
                mid = rs[sps.index(statistics.median_low(sps))]
                per_step = max(r["per_step"]["bytes_copied"] for r in mid)
                secs = max(r["seconds"] for r in mid) / args.steps
                records.append(common.make_record(
                    bench=BENCH, impl="scalefree", variant=f"{workload}, tracing {trace}", ranks=ranks,
                    hosts=args.hosts, nbytes=args.batch * args.width * 4, dtype="float32",
                    stats=common.Stats(secs, secs, secs, args.steps), gbps=0.0, workload=workload, trace=trace,
                    samples_per_s=statistics.median_low(sps), samples_per_s_rounds=sps,
                    bytes_copied_per_step=per_step,
                    bytes_staged_per_step=max(r["per_step"]["bytes_staged"] for r in mid),
                    bytes_copied_recv_per_step=max(r["per_step"]["bytes_copied_recv"] for r in mid),
                    transport=mid[0]["transport"], loss=mid[-1]["loss"],
                    dispatch_modes=[r.get("dispatch_modes") for r in mid],
                    dynamo_imported=[r.get("dynamo_imported") for r in mid],
                    peak_rss_bytes=[r["peak_rss_bytes"] for r in mid]))
    print(render(records))
    if args.json:
        common.write_json(args.json, records)
    return 0


def render(records: list[dict]) -> str:
    rows = []
    for r in records:
        off = next((o for o in records if o["workload"] == r["workload"] and o["trace"] == "off"), None)
        vs = ""
        if off is not None and r is not off:
            copied = (f"{r['bytes_copied_per_step'] / off['bytes_copied_per_step']:.3f}x copied"
                      if off["bytes_copied_per_step"] else "nothing copied either way")
            vs = f"{copied}, {r['samples_per_s'] / off['samples_per_s']:.2f}x samples/s"
        rows.append([r["variant"], f"{r['samples_per_s']:.0f}",
                     " / ".join(f"{s:.0f}" for s in r["samples_per_s_rounds"]),
                     common.human_bytes(round(r["bytes_copied_per_step"])),
                     common.human_bytes(round(r["bytes_staged_per_step"])),
                     common.human_bytes(round(r["bytes_copied_recv_per_step"])), vs,
                     ", ".join(common.human_bytes(x) for x in r["peak_rss_bytes"] if x)])
    return common.format_table(["run", "samples/s (median)", "rounds", "copied per step (rank max)", "staged",
                                "out of mailbox", "vs tracing off", "peak RSS per rank"], rows, left_columns=1)
