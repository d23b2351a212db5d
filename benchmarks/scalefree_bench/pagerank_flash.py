"""``scalefree bench pagerank-flash``: PageRank with each rank's CSR on flash
(``scalefree graph pagerank --memory-budget``) against the same job in memory and against
the disk's own sequential read of the CSR's bytes, in one run.

Per repeat, interleaved: the in-memory job (``scalefree graph pagerank GRAPH -n P --max-iter
I --tol 0``: I iterations, its JSON gives the CSR's bytes per rank), the disk's sequential
read rate (``dd`` of a file of ``--dd-bytes`` in ``--flash-dir`` with ``iflag=direct``, the
page cache dropped first), and the out-of-core job at a budget of ``--budget-fraction`` of
the largest rank's CSR bytes (the CSR streamed from a scratch file in ``--flash-dir`` by
direct IO, so every iteration reads from the device whatever the page cache holds).
``--cold`` drops the page cache before every job (root only).

Columns: ``per iter`` (median iteration time, rank 0's), ``CSR read`` = the CSR's bytes over
the dd rate (what one sequential read of the CSR costs on this disk), ``vs read`` = per
iteration / CSR read (the target: at most 1.3), ``vs memory`` = per iteration / in memory,
peak RSS per rank, and ``top equal`` / ``bits equal``: the top vertices (ids; ids and
scores) the same as in memory's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .common import human_bytes, human_time, progress

BENCH = "pagerank-flash"


def add_parser(sub):
    p = sub.add_parser(BENCH, help="PageRank with the CSR on flash (--memory-budget) vs in memory and the disk's read",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("graph", type=Path, help="edge file (e.g. from `scalefree graph rmat g.npz --scale 22 --edges 64M`)")
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=1, help="ranks of both jobs")
    p.add_argument("--iterations", type=arg(common.positive_int), default=5, help="iterations per job (--tol 0)")
    p.add_argument("--budget-fraction", type=arg(common.positive_float), default=0.25,
                   help="the out-of-core budget as a fraction of the largest rank's CSR bytes")
    p.add_argument("--flash-dir", type=Path, default=None,
                   help="scratch directory of the CSR files and the dd file (default: the graph's directory)")
    p.add_argument("--dd-bytes", type=arg(common.parse_size), default="512M",
                   help="size of the file dd reads to measure the disk's sequential rate")
    p.add_argument("--repeats", type=arg(common.positive_int), default=3, help="runs of every row, interleaved")
    p.add_argument("--timeout", type=arg(common.positive_float), default=1800.0, help="seconds per job")
    common.add_cold_arg(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _job(cmd: list[str], out: Path, timeout: float) -> dict | None:
    if out.exists():
        out.unlink()
    job = common.run_job(cmd, timeout_s=timeout)
    if job.returncode != 0 or not out.exists():
        progress(f"{BENCH}: {' '.join(cmd[3:8])} ... failed ({'timed out' if job.timed_out else job.returncode})")
        return None
    return json.loads(out.read_text())


def dd_rate(path: Path, nbytes: int) -> float:
    """Bytes per second of ``dd if=path iflag=direct bs=4M`` over ``nbytes`` (the file is
    written first when it is missing or shorter)."""
    block = 4 << 20
    count = max(1, nbytes // block)
    if not path.exists() or path.stat().st_size < count * block:
        subprocess.run(["dd", "if=/dev/urandom", f"of={path}", f"bs={block}", f"count={count}", "oflag=direct",
                        "status=none"], check=True)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", f"bs={block}", f"count={count}", "iflag=direct",
                    "status=none"], check=True)
    return count * block / (time.perf_counter() - t)


def run(args) -> int:
    flash_dir = Path(args.flash_dir or args.graph.parent)
    cache = common.PageCache(args.cold, BENCH)
    base = [sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(args.graph), "-n", str(args.ranks),
            "--max-iter", str(args.iterations), "--tol", "0", "--top", "10", "-q"]
    runs: list[dict] = []
    ddfile = flash_dir / ".scalefree-bench-dd"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rec.json"
            for rep in range(args.repeats):
                progress(f"{BENCH}: in memory, {args.ranks} ranks (run {rep + 1}/{args.repeats})")
                cache.drop()
                mem = _job(base + ["--json", str(out)], out, args.timeout)
                if mem is None:
                    return 1
                csr = max(mem["csr_bytes_per_rank"])
                budget = max(1 << 20, int(csr * args.budget_fraction))
                cache.drop()
                rate = dd_rate(ddfile, args.dd_bytes)
                progress(f"{BENCH}: dd iflag=direct: {rate / 1e9:.3f} GB/s; out of core at {human_bytes(budget)} "
                         f"(run {rep + 1}/{args.repeats})")
                cache.drop()
                ooc = _job(base + ["--memory-budget", str(budget), "--flash-dir", str(flash_dir), "--json", str(out)],
                           out, args.timeout)
                if ooc is None:
                    return 1
                runs.append({"mem": mem, "ooc": ooc, "rate": rate, "budget": budget, "csr": csr})
    finally:
        if ddfile.exists():
            ddfile.unlink()
    records = []
    for i, r in enumerate(runs):
        mem, ooc = r["mem"], r["ooc"]
        read_s = r["csr"] / r["rate"]
        records.append({
            "bench": BENCH, "run": i + 1, "ranks": args.ranks, "graph": str(args.graph), "edges": mem["edges"],
            "vertices": mem["vertices"], "iterations": ooc["iterations"], "csr_bytes_per_rank": mem["csr_bytes_per_rank"],
            "memory_budget_bytes": r["budget"], "disk_read_bytes_per_s": r["rate"], "csr_read_s": read_s,
            "memory_per_iteration_s": mem["per_iteration_s"], "flash_per_iteration_s": ooc["per_iteration_s"],
            "vs_read": ooc["per_iteration_s"] / read_s, "vs_memory": ooc["per_iteration_s"] / mem["per_iteration_s"],
            "memory_peak_rss_bytes": mem["peak_rss_bytes"], "flash_peak_rss_bytes": ooc["peak_rss_bytes"],
            "flash": ooc.get("flash", {}), "page_cache": cache.state,
            "top_equal": [v for v, _ in ooc["top"]] == [v for v, _ in mem["top"]],
            "bits_equal": ooc["top"] == mem["top"],
        })
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    return 0 if records and all(r["top_equal"] for r in records) else 1


def print_table(records: list[dict]) -> None:
    head = ["run", "ranks", "edges", "CSR/rank", "budget", "disk GB/s", "CSR read", "in memory", "per iter",
            "vs read", "vs memory", "peak RSS mem", "peak RSS flash", "top equal", "bits equal"]
    rows = []
    for r in records:
        rows.append([str(r["run"]), str(r["ranks"]), str(r["edges"]), human_bytes(max(r["csr_bytes_per_rank"])),
                     human_bytes(r["memory_budget_bytes"]), f"{r['disk_read_bytes_per_s'] / 1e9:.3f}",
                     human_time(r["csr_read_s"]), human_time(r["memory_per_iteration_s"]),
                     human_time(r["flash_per_iteration_s"]), f"{r['vs_read']:.2f}x", f"{r['vs_memory']:.2f}x",
                     " ".join(human_bytes(x) for x in r["memory_peak_rss_bytes"]),
                     " ".join(human_bytes(x) for x in r["flash_peak_rss_bytes"]),
                     "yes" if r["top_equal"] else "NO", "yes" if r["bits_equal"] else "NO"])
    print(common.format_table(head, rows))
    if records:
        med = statistics.median(r["vs_read"] for r in records)
        print(f"median per iteration / CSR read: {med:.2f}x over {len(records)} runs")
