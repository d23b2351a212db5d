"""``scalefree bench tensors``: one-way transfer of a preallocated buffer between two
processes — ours (static slot, dynamic channel, and the copy path for unregistered memory)
against gRPC (unary call, and client streaming in 1 MiB chunks), torch.distributed gloo
send/recv, a plain TCP socket into a preallocated buffer, and single-process memcpy as the
ceiling.

Ours, gloo and TCP ping-pong the buffer between rank 0 and rank 1 (one-way = round trip / 2);
gRPC sends it in one call with an empty reply (the serialization copy a user makes,
``arr.tobytes()``, is included). Each figure is the median of many transfers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from . import common
from .common import human_bytes, human_time, progress

BENCH = "tensors"
PEERS = ("grpc", "gloo", "tcp")
OURS = ("static", "dynamic", "copy")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("tensors", help="one-way tensor transfer vs gRPC, gloo, TCP and memcpy",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("--sizes", type=arg(common.parse_sizes), default="4K,1M,16M,64M,256M", metavar="SIZE[,SIZE...]")
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, PEERS, "peer")), default=",".join(PEERS),
                   metavar="PEER[,PEER...]")
    p.add_argument("--ours", type=arg(lambda s: common.parse_choice_list(s, OURS, "variant")), default=",".join(OURS),
                   metavar="V[,V...]")
    p.add_argument("--target-seconds", type=arg(common.non_negative_float), default=0.3)
    p.add_argument("--timeout", type=arg(common.positive_float), default=600.0)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _available(peer: str) -> bool:
    mod = {"grpc": "grpc", "gloo": "torch", "tcp": "socket"}[peer]
    if importlib.util.find_spec(mod) is None:
        progress(f"tensors: skipping {peer}: {mod} is not installed (pip install ./benchmarks)")
        return False
    return True


def _job(impl: str, args, tmp: Path) -> dict:
    out = str(tmp / f"{impl}.json")
    argv = [sys.executable, "-m", "scalefree_bench._worker_tensors", "--impl", impl,
            "--sizes", ",".join(str(s) for s in args.sizes), "--out", out, "--port", str(common.free_port()),
            "--target-seconds", repr(args.target_seconds)]
    progress(f"tensors: {impl}")
    outcome = common.run_job(common.launcher_cmd(2, argv), timeout_s=args.timeout)
    if not outcome.ok or not Path(out).exists():
        raise RuntimeError(f"{impl}: {outcome.describe()}")
    return {int(k): v for k, v in json.loads(Path(out).read_text()).items()}


def _memcpy(sizes, target_s) -> dict:
    import time

    import numpy as np

    res = {}
    for n in sizes:
        a = np.full(n, 7, np.uint8)
        b = np.zeros(n, np.uint8)
        reps = int(max(7, min(2000, target_s * 4e9 / max(n, 1))))
        for _ in range(3):
            np.copyto(b, a)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            np.copyto(b, a)
            ts.append(time.perf_counter() - t)
        res[n] = ts
    return res


def run(args) -> int:
    peers = [p for p in args.vs if _available(p)]
    jobs = [("scalefree", v, v) for v in args.ours]
    for p in peers:
        if p == "grpc":
            jobs += [("grpc", "unary", "grpc-unary"), ("grpc", "stream", "grpc-stream")]
        else:
            jobs.append((p, "", p))
    records, failures = [], []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-tensors-") as tmp:
        for impl, variant, worker in jobs:
            try:
                res = _job(worker, args, Path(tmp))
            except RuntimeError as e:
                failures.append(str(e))
                continue
            for n, got in res.items():
                # ours: {times, peak_rss_bytes (per rank)}; the peers: the times
                ts, extra = (got["times"], {"peak_rss_bytes": got["peak_rss_bytes"]}) if isinstance(got, dict) else (got, {})
                st = common.Stats.of(ts)
                records.append(common.make_record(bench=BENCH, impl=impl, variant=variant, ranks=2, nbytes=n,
                                                  dtype="uint8", stats=st, gbps=common.copy_gbps(n, st.median_s), **extra))
    progress("tensors: memcpy")
    for n, ts in _memcpy(args.sizes, args.target_seconds).items():
        st = common.Stats.of(ts)
        records.append(common.make_record(bench=BENCH, impl="memcpy", variant="", ranks=1, nbytes=n, dtype="uint8",
                                          stats=st, gbps=common.copy_gbps(n, st.median_s)))
    print(render_table(records))
    if args.json:
        common.write_json(args.json, records)
    if args.plot:
        common.plot_records(records, args.plot, series=("impl", "variant"), title="one-way tensor transfer (2 processes)")
    for f in failures:
        progress(f"tensors: FAILED {f}")
    return 1 if failures else 0


def render_table(records: list[dict]) -> str:
    order = {"scalefree": 0, "memcpy": 1, "grpc": 2, "gloo": 3, "tcp": 4}
    best = {}
    for r in records:
        key = (r["bytes"], r["impl"])
        if key not in best or r["median_s"] < best[key]:
            best[key] = r["median_s"]
    headers = ["size", "impl", "variant", "median", "GB/s", "vs grpc", "vs gloo", "vs tcp", "of memcpy"]
    rows = []
    for r in sorted(records, key=lambda r: (r["bytes"], order.get(r["impl"], 9), r["variant"])):
        n, t = r["bytes"], r["median_s"]
        ratio = lambda impl: f"{best[(n, impl)] / t:.1f}x" if r["impl"] == "scalefree" and (n, impl) in best else ""  # noqa: E731
        of_memcpy = f"{best[(n, 'memcpy')] / t * 100:.0f} %" if r["impl"] == "scalefree" and (n, "memcpy") in best else ""
        rows.append([human_bytes(n), r["impl"], r["variant"], human_time(t), common.format_gbps(r["gbps"]),
                     ratio("grpc"), ratio("gloo"), ratio("tcp"), of_memcpy])
    return common.format_table(headers, rows, left_columns=3)
