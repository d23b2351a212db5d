"""``scalefree bench rendezvous``: how long a real host takes to join a job across hosts while
strangers hold silent TCP connections to rank 0's rendezvous, for this scalefree and for
another build of it (``--baseline-python``: an interpreter whose ``scalefree`` is, say, the
previous release), in one run.

Two ``scalefree run --nnodes 2`` launchers on this machine meet at 127.0.0.1 (one rank each).
Rank 0 starts; once its port answers, ``--silent`` connections are opened to it and left
silent; then host 1 starts. The figure is host 1's ``scalefree.init()`` time (after the
import), i.e. the join: rendezvous (with its challenge and response) plus the device set-up.
With no silent connections it is the bootstrap cost, handshake included. Peak RSS of each
rank is reported.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import common
from .common import argparse_type as arg, progress

BENCH = "rendezvous"

CODE = """import resource, time
import scalefree
t = time.monotonic()
g = scalefree.init(bootstrap_timeout=900)
took = time.monotonic() - t
g.barrier()
print("joined", g.rank, took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, flush=True)
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(BENCH, help="join delay of a host behind silent connections to the rendezvous, vs a baseline build",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--silent", type=arg(lambda t: common.parse_int_list(t, "count", minimum=0)), default=[0, 50],
                   help="numbers of silent connections (default 0,50)")
    p.add_argument("--repeats", type=arg(common.positive_int), default=3, help="joins per point (default 3)")
    p.add_argument("--baseline-python", default=None, metavar="PYTHON",
                   help="an interpreter whose scalefree is the build to compare with (e.g. the previous release)")
    p.add_argument("--baseline-repeats", type=arg(common.positive_int), default=1,
                   help="joins per point of the baseline (default 1: behind silent connections it may take minutes)")
    p.add_argument("--json", metavar="OUT", help="write the records as JSON")
    p.set_defaults(func=run)
    return p


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rank 0 exited with {proc.returncode}: {proc.stdout.read()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"rank 0 does not listen on port {port}")


def join_once(python: str, silent: int) -> dict:
    """One job: rank 0, then `silent` silent connections, then host 1. Host 1's init time
    and both ranks' peak RSS."""
    port = common.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCALEFREE_", "OMPI_", "PMI_", "SLURM_"))}
    env.update(SCALEFREE_JOB_TOKEN=secrets.token_hex(16), SCALEFREE_BOOTSTRAP_TIMEOUT="900", PYTHONUNBUFFERED="1")

    def host(i: int) -> subprocess.Popen:
        return subprocess.Popen([python, "-m", "scalefree.cli", "run", "--nnodes", "2", "--node-rank", str(i), "-n", "1",
                                 "--master-addr", "127.0.0.1", "--master-port", str(port), "--no-prefix",
                                 "--", python, "-c", CODE],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    h0 = host(0)
    conns = []
    try:
        _wait_listening(port, h0)
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(silent)]
        h1 = host(1)
        out1, _ = h1.communicate(timeout=1200)
        out0, _ = h0.communicate(timeout=120)
    finally:
        for c in conns:
            c.close()
        for p in (h0,):
            if p.poll() is None:
                p.kill()
    rows = {}
    for line in (out0 + out1).splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "joined":
            rows[int(parts[1])] = (float(parts[2]), int(parts[3]))
    if 1 not in rows or 0 not in rows:
        raise RuntimeError(f"the job failed:\n{out0[-1500:]}\n{out1[-1500:]}")
    return {"join_s": rows[1][0], "rss_rank0": rows[0][1], "rss_rank1": rows[1][1]}


def run(args) -> int:
    impls = [("scalefree", sys.executable, args.repeats)]
    if args.baseline_python:
        impls.append(("baseline", args.baseline_python, args.baseline_repeats))
    records = []
    for silent in args.silent:
        for impl, python, repeats in impls:
            joins = []
            for _ in range(repeats):
                r = join_once(python, silent)
                progress(f"rendezvous: {impl} behind {silent} silent connections joined in {r['join_s']:.3f} s")
                joins.append(r)
            times = [j["join_s"] for j in joins]
            records.append({"bench": BENCH, "impl": impl, "python": python, "silent": silent, "repeats": repeats,
                            "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                            "peak_rss_rank0": max(j["rss_rank0"] for j in joins),
                            "peak_rss_rank1": max(j["rss_rank1"] for j in joins)})
    ratios = common.peer_ratios(records, ["baseline"], ["silent"])
    rows = [[r["impl"], str(r["silent"]), f"{r['median_s']:.3f}", f"{r['min_s']:.3f}", f"{r['max_s']:.3f}",
             common.human_bytes(r["peak_rss_rank0"]), common.human_bytes(r["peak_rss_rank1"]),
             f"{ratio['baseline']:.1f}x" if "baseline" in ratio else ""] for r, ratio in zip(records, ratios)]
    print(common.format_table(["impl", "silent", "join median s", "min", "max", "rss r0", "rss r1", "baseline/ours"], rows,
                              left_columns=1))
    if args.json:
        common.write_json(Path(args.json), records)
    return 0
