"""Graph analytics on the sparse allreduce: ``scalefree graph pagerank EDGES -n 4 --top 20``.

Each rank reads its share of the edge file and sends every edge to the rank that owns it
(a hash of the edge), which drops duplicates. Each rank renumbers the vertices
its edges touch into compact local ids, so its vectors and its SpMV have the size of what
it touches, not of the graph; per iteration one sparse allreduce (configured once) sums the
rank flow each rank produced for its edge targets and returns it for its edge sources and
for the vertices it owns (``v % size == rank``), which it uses for the convergence test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .._atomic import atomic_path
from .io import load_graph, logical_rank
from .rmat import _rmat_cmd


def vertex_keys(group, src, dst, n: int, replication: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Collective: (out-degree of every vertex, its key, the vertex of each degree rank,
    number of keys, number of vertices on an edge) for the sparse
    allreduce without hashing. Vertices are ranked by falling total degree over all ranks
    (``g``), and ``key = (g % size) * B + g // size`` with ``B = ceil(n / size)``: the
    layer ranges of the butterfly (contiguous key ranges) each receive every size-th
    vertex in degree order, so the hubs spread over the ranks as a hash would spread them,
    while each rank's keys, sorted, stay close to degree order (hub entries together, which
    keeps its SpMV's gathers in cache). Key range ``[r * B, r * B + count)`` is the
    vertices rank r owns. Ids without an edge rank last (``order[nv:]``). Keys are uint32
    when they fit. With ``replication`` r, ranks are r replicas of ``size / r``
    logical nodes holding the same edges."""
    size = group.size // replication
    deg = np.concatenate([np.bincount(src, minlength=n), np.bincount(dst, minlength=n)]).astype(np.float64)
    if group.size > 1 and len(deg):
        group.allreduce(deg)
        deg /= replication
    total = deg[:n] + deg[n:]
    nv = int(np.count_nonzero(total))
    order = np.argsort(-total, kind="stable")
    del total
    width = -(-n // size)
    kt = np.uint32 if size * width + 1 < 1 << 32 else np.int64
    key = np.empty(n, kt)
    g = np.arange(n, dtype=kt)
    key[order] = (g % kt(size)) * kt(width) + g // kt(size)
    return deg[:n], key, order, size * width, nv


class SparsePageRank:
    """One rank's state of a distributed PageRank over the sparse allreduce (collective to
    construct: it configures the allreduce once). ``step()`` runs one iteration and
    returns the L1 change of the scores (the same on every rank); ``owned``/``scores`` are
    this rank's vertices and their current scores.

    Set-up renumbers the vertices by :func:`vertex_keys` and gives this rank's touched
    vertices compact slots in key order: its out vector (edge targets) and in vector (edge
    sources and owned vertices) are then in the sparse allreduce's own order, so a reduce
    sends the SpMV's output as it is and writes the next input straight into place. One
    extra key (after all vertices) carries each rank's total flow, so the dangling mass
    comes back with the reduce. The local SpMV is a Rust kernel over a value-free CSR of
    the rank's edges (``_native.PageRankCsr``); ``dtype="float32"`` halves every vector
    and message (scores to about 1e-7 relative).

    ``replication=r``: the group's ranks are r replicas of ``size / r`` logical nodes (rank
    p is logical node ``p % (size / r)``; replicas pass the same edges, see
    :func:`logical_rank`). Construction needs every rank; afterwards an iteration completes
    while one replica of every logical node is alive (no group-wide collective is used:
    the L1 change travels through a second replicated sparse allreduce)."""

    def __init__(self, group, src, dst, n: int, damping: float = 0.85, degrees="auto", dtype="float64",
                 replication: int = 1, isolated: bool = True):
        from .. import _native

        me, size = logical_rank(group, replication)
        self.replication = int(replication)
        dtype = np.dtype(dtype)
        self.group, self.n, self.damping, self.dtype = group, int(n), float(damping), dtype
        src, dst = np.asarray(src), np.asarray(dst)
        if src.dtype.kind not in "iu" or dst.dtype.kind not in "iu":
            raise ValueError(f"SparsePageRank: src and dst must hold integer ids, got {src.dtype} and {dst.dtype}")
        outdeg, key, order, nkeys, nv = vertex_keys(group, src, dst, self.n, self.replication)
        if not isolated:
            # Ids without an edge are not vertices: the graph has the nv that have one.
            self.n = nv
        width = nkeys // size
        flow_key = nkeys  # one key past the vertices: the rank's total flow
        self.owned = order[me:self.n:size].astype(np.int64) if not isolated else order[me::size].astype(np.int64)
        n_own = len(self.owned)
        own_lo_key = me * width
        sk, dk = key[src], key[dst]
        # Compact slots in key order (a marker pass over the key space, linear time).
        mark = np.zeros(nkeys + 1, np.bool_)
        mark[dk] = True
        mark[flow_key] = True
        out_keys = np.flatnonzero(mark)
        mark[:] = False
        mark[sk] = True
        mark[own_lo_key: own_lo_key + n_own] = True
        mark[flow_key] = True
        in_keys = np.flatnonzero(mark)
        del mark
        if max(len(out_keys), len(in_keys)) >= 2**32:
            raise ValueError("SparsePageRank: a rank touches 2**32 or more vertices (slots are uint32)")
        slot = np.empty(nkeys + 1, np.uint32)
        slot[out_keys] = np.arange(len(out_keys), dtype=np.uint32)
        rows = slot[dk]
        slot[in_keys] = np.arange(len(in_keys), dtype=np.uint32)
        cols = slot[sk]
        self.own_lo = int(slot[own_lo_key]) if n_own else 0
        del slot, sk, dk
        self.csr = _native.PageRankCsr(rows, cols, len(out_keys) - 1, len(in_keys), dtype.name)
        del rows, cols
        # 1 / out-degree of the vertex behind every in slot; 0 for vertices without out
        # edges and for the flow slot, which keeps them out of the product.
        k = in_keys[:-1]
        v = order[(k % max(width, 1)) * size + k // max(width, 1)] if len(k) else np.zeros(0, np.int64)
        d = np.zeros(len(in_keys))
        d[:-1] = outdeg[v]
        inv = np.zeros(len(in_keys))
        np.divide(1.0, d, out=inv, where=d > 0)
        self.inv_deg = inv.astype(dtype)
        self.n_local = len(in_keys) - 1
        self.sa = group.sparse_allreduce(nkeys + 1, degrees=degrees, hash=False, replication=self.replication)
        self.sa.config(out_keys, in_keys)
        self._l1 = None
        if self.replication > 1:
            self._l1 = group.sparse_allreduce(1, degrees=degrees, replication=self.replication)
            self._l1.config(np.zeros(1, np.int64), np.zeros(1, np.int64))
        self.y = np.zeros(len(out_keys), dtype)
        self.got = np.zeros(len(in_keys), dtype)
        self.scores = np.full(n_own, 1.0 / max(self.n, 1), dtype)
        self._base, self._d = 1.0 / max(self.n, 1), 0.0  # the first iteration's scores: 1/n
        self._scal = np.zeros(1)
        self.last_comm_s = 0.0  # time in collectives (incl. waiting for peers) of the last step

    def step(self) -> float:
        d = self.damping
        # Local: scores of the in slots from the last reduce, over out-degree, times the
        # matrix; y[-1] = the flow total.
        self.csr.step(self.got, self.inv_deg, self._base, self._d, self.y)
        t0 = time.perf_counter()
        self.sa.reduce(self.y, out=self.got)
        comm = time.perf_counter() - t0
        # Mass that left non-dangling vertices = total flow; the rest is dangling mass.
        dangling = max(0.0, 1.0 - float(self.got[-1]))
        self._base, self._d = (1.0 - d) / self.n + d * dangling / self.n, d
        self._scal[0] = self.csr.owned(self.got, self.own_lo, self._base, d, self.scores)
        t0 = time.perf_counter()
        if self._l1 is not None:
            self._scal[0] = self._l1.reduce(self._scal)[0]
        else:
            self.group.allreduce(self._scal)
        self.last_comm_s = comm + time.perf_counter() - t0
        return float(self._scal[0])


def pagerank(group, src, dst, n: int, damping: float = 0.85, tol: float = 1e-10, max_iter: int = 200,
             degrees="auto", progress: bool = False, dtype="float64", replication: int = 1):
    """Distributed PageRank (networkx semantics: dangling mass spread uniformly; stops when
    the L1 change is ``< tol``). Returns (owned vertex ids, their scores, iterations,
    median seconds per iteration)."""
    pr = SparsePageRank(group, src, dst, n, damping, degrees, dtype, replication)
    it, per_it = iterate(pr, tol, max_iter, progress)
    return pr.owned, pr.scores, it, per_it


def iterate(pr: "SparsePageRank", tol: float, max_iter: int, progress: bool = False, before=None) -> tuple[int, float]:
    """Steps ``pr`` until the L1 change is ``< tol`` or ``max_iter`` steps; ``before(it)``
    is called before step ``it`` (1-based). Returns (iterations, median seconds per step)."""
    times = []
    it = 0
    for it in range(1, max_iter + 1):
        if before is not None:
            before(it)
        t0 = time.perf_counter()
        d = pr.step()
        times.append(time.perf_counter() - t0)
        if progress and pr.group.rank == 0:
            print(f"iteration {it:3d}  L1 change {d:.3e}", file=sys.stderr, flush=True)
        if d < tol:
            break
    return it, float(np.median(times)) if times else 0.0


def gather_scores(group, owned, scores, n: int) -> np.ndarray | None:
    """All n scores on rank 0 (None elsewhere), through one more sparse allreduce."""
    sa = group.sparse_allreduce(n)
    want = np.arange(n, dtype=np.int64) if group.rank == 0 else np.zeros(0, np.int64)
    out = sa.config_reduce(owned, scores, want)
    return out if group.rank == 0 else None


def _save_scores(directory, rank: int, owned, scores) -> None:
    """``DIR/scores.rank{rank}.npz`` (owned vertex ids, their scores), written atomically."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / f"scores.rank{rank}.npz") as tmp:
        np.savez(tmp, owned=np.asarray(owned, np.int64), scores=np.asarray(scores, np.float64))


def _parse_fail(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        r, it = (int(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"scalefree graph pagerank: --fail-rank expects RANK:ITERATION, got {text!r}") from None
    return r, it


def top_scores(group, owned, scores, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Collective: the ``k`` best (vertex, score) pairs over all ranks on rank 0 (None
    elsewhere), best first, ties by vertex id; each rank sends only its own best ``k``."""
    k = max(0, int(k))
    scores = np.asarray(scores, np.float64)
    best = np.lexsort((owned, -scores))[:k] if len(scores) else np.zeros(0, np.int64)
    ids = np.full(k, -1, np.int64)
    vals = np.full(k, -np.inf)
    ids[: len(best)] = np.asarray(owned)[best]
    vals[: len(best)] = scores[best]
    all_ids = group.allgather(ids).reshape(-1)
    all_vals = group.allgather(vals).reshape(-1)
    if group.rank != 0:
        return None
    keep = all_ids >= 0
    all_ids, all_vals = all_ids[keep], all_vals[keep]
    order = np.lexsort((all_ids, -all_vals))[:k]
    return all_ids[order], all_vals[order]


def _pagerank_cmd(args) -> int:
    import json
    import os
    import signal

    import scalefree

    from .._rss import peak_rss_bytes

    g = scalefree.init()
    rep = args.replication
    if rep < 1 or g.size % rep:
        raise SystemExit(f"scalefree graph pagerank: --replication {rep} must divide the rank count {g.size}")
    fail = _parse_fail(args.fail_rank)
    t0 = time.perf_counter()
    s, d, n_ids, edges = load_graph(g, args.edges, rep, args.progress)
    if edges == 0:
        raise SystemExit(f"scalefree graph pagerank: {args.edges}: the graph has no edges")
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    pr = SparsePageRank(g, s, d, n_ids, args.damping, "auto", args.dtype, rep, isolated=False)
    del s, d
    n = pr.n
    me, m = logical_rank(g, rep)
    gather = None
    if rep > 1:
        # Replicated: the gather is configured now, while every rank is alive; after the
        # iterations it runs on whichever replicas survive. Every replica of logical node
        # 0 receives every id's score and prints the best.
        gather = g.sparse_allreduce(n_ids, replication=rep)
        gather.config(pr.owned, np.arange(n_ids, dtype=np.int64) if me == 0 else np.zeros(0, np.int64))
    setup_s = time.perf_counter() - t1

    def before(it):
        if fail and g.rank == fail[0] and it == fail[1]:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection (tests, demos)

    t2 = time.perf_counter()
    it, per_it = iterate(pr, args.tol, args.max_iter, args.progress, before)
    iterate_s = time.perf_counter() - t2
    if gather is not None:
        got = gather.reduce(pr.scores.astype(np.float64))
        best = None
        if me == 0:
            v = np.lexsort((np.arange(n_ids), -got))[: args.top]
            best = (v, got[v])
    else:
        best = top_scores(g, pr.owned, pr.scores, args.top)
    if args.save_scores:
        _save_scores(args.save_scores, g.rank, pr.owned, pr.scores)
    rss = g.allgather(np.array([peak_rss_bytes()], np.int64)).reshape(-1) if rep == 1 else None
    if best is not None:
        who = f" ({m} logical x {rep} replicas; this is replica {g.rank // m} of logical node 0)" if rep > 1 else ""
        print(f"{n} vertices, {edges} edges, {g.size} ranks{who}, {it} iterations, "
              f"{per_it * 1e3:.2f} ms/iteration (load {load_s:.2f} s, set-up {setup_s:.2f} s)", flush=True)
        for v, x in zip(*best):
            print(f"{v}\t{x:.10g}")
        if args.json and g.rank == 0:
            rec = {"vertices": n, "edges": edges, "ranks": g.size, "iterations": it, "load_s": load_s,
                   "setup_s": setup_s, "iterate_s": iterate_s, "per_iteration_s": per_it,
                   "end_to_end_s": time.perf_counter() - t0,
                   "peak_rss_bytes": None if rss is None else rss.tolist(),
                   "top": [[int(v), float(x)] for v, x in zip(*best)]}
            with atomic_path(Path(args.json)) as tmp:
                Path(tmp).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


def _count(text: str) -> int:
    from .._units import parse_bytes

    return parse_bytes(text, "count")


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="graph analytics on the sparse allreduce (pagerank, diameter)")
    s = p.add_subparsers(dest="graph_command", metavar="COMMAND")
    s.required = True
    q = s.add_parser("pagerank", help="PageRank of an edge list over the sparse allreduce",
                     description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("edges", help="edge file: SNAP edge list (# comments, .gz allowed), Matrix Market .mtx[.gz] or .npz")
    q.add_argument("-n", "--ranks", type=int, default=1, help="ranks to run (via scalefree run)")
    q.add_argument("--top", type=int, default=20)
    q.add_argument("--damping", type=float, default=0.85)
    q.add_argument("--tol", type=float, default=1e-10, help="stop when the L1 change is below this")
    q.add_argument("--max-iter", type=int, default=200)
    q.add_argument("--progress", action="store_true", help="print the L1 change per iteration")
    q.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="value type of the scores and messages (float32: half the memory traffic, ~1e-7 relative; use --tol 1e-6 or looser)")
    q.add_argument("--replication", type=int, default=1,
                   help="run the ranks as ranks/R logical nodes with R replicas each: the job finishes with "
                        "correct scores while one replica of every node lives (started with --allow-rank-failure)")
    q.add_argument("--json", metavar="OUT", help="write times, peak RSS per rank and the top vertices here (rank 0)")
    q.add_argument("--save-scores", metavar="DIR",
                   help="every rank writes DIR/scores.rank{R}.npz (its owned vertex ids and their scores)")
    q.add_argument("--fail-rank", metavar="RANK:ITERATION",
                   help="fault injection: that rank SIGKILLs itself before that iteration (to try --replication)")
    q.set_defaults(func=_launch)
    r = s.add_parser("rmat", help="write a seeded R-MAT power-law graph as an edge list",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("out", help="output: .npz (src, dst arrays), .gz (compressed edge list), a directory with "
                               "--parts, else a SNAP edge list")
    r.add_argument("--scale", type=int, default=16, help="2**scale vertex ids")
    r.add_argument("--edges", type=_count, default="1M", help="edges to generate (K, M, G: binary multiples)")
    r.add_argument("--parts", type=int, default=0, help="write a directory of this many text parts")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=_rmat_cmd)
    from . import hadi

    hadi.add_parser(s)


def launch_or_run(args, run) -> int:
    """With ``-n`` > 1 outside a job, starts the ranks with the launcher (each runs this
    same command line); inside one, or with one rank, calls ``run(args)``."""
    import os
    import subprocess

    if args.ranks > 1 and "SCALEFREE_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        argv = [a for a in sys.argv[1:]]
        keep = ["--allow-rank-failure"] if getattr(args, "replication", 1) > 1 else []
        cmd = [sys.executable, "-m", "scalefree.launch.launcher", "-n", str(args.ranks), *keep, "--",
               sys.executable, "-m", "scalefree.cli", *argv]
        return subprocess.call(cmd)
    return run(args)


def _launch(args) -> int:
    return launch_or_run(args, _pagerank_cmd)
