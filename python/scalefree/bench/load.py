"""``scalefree bench load``: loading one R-MAT graph as users hold it, with ``scalefree graph
pagerank FILE -n P``: a SNAP text edge list (the peer), a CSV part directory as Spark writes it
(``part-*.csv`` with a ``src,dst`` header each, ``_SUCCESS``), and Parquet with several row
groups (snappy, as Spark and pyarrow write it by default).

The text is written by ``scalefree graph rmat``; the CSV parts and the Parquet file from it
with pyarrow (CSV read multi-threaded, once, outside the timed runs). Every row is one whole
``graph pagerank`` job; its ``--json`` gives the load time (every rank reads its share,
the owners drop duplicates), the iterations, the peak RSS of every rank and the top vertices.
``load vs text``: the text row's load time over this row's (above 1: faster). ``top equal``:
the top-k ids, in order, are the text row's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .common import human_bytes, human_time, progress

FORMATS = ("text", "csv-parts", "parquet")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("load", help="graph input as users hold it: SNAP text vs CSV part directory vs Parquet",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(common.positive_int), default=4, help="ranks of every pagerank job")
    p.add_argument("--scale", type=arg(common.positive_int), default=24, help="R-MAT: 2**scale vertex ids")
    p.add_argument("--edges", type=arg(common.parse_size), default="65000000", help="R-MAT: edges generated")
    p.add_argument("--seed", type=int, default=1, help="R-MAT seed")
    p.add_argument("--formats", type=arg(lambda s: common.parse_choice_list(s, FORMATS, "format")),
                   default=",".join(FORMATS), metavar="F[,F...]", help=f"among {', '.join(FORMATS)}")
    p.add_argument("--parts", type=arg(common.positive_int), default=8, help="CSV parts")
    p.add_argument("--row-group", type=arg(common.parse_size), default="4M", help="Parquet rows per row group")
    p.add_argument("--data-dir", type=Path, default=Path("bench-out/load"), help="where the files are written (once)")
    p.add_argument("--max-iter", type=arg(common.positive_int), default=20, help="PageRank iterations")
    p.add_argument("--top", type=arg(common.positive_int), default=10, help="top vertices compared")
    p.add_argument("--repeats", type=arg(common.positive_int), default=1, help="runs of every row (interleaved), medians")
    p.add_argument("--timeout", type=arg(common.positive_float), default=1800.0, metavar="SECONDS")
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def graph_files(args) -> dict[str, Path]:
    """The graph in every form asked for, written when missing (the text first)."""
    from scalefree.graph.rmat import write_rmat

    d = Path(args.data_dir)
    d.mkdir(parents=True, exist_ok=True)
    stem = f"rmat-s{args.scale}-e{args.edges}-seed{args.seed}"
    text = d / f"{stem}.txt"
    files = {"text": text, "csv-parts": d / f"{stem}-csv", "parquet": d / f"{stem}-rg{args.row_group}.parquet"}
    if not text.exists():
        progress(f"load: writing {text}")
        write_rmat(text, args.scale, args.edges, args.seed, progress=False)
    todo = [f for f in args.formats if f != "text" and not files[f].exists()]
    if todo:
        import pyarrow as pa
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq

        progress(f"load: reading {text} with pyarrow to write {', '.join(todo)}")
        table = pcsv.read_csv(text, read_options=pcsv.ReadOptions(column_names=["src", "dst"]),
                              parse_options=pcsv.ParseOptions(delimiter=" "),
                              convert_options=pcsv.ConvertOptions(column_types={"src": pa.int64(), "dst": pa.int64()}))
        if "parquet" in todo:
            tmp = files["parquet"].with_name(files["parquet"].name + ".tmp")
            pq.write_table(table, tmp, row_group_size=args.row_group, compression="snappy")
            tmp.rename(files["parquet"])
        if "csv-parts" in todo:
            tmp = files["csv-parts"].with_name(files["csv-parts"].name + ".tmp")
            tmp.mkdir(exist_ok=True)
            m = table.num_rows
            for k in range(args.parts):
                lo, hi = m * k // args.parts, m * (k + 1) // args.parts
                pcsv.write_csv(table.slice(lo, hi - lo), tmp / f"part-{k:05d}-{stem}.csv",
                               pcsv.WriteOptions(quoting_style="none"))
            (tmp / "_SUCCESS").write_bytes(b"")
            tmp.rename(files["csv-parts"])
        del table
    return {f: files[f] for f in args.formats}


def _run(cmd: list[str], out: Path, timeout: float) -> dict | None:
    if out.exists():
        out.unlink()
    t = time.perf_counter()
    job = common.run_job(cmd, timeout_s=timeout)
    wall = time.perf_counter() - t
    if job.returncode != 0 or not out.exists():
        progress(f"load: {' '.join(cmd[3:7])} ... failed ({'timed out' if job.timed_out else job.returncode})")
        return None
    rec = json.loads(out.read_text())
    rec["wall_s"] = wall
    return rec


def run(args) -> int:
    files = graph_files(args)
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        for rep in range(args.repeats):
            for fmt, path in files.items():
                cmd = [sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(path), "-n", str(args.ranks),
                       "-q", "--max-iter", str(args.max_iter), "--top", str(args.top), "--json", str(out)]
                progress(f"load: {fmt}: {args.ranks} ranks (run {rep + 1}/{args.repeats})")
                rec = _run(cmd, out, args.timeout)
                if rec is not None:
                    rows.setdefault(fmt, []).append(rec)
    records = []
    for fmt, recs in rows.items():
        path = files[fmt]
        size = sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
        records.append({"bench": "load", "format": fmt, "ranks": args.ranks, "file_bytes": size,
                        "graph": f"rmat-s{args.scale}-e{args.edges}-seed{args.seed}", "edges": recs[0]["edges"],
                        "vertices": recs[0]["vertices"], "iterations": recs[0]["iterations"],
                        "load_s": statistics.median(r["load_s"] for r in recs),
                        "wall_s": statistics.median(r["wall_s"] for r in recs),
                        "load_runs_s": [r["load_s"] for r in recs],
                        "peak_rss_bytes": recs[-1]["peak_rss_bytes"],
                        "peak_rss_max_bytes": max(max(r["peak_rss_bytes"]) for r in recs),
                        "top": recs[-1]["top"], "runs": len(recs)})
    ref = next((r for r in records if r["format"] == "text"), None)
    for r in records:
        if ref is not None:
            r["load_vs_text"] = ref["load_s"] / r["load_s"] if r["load_s"] else None
            r["top_equal"] = [v for v, _ in r["top"]] == [v for v, _ in ref["top"]]
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    bad = [r for r in records if r.get("top_equal") is False]
    for r in bad:
        progress(f"load: {r['format']}: top-{args.top} differs from the text's")
    return 1 if bad or len(records) < len(files) else 0


def print_table(records: list[dict]) -> None:
    head = ["format", "ranks", "file", "load", "load vs text", "end to end", "iters", "peak RSS per rank", "top equal"]
    rows = []
    for r in sorted(records, key=lambda r: FORMATS.index(r["format"])):
        rows.append([r["format"], str(r["ranks"]), human_bytes(r["file_bytes"]), human_time(r["load_s"]),
                     f"{r['load_vs_text']:.2f}x" if r.get("load_vs_text") else "", human_time(r["wall_s"]),
                     str(r["iterations"]), " ".join(human_bytes(x) for x in r["peak_rss_bytes"]),
                     {True: "yes", False: "NO"}.get(r.get("top_equal"), "")])
    print(common.format_table(head, rows, left_columns=1))
