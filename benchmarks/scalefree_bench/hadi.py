"""``scalefree bench hadi GRAPH [GRAPH...]``: HADI's neighbourhood function by method, graph
and rank count: N(h) against the exact one where that is affordable, time per hop, peak RSS
per rank.

Every row is one ``scalefree graph diameter GRAPH -n P --method M ... --json OUT`` job (one
whole process tree). Methods: ``exact`` (bitsets), ``fm`` (Flajolet-Martin, 32 strings),
``hll`` (HyperLogLog registers with the sampled-target bits, the defaults), ``hll:p=P`` /
``hll:s=S`` / ``hll:p=P:s=S`` (precision P, S sampled targets; ``s=0``: registers alone).
``--seeds`` runs the estimators with several hash seeds (``--fm-seed``), so an error is
not one seed's luck. The reference is the ``exact`` row of the same graph (run first, at
the first rank count) or ``--reference GRAPH=RECORD.json`` (an earlier ``graph diameter
--method exact --json`` record of that graph). ``max err`` is the largest
``|N(h)/exact(h) - 1|`` over every hop (a method that stops early keeps its last value),
``sd bound`` the largest bound on N(h)'s standard deviation over N(h) the job reported
(``hll``), ``ms/hop`` the median hop, ``peak RSS`` the largest rank's ``VmHWM``.

``--baseline NAME=PYTHONPATH`` runs every estimator row a second time with another tree's
code (``PYTHONPATH`` set to it: ``main=/work/main/python:/work/main/benchmarks`` is the main
branch's), and ``--repeats R`` runs each row ``R`` times, the two codes alternating, so both
see the same machine; a last table gives per code the median ms/hop and the largest peak
RSS over the runs, and this code's over the baseline's (below 1: this code is faster or
smaller).

    scalefree graph rmat r15.npz --scale 15 --edges 1M --seed 1
    flock /tmp/bench.lock scalefree bench hadi wiki-Vote.txt r15.npz -n 2 --methods exact,hll,hll:s=0,fm --seeds 0,1,2
    flock /tmp/bench.lock scalefree bench hadi rmat22_64m.npz -n 4 --methods hll --repeats 3 \
        --baseline main=/work/main/python:/work/main/benchmarks
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import human_bytes, progress
from .pagerank_e2e import _run  # one JSON-reporting job, timed


def parse_method(text: str) -> dict:
    """``exact``, ``fm``, ``hll``, ``hll:p=8:s=4096`` -> {"method", "precision"?, "sample"?}."""
    name, *opts = text.split(":")
    if name not in ("exact", "fm", "hll"):
        raise ValueError(f"method must be exact, fm or hll[:p=P][:s=S], got {text!r}")
    spec: dict = {"method": name, "label": text}
    for o in opts:
        key, _, value = o.partition("=")
        if name != "hll" or key not in ("p", "s") or not value.isdigit():
            raise ValueError(f"{text!r}: options are hll:p=P and hll:s=S (integers)")
        spec["precision" if key == "p" else "sample"] = int(value)
    return spec


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("hadi", help="HADI: N(h) against exact, ms/hop and peak RSS by method, graph and rank count",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__)
    arg = common.argparse_type
    p.add_argument("graphs", nargs="+", type=Path, help="edge inputs (any format the graph commands read)")
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")), default="2",
                   metavar="N[,N...]", help="rank counts to run (default 2)")
    p.add_argument("--methods", type=arg(lambda s: [parse_method(x) for x in s.split(",")]), default="exact,hll",
                   help="comma-separated: exact, fm, hll, hll:p=P, hll:s=S, hll:p=P:s=S (default exact,hll)")
    p.add_argument("--seeds", type=arg(lambda s: common.parse_int_list(s, "seed", minimum=0)), default="0",
                   metavar="S[,S...]", help="hash seeds of the estimators (default 0)")
    p.add_argument("--reference", action="append", default=[], metavar="GRAPH=RECORD.json",
                   help="the exact N(h) of GRAPH from an earlier `graph diameter --method exact --json` record")
    p.add_argument("--undirected", action="store_true", help="follow edges both ways")
    p.add_argument("--repeats", type=arg(common.positive_int), default=1,
                   help="runs of every estimator row (interleaved with --baseline's)")
    p.add_argument("--baseline", type=arg(parse_baseline), metavar="NAME=PYTHONPATH",
                   help="also run every estimator row with this PYTHONPATH (another tree's code), alternating")
    p.add_argument("--timeout", type=arg(common.positive_float), default=3600.0, help="seconds per run")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the records as a JSON array")
    p.set_defaults(func=run)
    return p


def parse_baseline(text: str) -> tuple[str, str]:
    """``NAME=PYTHONPATH`` -> (name, pythonpath); every directory of the path must exist."""
    name, _, path = text.partition("=")
    if not name or not path:
        raise ValueError(f"--baseline: expected NAME=PYTHONPATH, got {text!r}")
    missing = [d for d in path.split(":") if d and not Path(d).is_dir()]
    if missing:
        raise ValueError(f"--baseline {text}: no such directory {missing[0]}")
    return name, path


def max_relative_error(nf: list[float], exact: list[float]) -> tuple[float, int]:
    """(largest |nf[h] / exact[h] - 1| over the hops of either, the hop): the shorter list
    keeps its last value (N(h) stays once no set grows)."""
    hops = max(len(nf), len(exact))
    worst, at = 0.0, 0
    for h in range(hops):
        a, b = nf[min(h, len(nf) - 1)], exact[min(h, len(exact) - 1)]
        err = abs(a / b - 1) if b else (0.0 if a == 0 else float("inf"))
        if err > worst:
            worst, at = err, h
    return worst, at


def run(args) -> int:
    refs: dict[str, list[float]] = {}
    for r in args.reference:
        graph, _, path = r.partition("=")
        if not path:
            progress(f"hadi: --reference {r}: expected GRAPH=RECORD.json")
            return 2
        refs[str(Path(graph))] = json.loads(Path(path).read_text())["neighbourhood"]
    for g in args.graphs:
        if not g.exists():
            progress(f"hadi: {g}: no such file or directory")
            return 2
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        # exact first: the reference of the rows after it
        for g in args.graphs:
            for spec in sorted(args.methods, key=lambda s: s["method"] != "exact"):
                exact = spec["method"] == "exact"
                seeds = [0] if exact else args.seeds
                ranks = args.ranks[:1] if exact else args.ranks
                codes = [("this", None)] + ([args.baseline] if args.baseline and not exact else [])
                for nr, seed, rep, (code, pythonpath) in itertools.product(
                        ranks, seeds, range(1 if exact else args.repeats), codes):
                    progress(f"hadi: {g.name}: {spec['label']}, {nr} ranks, seed {seed}, code {code}"
                             + (f", run {rep + 1}/{args.repeats}" if args.repeats > 1 else ""))
                    cmd = [sys.executable, "-m", "scalefree.cli", "graph", "diameter", str(g), "-n", str(nr),
                           "--method", spec["method"], "--fm-seed", str(seed), "--json", str(out), "-q"]
                    if "precision" in spec:
                        cmd += ["--precision", str(spec["precision"])]
                    if "sample" in spec:
                        cmd += ["--sample", str(spec["sample"])]
                    if args.undirected:
                        cmd.append("--undirected")
                    rec = _run(cmd, out, args.timeout, None if pythonpath is None else {"PYTHONPATH": pythonpath})
                    if rec is None:
                        continue
                    rec.update(bench="hadi", graph=str(g), label=spec["label"], seed=seed, code=code, run=rep + 1)
                    if spec["method"] == "exact":
                        refs.setdefault(str(g), rec["neighbourhood"])
                    ref = refs.get(str(g))
                    if ref is not None:
                        rec["max_rel_error"], rec["max_rel_error_hop"] = max_relative_error(rec["neighbourhood"],
                                                                                            ref)
                    if rec.get("sd_bound"):
                        rec["max_sd_bound"] = max(sd / v for sd, v in zip(rec["sd_bound"], rec["neighbourhood"])
                                                  if v)
                    records.append(rec)
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    return 0 if records else 1


def print_table(records: list[dict]) -> None:
    head = ["graph", "method", "code", "ranks", "seed", "run", "hops", "eff. diam.", "max err", "at hop", "sd bound",
            "ms/hop", "peak RSS (max rank)"]
    rows = []
    for r in records:
        rows.append([Path(r["graph"]).name, r["label"], r.get("code", "this"), str(r["ranks"]), str(r["seed"]),
                     str(r.get("run", 1)),
                     str(len(r["neighbourhood"]) - 1), f"{r['effective_diameter_interpolated']:.3f}",
                     f"{100 * r['max_rel_error']:.2f} %" if "max_rel_error" in r else "",
                     str(r.get("max_rel_error_hop", "")),
                     f"{100 * r['max_sd_bound']:.2f} %" if "max_sd_bound" in r else "",
                     f"{1e3 * r['per_hop_s']:.0f}", human_bytes(max(r["peak_rss_bytes"]))])
    print(common.format_table(head, rows, left_columns=3))
    by = {}
    for r in records:
        if "max_rel_error" in r and r["method"] != "exact":
            by.setdefault((Path(r["graph"]).name, r["label"], r["ranks"]), []).append(r["max_rel_error"])
    for (g, label, nr), errs in by.items():
        if len(errs) > 1:
            print(f"{g} {label} {nr} ranks: max err over {len(errs)} seeds {100 * max(errs):.2f} %, "
                  f"median {100 * statistics.median(errs):.2f} %")
    codes: dict[tuple, dict[str, list[dict]]] = {}
    for r in records:
        if r["method"] != "exact":
            codes.setdefault((Path(r["graph"]).name, r["label"], r["ranks"], r["seed"]), {}).setdefault(
                r.get("code", "this"), []).append(r)
    compared = [(k, v) for k, v in codes.items() if len(v) > 1 or any(len(runs) > 1 for runs in v.values())]
    if compared:
        head = ["graph", "method", "ranks", "seed", "code", "runs", "ms/hop (median)", "peak RSS (max)",
                "ms/hop this/code", "RSS this/code"]
        rows = []
        for (g, label, nr, seed), by in compared:
            this = by.get("this")
            for code, runs in by.items():
                hop = statistics.median(r["per_hop_s"] for r in runs)
                rss = max(max(r["peak_rss_bytes"]) for r in runs)
                ratio_t = ratio_m = ""
                if this and code != "this":
                    ratio_t = f"{statistics.median(r['per_hop_s'] for r in this) / hop:.2f}x"
                    ratio_m = f"{max(max(r['peak_rss_bytes']) for r in this) / rss:.2f}x"
                rows.append([g, label, str(nr), str(seed), code, str(len(runs)), f"{1e3 * hop:.0f}", human_bytes(rss),
                             ratio_t, ratio_m])
        print(common.format_table(head, rows, left_columns=2))
