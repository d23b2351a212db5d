"""``scalefree bench pagerank --from-file``: PageRank end to end, from an edge file on disk
to the top scores, as a user runs it: ``scalefree graph pagerank FILE -n P`` against the
single-process scipy pipeline (:mod:`scalefree_bench._pagerank_scipy`: read, CSR build,
power iteration to the same tolerance).

The R-MAT graph is written once by the project's writer (``scalefree graph rmat``) in
three forms: ``.npz`` (int32 src/dst), a SNAP text edge list, and a directory of 8 text
parts. Every row is one whole process tree, timed from start to exit (wall clock, the
Python start-up included); peak RSS is each process's high-water mark (``VmHWM``), the
largest rank's for scalefree. ``top equal``: the top-k vertex ids in the same order as
scipy's. With ``--repeats R`` every row runs R times, interleaved, and the medians are
reported.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .common import human_bytes, human_time, progress

FORMATS = ("npz", "text", "parts")


def add_args(p) -> None:
    arg = common.argparse_type
    p.add_argument("--from-file", action="store_true",
                   help="end to end from an R-MAT file on disk (load + set-up + iterations), "
                        "against scipy's single-process pipeline")
    p.add_argument("--formats", type=arg(lambda s: common.parse_choice_list(s, FORMATS, "format")),
                   default="npz,text,parts", metavar="F[,F...]", help=f"--from-file: file forms among {', '.join(FORMATS)}")
    p.add_argument("--data-dir", type=Path, default=Path("bench-out/graphs"),
                   help="--from-file: where the R-MAT files are written (once) and read")
    p.add_argument("--tol", type=common.argparse_type(common.positive_float), default=1e-9, help="--from-file: L1 tolerance of both pipelines")
    p.add_argument("--top", type=common.argparse_type(common.positive_int), default=10, help="--from-file: top vertices compared with scipy's")
    p.add_argument("--repeats", type=arg(common.positive_int), default=1,
                   help="--from-file: runs of every row (interleaved); medians reported")


def graph_files(args) -> dict[str, Path]:
    """The R-MAT graph of ``args`` in every form asked for, written when missing."""
    from scalefree.graph.rmat import write_rmat

    d = Path(args.data_dir)
    d.mkdir(parents=True, exist_ok=True)
    stem = f"rmat-s{args.rmat_scale}-e{args.rmat_edges}-seed{args.rmat_seed}"
    files = {"npz": d / f"{stem}.npz", "text": d / f"{stem}.txt", "parts": d / f"{stem}-parts"}
    for fmt in args.formats:
        f = files[fmt]
        if f.exists():
            continue
        progress(f"pagerank: writing {f}")
        write_rmat(f, args.rmat_scale, args.rmat_edges, args.rmat_seed, progress=False,
                   parts=8 if fmt == "parts" else 0)
    return {k: files[k] for k in args.formats}


def _run(cmd: list[str], out: Path, timeout: float, env_extra: dict | None = None) -> dict | None:
    if out.exists():
        out.unlink()
    t = time.perf_counter()
    job = common.run_job(cmd, timeout_s=timeout, env_extra=env_extra)
    wall = time.perf_counter() - t
    if job.returncode != 0 or not out.exists():
        progress(f"pagerank: {' '.join(cmd[:6])} ... failed ({'timed out' if job.timed_out else job.returncode})")
        return None
    rec = json.loads(out.read_text())
    rec["wall_s"] = wall
    return rec


def run(args) -> int:
    files = graph_files(args)
    # scipy runs without this machine's OpenBLAS overrides, which slow numpy (see BENCHMARKS.md).
    env_np = {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}
    rows: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        for rep in range(args.repeats):
            for fmt, path in files.items():
                cmd = [sys.executable, "-m", "scalefree_bench._pagerank_scipy", str(path), "--tol", repr(args.tol),
                       "--top", str(args.top), "--json", str(out)]
                progress(f"pagerank: {fmt}: scipy, 1 process (run {rep + 1}/{args.repeats})")
                rec = _run(cmd, out, args.timeout, env_np)
                if rec is not None:
                    rows.setdefault(("scipy", fmt, 1), []).append(rec)
                for nr in args.ranks:
                    cmd = [sys.executable, "-m", "scalefree.cli", "graph", "pagerank", str(path), "-n", str(nr),
                           "--tol", repr(args.tol), "--top", str(args.top), "--json", str(out)]
                    progress(f"pagerank: {fmt}: scalefree, {nr} ranks (run {rep + 1}/{args.repeats})")
                    rec = _run(cmd, out, args.timeout)
                    if rec is not None:
                        rows.setdefault(("scalefree", fmt, nr), []).append(rec)
    records = []
    for (impl, fmt, nr), recs in rows.items():
        med = {k: statistics.median(r[k] for r in recs) for k in ("wall_s", "load_s") if all(k in r for r in recs)}
        for k in ("setup_s", "iterate_s"):
            if all(r.get(k) is not None for r in recs):
                med[k] = statistics.median(r[k] for r in recs)
        records.append({"bench": "pagerank-e2e", "impl": impl, "format": fmt, "ranks": nr,
                        "graph": f"rmat-s{args.rmat_scale}-e{args.rmat_edges}", "edges": recs[0]["edges"],
                        "vertices": recs[0]["vertices"], "iterations": recs[0]["iterations"],
                        "peak_rss_max_bytes": max(max(r["peak_rss_bytes"]) for r in recs),
                        "peak_rss_bytes": recs[-1]["peak_rss_bytes"], "top": recs[-1]["top"],
                        "runs": len(recs), "wall_runs_s": [r["wall_s"] for r in recs], **med})
    for r in records:
        ref = next((s for s in records if s["impl"] == "scipy" and s["format"] == r["format"]), None)
        if ref is not None:
            r["speedup_vs_scipy"] = ref["wall_s"] / r["wall_s"]
            r["top_equal"] = [v for v, _ in r["top"]] == [v for v, _ in ref["top"]]
        one = next((s for s in records if s["impl"] == r["impl"] and s["format"] == r["format"] and s["ranks"] == 1), None)
        if one is not None and r["impl"] == "scalefree":
            r["load_vs_1_rank"] = r["load_s"] / one["load_s"] if one["load_s"] else None
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    bad = [r for r in records if r.get("top_equal") is False]
    for r in bad:
        progress(f"pagerank: {r['impl']} {r['format']} {r['ranks']} ranks: top-{args.top} differs from scipy's")
    return 1 if bad or not records else 0


def print_table(records: list[dict]) -> None:
    head = ["format", "impl", "ranks", "end to end", "load", "set-up", "iterate", "iters", "peak RSS (max rank)",
            "vs scipy", "load vs 1 rank", "top equal"]
    rows = []
    for r in sorted(records, key=lambda r: (FORMATS.index(r["format"]), r["impl"] != "scipy", r["ranks"])):
        rows.append([r["format"], r["impl"], str(r["ranks"]), human_time(r["wall_s"]), human_time(r["load_s"]),
                     human_time(r["setup_s"]) if "setup_s" in r else "",
                     human_time(r["iterate_s"]) if "iterate_s" in r else "", str(r["iterations"]),
                     human_bytes(r["peak_rss_max_bytes"]),
                     f"{r['speedup_vs_scipy']:.2f}x" if "speedup_vs_scipy" in r else "",
                     f"{r['load_vs_1_rank']:.2f}" if r.get("load_vs_1_rank") is not None else "",
                     {True: "yes", False: "NO"}.get(r.get("top_equal"), "")])
    print(common.format_table(head, rows, left_columns=2))
