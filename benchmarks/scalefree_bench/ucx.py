"""``scalefree bench ucx``: our one-sided put and small-message latency between two simulated
hosts against ``ucx_perftest`` (``ucp_put_bw``, ``ucp_am_lat``) on the same hosts, in one run.

Ours goes through the public Python API (``Channel.write`` + ``notify`` for bandwidth, an
8-byte ``write_notify`` ping-pong for latency), so its figures include the Python call
overhead that a user pays; ``ucx_perftest`` is UCX's own C harness. perftest runs once with
UCX's defaults and once with the settings scalefree applies (``--perftest-env``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .common import argparse_type as arg, human_bytes, human_time, progress

BENCH = "ucx"
# What scalefree sets for UCX unless the user did (backends/ucx: set_default_env).
SCALEFREE_UCX_ENV = {"UCX_TCP_TX_SEG_SIZE": "256k", "UCX_TCP_RX_SEG_SIZE": "256k"}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ucx", help="one-sided put bandwidth and latency across 2 simulated hosts vs ucx_perftest",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=arg(common.parse_sizes), default=common.parse_sizes("64K,1M,64M"),
                   help="put sizes (default 64K,1M,64M)")
    p.add_argument("--lat-iters", type=arg(common.positive_int), default=20000, help="ping-pong iterations")
    p.add_argument("--perftest-iters", type=arg(common.positive_int), default=20,
                   help="ucx_perftest iterations for the largest size (more for smaller ones)")
    common.add_timing_args(p)
    p.add_argument("--json", metavar="OUT", help="write the records as JSON")
    p.set_defaults(func=run)
    return p


def _perftest(sim, pt: list[str], test: str, size: int, iters: int, env: dict, port: int) -> dict | None:
    """One ucx_perftest client/server pair; the 'Final:' row as numbers."""
    e = dict(os.environ)
    e.update(env)
    srv = sim.popen(1, pt + ["-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
    try:
        time.sleep(0.5)
        r = subprocess.run(sim.command(0, pt + [sim.ip(1), "-p", str(port), "-t", test, "-s", str(size), "-n", str(iters)]),
                           capture_output=True, text=True, timeout=300, env=e)
        srv.wait(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
    m = re.search(r"Final:\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", r.stdout)
    if not m:
        progress(f"ucx: ucx_perftest {test} {size} gave no result: {(r.stdout + r.stderr)[-400:]}")
        return None
    it, p50, avg, overall, bw_avg, bw_overall = m.groups()
    return {"p50_us": float(p50), "avg_us": float(avg), "overall_us": float(overall), "mbps": float(bw_overall)}


def run(args) -> int:
    from scalefree.launch import simhosts
    from scalefree.launch import ucx

    why = simhosts.available()
    if why:
        print(f"scalefree bench ucx: simulated hosts are not possible here: {why}", file=sys.stderr)
        return 2
    ucx.prepare()
    pt = ucx.tool("ucx_perftest")
    if pt is None:
        print("scalefree bench ucx: ucx_perftest not found (pip install 'scalefree[ucx]')", file=sys.stderr)
        return 2
    from . import hosts

    records: list[dict] = []
    largest = max(args.sizes)
    with simhosts.SimHosts(2) as sim, tempfile.TemporaryDirectory(prefix="scalefree-bench-ucx-") as tmp:
        out = Path(tmp) / "ours.json"
        progress("ucx: scalefree (put, write_notify ping-pong) across 2 simulated hosts")
        argv = [sys.executable, "-m", "scalefree_bench._worker_ucx", "--sizes", ",".join(map(str, args.sizes)),
                "--lat-iters", str(args.lat_iters), "--target-seconds", repr(args.target_seconds), "--out", str(out)]
        outcome = hosts.run_all(hosts.scalefree_cmds(sim, 1, sim.port(), argv), timeout_s=args.timeout)
        if outcome.returncode != 0 or not out.exists():
            print("scalefree bench ucx: our run failed:\n" + "\n".join(outcome.tail), file=sys.stderr)
            return 1
        ours = json.loads(out.read_text())
        progress(f"ucx: ours carried by {ours['ucx_transports']}")
        for p in ours["put"]:
            st = common.Stats.of(p["times_s"])
            records.append(common.make_record(bench=BENCH, impl="scalefree", variant="put", ranks=2, hosts=2,
                                              nbytes=p["bytes"], dtype="u8", stats=st, gbps=p["bytes"] / st.median_s / 1e9,
                                              transports=ours["ucx_transports"]))
        for key, variant in (("lat", "write_notify-lat"), ("lat_native", "write_notify-lat-native")):
            lat = ours[key]["half_rtt_s"]
            records.append(common.make_record(bench=BENCH, impl="scalefree", variant=variant, ranks=2, hosts=2,
                                              nbytes=8, dtype="u8", stats=common.Stats.of([lat]), gbps=0.0))
        for label, env in (("perftest", {}), ("perftest+sf-env", SCALEFREE_UCX_ENV)):
            for size in args.sizes:
                iters = max(args.perftest_iters, min(100000, args.perftest_iters * largest // max(size, 1)))
                progress(f"ucx: ucx_perftest ucp_put_bw {human_bytes(size)} ({label})")
                r = _perftest(sim, pt, "ucp_put_bw", size, iters, env, sim.port())
                if r:
                    s = size / (r["mbps"] * 2**20)
                    records.append(common.make_record(bench=BENCH, impl="ucx_perftest", variant=f"ucp_put_bw{'' if not env else '+sf-env'}",
                                                      ranks=2, hosts=2, nbytes=size, dtype="u8", stats=common.Stats.of([s]),
                                                      gbps=r["mbps"] * 2**20 / 1e9))
            progress(f"ucx: ucx_perftest ucp_am_lat 8 B ({label})")
            r = _perftest(sim, pt, "ucp_am_lat", 8, args.lat_iters, env, sim.port())
            if r:
                records.append(common.make_record(bench=BENCH, impl="ucx_perftest", variant=f"ucp_am_lat{'' if not env else '+sf-env'}",
                                                  ranks=2, hosts=2, nbytes=8, dtype="u8",
                                                  stats=common.Stats(median_s=r["p50_us"] * 1e-6, min_s=r["p50_us"] * 1e-6,
                                                                     max_s=r["avg_us"] * 1e-6, n=args.lat_iters),
                                                  gbps=0.0))
    print(render(records))
    if args.json:
        common.write_json(args.json, records)
        progress(f"ucx: wrote {len(records)} records to {args.json}")
    return 0


def render(records: list[dict]) -> str:
    best_put = {}
    for r in records:
        if r["impl"] == "ucx_perftest" and r["variant"].startswith("ucp_put_bw"):
            best_put[r["bytes"]] = max(best_put.get(r["bytes"], 0.0), r["gbps"])
    lat_peer = min((r["median_s"] for r in records if r["variant"].startswith("ucp_am_lat")), default=None)
    rows = []
    for r in records:
        if "lat" in r["variant"]:
            ratio = f"{r['median_s'] / lat_peer:.2f}x of best perftest" if lat_peer and r["impl"] == "scalefree" else ""
            rows.append([human_bytes(r["bytes"]), r["impl"], r["variant"], human_time(r["median_s"]), "", ratio])
        else:
            ratio = f"{r['gbps'] / best_put[r['bytes']]:.0%} of best perftest" if r["impl"] == "scalefree" and best_put.get(r["bytes"]) else ""
            rows.append([human_bytes(r["bytes"]), r["impl"], r["variant"], human_time(r["median_s"]), f"{r['gbps']:.2f}", ratio])
    return common.format_table(["size", "impl", "variant", "median", "GB/s", "vs perftest"], rows, left_columns=3)
