"""PageRank on an edge list, data-parallel over edges with the dense allreduce.

    scalefree pagerank ../shared/data/wiki-vote/wiki-Vote.txt -n 2

Every rank reads the graph, keeps a contiguous share of the edges, and per iteration
computes its share of the rank flow; one allreduce of the n-vertex vector combines them.
(The sparse-allreduce PageRank of the sparse collectives issue replaces the dense vector.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .io import read_edge_list


def pagerank(group, src, dst, n, damping=0.85, tol=1e-10, max_iter=200, progress=True):
    """Returns (scores, iterations, seconds per iteration). `src`/`dst` are this rank's
    edges; out-degrees are combined across ranks first."""
    outdeg = np.bincount(src, minlength=n).astype(np.int64)
    group.allreduce(outdeg)
    inv_out = np.zeros(n)
    nz = outdeg > 0
    inv_out[nz] = 1.0 / outdeg[nz]
    dangling = ~nz
    pr = np.full(n, 1.0 / n)
    flow = np.empty(n)
    times = []
    it = 0
    for it in range(1, max_iter + 1):
        t0 = time.perf_counter()
        flow[:] = np.bincount(dst, weights=pr[src] * inv_out[src], minlength=n)
        group.allreduce(flow)
        new = (1.0 - damping) / n + damping * (flow + pr[dangling].sum() / n)
        delta = float(np.abs(new - pr).sum())
        pr = new
        times.append(time.perf_counter() - t0)
        if progress and group.rank == 0:
            print(f"iteration {it:3d}  L1 change {delta:.3e}", file=sys.stderr, flush=True)
        if delta < tol:
            break
    return pr, it, float(np.median(times)) if times else 0.0


def write_scores(path: str, ids: np.ndarray, scores: np.ndarray) -> None:
    """Writes `id score` lines atomically (temporary file, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        for i, s in zip(ids.tolist(), scores.tolist()):
            f.write(f"{i}\t{s:.12g}\n")
    os.replace(tmp, path)


def run(args) -> int:
    import scalefree

    g = scalefree.init()
    t0 = time.perf_counter()
    src, dst, ids = read_edge_list(args.edges)
    lo, hi = g.share_bounds(src.size)
    src, dst = src[lo:hi], dst[lo:hi]
    load_s = time.perf_counter() - t0
    scores, iters, per_iter = pagerank(g, src, dst, ids.size, args.damping, args.tol, args.max_iter, not args.quiet)
    if g.rank == 0:
        top = np.argsort(-scores, kind="stable")[: args.top]
        print(f"graph: {ids.size} vertices, {hi - lo} of the edges on rank 0, {g.size} ranks; loaded in {load_s:.2f} s")
        print(f"converged in {iters} iterations, {per_iter * 1e3:.3f} ms per iteration (median)")
        print(f"sum of scores {scores.sum():.6f}")
        print("top vertices (id, score):")
        for v in top:
            print(f"  {ids[v]}\t{scores[v]:.6e}")
        if args.output:
            write_scores(args.output, ids, scores)
            print(f"scores written to {args.output}")
    g.close()
    return 0


def _cli(args) -> int:
    inside = "SCALEFREE_RANK" in os.environ or args.nprocs == 1
    if inside:
        return run(args)
    from ..launch.launcher import launch

    argv = [sys.executable, "-m", "scalefree.graph.pagerank_dense", os.path.abspath(args.edges),
            "--damping", repr(args.damping), "--tol", repr(args.tol), "--max-iter", str(args.max_iter),
            "--top", str(args.top)]
    if args.output:
        argv += ["--output", os.path.abspath(args.output)]
    if args.quiet:
        argv.append("--quiet")
    return launch(argv, args.nprocs)


def _parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("edges", help="edge list: two integer vertex ids per line, '#' comments (SNAP format)")
    p.add_argument("-n", "--nprocs", type=int, default=2, help="ranks to start on this host (default: 2)")
    p.add_argument("--damping", type=float, default=0.85, help="damping factor (default: 0.85)")
    p.add_argument("--tol", type=float, default=1e-10, help="stop when the L1 change is below this (default: 1e-10)")
    p.add_argument("--max-iter", type=int, default=200, help="iteration limit (default: 200)")
    p.add_argument("--top", type=int, default=10, help="vertices to list (default: 10)")
    p.add_argument("--output", help="write every vertex's score here (id<TAB>score)")
    p.add_argument("--quiet", action="store_true", help="no per-iteration progress")
    return p


def add_parser(sub) -> None:
    p = _parser(sub.add_parser("pagerank", help="PageRank of an edge list over the dense allreduce",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.set_defaults(func=_cli)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argparse.ArgumentParser(prog="scalefree pagerank")).parse_args(argv)
    return _cli(args)


if __name__ == "__main__":
    sys.exit(main())
