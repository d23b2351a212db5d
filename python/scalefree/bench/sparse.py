"""``scalefree bench sparse``: the sparse allreduce against what an MPI user would do.

Every rank contributes and requests the same ``--nnz`` distinct indices of ``[0, --dim)``
drawn from a Zipf law (seeded per rank), float32 values. Rows:

* ``scalefree/config``, ``scalefree/reduce``, ``scalefree/config_reduce`` — ours, with
  per-layer accounting (bytes, messages, largest packet, merge and wait time) of a reduce;
* ``mpi/dense`` — ``MPI_Allreduce`` of the full ``dim``-long vector (the allreduce alone);
* ``mpi/allgatherv`` — ``MPI_Allgatherv`` of (index, value) pairs, then a numpy merge
  (``np.unique`` + ``np.bincount``) and a lookup of the requested indices;
* ``mpi/indices-once`` — the indices allgathered and merged once (reported as set-up), then
  per call only ``MPI_Allgatherv`` of the values and a ``bincount`` with the saved inverse.

The time of a call is the slowest rank's; each figure the median over calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common
from .common import human_time

BENCH = "sparse"
PEERS = ("mpi",)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sparse",
        help="sparse allreduce vs MPI dense allreduce, allgatherv+merge, indices-once",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__,
    )
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")),
                   default="2,4", metavar="N[,N...]", help="rank counts to run")
    p.add_argument("--dim", type=arg(common.positive_int), default=10_000_000, help="index space")
    p.add_argument("--nnz", type=arg(common.positive_int), default=200_000,
                   help="distinct indices each rank contributes and requests")
    p.add_argument("--zipf", type=arg(common.positive_float), default=1.1, help="Zipf exponent")
    p.add_argument("--degrees", default="auto", help="'auto' or layer degrees like 2x2")
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, PEERS, "peer")),
                   default="mpi", metavar="PEER", help="peers ('none' for none)")
    common.add_timing_args(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def zipf_indices(rank: int, dim: int, nnz: int, a: float) -> np.ndarray:
    """``nnz`` distinct indices of ``[0, dim)`` drawn from Zipf(a) (ids past dim wrap)."""
    rng = np.random.default_rng([7, rank])
    got = np.zeros(0, np.int64)
    while len(got) < nnz:
        draw = (rng.zipf(a, 2 * nnz) - 1) % dim
        got = np.unique(np.concatenate([got, draw]))
    return rng.permutation(got)[:nnz].astype(np.int64)


# ---------------------------------------------------------------------------------------
# Rank side


def _timed(args, rank, size, op, barrier, allmax, gather_max):
    tp = common.time_point(op, barrier, allmax, rank=rank, straggler=common.StragglerSchedule(0, 0, size),
                           min_calls=args.min_calls, target_seconds=args.target_seconds,
                           max_calls=args.max_calls, warmup_calls=args.warmup)
    times = gather_max(np.asarray(tp.times_s))
    return common.Stats.of(times)


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--nnz", type=int, required=True)
    p.add_argument("--zipf", type=float, required=True)
    p.add_argument("--degrees", default="auto")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--max-calls", type=int, default=100_000)
    p.add_argument("--target-seconds", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    recs = []
    if args.impl == "scalefree":
        import scalefree

        g = scalefree.init()
        rank, size = g.rank, g.size
        idx = zipf_indices(rank, args.dim, args.nnz, args.zipf)
        vals = np.random.default_rng(rank).random(len(idx)).astype(np.float32)
        degrees = "auto" if args.degrees == "auto" else [int(x) for x in args.degrees.split("x")]

        def allmax(x):
            return float(g.allreduce(np.array([x]), op="max")[0])

        def gather_max(t):
            return g.allreduce(t.copy(), op="max")

        sa = g.sparse_allreduce(args.dim, degrees=degrees)
        common_f = dict(bench=BENCH, impl="scalefree", ranks=size, nbytes=len(idx) * 4, dtype="float32", gbps=0.0)
        st = _timed(args, rank, size, lambda: sa.config(idx, idx), g.barrier, allmax, gather_max)
        recs.append(common.make_record(variant="config", stats=st, **common_f, degrees="x".join(map(str, sa.degrees))))
        st = _timed(args, rank, size, lambda: sa.reduce(vals), g.barrier, allmax, gather_max)
        layers = sa.stats()
        recs.append(common.make_record(variant="reduce", stats=st, **common_f, degrees="x".join(map(str, sa.degrees)),
                                       layers=layers))
        sa2 = g.sparse_allreduce(args.dim, degrees=degrees)
        st = _timed(args, rank, size, lambda: sa2.config_reduce(idx, vals, idx), g.barrier, allmax, gather_max)
        recs.append(common.make_record(variant="config_reduce", stats=st, **common_f,
                                       degrees="x".join(map(str, sa2.degrees))))
        # Correctness check against the dense reference (outside timing).
        got = sa.reduce(vals)
        dense = np.zeros(args.dim, np.float64)
        for r in range(size):
            ii = zipf_indices(r, args.dim, args.nnz, args.zipf)
            np.add.at(dense, ii, np.random.default_rng(r).random(len(ii)).astype(np.float32))
        if not np.allclose(got, dense[idx], rtol=1e-5, atol=1e-5):
            raise SystemExit("scalefree sparse allreduce disagrees with the dense reference")
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        idx = zipf_indices(rank, args.dim, args.nnz, args.zipf)
        vals = np.random.default_rng(rank).random(len(idx)).astype(np.float32)

        def allmax(x):
            return comm.allreduce(x, op=MPI.MAX)

        def gather_max(t):
            out = np.empty_like(t)
            comm.Allreduce(t, out, op=MPI.MAX)
            return out

        common_f = dict(bench=BENCH, impl="mpi", ranks=size, nbytes=len(idx) * 4, dtype="float32", gbps=0.0)
        dense = np.zeros(args.dim, np.float32)
        dense[idx] = vals

        def dense_call():
            comm.Allreduce(MPI.IN_PLACE, dense, op=MPI.SUM)

        st = _timed(args, rank, size, dense_call, comm.Barrier, allmax, gather_max)
        recs.append(common.make_record(variant="dense", stats=st, **common_f))
        counts = np.array(comm.allgather(len(idx)), np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        total = int(counts.sum())
        all_idx = np.empty(total, np.int64)
        all_val = np.empty(total, np.float32)

        def allgatherv_merge():
            comm.Allgatherv(idx, [all_idx, counts, displs, MPI.INT64_T])
            comm.Allgatherv(vals, [all_val, counts, displs, MPI.FLOAT])
            u, inv = np.unique(all_idx, return_inverse=True)
            s = np.bincount(inv, weights=all_val, minlength=len(u))
            pos = np.searchsorted(u, idx)
            return s[pos].astype(np.float32)

        st = _timed(args, rank, size, allgatherv_merge, comm.Barrier, allmax, gather_max)
        recs.append(common.make_record(variant="allgatherv", stats=st, **common_f))
        t0 = time.perf_counter()
        comm.Allgatherv(idx, [all_idx, counts, displs, MPI.INT64_T])
        u, inv = np.unique(all_idx, return_inverse=True)
        pos = np.searchsorted(u, idx)
        setup_s = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

        def indices_once():
            comm.Allgatherv(vals, [all_val, counts, displs, MPI.FLOAT])
            s = np.bincount(inv, weights=all_val, minlength=len(u))
            return s[pos].astype(np.float32)

        st = _timed(args, rank, size, indices_once, comm.Barrier, allmax, gather_max)
        recs.append(common.make_record(variant="indices-once", stats=st, **common_f, config_s=setup_s))
    if rank == 0:
        args.out.write_text(json.dumps(recs))
    return 0


# ---------------------------------------------------------------------------------------
# Driver


def run(args) -> int:
    records: list[dict] = []
    peers = [] if args.vs == ["none"] else list(args.vs)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            for impl in ["scalefree"] + peers:
                out = Path(tmp) / f"{impl}-{n}.json"
                argv = [sys.executable, "-m", "scalefree.bench.sparse", "--impl", impl, "--out", str(out),
                        "--dim", str(args.dim), "--nnz", str(args.nnz), "--zipf", repr(args.zipf),
                        "--degrees", args.degrees, "--min-calls", str(args.min_calls),
                        "--max-calls", str(args.max_calls), "--target-seconds", repr(args.target_seconds),
                        "--warmup", str(args.warmup)]
                if not common.run_ranks(impl, n, argv, timeout_s=args.timeout, label="sparse") or not out.exists():
                    continue
                records += json.loads(out.read_text())
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    if args.plot:
        plot(records, args.plot)
    return 0


def print_table(records: list[dict]) -> None:
    rows = []
    for n in sorted({r["ranks"] for r in records}):
        rs = [r for r in records if r["ranks"] == n]
        ours = next((r for r in rs if r["impl"] == "scalefree" and r["variant"] == "reduce"), None)
        for r in rs:
            vs = f"{r['median_s'] / ours['median_s']:.2f}x" if ours and r["impl"] != "scalefree" else ""
            extra = r.get("degrees", "") or (f"setup {human_time(r['config_s'])}" if "config_s" in r else "")
            rows.append([str(n), r["impl"], r["variant"], human_time(r["median_s"]), human_time(r["min_s"]),
                         human_time(r["max_s"]), str(r["n"]), vs, extra])
    print(common.format_table(["ranks", "impl", "variant", "median", "min", "max", "calls",
                               "peer/ours(reduce)", "degrees / set-up"], rows, left_columns=3))
    for r in records:
        if r.get("layers"):
            print(f"\nscalefree reduce at {r['ranks']} ranks, rank 0's layers (degrees {r['degrees']}):")
            lrows = [[str(i), str(s["degree"]), common.human_bytes(s["bytes_sent"]), str(s["messages"]),
                      common.human_bytes(s["max_packet"]), human_time(s["merge_s"]), human_time(s["wait_s"]),
                      str(s["out_keys"]), "dense" if s.get("dense") else "sparse"] for i, s in enumerate(r["layers"])]
            print(common.format_table(["layer", "degree", "bytes sent", "msgs", "max packet", "merge",
                                       "wait+read", "keys after", "segment"], lrows))


def plot(records: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib ({e})") from e
    fig, ax = plt.subplots(figsize=(8, 5))
    series = sorted({(r["impl"], r["variant"]) for r in records})
    for i, (impl, var) in enumerate(series):
        rs = sorted((r for r in records if (r["impl"], r["variant"]) == (impl, var)), key=lambda r: r["ranks"])
        ax.plot([r["ranks"] for r in rs], [r["median_s"] for r in rs], marker="o", label=f"{impl} {var}", color=f"C{i}")
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("median time per call (s)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.suptitle("sparse allreduce")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
