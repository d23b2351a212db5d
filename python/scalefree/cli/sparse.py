"""``scalefree sparse plan``: the command line of the sparse allreduce's cost model
(:mod:`scalefree.sparse.plan`) and of the PageRank scale model (:mod:`scalefree.graph.model`)."""

from __future__ import annotations

import argparse

from ..sparse.plan import (
    DEFAULT_BANDWIDTH_GBPS,
    DEFAULT_LATENCY_US,
    Costs,
    choose,
    factorizations,
    predict,
    predict_time,
)
from .common import count, number


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sparse", help="sparse allreduce tools (plan: cost model of layer degrees)")
    s = p.add_subparsers(dest="sparse_command", metavar="COMMAND")
    s.required = True
    q = s.add_parser("plan", help="predicted packet sizes and times per degree configuration",
                     description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("--ranks", type=count(1), help="ranks (required without --pagerank)")
    q.add_argument("--nnz", type=count(1), help="distinct indices per rank (required without --pagerank)")
    q.add_argument("--dim", type=count(1), help="index space (required without --pagerank)")
    q.add_argument("--value-bytes", type=count(1), default=4, help="bytes per value (float32: 4)")
    q.add_argument("--latency-us", type=number(0), default=DEFAULT_LATENCY_US, help="per-message latency")
    q.add_argument("--round-us", type=number(0), default=0.0,
                   help="fixed cost per message round (a layer has two), on top of the messages")
    q.add_argument("--fixed-us", type=number(0), default=0.0, help="fixed cost per reduce")
    q.add_argument("--probe", action="store_true",
                   help="use this machine's costs as degrees='auto' probes them (runs --ranks ranks here)")
    q.add_argument("--bandwidth-gbps", type=number(0, low_open=True), default=DEFAULT_BANDWIDTH_GBPS, help="per-rank bandwidth, GB/s")
    q.add_argument("--top", type=count(1), default=12, help="configurations to print, best first")
    g = q.add_argument_group("PageRank at scale (--pagerank): load, set-up, iteration and memory per rank "
                             "of `scalefree graph pagerank`, see docs/scale-model.md")
    g.add_argument("--pagerank", action="store_true", help="predict a PageRank job per host count instead")
    g.add_argument("--edges", type=count(1), default="1G", help="edges in the input (R-MAT: generated, before "
                                                              "duplicates are dropped); K, M, G binary")
    g.add_argument("--ids", type=count(1), default="64M", help="vertex id space (R-MAT: 2**scale; a power of two)")
    g.add_argument("--hosts", default="16,32,64,128,256", help="host counts, comma-separated")
    g.add_argument("--ranks-per-host", type=count(1), default=1)
    g.add_argument("--cores", type=count(1), default=2, help="cores per host (ranks beyond it share cores)")
    g.add_argument("--format", choices=["npz", "text"], default="npz", help="input: .npz int32 pairs or text")
    g.add_argument("--net-gbps", type=number(0, low_open=True), default=12.5, help="network GB/s per host each way (12.5 = 100 Gb/s)")
    g.add_argument("--storage-gbps", type=_gbps_or_inf, default=float("inf"),
                   help="GB/s a host reads its share of the input at (inf: page cache, parse-bound)")
    g.add_argument("--degrees", metavar="JSON",
                   help="degree histogram of a measured graph, scaled by copies to --edges (default: the R-MAT "
                        "closed form for --ids and --edges)")
    g.add_argument("--check", metavar="RUNS.json",
                   help="instead: predicted vs measured for the runs in this file (docs/results/scale-model/)")
    q.set_defaults(func=run)
    return p


def _probe_here(n: int) -> Costs:
    """Runs the probe on ``n`` ranks of this host and returns its costs."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/costs.json"
        code = ("import json, dataclasses, scalefree; from scalefree.sparse import plan as sparse_plan; g = scalefree.init(); "
                "c = sparse_plan.probe(g); g.rank == 0 and open(%r, 'w').write(json.dumps(dataclasses.asdict(c)))" % out)
        rc = subprocess.call([sys.executable, "-m", "scalefree.cli", "run", "-n", str(n), "--", sys.executable, "-c", code])
        if rc != 0:
            raise SystemExit(f"scalefree sparse plan --probe: the probe on {n} ranks failed (exit {rc})")
        return Costs(**json.loads(open(out).read()))


def _gbps_or_inf(text: str) -> float:
    """GB/s above 0, or ``inf``."""
    return float("inf") if text.strip().lower() == "inf" else number(0, low_open=True)(text)


def _shape(args, generated: float, ids: int):
    from ..graph import model

    if args.degrees:
        return model.histogram_shape(args.degrees, generated)
    if ids & (ids - 1):
        raise SystemExit(f"scalefree sparse plan: --ids {ids} is not a power of two (R-MAT: 2**scale); "
                         "pass --degrees for another graph")
    return model.RmatShape(ids.bit_length() - 1, float(generated))


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def run_pagerank(args) -> int:
    """The table of ``--pagerank``: predictions per host count."""
    from ..graph import model

    try:
        hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
    except ValueError:
        raise SystemExit(f"scalefree sparse plan: --hosts expects comma-separated counts, got {args.hosts!r}") from None
    if not hosts or min(hosts) < 1 or args.ranks_per_host < 1 or args.cores < 1 or args.net_gbps <= 0:
        raise SystemExit("scalefree sparse plan: --hosts, --ranks-per-host, --cores and --net-gbps must be positive")
    shape = _shape(args, args.edges, args.ids)
    print(f"PageRank of {shape.describe()}: {shape.edges:.4g} distinct edges, {shape.vertices:.4g} vertices; "
          f"{args.format} input, {args.ranks_per_host} rank(s) and {args.cores} cores per host, "
          f"{args.net_gbps:g} GB/s and {args.latency_us:g} µs per message, storage "
          f"{args.storage_gbps:g} GB/s per host")
    print(f"{'hosts':>6}{'edges/rank':>12}{'touched':>11}{'read s':>8}{'exch s':>8}{'load s':>8}"
          f"{'set-up s':>10}{'path':>7}{'ms/iter':>9}{'reduce':>8}{'GB/rank':>9}")
    for h in hosts:
        c = model.Cluster(h, args.ranks_per_host, args.cores, args.net_gbps, args.latency_us, args.storage_gbps)
        r = model.predict(shape, c, args.format)
        print(f"{h:>6}{r['edges']:>12.4g}{r['touched']:>11.4g}{r['read_s']:>8.2f}{r['exchange_s']:>8.2f}"
              f"{r['load_s']:>8.2f}{r['setup_s']:>10.2f}{r['setup_path']:>7}{r['iteration_s'] * 1e3:>9.1f}"
              f"{r['reduce_s'] * 1e3:>8.1f}{_gb(r['peak_bytes']):>9}")
    return 0


def run_check(args) -> int:
    """Predicted vs measured for the runs of ``--check`` (a JSON list written by
    benchmarks/scale_model/collect.py): constants calibrated on its 1-rank runs
    (:func:`scalefree.graph.model.calibrate`), every stage of every run side by side."""
    import json

    from ..graph import model

    with open(args.check) as f:
        runs = json.load(f)
    k = model.calibrate(runs)
    print("calibrated (1-rank runs; the exchange's local part on 2 ranks): read ns/edge "
          + ", ".join(f"{f} {v * 1e9:.1f}" for f, v in k.read_s_per_edge.items())
          + f"; sort-dedup {k.dedup_s_per_edge * 1e9:.1f}, exchange local {k.exchange_local_s_per_edge * 1e9:.1f} "
          + "ns/edge; set-up ns/edge "
          + ", ".join(f"{p} {v * 1e9:.0f}" for p, v in k.setup_s_per_edge.items())
          + f" (sparse + {k.setup_s_per_touched * 1e9:.0f} per touched)"
          + f"; SpMV {k.iteration_s_per_edge * 1e9:.2f} ns/edge; bytes/edge "
          + ", ".join(f"{p} {v:.1f}" for p, v in k.bytes_per_edge.items())
          + f" (+{k.bytes_per_read_edge['text']:.1f} per text edge read)")
    stages = [("read s", "read_s", 1), ("exchange s", "exchange_s", 1), ("load s", "load_s", 1),
              ("set-up s", "setup_s", 1), ("ms/iter", "per_iteration_s", 1e3), ("peak GB", "peak_rss_bytes", 1e-9)]
    keys = {"read_s": "read_s", "exchange_s": "exchange_s", "load_s": "load_s", "setup_s": "setup_s",
            "per_iteration_s": "iteration_s", "peak_rss_bytes": "peak_bytes"}
    print(f"{'input':<14}{'ranks':>5}  " + "".join(f"{w:>22}" for w, _, _ in stages)
          + "   (predicted / measured median, error)")
    worst = 0.0
    for run in runs:
        shape = model.run_shape(run)
        c = model.Cluster(1, run["ranks"], run.get("cores", args.cores), args.net_gbps, args.latency_us)
        r = model.predict(shape, c, run["format"], k)
        name = run["format"] + (f"-ids-x{run['spread']}" if run.get("spread", 1) > 1 else "")
        cells = []
        for _, key, unit in stages:
            if key not in run:
                cells.append(f"{'-':>22}")
                continue
            pred, meas = r[keys[key]] * unit, run[key] * unit
            err = pred / meas - 1
            calibrated = run["ranks"] == 1 or (run["ranks"] == 2 and key == "exchange_s")
            if not calibrated:
                worst = max(worst, abs(err))
            cells.append(f"{pred:>8.3g} /{meas:>6.3g} {err * 100:>+4.0f}%")
        tag = "  (calibration)" if run["ranks"] == 1 else "  (calibration: exchange)" if run["ranks"] == 2 else ""
        print(f"{name:<14}{run['ranks']:>5}  " + "".join(cells) + tag)
    print(f"largest error outside the calibration runs {worst * 100:.0f}%")
    return 0


def run(args) -> int:
    if args.check:
        return run_check(args)
    if args.pagerank:
        return run_pagerank(args)
    n, nnz, dim, vb = args.ranks, args.nnz, args.dim, args.value_bytes
    if n is None or nnz is None or dim is None:
        raise SystemExit("scalefree sparse plan: --ranks, --nnz and --dim are required (or --pagerank)")
    if n < 1 or nnz < 0 or dim < 1:
        raise SystemExit("scalefree sparse plan: --ranks >= 1, --nnz >= 0 and --dim >= 1 are required")
    lat, bw = args.latency_us * 1e-6, args.bandwidth_gbps * 1e9
    costs = Costs(args.fixed_us * 1e-6, args.round_us * 1e-6, lat, 1 / bw)
    if args.probe:
        costs = _probe_here(n)
        lat, bw = costs.msg_s + costs.round_s, 1 / costs.s_per_byte
    cands = sorted(((predict(d, n, nnz, dim, vb, lat, bw)[0], predict_time(d, nnz, dim, vb, costs), d)
                    for d in factorizations(n)), key=lambda x: x[1])
    print(f"ranks {n}, nnz {nnz:.0f}/rank, dim {dim:.0f}, {vb}-byte values; costs: fixed {costs.fixed_s * 1e6:.1f} µs, "
          f"round {costs.round_s * 1e6:.1f} µs, message {costs.msg_s * 1e6:.1f} µs, {1e-9 / costs.s_per_byte:.3g} GB/s "
          f"(packet floor {costs.floor_bytes / 1024:.1f} KiB)")
    pick = choose(n, nnz, dim, vb, costs)["degrees"]
    print(f"{'degrees':<16}{'reduce':>12}   per layer: degree keys->packet")
    for layers, total, d in cands[: args.top]:
        desc = "  ".join(f"{k}:{keys:.3g}->{pk / 1024:.1f}KiB" for k, keys, pk, _ in layers)
        mark = "  <- auto" if list(d) == pick else ""
        print(f"{'x'.join(map(str, d)) or '-':<16}{total * 1e3:>10.3f} ms   {desc}{mark}")
    ag = (n - 1) * (lat + nnz * (8 + vb) / bw)
    once = (n - 1) * (lat + nnz * vb / bw)
    dense = 2 * (n - 1) * (lat + dim / n * vb / bw)
    print(f"{'allgatherv':<16}{ag * 1e3:>10.3f} ms   (index, value) pairs from every rank, before the merge")
    print(f"{'indices-once':<16}{once * 1e3:>10.3f} ms   values from every rank, before the merge")
    print(f"{'dense':<16}{dense * 1e3:>10.3f} ms   ring allreduce of the dim-long vector")
    return 0
