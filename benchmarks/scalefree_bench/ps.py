"""``scalefree bench ps``: samples/s of the same fully connected net (1024 → 2048 → 2048 →
2048 → 10, batch 32 per worker) trained with the parameter server of :mod:`scalefree.tensors.ps`
(1 server + 2 workers) with no copies (``mapped``: workers read the server's double-buffered
parameters in place, the server reads their gradients in place), over our static slots, and
over torch.distributed gloo, over gRPC (unary calls, and 1 MiB streams), beside one
process training alone (batch 32, all cores). Each worker's step is split into computation
and communication (pull + push).

``--hosts H`` trains over static slots across H simulated hosts instead (``-n`` ranks, one
per host unless given; a multiple of H) once per ``--trace`` setting, in one run:
allocation-site tracing on (gradients born in registered memory after the first step) and
off (every pushed gradient staged into registered memory), with the bytes copied per step
per worker, samples/s and peak RSS per rank."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from . import common
from .common import progress

BENCH = "ps"


def add_parser(sub):
    p = sub.add_parser("ps", help="parameter-server training: ours vs gloo vs one process",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, ("gloo", "grpc", "local"), "peer")),
                   default="gloo,grpc,local", metavar="PEER[,PEER...]")
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=None, help="3; with --hosts, one per host")
    p.add_argument("--hosts", type=arg(common.positive_int), default=1,
                   help="train across this many simulated hosts (slots only, tracing on and off)")
    p.add_argument("--trace", type=arg(lambda s: common.parse_choice_list(s, ("on", "off"), "trace setting")),
                   default="on,off", metavar="on,off", help="with --hosts: the tracing settings to run")
    p.add_argument("--steps", type=arg(common.positive_int), default=100)
    p.add_argument("--hidden", type=arg(common.positive_int), nargs="+", default=[2048, 2048, 2048])
    p.add_argument("--timeout", type=arg(common.positive_float), default=900.0)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _train(transport: str, args, tmp: Path) -> list[dict]:
    out = str(tmp / transport)
    ranks = 1 if transport == "local" else args.ranks
    argv = [sys.executable, "-m", "scalefree.cli.ps", "--ranks", str(args.ranks), "--steps", str(args.steps),
            "--transport", transport, "--out", out, "--hidden", *[str(h) for h in args.hidden]]
    env = {"SCALEFREE_PS_GLOO_PORT": str(common.free_port())}
    if transport == "local":
        # One process alone, at batch 32, with every core.
        argv[argv.index("--ranks") + 1] = "2"
        cmd = argv
    else:
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = common.launcher_cmd(ranks, argv)
    progress(f"ps: {transport}")
    outcome = common.run_job(cmd, timeout_s=args.timeout, env_extra=env)
    if not outcome.ok:
        raise RuntimeError(f"{transport}: {outcome.describe()}")
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(ranks)]


def _train_hosts(trace: str, args, tmp: Path) -> list[dict]:
    """One run over static slots across ``args.hosts`` simulated hosts."""
    from scalefree.launch import simhosts

    from . import hosts

    out = str(tmp / f"hosts-{trace}")
    argv = [sys.executable, "-m", "scalefree.cli.ps", "--ranks", str(args.ranks), "--steps", str(args.steps),
            "--transport", "slots", "--trace", trace, "--out", out, "--hidden", *[str(h) for h in args.hidden]]
    progress(f"ps: slots across {args.hosts} simulated hosts, tracing {trace}")
    with simhosts.SimHosts(args.hosts) as sim:
        outcome = hosts.run_all(hosts.scalefree_cmds(sim, args.ranks // args.hosts, sim.port(), argv),
                                timeout_s=args.timeout,
                                env_extra=dict(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    if not outcome.ok:
        raise RuntimeError(f"tracing {trace}: {outcome.describe()}")
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(args.ranks)]


def run_hosts(args) -> int:
    from scalefree.launch import simhosts

    why = simhosts.available()
    if why:
        print(f"scalefree bench ps: simulated hosts are not possible here: {why}", file=sys.stderr)
        return 2
    args.ranks = args.ranks or args.hosts
    if args.ranks < 2 or args.ranks % args.hosts:
        print(f"scalefree bench ps: -n {args.ranks} must be at least 2 and a multiple of --hosts {args.hosts}",
              file=sys.stderr)
        return 2
    if not args.trace:
        print("scalefree bench ps: --trace names no setting (on, off)", file=sys.stderr)
        return 2
    records = []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-ps-") as tmp:
        for trace in args.trace:
            res = _train_hosts(trace, args, Path(tmp))
            ws = res[1:]
            secs = max(w["seconds"] for w in ws)
            per_step = secs / args.steps
            records.append(common.make_record(
                bench=BENCH, impl="scalefree", variant=f"slots, tracing {trace}", ranks=args.ranks, hosts=args.hosts,
                nbytes=0, dtype="float32", stats=common.Stats(per_step, per_step, per_step, args.steps), gbps=0.0,
                trace=trace, samples_per_s=sum(w["samples"] for w in ws) / secs,
                comm_fraction=max(w["comm_seconds"] / w["seconds"] for w in ws),
                bytes_copied_per_step=max(w["bytes_copied_per_step"] for w in ws),
                final_loss=ws[0]["history"][-1][2], peak_rss_bytes=[r.get("peak_rss_bytes") for r in res]))
    print(render_hosts(records))
    if args.json:
        common.write_json(args.json, records)
    return 0


def render_hosts(records: list[dict]) -> str:
    off = next((r for r in records if r["trace"] == "off"), None)
    rows = []
    for r in records:
        copied = common.human_bytes(round(r["bytes_copied_per_step"]))
        vs = ""
        if off and r is not off:
            ratio = r["bytes_copied_per_step"] / off["bytes_copied_per_step"] if off["bytes_copied_per_step"] else 0.0
            vs = f"{ratio:.3f}x copied, {r['samples_per_s'] / off['samples_per_s']:.2f}x samples/s"
        rows.append([r["variant"], f"{r['samples_per_s']:.0f}", f"{100 * r['comm_fraction']:.0f} %", copied, vs,
                     f"{r['final_loss']:.4f}", ", ".join(common.human_bytes(x) for x in r["peak_rss_bytes"] if x)])
    return common.format_table(["run", "samples/s", "communication", "copied per step per worker", "vs tracing off",
                                "final loss", "peak RSS per rank"], rows, left_columns=1)


def run(args) -> int:
    if args.hosts > 1:
        return run_hosts(args)
    args.ranks = args.ranks or 3
    records = []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-ps-") as tmp:
        peers = [v for v in args.vs if v == "gloo"] + (["grpc", "grpc-stream"] if "grpc" in args.vs else [])
        for transport in ["mapped", "slots"] + peers + [v for v in args.vs if v == "local"]:
            res = _train(transport, args, Path(tmp))
            if transport == "local":
                r = res[0]
                sps, comm, steps_s = r["samples"] / r["seconds"], 0.0, args.steps / r["seconds"]
                loss = r["history"][-1][2]
            else:
                ws = res[1:]
                secs = max(w["seconds"] for w in ws)
                sps = sum(w["samples"] for w in ws) / secs
                comm = max(w["comm_seconds"] / w["seconds"] for w in ws)
                steps_s = args.steps / secs
                loss = ws[0]["history"][-1][2]
            per_step = 1.0 / steps_s
            records.append(common.make_record(
                bench=BENCH, impl="scalefree" if transport in ("mapped", "slots") else transport.split("-")[0],
                variant=transport,
                ranks=1 if transport == "local" else args.ranks, nbytes=0, dtype="float32",
                stats=common.Stats(per_step, per_step, per_step, args.steps), gbps=0.0,
                samples_per_s=sps, steps_per_s=steps_s, comm_fraction=comm, final_loss=loss))
    ours = records[0]["samples_per_s"]
    headers = ["impl", "samples/s", "steps/s per worker", "communication", "ours vs this", "final loss"]
    rows = [[r["variant"], f"{r['samples_per_s']:.0f}", f"{r['steps_per_s']:.1f}", f"{100 * r['comm_fraction']:.0f} %",
             f"{ours / r['samples_per_s']:.2f}x", f"{r['final_loss']:.4f}"] for r in records]
    print(common.format_table(headers, rows, left_columns=1))
    if args.json:
        common.write_json(args.json, records)
    return 0
