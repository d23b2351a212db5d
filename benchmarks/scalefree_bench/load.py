"""``scalefree bench load FILE [FILE...]``: graph load time by input format and rank count.

Every row is ``scalefree graph pagerank FILE -n P --max-iter 1 --json OUT`` (one whole
process tree) and reports the job's ``load_s`` — read every rank's share of the file, send
each edge to its owner, drop duplicates — with the peak RSS of the largest rank; the
PageRank iteration is cut to one. ``read`` is the part of the load spent reading and parsing
the shares (the slowest rank's), before the edges go to their owners. The inputs are given as arguments (any input the graph
commands read: a SNAP text edge list, its ``.gz`` as one gzip stream or as several members
(``scalefree graph convert g.txt g.txt.gz``), a part directory, Parquet or Arrow IPC
(``graph convert g.txt g.parquet``), ...), so the rows compare
formats of one graph; ``vs 1 rank`` is the load time at 1 rank of the same file over this
row's (a speed-up when above 1), ``vs first`` the first file's load time at the same rank
count over this row's. ``dedup``: how the duplicates were dropped — ``exchange`` (every edge
sent to the rank its hash owns) or ``sorted`` (an input written sorted, ``graph convert
--sort``: every rank keeps the run it read). On the exchange path ``exchange`` is the
grouping of the edges by owner and the ``alltoallv``, ``sort`` the owners' sort and
deduplication (each the slowest rank's). ``top equal``: the top-10 vertices agree with the first file's at the
same rank count. With ``--repeats R`` every row runs R times, interleaved, and the medians
are reported.

    scalefree graph rmat g.txt --scale 22 --edges 65M
    scalefree graph convert g.txt g.txt.gz
    scalefree graph convert g.txt g.parquet --row-group 4M
    flock /tmp/bench.lock scalefree bench load g.txt g.txt.gz g.parquet -n 1,2,4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import human_bytes, human_time, progress
from .pagerank_e2e import _run  # one JSON-reporting job, timed


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("load", help="graph load time by input format (text, gz, parts, ...) and rank count",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("files", nargs="+", type=Path, help="edge inputs (files or part directories) of one graph")
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")), default="1,2,4",
                   metavar="N[,N...]", help="rank counts to run (default 1,2,4)")
    p.add_argument("--repeats", type=arg(common.positive_int), default=1, help="runs of every row (medians reported)")
    p.add_argument("--timeout", type=arg(common.positive_float), default=3600.0, help="seconds per run")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the records as a JSON array")
    p.set_defaults(func=run)
    return p


def describe(path: Path) -> str:
    """What the input is: text, gz (one stream / N members / BGZF), parts (N)."""
    if path.is_dir():
        from scalefree import _native

        parts = _native.resolve_parts(str(path))
        kinds = sorted({describe(Path(p)) for p in parts})
        return f"parts ({len(parts)}: {', '.join(kinds)})"
    with open(path, "rb") as f:
        head = f.read(18)
    if head[:4] == b"PAR1":
        import pyarrow.parquet as pq

        return f"parquet ({pq.ParquetFile(path).num_row_groups} row groups)"
    if head[:6] == b"ARROW1":
        import pyarrow as pa

        with pa.memory_map(str(path)) as f:
            return f"arrow ({pa.ipc.open_file(f).num_record_batches} batches)"
    if head[:2] != b"\x1f\x8b":
        return "text"
    if len(head) >= 16 and head[3] & 4 and head[12:14] == b"BC":
        return "gz (BGZF)"
    data = path.read_bytes() if path.stat().st_size < (64 << 20) else None
    if data is None:
        # A large file: a second member within the first 64 MiB says several members.
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    members = data.count(b"\x1f\x8b\x08\x00") + data.count(b"\x1f\x8b\x08\x08")
    return "gz (one stream)" if members <= 1 else "gz (members)"


def run(args) -> int:
    for f in args.files:
        if not f.exists():
            progress(f"load: {f}: no such file or directory")
            return 2
    kinds = {str(f): describe(f) for f in args.files}
    rows: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        for rep in range(args.repeats):
            for f in args.files:
                for nr in args.ranks:
                    progress(f"load: {f} ({kinds[str(f)]}), {nr} ranks (run {rep + 1}/{args.repeats})")
                    cmd = [sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(f), "-n", str(nr),
                           "--max-iter", "1", "--top", "10", "--json", str(out), "-q"]
                    rec = _run(cmd, out, args.timeout)
                    if rec is not None:
                        rows.setdefault((str(f), nr), []).append(rec)
    records = []
    for (f, nr), recs in rows.items():
        records.append({"bench": "load", "file": f, "format": kinds[f], "ranks": nr, "edges": recs[0]["edges"],
                        "load_s": statistics.median(r["load_s"] for r in recs),
                        "read_s": statistics.median(r.get("read_s", float("nan")) for r in recs),
                        "exchange_s": statistics.median(r.get("exchange_s", float("nan")) for r in recs),
                        "sort_s": statistics.median(r.get("sort_s", float("nan")) for r in recs),
                        "wall_s": statistics.median(r["wall_s"] for r in recs),
                        "load_runs_s": [r["load_s"] for r in recs],
                        "peak_rss_bytes": recs[-1]["peak_rss_bytes"],
                        "peak_rss_max_bytes": max(max(r["peak_rss_bytes"]) for r in recs),
                        "top": [v for v, _ in recs[-1]["top"]], "runs": len(recs),
                        "dedup_path": recs[-1].get("dedup_path", "")})
    first = str(args.files[0])
    for r in records:
        one = next((s for s in records if s["file"] == r["file"] and s["ranks"] == 1), None)
        if one is not None:
            r["load_vs_1_rank"] = one["load_s"] / r["load_s"]
        ref = next((s for s in records if s["file"] == first and s["ranks"] == r["ranks"]), None)
        if ref is not None:
            r["load_vs_first"] = ref["load_s"] / r["load_s"]
            r["read_vs_first"] = ref["read_s"] / r["read_s"]
            r["top_equal"] = r["top"] == ref["top"]
    print_table(records, [str(f) for f in args.files])
    if args.json:
        common.write_json(args.json, records)
    bad = [r for r in records if r.get("top_equal") is False]
    for r in bad:
        progress(f"load: {r['file']} at {r['ranks']} ranks: the top-10 differs from {first}'s")
    return 1 if bad or not records else 0


def print_table(records: list[dict], order: list[str]) -> None:
    head = ["file", "format", "ranks", "load", "vs 1 rank", "vs first", "read", "read vs first", "dedup", "exchange",
            "sort", "end to end", "peak RSS per rank", "top equal"]
    rows = []
    for r in sorted(records, key=lambda r: (order.index(r["file"]), r["ranks"])):
        rows.append([Path(r["file"]).name, r["format"], str(r["ranks"]), human_time(r["load_s"]),
                     f"{r['load_vs_1_rank']:.2f}x" if "load_vs_1_rank" in r else "",
                     f"{r['load_vs_first']:.2f}x" if "load_vs_first" in r else "",
                     human_time(r["read_s"]), f"{r['read_vs_first']:.2f}x" if "read_vs_first" in r else "",
                     r.get("dedup_path", ""), _time_or_blank(r.get("exchange_s")), _time_or_blank(r.get("sort_s")),
                     human_time(r["wall_s"]), " ".join(human_bytes(x) for x in r["peak_rss_bytes"]),
                     {True: "yes", False: "NO"}.get(r.get("top_equal"), "")])
    print(common.format_table(head, rows, left_columns=2))


def _time_or_blank(s) -> str:
    return "" if s is None or s != s else human_time(s)  # NaN: not on the exchange path
