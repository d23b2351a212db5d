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

from .._cores import usable_cores
from .._units import parse_positive_bytes
from ..ssp.straggler import StragglerSchedule
from .io import local_ids, logical_rank, sorted_unique


def vertex_owner(ids, size: int) -> np.ndarray:
    """The rank that owns each vertex id: a seeded hash of the id modulo ``size``."""
    with np.errstate(over="ignore"):
        h = np.asarray(ids).astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        h ^= h >> np.uint64(32)
        h *= np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return (h % np.uint64(size)).astype(np.uint16)


def vertex_keys(group, src, dst, n: int, replication: int = 1, isolated: bool = True):
    """Collective: numbers the vertices for the sparse allreduce without hashing, touching
    only what this rank holds (memory O(its edges + the ids they touch)).

    Each vertex has an owner (:func:`vertex_owner`), which learns its vertices from the
    ranks that touch them (an ``alltoallv`` of their distinct ids; with ``isolated`` every
    id in ``[0, n)`` is a vertex). One sparse allreduce sums the out- and in-degrees of
    every touched and owned vertex. Owner ``r`` numbers its vertices by falling total degree
    into keys ``[r * B, r * B + count)`` (``B`` the largest count), so the hubs spread over
    the ranks as the hash spreads them and each rank's keys, sorted, stay close to degree
    order (hub entries together, which keeps its SpMV's gathers in cache); a second sparse
    allreduce hands every rank the keys of the vertices it touches. When the id space is no
    larger than a rank's share of the edge endpoints, dense allreduces over it do the same
    faster (arrays over the id space then cost no more than the rank's edges).

    Returns a dict: ``ids`` (the distinct ids of ``src``/``dst``, sorted), ``src``/``dst``
    (the edges as indices into ``ids``), ``key`` and ``outdeg`` of each of ``ids``,
    ``owned`` (this rank's vertices in key order), ``owned_outdeg``, ``width`` (``B``),
    ``nkeys`` and ``vertices`` (the graph's vertex count). With ``replication`` r, ranks
    are r replicas of ``size / r`` logical nodes holding the same edges."""
    me, size = logical_rank(group, replication)
    m = len(src)
    ids, s_loc, d_loc = local_ids(src, dst, n)

    edges_all = int(group.allreduce(np.array([m], np.int64))[0]) // replication
    if n <= 2 * (edges_all // size) + 1:
        # The id space is no larger than a rank's share of the edge endpoints: arrays over it
        # cost no more memory than the rank's edges, and a dense allreduce is the fastest
        # way to sum degrees and spread keys. (The same choice on every rank.)
        outdeg, owned, owned_outdeg, owned_total, key_of = _dense_degrees(group, src, dst, n, size, me, replication,
                                                                         isolated)
    else:
        outdeg, owned, owned_outdeg, owned_total = _sparse_degrees(group, ids, s_loc, d_loc, n, size, me, replication,
                                                                   isolated)
        key_of = None
    by_degree = np.lexsort((owned, -owned_total))
    owned, owned_outdeg = owned[by_degree], owned_outdeg[by_degree]
    width = int(group.allreduce(np.array([len(owned)], np.int64), op="max")[0])
    vertices = int(group.allreduce(np.array([len(owned)], np.int64))[0]) // replication
    nkeys = size * width
    kt = np.uint32 if nkeys + 1 < 1 << 32 else np.int64
    mine = me * width + np.arange(len(owned), dtype=np.int64)
    if key_of is not None:
        key_of[owned] = mine
        group.allreduce(key_of, op="max")
        key = key_of[ids].astype(kt)
        del key_of
    else:
        keys = group.sparse_allreduce(max(n, 1), op="max", replication=replication)
        key = keys.config_reduce(owned, mine, ids).astype(kt)
    if len(outdeg) != len(ids):
        outdeg = outdeg[ids]
    return {"ids": ids, "src": s_loc, "dst": d_loc, "key": key, "outdeg": outdeg, "owned": owned,
            "owned_outdeg": owned_outdeg, "width": width, "nkeys": nkeys, "vertices": vertices}


def _dense_degrees(group, src, dst, n, size, me, replication, isolated):
    """Degrees and owned vertices by dense allreduces over the id space (see vertex_keys)."""
    from .. import _native

    src, dst = np.asarray(src), np.asarray(dst)
    if src.dtype != dst.dtype:
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    deg = _native.degree_counts(np.ascontiguousarray(src), np.ascontiguousarray(dst), n)
    group.allreduce(deg)
    if replication > 1:
        deg /= replication  # every replica added the same edges
    total = deg[:n] + deg[n:]
    cand = np.arange(n, dtype=np.int64) if isolated else np.flatnonzero(total > 0)
    owned = cand[vertex_owner(cand, size) == me]
    del cand
    key_of = np.full(n, -1, np.int64)
    return deg[:n], owned, deg[:n][owned], total[owned], key_of


def _sparse_degrees(group, ids, s_loc, d_loc, n, size, me, replication, isolated):
    """Degrees and owned vertices through the sparse allreduce, O(touched ids) per rank
    (see vertex_keys). Returns the out-degrees of ``ids`` too."""
    from .. import _native
    if isolated:
        cand = np.arange(n, dtype=np.int64)
        owned = cand[vertex_owner(cand, size) == me]
        del cand
    else:
        own = vertex_owner(ids, size)
        order = np.argsort(own, kind="stable")
        counts = np.zeros(group.size, np.int64)
        first = (group.rank // size) * size
        counts[first:first + size] = np.bincount(own, minlength=size)
        got = group.alltoallv(ids[order], counts)
        del own, order
        owned = sorted_unique(got)
    counts = _native.degree_counts(s_loc, d_loc, len(ids))
    local = np.stack([counts[: len(ids)], counts[len(ids):]], axis=1)
    del counts
    degs = group.sparse_allreduce(max(n, 1), replication=replication)
    deg = degs.config_reduce(ids, local, np.concatenate([ids, owned]))
    del local  # (replicated: the first replica's sums are used, not the sum over replicas)
    owned_deg = deg[len(ids):]
    return deg[: len(ids), 0], owned, owned_deg[:, 0], owned_deg[:, 0] + owned_deg[:, 1]


# Slots a rank numbers in uint32 (4 bytes per edge in its CSR); a rank with more out or in
# slots (it touches 2**32 vertices or more: its vectors alone hold that many values) numbers
# them in uint64, 8 bytes per edge. The global ids and keys are 64-bit.
NARROW_SLOTS = 2**32


def _local_slots(vk, key, t_in, own_lo_key: int, n_own: int, flow_key: int):
    """(out keys, in keys, CSR rows, CSR columns) of the rank's edges by sorting the keys it
    touches (memory O(its edges and touched vertices)); the native ``from_edges`` does the
    same with bitmaps over the key space. Rows and columns are uint32 slots, or uint64 ones
    when the rank has more than :data:`NARROW_SLOTS` out or in slots."""
    used = np.zeros(len(key), np.bool_)
    used[vk["dst"]] = True
    t_out = np.flatnonzero(used)
    del used
    o = np.argsort(key[t_out], kind="stable")
    out_keys = np.append(key[t_out][o].astype(np.int64), flow_key)
    own_keys = np.arange(own_lo_key, own_lo_key + n_own, dtype=np.int64)
    in_keys = np.append(sorted_unique(np.concatenate([key[t_in].astype(np.int64), own_keys])), flow_key)
    st = np.uint32 if max(len(out_keys), len(in_keys)) <= NARROW_SLOTS else np.uint64
    slot = np.empty(len(key), st)
    slot[t_out[o]] = np.arange(len(t_out), dtype=st)
    rows = slot[vk["dst"]]
    slot[t_in] = np.searchsorted(in_keys, key[t_in]).astype(st)
    cols = slot[vk["src"]]
    return out_keys, in_keys, rows, cols


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
    the L1 change travels through a second replicated sparse allreduce).

    ``slack=s`` (asynchronous PageRank, bounded staleness): the reduce may use other ranks'
    flow up to ``s`` iterations old instead of waiting for a slow rank (the sparse
    allreduce's ``slack``), and no iteration synchronizes the ranks. Every ``check_every``
    iterations (default ``max(s, 1)``) a check flushes the allreduce: the scores become
    the exact result of every rank's latest flow, and ``step`` returns the mean L1 change
    per iteration of these exact scores since the previous check (``inf`` between checks),
    which is at least the change of the last iteration while the iteration contracts, so
    stopping on it is no looser than the synchronous test. :meth:`finish` flushes once
    more when the last step was no check.

    ``memory_budget`` (bytes, or a size such as ``"64M"``): once built, the rank's CSR moves
    to a scratch file of a flash runtime with that budget (in ``flash_dir``, default
    ``SCALEFREE_FLASH_DIR`` or the system temp dir; unnamed, so nothing is left behind even
    after a crash) and every step streams it once, in row blocks, prefetched under the
    budget; the vectors stay in memory. The scores are the same bit for bit.
    ``flash_threads``: the runtime's compute threads (default: this machine's cores over the
    group's ranks, at least 1)."""

    def __init__(self, group, src, dst=None, n: int | None = None, damping: float = 0.85, degrees="auto",
                 dtype="float64", replication: int = 1, isolated: bool = True, columns=None,
                 slack: int | None = None, check_every: int | None = None, *,
                 memory_budget=None, flash_dir=None, flash_threads: int | None = None):
        from .. import _native

        me, size = logical_rank(group, replication)
        self.replication = int(replication)
        dtype = np.dtype(dtype)
        src, dst = _edge_arrays(src, dst, columns)
        if n is None:
            top = max((int(a.max()) for a in (src, dst) if a.size), default=-1) + 1
            n = int(group.allreduce(np.array([top], np.int64), op="max")[0])
        self.group, self.n, self.damping, self.dtype = group, int(n), float(damping), dtype
        if src.dtype.kind not in "iu" or dst.dtype.kind not in "iu":
            raise ValueError(f"SparsePageRank: src and dst must hold integer ids, got {src.dtype} and {dst.dtype}")
        vk = vertex_keys(group, src, dst, self.n, self.replication, isolated)
        if not isolated:
            # Ids without an edge are not vertices: the graph has those that have one.
            self.n = vk["vertices"]
        key, width, nkeys = vk["key"], vk["width"], vk["nkeys"]
        flow_key = nkeys  # one key past the vertices: the rank's total flow
        self.owned = vk["owned"]
        n_own = len(self.owned)
        own_lo_key = me * width
        # Out slots: the keys of the edge targets, sorted; in slots: the keys of the edge
        # sources and of the owned vertices, sorted; the flow key last in both.
        used = np.zeros(len(key), np.bool_)
        used[vk["src"]] = True
        t_in = np.flatnonzero(used)
        del used
        native = key.dtype == np.uint32 and nkeys // 4 <= 8 * max(len(vk["src"]), 1) and nkeys + 1 <= NARROW_SLOTS
        if native:
            # Native: two bitmaps over the key space (no larger than the rank's edges here).
            self.csr, out_keys, in_keys = _native.PageRankCsr.from_edges(
                vk["src"], vk["dst"], key, flow_key, own_lo_key, n_own, dtype.name)
        else:
            out_keys, in_keys, rows, cols = _local_slots(vk, key, t_in, own_lo_key, n_own, flow_key)
            self.csr = _native.PageRankCsr(rows, cols, len(out_keys) - 1, len(in_keys), dtype.name)
            del rows, cols
        self.flash_runtime = None
        if memory_budget is not None:
            threads = flash_threads or max(1, usable_cores() // max(1, group.size))
            self.flash_runtime = _native.FlashRuntime(parse_positive_bytes(memory_budget, "memory_budget"), threads,
                                                      None if flash_dir is None else str(flash_dir), "")
            self.csr.move_to_flash(self.flash_runtime)
        if native:
            at = np.empty(nkeys + 1, np.uint32)  # slot of every key (the key space is small here)
            at[in_keys] = np.arange(len(in_keys), dtype=np.uint32)
            src_slots = at[key[t_in]]
            del at
        else:
            src_slots = np.searchsorted(in_keys, key[t_in])
        self.own_lo = int(np.searchsorted(in_keys, own_lo_key)) if n_own else 0
        # 1 / out-degree of the vertex behind every in slot; 0 for vertices without out
        # edges and for the flow slot, which keeps them out of the product.
        d = np.zeros(len(in_keys))
        d[src_slots] = vk["outdeg"][t_in]
        d[self.own_lo:self.own_lo + n_own] = vk["owned_outdeg"]
        inv = np.zeros(len(in_keys))
        np.divide(1.0, d, out=inv, where=d > 0)
        self.inv_deg = inv.astype(dtype)
        del vk
        self.n_local = len(in_keys) - 1
        self.slack = None if slack is None else int(slack)
        self.check_every = max(1, int(check_every if check_every is not None else (self.slack or 1)))
        self.sa = group.sparse_allreduce(nkeys + 1, degrees=degrees, hash=False, replication=self.replication,
                                         slack=self.slack)
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
        self._since = 0  # slack: steps since the last check, and the scores it left
        self._checked = self.scores.copy() if self.slack is not None else None

    def step(self) -> float:
        if self.slack is not None:
            return self._step_stale()
        # Local: scores of the in slots from the last reduce, over out-degree, times the
        # matrix; y[-1] = the flow total.
        self.csr.step(self.got, self.inv_deg, self._base, self._d, self.y)
        t0 = time.perf_counter()
        self.sa.reduce(self.y, out=self.got)
        comm = time.perf_counter() - t0
        self._scal[0] = self._scores_from_got()
        t0 = time.perf_counter()
        if self._l1 is not None:
            self._scal[0] = self._l1.reduce(self._scal)[0]
        else:
            self.group.allreduce(self._scal)
        self.last_comm_s = comm + time.perf_counter() - t0
        return float(self._scal[0])

    def _scores_from_got(self) -> float:
        """The next iteration's base from the flow total in ``got``, and the owned scores;
        returns their L1 change on this rank."""
        d = self.damping
        # Mass that left non-dangling vertices = total flow; the rest is dangling mass.
        dangling = max(0.0, 1.0 - float(self.got[-1]))
        self._base, self._d = (1.0 - d) / self.n + d * dangling / self.n, d
        return self.csr.owned(self.got, self.own_lo, self._base, d, self.scores)

    def _step_stale(self) -> float:
        """One iteration with slack (see the class docs); a check every ``check_every``."""
        self.csr.step(self.got, self.inv_deg, self._base, self._d, self.y)
        t0 = time.perf_counter()
        self.sa.reduce(self.y, out=self.got)
        self.last_comm_s = time.perf_counter() - t0
        self._since += 1
        if self._since < self.check_every:
            self._scores_from_got()
            return float("inf")
        return self._check()

    def _check(self) -> float:
        """Flush: the scores from every rank's latest flow, exactly; returns the mean L1 change
        per iteration of these exact scores since the previous check (the same on every rank)."""
        t0 = time.perf_counter()
        steps, self._since = self._since, 0
        self.sa.flush(out=self.got)
        self._scores_from_got()
        self._scal[0] = float(np.abs(self.scores.astype(np.float64) - self._checked).sum())
        self._checked[...] = self.scores
        if self._l1 is not None:
            self._scal[0] = self._l1.reduce(self._scal)[0]
        else:
            self.group.allreduce(self._scal)
        self.last_comm_s += time.perf_counter() - t0
        return float(self._scal[0]) / max(steps, 1)

    def finish(self) -> None:
        """With slack: a last check when the last step was none, so the scores are exact."""
        if self.slack is not None and self._since > 0:
            self._check()

    def state(self) -> dict:
        """This rank's state between iterations, for a checkpoint: its scores, the in slots of
        the last reduce and the next iteration's base and damping (:meth:`restore` continues
        bit for bit)."""
        return {"scores": self.scores, "got": self.got, "base_d": np.array([self._base, self._d])}

    def restore(self, state: dict) -> None:
        """Continues from :meth:`state` of a run over the same edges, ranks and options."""
        if state["got"].shape != self.got.shape or state["scores"].shape != self.scores.shape:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError("checkpoint does not fit this rank's share of the graph")
        self.scores[...] = state["scores"]
        self.got[...] = state["got"]
        self._base, self._d = (float(x) for x in state["base_d"])


def _edge_arrays(src, dst, columns=None) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) as arrays: given as two arrays, or ``src`` a table and ``dst`` None
    (pandas / polars / pyarrow, a 2-D array, a scipy sparse adjacency matrix:
    :func:`scalefree._tables.table_columns`, columns by name or the first two integer ones)."""
    from .. import _tables

    if dst is None:
        if not _tables.is_table(src):
            raise ValueError("SparsePageRank: pass src and dst arrays, or a table of edges as src")
        src, dst = _tables.table_columns(src, (_tables.ID, _tables.ID), columns, "edges")
    src, dst = np.asarray(src), np.asarray(dst)
    # The native kernels take uint32, int64 or uint64 ids, one dtype for both (views when so).
    if src.dtype.kind in "iu" and dst.dtype.kind in "iu" and (
            src.dtype != dst.dtype or src.dtype not in (np.uint32, np.int64, np.uint64)):
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    return src, dst


def pagerank(group, src, dst=None, n: int | None = None, damping: float = 0.85, tol: float = 1e-10,
             max_iter: int = 200, degrees="auto", progress: bool = False, dtype="float64", replication: int = 1,
             columns=None, slack: int | None = None):
    """Distributed PageRank (networkx semantics: dangling mass spread uniformly; stops when
    the L1 change is ``< tol``). ``src``/``dst``: this rank's edges as arrays, or ``src`` a
    table of them (pandas, polars, pyarrow, 2-D array, scipy sparse; ``columns`` by name) and
    ``dst`` None; ``n``: the id space (default: the largest id over all ranks + 1); ``slack``:
    asynchronous iterations (see :class:`SparsePageRank`). Returns (owned vertex ids, their
    scores, iterations, median seconds per iteration)."""
    pr = SparsePageRank(group, src, dst, n, damping, degrees, dtype, replication, columns=columns, slack=slack)
    it, per_it = iterate(pr, tol, max_iter, progress)
    return pr.owned, pr.scores, it, per_it


def iterate(pr: "SparsePageRank", tol: float, max_iter: int, progress: bool = False, before=None,
            checkpoints=None, straggler_ms: float = 0.0, seed: int = 0) -> tuple[int, float]:
    """Steps ``pr`` until the L1 change is ``< tol`` or ``max_iter`` steps; ``before(it)``
    is called before step ``it`` (1-based). ``checkpoints``: a
    :class:`~scalefree.checkpoint.Checkpoints` (collective; the run resumes from it and saves
    to it, and ends early at its ``stop_after``). ``straggler_ms``: before each step one rank,
    drawn by :class:`~scalefree.ssp.straggler.StragglerSchedule` (``seed``), sleeps up to that
    long (benchmarks of ``slack``). Returns (iterations, median seconds per step)."""
    delays = StragglerSchedule(straggler_ms, seed, pr.group.size).delays_s(pr.group.rank, max_iter + 1)
    times = []
    start, state = (0, None) if checkpoints is None else checkpoints.restore()
    it = start
    if state is not None:
        pr.restore(state)
        if float(state["change"][0]) < tol:
            return it, 0.0  # the checkpointed run had converged
    for it in range(start + 1, max_iter + 1):
        if before is not None:
            before(it)
        if delays[it]:
            time.sleep(delays[it])
        t0 = time.perf_counter()
        d = pr.step()
        times.append(time.perf_counter() - t0)
        if progress and pr.group.rank == 0 and d != float("inf"):
            print(f"iteration {it:3d}  L1 change {d:.3e}", file=sys.stderr, flush=True)
        if d < tol:
            break
        if checkpoints is not None and checkpoints.after(it, lambda: {**pr.state(), "change": np.array([d])}):
            break
    pr.finish()
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
