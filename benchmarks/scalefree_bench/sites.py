"""``scalefree bench sites``: allocation-site tracing in a training-style loop with no site
names (the RDMA tensor paper, §3.4). Two ranks; every iteration rank 0 computes a fresh
gradient of ``--size`` bytes and sends it through a dynamic channel, a static slot and the
parameter server (slot transport). The table shows the bytes copied in the first iteration
and in all later ones, and the median send time from the second iteration on, with the arena
(and so tracing) on and off (``SCALEFREE_ARENA=0``: every unregistered array is staged).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import argparse_type as arg, human_bytes, human_time, progress

BENCH = "sites"


def add_parser(sub):
    p = sub.add_parser("sites", help="allocation-site tracing: bytes copied per iteration, no site names",
                       description=__doc__, formatter_class=common.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=arg(common.parse_sizes), default="16K,48K",
                   help="gradient sizes (below the 64 KiB arena threshold: what tracing is for)")
    p.add_argument("--iters", type=arg(common.positive_int), default=200)
    p.add_argument("--timeout", type=arg(common.positive_float), default=600.0)
    p.add_argument("--json", metavar="OUT", help="write the records as JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    records, failures = [], []
    for size in args.sizes:
        for arena in ("1", "0"):
            with tempfile.TemporaryDirectory(prefix="scalefree-bench-sites-") as tmp:
                out = Path(tmp) / "out.json"
                argv = [sys.executable, "-m", "scalefree_bench._worker_sites", "--bytes", str(size),
                        "--iters", str(args.iters), "--out", str(out)]
                progress(f"sites: {human_bytes(size)}, arena {'on' if arena == '1' else 'off'}")
                o = common.run_job(common.launcher_cmd(2, argv), timeout_s=args.timeout,
                                   env_extra={"SCALEFREE_ARENA": arena})
                if not o.ok or not out.exists():
                    failures.append(f"{human_bytes(size)} arena={arena}: {o.describe()}")
                    continue
                res = json.loads(out.read_text())
            for way in ("dynamic", "static", "ps"):
                its = [r[way] for r in res["rows"] if way in r]
                if not its:
                    continue
                later = [r["send_s"] for r in its[1:]]
                records.append({"bench": BENCH, "way": way, "bytes": size, "arena": arena == "1",
                                "iters": len(its), "copied_first": its[0]["copied"],
                                "copied_later": sum(r["copied"] for r in its[1:]),
                                "median_send_s": statistics.median(later) if later else 0.0,
                                "traced_sites": res["traced_sites"], "peak_rss_bytes": res.get("peak_rss_bytes")})
    print(render(records))
    if args.json:
        common.write_json(args.json, records)
        progress(f"sites: wrote {len(records)} records to {args.json}")
    for f in failures:
        progress(f"sites: FAILED {f}")
    return 1 if failures else 0


def render(records: list[dict]) -> str:
    rows = [[human_bytes(r["bytes"]), r["way"], "on" if r["arena"] else "off", str(r["copied_first"]),
             str(r["copied_later"]), human_time(r["median_send_s"]), str(r["traced_sites"]),
             " / ".join(human_bytes(x) for x in r.get("peak_rss_bytes") or [])] for r in records]
    return common.format_table(["gradient", "way", "arena/tracing", "copied it. 1", "copied it. 2..",
                                "median send (it. 2..)", "sites traced", "peak RSS rank 0 / 1"], rows, left_columns=3)
