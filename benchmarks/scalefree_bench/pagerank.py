"""``scalefree bench pagerank``: PageRank iterations per second, sparse allreduce against
dense allreduces and a single-process scipy baseline.

Graphs: SNAP wiki-Vote from ``../shared/data`` and a seeded R-MAT power-law graph (built
once by the driver, read by every rank). Ranks split the edges by the same seeded random
edge partition. Rows, per graph and rank count:

* ``scalefree/sparse`` — :class:`scalefree.graph.pagerank.SparsePageRank`: each rank renumbers the
  vertices its edges touch into compact local ids, its vectors and SpMV are that size, and
  one sparse allreduce (configured once, reported as ``config_s``) moves the flow;
* ``scalefree/dense`` — each rank's SpMV over the full-length vector and scalefree's dense
  allreduce of the n-vector;
* ``mpi/dense`` — the same program with ``MPI_Allreduce`` (mpi4py, Open MPI);
* ``mpi/allgatherv`` — the same program, the flow combined by ``MPI_Allgatherv`` of each
  rank's (index, value) pairs of non-zeros and a numpy ``bincount`` merge;
* ``scipy/1-process`` — single-process CSR SpMV over all edges (one row, ranks = 1).

One timed call is one iteration (the slowest rank's time; median over calls). After
timing, every implementation runs ``--check-iters`` iterations from the start and its
scores are compared with scipy's after the same number of iterations (``max_abs_err``).
``comm`` (``comm_fraction``): rank 0's median time in collectives per iteration, waiting
for slower ranks included, over the median iteration time.
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
from .common import human_time, progress

BENCH = "pagerank"
PEERS = ("mpi", "scipy")
GRAPHS = ("wiki-vote", "rmat")
DAMPING = 0.85


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pagerank",
        help="PageRank iterations/s: sparse allreduce vs dense allreduce, MPI and scipy",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__,
    )
    arg = common.argparse_type
    p.add_argument("-n", "--ranks", type=arg(lambda s: common.parse_int_list(s, "rank count")),
                   default="2,4", metavar="N[,N...]", help="rank counts to run")
    p.add_argument("--graphs", type=arg(lambda s: common.parse_choice_list(s, GRAPHS, "graph")),
                   default="wiki-vote,rmat", metavar="G[,G...]", help=f"graphs among {', '.join(GRAPHS)}")
    p.add_argument("--wiki-vote", type=Path, default=None,
                   help="wiki-Vote edge list (default: ../shared/data/wiki-vote/wiki-Vote.txt)")
    p.add_argument("--rmat-scale", type=arg(common.positive_int), default=20, help="R-MAT: 2**scale vertex ids")
    p.add_argument("--rmat-edges", type=arg(common.parse_size), default="8M",
                   help="R-MAT: edges generated (before duplicates are dropped); K/M suffixes")
    p.add_argument("--rmat-seed", type=common.argparse_type(common.non_negative_int), default=0)
    p.add_argument("--degrees", default="auto", help="'auto' or layer degrees like 2x2")
    p.add_argument("--sparse-dtypes", type=arg(lambda s: common.parse_choice_list(s, ("float64", "float32"), "dtype")),
                   default="float64,float32", metavar="DT[,DT...]",
                   help="value types of the scalefree sparse rows (float32: variant sparse-f32)")
    p.add_argument("--check-iters", type=arg(common.positive_int), default=5,
                   help="iterations of the correctness check against scipy")
    p.add_argument("--vs", type=arg(lambda s: common.parse_choice_list(s, PEERS, "peer")), default="mpi,scipy", metavar="PEER[,PEER...]",
                   help="peers: mpi, scipy ('none' for none)")
    from . import pagerank_e2e

    pagerank_e2e.add_args(p)
    common.add_timing_args(p)
    common.add_output_args(p)
    p.set_defaults(func=run)
    return p


def _default_wiki_vote() -> Path:
    for base in (Path.cwd() / "../shared/data", Path(__file__).resolve().parents[2] / "../shared/data"):
        f = base / "wiki-vote" / "wiki-Vote.txt"
        if f.exists():
            return f.resolve()
    raise SystemExit("no wiki-Vote: pass --wiki-vote FILE or --graphs rmat (../shared/data not found)")


# ---------------------------------------------------------------------------------------
# The dense program (ours and MPI's differ only in the allreduce)


class DensePageRank:
    """One rank's PageRank over a full-length score vector; ``allreduce(a)`` sums ``a`` in
    place over the ranks. Every rank holds all scores, so the L1 change needs no message."""

    def __init__(self, src, dst, n: int, allreduce, damping: float = DAMPING):
        self.src, self.dst, self.n, self.allreduce, self.damping = src, dst, n, allreduce, damping
        self.last_comm_s = 0.0
        outdeg = np.bincount(src, minlength=n).astype(np.float64)
        allreduce(outdeg)
        nz = outdeg > 0
        self.inv_out = np.zeros(n)
        self.inv_out[nz] = 1.0 / outdeg[nz]
        self.dangling = ~nz
        self.scores = np.full(n, 1.0 / n)
        self.flow = np.empty(n)

    def step(self) -> float:
        r = self.scores
        self.flow[:] = np.bincount(self.dst, weights=r[self.src] * self.inv_out[self.src], minlength=self.n)
        t0 = time.perf_counter()
        self.allreduce(self.flow)
        self.last_comm_s = time.perf_counter() - t0
        new = (1.0 - self.damping) / self.n + self.damping * (self.flow + r[self.dangling].sum() / self.n)
        delta = float(np.abs(new - r).sum())
        self.scores = new
        return delta


class ScipyPageRank:
    """Single-process PageRank with a CSR matrix (rows = targets)."""

    def __init__(self, src, dst, n: int, damping: float = DAMPING):
        import scipy.sparse as sp

        self.n, self.damping = n, damping
        self.a = sp.csr_matrix((np.ones(len(src)), (dst, src)), shape=(n, n))
        outdeg = np.bincount(src, minlength=n).astype(np.float64)
        nz = outdeg > 0
        self.inv_out = np.zeros(n)
        self.inv_out[nz] = 1.0 / outdeg[nz]
        self.dangling = ~nz
        self.scores = np.full(n, 1.0 / n)

    def step(self) -> float:
        r = self.scores
        y = self.a @ (r * self.inv_out)
        new = (1.0 - self.damping) / self.n + self.damping * (y + r[self.dangling].sum() / self.n)
        delta = float(np.abs(new - r).sum())
        self.scores = new
        return delta


# ---------------------------------------------------------------------------------------
# Rank side


def _measure(args, rank, size, make, timing, base, impl, variant, extra=lambda prog: {}):
    """Times a fresh program from ``make()`` (``timing`` = barrier, allmax, gather_max) and
    records it; then runs another fresh one ``args.check_iters`` steps for the score check.
    Returns (record, checked program)."""
    prog = make()
    st, cf = _timed(args, rank, size, prog, *timing)
    rec = common.make_record(impl=impl, variant=variant, stats=st, **base, iters_per_s=1.0 / st.median_s,
                             comm_fraction=cf, **extra(prog))
    check = make()
    for _ in range(args.check_iters):
        check.step()
    return rec, check


def _timed(args, rank, size, pr, barrier, allmax, gather_max):
    """Times ``pr.step``; returns (stats, comm_fraction): the median of this rank's time in
    collectives per step (waiting for peers included) over the median step time."""
    comm = []

    def op():
        pr.step()
        comm.append(pr.last_comm_s)

    tp = common.time_point(op, barrier, allmax, rank=rank, straggler=common.StragglerSchedule(0, 0, size),
                           min_calls=args.min_calls, target_seconds=args.target_seconds,
                           max_calls=args.max_calls, warmup_calls=args.warmup)
    comm_s = float(np.median(comm[-tp.calls:]))
    return common.Stats.of(gather_max(np.asarray(tp.times_s))), comm_s / float(np.median(tp.times_s))


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", required=True, choices=["scalefree", "mpi"])
    p.add_argument("--graph", required=True, help="graph name for the records")
    p.add_argument("--edges", required=True, type=Path, help=".npz with src, dst, n")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--scores-out", required=True, type=Path)
    p.add_argument("--degrees", default="auto")
    p.add_argument("--sparse-dtypes", default="float64")
    p.add_argument("--check-iters", type=int, default=5)
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--max-calls", type=int, default=100_000)
    p.add_argument("--target-seconds", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    z = np.load(args.edges)
    n = int(z["n"])
    recs = []
    if args.impl == "scalefree":
        import scalefree
        from scalefree.graph.pagerank import SparsePageRank, gather_scores
        from scalefree.graph.io import partition_edges

        g = scalefree.init()
        rank, size = g.rank, g.size
        src, dst = partition_edges(z["src"], z["dst"], rank, size)
        degrees = "auto" if args.degrees == "auto" else [int(x) for x in args.degrees.split("x")]

        def allmax(x):
            return float(g.allreduce(np.array([x]), op="max")[0])

        def gather_max(t):
            return g.allreduce(t.copy(), op="max")

        def allsum(x):
            return float(g.allreduce(np.array([float(x)]))[0])

        base = dict(bench=BENCH, ranks=size, nbytes=8 * n, dtype="float64", gbps=0.0, graph=args.graph,
                    vertices=n, n_items=int(len(z["src"])))
        timing = (g.barrier, allmax, gather_max)
        # Sparse: set-up (renumbering, CSR, config) outside the timed loop, reported on its
        # own (first one); one row per value type.
        sparse_scores = {}
        for dt in args.sparse_dtypes.split(","):
            config_s = []
            variant = "sparse" if dt == "float64" else "sparse-f32"

            def make_sparse(dt=dt, config_s=config_s):
                g.barrier()
                t0 = time.perf_counter()
                prog = SparsePageRank(g, src, dst, n, DAMPING, degrees, dtype=dt)
                config_s.append(allmax(time.perf_counter() - t0))
                return prog

            rec, pr = _measure(args, rank, size, make_sparse, timing, dict(base, dtype=dt), "scalefree", variant,
                               lambda p, config_s=config_s: dict(config_s=config_s[0],
                                                                 touched_frac=allsum(p.n_local) / size / max(1, n),
                                                                 degrees="x".join(map(str, p.sa.degrees))))
            recs.append(rec)
            sparse_scores[variant] = gather_scores(g, pr.owned, pr.scores, n)
            del pr
        # Dense: scalefree's allreduce of the n-vector.
        rec, dense = _measure(args, rank, size, lambda: DensePageRank(src, dst, n, g.allreduce), timing, base,
                              "scalefree", "dense")
        recs.append(rec)
        if rank == 0:
            np.savez(args.scores_out, dense=dense.scores, **{k: v.astype(np.float64) for k, v in sparse_scores.items()})
    else:
        from mpi4py import MPI

        from scalefree.graph.io import partition_edges

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        src, dst = partition_edges(z["src"], z["dst"], rank, size)

        def allmax(x):
            return comm.allreduce(x, op=MPI.MAX)

        def gather_max(t):
            out = np.empty_like(t)
            comm.Allreduce(t, out, op=MPI.MAX)
            return out

        def mpi_sum(a):
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        base = dict(bench=BENCH, ranks=size, nbytes=8 * n, dtype="float64", gbps=0.0, graph=args.graph,
                    vertices=n, n_items=int(len(z["src"])))
        timing = (comm.Barrier, allmax, gather_max)
        rec, dense = _measure(args, rank, size, lambda: DensePageRank(src, dst, n, mpi_sum), timing, base, "mpi", "dense")
        recs.append(rec)

        def allgatherv_sum(a):
            # What a numpy user writes without a sparse allreduce: gather every rank's
            # (index, value) pairs of its non-zeros and merge them with a bincount.
            idx = np.flatnonzero(a)
            counts = np.array(comm.allgather(len(idx)), np.int64)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            all_idx = np.empty(int(counts.sum()), np.int64)
            all_val = np.empty(int(counts.sum()), np.float64)
            comm.Allgatherv(idx.astype(np.int64), [all_idx, counts, displs, MPI.INT64_T])
            comm.Allgatherv(np.ascontiguousarray(a[idx]), [all_val, counts, displs, MPI.DOUBLE])
            a[:] = np.bincount(all_idx, weights=all_val, minlength=len(a))

        rec, agv = _measure(args, rank, size, lambda: DensePageRank(src, dst, n, allgatherv_sum), timing, base,
                            "mpi", "allgatherv")
        recs.append(rec)
        if rank == 0:
            np.savez(args.scores_out, dense=dense.scores, allgatherv=agv.scores)
    if rank == 0:
        args.out.write_text(json.dumps(recs))
    return 0


# ---------------------------------------------------------------------------------------
# Driver


def _load_graph(name: str, args) -> tuple[np.ndarray, np.ndarray, int, str]:
    from scalefree.graph.io import read_edges
    from scalefree.graph.rmat import rmat_edges

    if name == "wiki-vote":
        path = args.wiki_vote or _default_wiki_vote()
        src, dst, ids = read_edges(path)
        return src, dst, len(ids), "wiki-vote"
    progress(f"pagerank: generating R-MAT scale {args.rmat_scale}, {args.rmat_edges} edges (seed {args.rmat_seed})")
    src, dst, ids = rmat_edges(args.rmat_scale, args.rmat_edges, args.rmat_seed)
    return src, dst, len(ids), f"rmat-s{args.rmat_scale}-e{args.rmat_edges}"


def _scipy_point(args, src, dst, n: int, graph: str) -> tuple[dict, np.ndarray]:
    """Times scipy in this process (ranks = 1); returns its record and its scores after
    ``--check-iters`` iterations (the reference of the correctness check)."""
    pr = ScipyPageRank(src, dst, n)
    tp = common.time_point(pr.step, lambda: None, lambda x: x, rank=0, straggler=common.StragglerSchedule(0, 0, 1),
                           min_calls=args.min_calls, target_seconds=args.target_seconds,
                           max_calls=args.max_calls, warmup_calls=args.warmup)
    st = common.Stats.of(tp.times_s)
    ref = ScipyPageRank(src, dst, n)
    for _ in range(args.check_iters):
        ref.step()
    rec = common.make_record(bench=BENCH, impl="scipy", variant="1-process", ranks=1, nbytes=8 * n, dtype="float64",
                             stats=st, gbps=0.0, graph=graph, vertices=n, n_items=int(len(src)),
                             iters_per_s=1.0 / st.median_s, comm_fraction=0.0, max_abs_err=0.0)
    return rec, ref.scores


def run(args) -> int:
    if args.from_file:
        from . import pagerank_e2e

        return pagerank_e2e.run(args)
    records: list[dict] = []
    peers = list(args.vs)
    with tempfile.TemporaryDirectory() as tmp:
        for gname in args.graphs:
            src, dst, n, graph = _load_graph(gname, args)
            progress(f"pagerank: {graph}: {n} vertices, {len(src)} edges")
            edges = Path(tmp) / f"{gname}.npz"
            np.savez(edges, src=src, dst=dst, n=n)
            # The reference is always computed; the scipy row is printed only when asked for.
            progress(f"pagerank: {graph}: scipy, 1 process")
            srec, ref = _scipy_point(args, src, dst, n, graph)
            if "scipy" in peers:
                records.append(srec)
            del src, dst
            for nr in args.ranks:
                for impl in ["scalefree"] + [p for p in peers if p == "mpi"]:
                    out = Path(tmp) / f"{impl}-{gname}-{nr}.json"
                    scores = Path(tmp) / f"{impl}-{gname}-{nr}.npz"
                    argv = [sys.executable, "-m", "scalefree_bench.pagerank", "--impl", impl, "--graph", graph,
                            "--edges", str(edges), "--out", str(out), "--scores-out", str(scores),
                            "--degrees", args.degrees, "--check-iters", str(args.check_iters),
                            "--sparse-dtypes", ",".join(args.sparse_dtypes),
                            "--min-calls", str(args.min_calls), "--max-calls", str(args.max_calls),
                            "--target-seconds", repr(args.target_seconds), "--warmup", str(args.warmup)]
                    if not common.run_ranks(impl, nr, argv, timeout_s=args.timeout, label=f"pagerank: {graph}") or not out.exists():
                        continue
                    got = np.load(scores)
                    for r in json.loads(out.read_text()):
                        r["max_abs_err"] = float(np.abs(got[r["variant"]] - ref).max())
                        # float32 rows: within 1e-5 of the largest score (float32 rounding, summed
                        # over a hub's many in-edges).
                        r["tolerance"] = 1e-5 * float(np.abs(ref).max()) if r["dtype"] == "float32" else 1e-9
                        records.append(r)
    bad = [r for r in records if r["max_abs_err"] > r.get("tolerance", 1e-9)]
    print_table(records)
    if args.json:
        common.write_json(args.json, records)
    if args.plot:
        plot(records, args.plot)
    for r in bad:
        progress(f"pagerank: {r['impl']} {r['variant']} on {r['ranks']} ranks disagrees with scipy "
                 f"by {r['max_abs_err']:.3g} after {args.check_iters} iterations")
    return 1 if bad else 0


def print_table(records: list[dict]) -> None:
    rows = []
    for graph in dict.fromkeys(r["graph"] for r in records):
        gs = [r for r in records if r["graph"] == graph]
        for nr in sorted({r["ranks"] for r in gs}):
            rs = [r for r in gs if r["ranks"] == nr or (r["impl"] == "scipy" and nr == 1)]
            for r in rs:
                ours = next((o for o in gs if o["impl"] == "scalefree" and o["variant"] == "sparse"
                             and o["ranks"] == nr), None)
                ours32 = next((o for o in gs if o["impl"] == "scalefree" and o["variant"] == "sparse-f32"
                               and o["ranks"] == nr), None)
                vs = vs32 = ""
                if r is not ours and ours is not None and r is not ours32:
                    vs = f"{r['median_s'] / ours['median_s']:.2f}x"
                if r is not ours32 and ours32 is not None and r is not ours:
                    vs32 = f"{r['median_s'] / ours32['median_s']:.2f}x"
                extra = []
                if "config_s" in r:
                    extra.append(f"config {human_time(r['config_s'])}")
                if "touched_frac" in r:
                    extra.append(f"touched {100 * r['touched_frac']:.0f}%")
                if r.get("degrees"):
                    extra.append(f"degrees {r['degrees']}")
                rows.append([graph, str(r["ranks"]), r["impl"], r["variant"], human_time(r["median_s"]),
                             human_time(r["min_s"]), human_time(r["max_s"]), str(r["n"]),
                             f"{r['iters_per_s']:.1f}", f"{100 * r.get('comm_fraction', 0.0):.0f}%", vs, vs32,
                             f"{r['max_abs_err']:.1e}", ", ".join(extra)])
        # The scipy row compared with ours at every rank count.
        sc = next((r for r in gs if r["impl"] == "scipy"), None)
        if sc:
            for o in (o for o in gs if o["impl"] == "scalefree" and o["variant"] in ("sparse", "sparse-f32")):
                ratio = f"{sc['median_s'] / o['median_s']:.2f}x"
                f32 = o["variant"] == "sparse-f32"
                rows.append([graph, str(o["ranks"]), "scipy", "vs " + o["variant"], "", "", "", "", "", "",
                             "" if f32 else ratio, ratio if f32 else "", "", ""])
    print(common.format_table(["graph", "ranks", "impl", "variant", "median/iter", "min", "max", "calls",
                               "iter/s", "comm", "peer/ours(sparse)", "peer/ours(f32)", "err", "set-up"], rows,
                              left_columns=4))


def plot(records: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib ({e})") from e
    graphs = list(dict.fromkeys(r["graph"] for r in records))
    fig, axes = plt.subplots(1, len(graphs), figsize=(6 * len(graphs), 4.5), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        gs = [r for r in records if r["graph"] == graph]
        for i, key in enumerate(sorted({(r["impl"], r["variant"]) for r in gs})):
            rs = sorted((r for r in gs if (r["impl"], r["variant"]) == key), key=lambda r: r["ranks"])
            ax.plot([r["ranks"] for r in rs], [r["median_s"] for r in rs], marker="o", label=" ".join(key),
                    color=f"C{i}")
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_ylabel("median time per iteration (s)")
        ax.set_title(graph)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
