"""``scalefree bench onesided``: posted (asynchronous) one-sided writes against blocking ones,
between two simulated hosts (one rank each), in one run.

Per round rank 0 writes ``--window`` blocks of ``--size`` bytes into rank 1's region, then
notifies; rank 1 answers once it has seen the notification, so a round covers the data
landing at the peer. Three ways: ``blocking`` (``Channel.write`` ``window`` times in a
row), ``posted-serial`` (``start_write(...).wait()`` in a row: the posted path without
overlap) and ``posted`` (``window`` ``start_write`` outstanding, then all waited for). The
table gives the median round, the throughput and the ratio of ``posted`` to each of the
others. ``raw-tcp`` (one plain socket) and ``raw-tcp-xW`` (``window`` sockets) move the same
bytes per round with the same one-byte answer, without scalefree: the wire floor of the link
between the two hosts, measured in the same run. Every round runs each way once, in
turn, so a change of the machine's load falls on every way alike. With ``--compute-ms`` each round also runs with about that much numpy work beside the
writes (``blocking+compute``: after them; ``posted+compute``: while they are in flight).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from . import common
from .common import argparse_type as arg, human_bytes, progress

BENCH = "onesided"


def add_parser(sub):
    p = sub.add_parser("onesided", help="posted vs blocking one-sided writes across 2 simulated hosts",
                       description=__doc__, formatter_class=common.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=arg(common.parse_size), default=common.parse_size("1M"), help="bytes per write")
    p.add_argument("--window", type=arg(common.positive_int), default=8, help="writes per round")
    p.add_argument("--rounds", type=arg(common.positive_int), default=50, help="timed rounds per way")
    p.add_argument("--compute-ms", type=arg(common.non_negative_float), default=0.0,
                   help="also time the writes with about this much numpy work beside them (0: not)")
    p.add_argument("--timeout", type=arg(common.positive_float), default=600.0)
    p.add_argument("--json", metavar="OUT", help="write the records as JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from scalefree.launch import simhosts

    why = simhosts.available()
    if why:
        print(f"scalefree bench onesided: simulated hosts are not possible here: {why}", file=sys.stderr)
        return 2
    from . import hosts

    with simhosts.SimHosts(2) as sim, tempfile.TemporaryDirectory(prefix="scalefree-bench-onesided-") as tmp:
        out = Path(tmp) / "ours.json"
        progress(f"onesided: {args.window} x {human_bytes(args.size)} writes per round, {args.rounds} rounds, "
                 "across 2 simulated hosts")
        argv = [sys.executable, "-m", "scalefree_bench._worker_onesided", "--size", str(args.size),
                "--window", str(args.window), "--rounds", str(args.rounds), "--compute-ms", repr(args.compute_ms),
                "--out", str(out)]
        outcome = hosts.run_all(hosts.scalefree_cmds(sim, 1, sim.port(), argv), timeout_s=args.timeout)
        if outcome.returncode != 0 or not out.exists():
            print("scalefree bench onesided: the run failed:\n" + "\n".join(outcome.tail), file=sys.stderr)
            return 1
        res = json.loads(out.read_text())
    records = []
    total = args.size * args.window
    for mode, times in res["modes"].items():
        st = common.Stats.of(times)
        records.append(common.make_record(bench=BENCH, impl="scalefree", variant=mode, ranks=2, hosts=2, nbytes=total,
                                          dtype="u8", stats=st, gbps=total / st.median_s / 1e9, window=args.window,
                                          write_bytes=args.size, transports=res["ucx_transports"],
                                          peak_rss_bytes=res.get("peak_rss_bytes")))
    print(render(records))
    if args.json:
        common.write_json(args.json, records)
        progress(f"onesided: wrote {len(records)} records to {args.json}")
    return 0


def render(records: list[dict]) -> str:
    by = {r["variant"]: r for r in records}
    floor = by.get("raw-tcp")
    rows = []
    for r in records:
        posted = by.get("posted+compute" if r["variant"].endswith("+compute") else "posted")
        ratio = f"{r['median_s'] / posted['median_s']:.2f}x" if posted and r is not posted else ""
        rows.append([r["variant"], f"{r['window']} x {human_bytes(r['write_bytes'])}", common.human_time(r["median_s"]),
                     f"{r['gbps']:.2f}", ratio, f"{r['median_s'] / floor['median_s']:.2f}x" if floor else ""])
    rss = next((r["peak_rss_bytes"] for r in records if r.get("peak_rss_bytes")), None)
    table = common.format_table(["way", "per round", "median round", "GB/s", "posted is faster by", "of raw-tcp's time"],
                                rows, left_columns=2)
    if rss:
        table += "\npeak RSS per rank: " + ", ".join(human_bytes(x) for x in rss)
    return table
