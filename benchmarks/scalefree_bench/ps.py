"""``scalefree bench ps``: samples/s of the same fully connected net (1024 → 2048 → 2048 →
2048 → 10, batch 32 per worker) trained with the parameter server of :mod:`scalefree.tensors.ps`
(1 server + 2 workers) with no copies (``mapped``: workers read the server's double-buffered
parameters in place, the server reads their gradients in place), over our static slots, and
over torch.distributed gloo, over gRPC (unary calls, and 1 MiB streams), beside one
process training alone (batch 32, all cores). Each worker's step is split into computation
and communication (pull + push)."""

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
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=3)
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


def run(args) -> int:
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
