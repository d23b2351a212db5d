"""``scalefree bench mf --vs memory-budget --mode local``: ``local`` mode in memory and with
``--memory-budget`` = ``--budget-fraction`` of its training records (the grid's blocks on
flash, read through the flash runtime's program cache), beside LIBMF's official ``mf-train``
in memory and with ``--disk`` (its disk-level training), all in the same run.

Both sides read the same split files from disk: the data set (``--data``, else the seeded
synthetic matrix of ``--users`` × ``--items`` with ``--ratings``) split once (seeded, 90/10) into
a training and a test file in LIBMF's text format. Runs are interleaved, ``--repeat`` rounds of
(ours in memory, ours budgeted, LIBMF, LIBMF ``--disk``); with ``--cold`` the page cache is
dropped before every run (our budgeted blocks are read with O_DIRECT either way). Ours: the
training seconds ``mf train`` reports (set-up excluded), the test RMSE after the last
iteration, the process's peak RSS (GNU time), the cache's peak bytes, bytes read (and their
rate over the training time), seconds waited for reads (summed over the threads) and the
blocks each pass takes over from the one before ("carried", not read again; the last round's). ``--users``/``--items``/``--ratings`` size the synthetic matrix: the default
2M ratings (20.6 MiB of training records, 20 × 20 blocks of ~56 KiB: a pass takes ~14 ms in
memory, so the budgeted run measures per-read latency) or e.g. 20M over 200,000 × 200,000
(~205 MiB, blocks of ~0.5 MiB: streaming), written by the bench into its temporary directory. LIBMF: training seconds = (wall of ``-t N`` − wall of ``-t 1``)·N/(N − 1),
which leaves out its loading and (with ``--disk``) the writing of its buffer file, its
``mf-predict`` test RMSE, its peak RSS.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import common

BENCH = "mf"


@dataclass
class Helpers:
    """What this bench shares with ``mf.py`` (which imports this module): running a child with
    its wall time and peak RSS, the split files, the data files, the child's environment."""

    wall_rss: Callable
    split_files: Callable
    data_files: Callable
    child_env: dict


def _ours(h: Helpers, args, tr: Path, te: Path, d: Path, budget: int | None) -> dict:
    """One ``scalefree mf train --mode local`` run from the split files."""
    out = d / "ours.jsonl"
    cmd = [sys.executable, "-m", "scalefree.cli", "mf", "train", str(tr), "--test", str(te), "--mode", "local",
           "-t", str(args.threads), "-k", str(args.k), "--lam", repr(args.lam), "--eta", repr(args.eta),
           "-i", str(args.iterations), "--seed", str(args.seed), "--eval-every", "0", "--json", str(out), "-q"]
    if budget is not None:
        cmd += ["--memory-budget", str(budget), "--block-dir", str(d)]
    wall, rss, _ = h.wall_rss(cmd, timeout=3600, env=h.child_env)
    last = [json.loads(line) for line in out.read_text().splitlines()][-1]
    return {"train_s": last["seconds"], "wall_s": wall, "test_rmse": last["test_rmse"], "peak_rss_bytes": rss,
            "rating_bytes_resident": last.get("rating_bytes_resident"), "bytes_read": last.get("bytes_read"),
            "preload_wait_seconds": last.get("preload_wait_seconds"), "carried_blocks": last.get("carried_blocks")}


def _libmf(h: Helpers, args, tr: Path, te: Path, d: Path, disk: bool) -> dict:
    """One pair of LIBMF ``mf-train`` runs (``-t 1``, ``-t N``) and ``mf-predict``."""
    bin_dir = Path(args.libmf_bin)
    model = d / "libmf.model"
    base = [str(bin_dir / "mf-train"), "-f", "0", "-k", str(args.k), "-l1", "0", "-l2", repr(args.lam),
            "-r", repr(args.eta), "-s", str(args.threads), *(["--disk"] if disk else [])]
    n = args.iterations
    walls, rss = {}, 0
    for t in (1, n):
        walls[t], r, _ = h.wall_rss([*base, "-t", str(t), "--quiet", str(tr), str(model)], timeout=3600)
        rss = max(rss, r or 0)
    _, _, out = h.wall_rss([str(bin_dir / "mf-predict"), "-e", "0", str(te), str(model), str(d / "libmf.pred")])
    return {"train_s": (walls[n] - walls[1]) * n / (n - 1), "wall_s": walls[n],
            "test_rmse": float(out.strip().split("=")[-1]), "peak_rss_bytes": rss}


def run(args, h: Helpers) -> int:
    if args.iterations < 2:
        raise SystemExit("--vs memory-budget --mode local needs --iterations >= 2 (LIBMF's time is a difference)")
    libmf = args.libmf_bin is not None
    if libmf and not (Path(args.libmf_bin) / "mf-train").exists():
        raise SystemExit(f"--libmf-bin {args.libmf_bin}: no mf-train there")
    cache = common.PageCache(args.cold, BENCH)
    records, rows = [], []
    with tempfile.TemporaryDirectory(prefix="scalefree-bench-mf-local-") as dd:
        d = Path(dd)
        for f in h.data_files(args, dd):
            tr, te, n_tr, n_te = h.split_files(f, args.seed, d)
            data = n_tr * 12  # the training records, as the trainer holds them
            budget = int(args.budget_fraction * data)
            variants = [("scalefree", "memory", lambda: _ours(h, args, tr, te, d, None)),
                        ("scalefree", "budget", lambda: _ours(h, args, tr, te, d, budget))]
            if libmf:
                variants += [("libmf", "memory", lambda: _libmf(h, args, tr, te, d, False)),
                             ("libmf", "disk", lambda: _libmf(h, args, tr, te, d, True))]
            runs: dict[tuple, list] = {(impl, v): [] for impl, v, _ in variants}
            for rep in range(args.repeat):
                for impl, v, fn in variants:
                    common.progress(f"{f.name}: {impl} {v} ({rep + 1}/{args.repeat}) ...")
                    cache.drop()
                    runs[(impl, v)].append(fn())
            for (impl, v), rs in runs.items():
                times = [r["train_s"] for r in rs]
                rec = {"bench": BENCH, "vs": "memory-budget", "mode": "local", "impl": impl, "variant": v,
                       "data": f.name, "train": n_tr, "test": n_te, "k": args.k, "lam": args.lam,
                       "iterations": args.iterations, "threads": args.threads, "rating_bytes": data,
                       "memory_budget": budget if (impl, v) == ("scalefree", "budget") else None,
                       "page_cache": cache.state, "median_s": float(np.median(times)), "times": times,
                       "test_rmse": float(np.median([r["test_rmse"] for r in rs])),
                       "test_rmse_all": [r["test_rmse"] for r in rs],
                       "peak_rss_bytes": max(r["peak_rss_bytes"] or 0 for r in rs), "runs": rs}
                records.append(rec)
            for impl in ("scalefree", "libmf"):
                mem = next((r for r in records if r["data"] == f.name and r["impl"] == impl and r["variant"] == "memory"), None)
                for r in records:
                    if r["data"] == f.name and r["impl"] == impl and mem is not None:
                        r["ratio_vs_memory"] = r["median_s"] / mem["median_s"]
            for r in (r for r in records if r["data"] == f.name):
                last = r["runs"][-1]
                rows.append([f.name, r["impl"], r["variant"],
                             "-" if r["memory_budget"] is None else f"{r['memory_budget'] / 2**20:.1f}",
                             "-" if last.get("rating_bytes_resident") is None else f"{last['rating_bytes_resident'] / 2**20:.1f}",
                             " ".join(f"{t:.3f}" for t in r["times"]), f"{r['median_s']:.3f}",
                             f"{r.get('ratio_vs_memory', float('nan')):.2f}",
                             "-" if last.get("preload_wait_seconds") is None else f"{last['preload_wait_seconds']:.3f}",
                             "-" if last.get("carried_blocks") is None else str(last["carried_blocks"]),
                             "-" if last.get("bytes_read") is None else f"{last['bytes_read'] / 1e6:.0f}",
                             "-" if last.get("bytes_read") is None else f"{last['bytes_read'] / 1e6 / last['train_s']:.0f}",
                             f"{r['peak_rss_bytes'] / 2**20:.0f}", f"{r['test_rmse']:.5f}"])
    print(common.format_table(["data", "impl", "variant", "budget MiB", "held MiB (max)", "train s (runs)",
                               "train s (median)", "x memory", "IO wait s", "carried", "read MB", "read MB/s", "peak RSS MiB", "test RMSE"],
                              rows, left_columns=3))
    print(f"page cache: {cache.state}")
    for f in sorted({r["data"] for r in records}):
        mem, bud = (next(r for r in records if r["data"] == f and r["impl"] == "scalefree" and r["variant"] == v)
                    for v in ("memory", "budget"))
        print(f"{f}: local at budget {args.budget_fraction:g} of {mem['rating_bytes'] / 2**20:.1f} MiB training "
              f"records: time {bud['median_s'] / mem['median_s']:.2f}x in-memory, test RMSE "
              f"{bud['test_rmse']:.5f} vs {mem['test_rmse']:.5f} ({bud['test_rmse'] - mem['test_rmse']:+.1e})")
    if getattr(args, "json", None):
        common.write_json(args.json, records)
    return 0
