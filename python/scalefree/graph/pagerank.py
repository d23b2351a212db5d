"""Graph analytics on the sparse allreduce: ``scalefree graph pagerank EDGES -n 4 --top 20``.

Each rank reads its share of the edge file and sends every edge to the rank that owns it
(a hash of the edge), which drops duplicates. Each rank renumbers the vertices
its edges touch into compact local ids, so its vectors and its SpMV have the size of what
it touches, not of the graph; per iteration one sparse allreduce (configured once) sums the
rank flow each rank produced for its edge targets and returns it for its edge sources and
for the vertices it owns (``v % size == rank``), which it uses for the convergence test.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .io import logical_rank


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
