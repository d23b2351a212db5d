"""PageRank over the dense allreduce: the baseline of the sparse one
(``scalefree graph pagerank EDGES --collective dense``).

Every rank holds the whole score vector over the id space; per iteration it computes the
rank flow of its own edges, and one allreduce of the whole vector combines them.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def pagerank(group, src, dst, n: int, damping: float = 0.85, tol: float = 1e-10, max_iter: int = 200,
             progress: bool = False, isolated: bool = True):
    """Collective. ``src``/``dst``: this rank's edges (ids in ``[0, n)``). Returns (scores of
    every id, vertices, iterations, median seconds per iteration). ``isolated=False``: ids
    on no edge are not vertices (score 0, no teleport mass)."""
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    deg = np.concatenate([np.bincount(src, minlength=n), np.bincount(dst, minlength=n)]).astype(np.int64)
    group.allreduce(deg)
    outdeg = deg[:n]
    has = np.ones(n, np.bool_) if isolated else (deg[:n] + deg[n:]) > 0
    nv = int(has.sum())
    inv_out = np.zeros(n)
    np.divide(1.0, outdeg, out=inv_out, where=outdeg > 0)
    dangling = has & (outdeg == 0)
    pr = has / max(nv, 1)
    flow = np.empty(n)
    times = []
    it = 0
    for it in range(1, max_iter + 1):
        t0 = time.perf_counter()
        flow[:] = np.bincount(dst, weights=pr[src] * inv_out[src], minlength=n)
        group.allreduce(flow)
        new = np.where(has, (1.0 - damping) / nv + damping * (flow + pr[dangling].sum() / nv), 0.0)
        delta = float(np.abs(new - pr).sum())
        pr = new
        times.append(time.perf_counter() - t0)
        if progress and group.rank == 0:
            print(f"iteration {it:3d}  L1 change {delta:.3e}", file=sys.stderr, flush=True)
        if delta < tol:
            break
    return pr, nv, it, float(np.median(times)) if times else 0.0
