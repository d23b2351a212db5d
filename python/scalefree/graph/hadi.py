"""HADI diameter estimation on the sparse allreduce:
``scalefree graph diameter EDGES -n 4``.

Every vertex ``v`` carries a bitstring ``b_h(v)`` that stands for the set of vertices it
reaches in at most ``h`` hops along the edges; one hop is ``b_{h+1}(v) = b_h(v) | OR over
edges v->u of b_h(u)`` (eq. 3 of the sparse allreduce paper: a matrix-vector product where
OR replaces the sum). Each rank reads its share of the edge file (edges go to the rank that owns them, which drops
duplicates; ids stay as written); each rank
ORs the bitstrings of its edge targets into its edge sources, and one OR sparse allreduce
(configured once) combines the partial results and hands every rank the bitstrings of its
edge targets and of the vertices it owns (``v % size == rank``) for the next hop.

Three encodings of a set:

* ``hll`` — a HyperLogLog counter per vertex (what ``auto`` picks past 16384 ids, as
  HyperANF/HyperBall do): ``m = 2^precision`` uint8 registers; vertex ``v`` hashes to one
  register ``j`` (the top ``precision`` bits of a seeded 64-bit hash, so every rank agrees
  without a message) and writes there the position of the first one bit of the rest. The
  union of two sets is the register-wise max, so the hop is a max over edges (the Rust
  kernel ``scalefree_graph::hadi::union_changed``), the rows partitioned by owner
  (:func:`_hadi_partitioned`), beside a bitset of sampled targets. The size of a set is the HyperLogLog estimate
  ``alpha_m m^2 / sum_j 2^-M[j]`` with its bias constant ``alpha_m``, and linear counting
  ``m ln(m / zeros)`` in the small range (estimate <= 2.5 m with an empty register); 64-bit
  hashes need no large-range correction. Relative standard error of one counter
  ``1.04 / sqrt(m)`` (6.5 % at the default precision 8). ``N(h)`` sums ``n`` counters,
  but late hops of a graph with a giant component sum nearly the same set ``n`` times, so
  its error there is one counter's, not smaller (see ``docs/algorithms.md``). ``N(0)`` is the exact
  vertex count, not an estimate.
* ``fm`` — ``K`` Flajolet–Martin bitstrings (uint32) per vertex: vertex ``v`` sets bit ``i``
  of string ``k`` with probability ``2^-(i+1)`` (from a seeded hash of ``v`` and ``k``, so
  every rank agrees without a message); the size of a set is estimated as
  ``2^(mean_k R_k) / 0.77351`` with ``R_k`` the lowest zero bit of string ``k`` (biased
  upwards on small sets; kept for comparison).
* ``exact`` — one bit per vertex (``ceil(n/64)`` uint64 words per vertex): exact counts,
  for graphs small enough (``auto`` picks it up to 16384 vertices).

The neighbourhood function ``N(h)`` is the number of (source, target) pairs with the target
within ``h`` hops (``N(0) = n``); the effective diameter is the smallest ``h`` with
``N(h) >= 0.9 * N(h_last)`` (and, interpolated linearly between hops, a real number).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .. import _native, arena
from .._cores import usable_cores
from .._units import parse_positive_bytes
from ..errors import InvalidArgumentError
from .io import compact_ids

FM_CORRECTION = 0.77351
HLL_PRECISION = 8  # 256 registers a vertex: one counter within 1.04/sqrt(256) = 6.5 %
HLL_PRECISION_MAX = 16
HLL_COUNT_ROWS = 1 << 15  # rows counted at a time (a float64 temporary of rows x m)
HLL_SAMPLE = 4096  # sampled target vertices: bits a vertex beside the registers (0: none)
HOP_ROUND_BYTES = 32 << 20  # partial rows a rank sends in one round of a hop
ID_BYTES = 8  # a message is a vertex id (int64) and its partial row (scalefree_graph::hadi::ID_BYTES)
SAMPLE_SALT = 0x5851F42D4C957F2D  # the sample's hash differs from the registers'
EXACT_AUTO_MAX = 16384
EXACT_MAX = 1 << 24  # 2 MiB of bits per vertex


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _trailing_zeros(x: np.ndarray, cap: int) -> np.ndarray:
    """Trailing zero bits of each uint64 (``cap`` for 0 and anything past ``cap``)."""
    with np.errstate(over="ignore"):
        low = x & (~x + np.uint64(1))
    tz = np.full(x.shape, cap, np.int64)
    nz = low != 0
    tz[nz] = np.log2(low[nz].astype(np.float64)).astype(np.int64)
    return np.minimum(tz, cap)


def _popcount(a: np.ndarray) -> np.ndarray:
    """Set bits per row of a 2-D unsigned array."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(a).sum(axis=1, dtype=np.int64)
    return np.unpackbits(np.ascontiguousarray(a).view(np.uint8), axis=1).sum(axis=1, dtype=np.int64)


class Encoding:
    """How a vertex set is stored in a row of unsigned words, and how it is counted."""

    def __init__(self, method: str, n: int, k: int = 32, seed: int = 0, precision: int = HLL_PRECISION):
        if method == "auto":
            method = "exact" if n <= EXACT_AUTO_MAX else "hll"
        if method not in ("exact", "fm", "hll"):
            raise ValueError(f'method must be "auto", "exact", "hll" or "fm", got {method!r}')
        if not 4 <= precision <= HLL_PRECISION_MAX:
            raise ValueError(f"the HyperLogLog precision must be in [4, {HLL_PRECISION_MAX}] (2^precision registers), "
                             f"got {precision}")
        if method == "exact" and n > EXACT_MAX:
            raise ValueError(f"exact bitsets take a bit per id of the id space per vertex: {n} ids is too many "
                             f"(at most {EXACT_MAX}); use the Flajolet-Martin method")
        if k < 1:
            raise ValueError(f"the number of FM bitstrings must be >= 1, got {k}")
        self.method, self.n, self.k, self.seed, self.precision = method, int(n), int(k), int(seed), int(precision)
        if method == "exact":
            self.width, self.dtype = max(1, (self.n + 63) // 64), np.uint64
        elif method == "hll":
            self.width, self.dtype = 1 << self.precision, np.uint8
        else:
            self.width, self.dtype = self.k, np.uint32

    def initial(self, vertices: np.ndarray) -> np.ndarray:
        """Rows ``b_0(v)`` (each vertex reaches itself) for the given vertex ids."""
        v = np.asarray(vertices, np.int64)
        out = np.zeros((len(v), self.width), self.dtype)
        if self.method == "exact":
            out[np.arange(len(v)), v // 64] = np.left_shift(np.uint64(1), (v % 64).astype(np.uint64))
            return out
        if self.method == "hll":
            h = _splitmix64(_splitmix64(v.astype(np.uint64)) ^ np.uint64(self.seed & 0xFFFFFFFFFFFFFFFF))
            p = self.precision
            j = (h >> np.uint64(64 - p)).astype(np.int64)
            rest = h << np.uint64(p)  # the low 64 - p bits, at the top
            # rank = leading zeros of rest + 1, capped at 64 - p + 1 (rest == 0)
            lz = np.zeros(len(v), np.int64)
            x = rest.copy()
            for shift in (32, 16, 8, 4, 2, 1):
                top_clear = (x >> np.uint64(64 - shift)) == 0
                lz[top_clear] += shift
                x[top_clear] <<= np.uint64(shift)
            lz[rest == 0] = 64
            out[np.arange(len(v)), j] = (np.minimum(lz, 64 - p) + 1).astype(np.uint8)
            return out
        key = (v.astype(np.uint64)[:, None] * np.uint64(self.k) + np.arange(self.k, dtype=np.uint64)[None, :])
        h = _splitmix64(_splitmix64(key) ^ np.uint64(self.seed & 0xFFFFFFFFFFFFFFFF))
        bit = _trailing_zeros(h, 31)
        out[:] = np.left_shift(np.uint32(1), bit.astype(np.uint32))
        return out

    def count(self, rows: np.ndarray) -> np.ndarray:
        """The (estimated) size of the set of each row, as float64."""
        if len(rows) == 0:
            return np.zeros(0)
        if self.method == "exact":
            return _popcount(rows).astype(np.float64)
        if self.method == "hll":
            return _hll_estimate(rows)
        r = _trailing_zeros((~rows).astype(np.uint64), 32)  # lowest zero bit
        return np.exp2(r.mean(axis=1)) / FM_CORRECTION


def _hll_estimate(rows: np.ndarray) -> np.ndarray:
    """HyperLogLog estimates of uint8 register rows (``m`` a power of two >= 16): the raw
    estimate with its bias constant, linear counting in the small range."""
    m = rows.shape[1]
    alpha = {16: 0.673, 32: 0.697, 64: 0.709}.get(m, 0.7213 / (1 + 1.079 / m))
    inv = np.exp2(-np.arange(256, dtype=np.float64))
    out = np.empty(len(rows))
    for lo in range(0, len(rows), HLL_COUNT_ROWS):
        r = rows[lo: lo + HLL_COUNT_ROWS]
        raw = alpha * m * m / inv[r].sum(axis=1)
        zeros = (r == 0).sum(axis=1)
        small = (raw <= 2.5 * m) & (zeros > 0)
        raw[small] = m * np.log(m / zeros[small])
        out[lo: lo + len(r)] = raw
    return out


def _bottom_sample(group, vertices: np.ndarray, s: int, seed: int) -> tuple[np.ndarray, int]:
    """Collective. The ``s`` vertices of smallest seeded hash over all ranks (every vertex of
    a graph of at most ``s``): a uniform sample without replacement that every rank agrees
    on from one allgather. Returns (each of ``vertices``' index in the sample, -1 if not
    sampled; the sample size)."""
    h = _splitmix64(_splitmix64(vertices.astype(np.uint64) + np.uint64(SAMPLE_SALT))
                    ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    top = np.uint64(0xFFFFFFFFFFFFFFFF)  # padding (a vertex hashing there is never sampled)
    mine = np.full(s, top, np.uint64)
    low = np.sort(np.partition(h, s - 1)[:s]) if len(h) > s else np.sort(h)
    mine[: len(low)] = low
    every = np.sort(group.allgather(mine).reshape(-1))[:s]
    every = every[every != top]
    at = np.searchsorted(every, h)
    hit = at < len(every)
    hit[hit] = every[at[hit]] == h[hit]
    return np.where(hit, at, -1), len(every)


def _combine(est: np.ndarray, hits: np.ndarray, m: int, n: float, sample: int) -> tuple[np.ndarray, np.ndarray]:
    """Per vertex, the size of its set from its two estimates, and that estimate's standard
    deviation.

    * HyperLogLog, ``est`` (``m`` registers): standard deviation ``sqrt(m (e^t - t - 1))``
      with ``t = size / m`` in linear counting's range (``t <= 2.5``), else ``1.04 size /
      sqrt(m)``.
    * The target sample: ``hits`` of the ``sample`` sampled vertices (of ``n``) lie in the
      set, so ``hits n / sample`` estimates its size without bias; hypergeometric variance
      ``size (n - size) (n - sample) / (sample (n - 1))``: zero when every vertex is
      sampled, small for sets holding a large share of the vertices (which is where the
      counters' errors do not average out: the late hops, where most vertices hold nearly
      the same set).

    The two are independent (separate hashes); the result is their inverse-variance
    weighted mean, the variances taken at the HyperLogLog size (clipped to ``[1, n]``), then
    once more at that mean."""
    def variances(size):
        size = np.clip(size, 1.0, max(n, 1.0) if sample else None)
        t = size / m
        lc = np.minimum(t, 2.5)  # linear counting's range (no overflow in the branch not taken)
        var_h = np.where(t <= 2.5, m * (np.expm1(lc) - lc), (1.04 ** 2 / m) * size * size)
        return var_h, size * (n - size) * max(n - sample, 0.0) / (sample * max(n - 1.0, 1.0)) if sample else None

    var_h, var_s = variances(est)
    if sample == 0:
        return est, np.sqrt(var_h)
    by_sample = hits * (n / sample)
    for second in (False, True):
        if second:  # the variances again at the combined size (a counter past n says nothing of var_s)
            var_h, var_s = variances(mean)
        total = var_h + var_s
        w = np.divide(var_h, total, out=np.ones_like(total), where=total > 0)
        mean = (1 - w) * est + w * by_sample
    return mean, np.sqrt(np.divide(var_h * var_s, total, out=np.zeros_like(total), where=total > 0))


def effective_diameter(nf, fraction: float = 0.9) -> tuple[int, float]:
    """(smallest h with ``N(h) >= fraction * N(last)``, the same interpolated linearly
    between hops). ``nf[h]`` is the neighbourhood function."""
    nf = np.asarray(nf, np.float64)
    if len(nf) == 0:
        return 0, 0.0
    goal = fraction * nf[-1]
    h = int(np.argmax(nf >= goal - 1e-9 * max(1.0, abs(goal))))
    if h == 0 or nf[h] == nf[h - 1]:
        return h, float(h)
    return h, float(h - 1 + (goal - nf[h - 1]) / (nf[h] - nf[h - 1]))


def _estimates(rows: np.ndarray, m: int, sample: int) -> tuple[np.ndarray, np.ndarray]:
    """(HyperLogLog estimate, sampled targets reached) of every row, a piece at a time."""
    est, hits = np.empty(len(rows)), np.zeros(len(rows), np.int64)
    for lo in range(0, len(rows), HLL_COUNT_ROWS):
        est[lo: lo + HLL_COUNT_ROWS] = _hll_estimate(rows[lo: lo + HLL_COUNT_ROWS, :m])
        if sample:
            hits[lo: lo + HLL_COUNT_ROWS] = _popcount(rows[lo: lo + HLL_COUNT_ROWS, m:])
    return est, hits


def _hadi_partitioned(group, edges: list, n: int, enc: Encoding, sample: int, isolated: bool, max_hops: int,
                      progress: bool, checkpoints, stats: dict | None, memory_budget=None, flash_dir=None,
                      flash_threads: int | None = None):
    """HADI on HyperLogLog registers plus a sampled-target bitset, the rows partitioned by
    owner (``v % size``): memory O(vertices / ranks + edges / ranks) per rank, or
    O(vertices / ranks) with ``memory_budget`` (the edges on flash).

    Every edge goes to the owner of its target, so a rank reads only rows it owns. A hop
    computes, for each source of its edges, the union of its targets' rows over the targets
    that changed in the last hop (``_native.hadi_union_changed``, or ``FlashRows.union_changed``
    with the edges streamed from flash: the same row loop), and sends those partial rows,
    in rounds of at most ``HOP_ROUND_BYTES``, to the sources' owners, which merge them
    into the next hop's rows (``_native.hadi_merge_rows``: byte max for the registers, OR
    for the bits, and the sample's column counts kept current). Rows whose targets did not
    change are not recomputed nor sent (HyperBall's modified-counter tracking). The
    kernel writes each partial row after its source's id, packed: its output is the
    message, and the received messages are merged as they are (no copy per round).

    Memory per rank: two copies of the owned rows (this hop's and the next), the edges
    (4 bytes each, 8 per source; none with ``memory_budget``), one round's message buffers
    (``HOP_ROUND_BYTES`` out, as much in). The set-up's temporaries go before the rows are
    allocated, and the registered arena's cache of them goes back to the kernel
    (:func:`scalefree.arena.release_cached`)."""
    me, size = group.rank, group.size
    m = enc.width
    src, dst = edges  # ``[src, dst]``, emptied: the arrays go once they are sent
    edges.clear()
    dest = (dst % size).astype(np.int32)
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=size)
    del dest
    pairs = np.empty((len(src), 2), np.uint32 if n <= 1 << 32 else np.int64)  # every rank decides alike
    pairs[:, 0], pairs[:, 1] = src[order], dst[order]
    del order, src, dst
    pairs = group.alltoallv(pairs, counts)
    e_src, e_dst = pairs[:, 0].astype(np.int64), pairs[:, 1].copy()
    del pairs
    us, ls = compact_ids(e_src, n)
    del e_src
    if isolated:
        owned = np.arange(me, n, size, dtype=np.int64)
    else:
        # my vertices: the targets of my edges, and the sources other ranks hold
        so = us % size
        sorder = np.argsort(so, kind="stable")
        got = group.alltoallv(us[sorder], np.bincount(so, minlength=size))
        owned = np.union1d(np.unique(e_dst).astype(np.int64), got)
        del so, sorder, got
    lt = np.searchsorted(owned, e_dst).astype(np.uint32)
    del e_dst
    sampled, s_size = _bottom_sample(group, owned, sample, enc.seed) if sample > 0 else (None, 0)
    words = (s_size + 63) // 64
    width = m + 8 * words
    # Sources in sending order: by round, then by owner. A round holds at most
    # HOP_ROUND_BYTES of messages on every rank (every rank takes part in every round).
    n_src = len(us)
    rounds = int(group.allreduce(np.array([max(1, -(-n_src * (width + 8) // HOP_ROUND_BYTES))], np.int64),
                                 op="max")[0])
    owner = us % size
    key = (np.arange(n_src, dtype=np.int64) * rounds // max(n_src, 1)) * size + owner
    sorder = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[sorder], np.arange(rounds + 1, dtype=np.int64) * size)
    del key
    us, owner = us[sorder], owner[sorder]
    rank_of = np.empty(n_src, np.int64)
    rank_of[sorder] = np.arange(n_src)
    new_src = rank_of[ls]
    del sorder, rank_of, ls
    eorder = np.argsort(new_src, kind="stable")
    targets = np.ascontiguousarray(lt[eorder])
    indptr = np.zeros(n_src + 1, np.int64)
    np.cumsum(np.bincount(new_src, minlength=n_src), out=indptr[1:])
    del eorder, new_src, lt
    flash_rows = None
    if memory_budget is not None:
        threads = flash_threads or max(1, usable_cores() // max(1, size))
        rt = _native.FlashRuntime(parse_positive_bytes(memory_budget, "memory_budget"), threads,
                                  None if flash_dir is None else str(flash_dir), "")
        flash_rows = _native.FlashRows(rt, indptr, targets, len(owned))
        del targets, indptr
        if stats is not None:
            stats["edge_bytes_on_flash"] = flash_rows.size_bytes
    arena.release_cached()  # the set-up's temporaries, kept resident by the arena for reuse
    rows = np.zeros((len(owned), width), np.uint8)
    for lo in range(0, len(owned), HLL_COUNT_ROWS):  # in pieces: no temporary of every row
        rows[lo: lo + HLL_COUNT_ROWS, :m] = enc.initial(owned[lo: lo + HLL_COUNT_ROWS])
    columns = np.zeros(64 * words, np.int64)
    if s_size:
        own_s = np.flatnonzero(sampled >= 0)
        k = sampled[own_s]
        rows[own_s, m + k // 8] = np.left_shift(1, k % 8).astype(np.uint8)
        columns[k] = 1
        del own_s, k
    del sampled
    est, hits = _estimates(rows, m, s_size)
    changed = np.ones(len(owned), np.uint8)  # hop 1 reads every row: all are new
    start, state = (0, None) if checkpoints is None else checkpoints.restore()
    if state is not None:
        if state["rows"].shape != rows.shape:
            raise InvalidArgumentError("checkpoint does not fit this rank's share of the graph")
        rows, changed, columns = state["rows"], state["changed"].astype(np.uint8), state["columns"]
        nf, se = [float(x) for x in state["nf"]], [float(x) for x in state["se"]]
        est, hits = _estimates(rows, m, s_size)
    nxt = rows.copy()
    n_vertices = float(group.allreduce(np.array([float(len(owned))]))[0])
    if state is None:
        nf, se = [n_vertices], [0.0]  # every vertex reaches itself: N(0) is the vertex count
    by_sample = [n_vertices] if s_size else []
    widest = int(np.max(np.diff(bounds))) if n_src else 0
    out = np.empty((widest, ID_BYTES + width), np.uint8)  # the messages of a round, packed
    hit = np.empty(widest, np.uint8)
    times = []
    for hop in range(start + 1, max_hops + 1):
        t0 = time.perf_counter()
        grew = np.zeros(len(owned), np.uint8)
        for r in range(rounds):
            a, b = int(bounds[r]), int(bounds[r + 1])
            if flash_rows is not None:
                k = flash_rows.union_changed(rows, width, m, changed, a, b, us[a:b], out[: b - a], hit[: b - a])
            else:
                k = _native.hadi_union_changed(rows, width, m, changed, targets, indptr[a: b + 1], us[a:b],
                                               out[: b - a], hit[: b - a])
            got = group.alltoallv(out[:k], np.bincount(owner[a: b][hit[: b - a] != 0], minlength=size))
            ids = got[:, :ID_BYTES].copy().view(np.int64).reshape(-1)
            pos = ids // size if isolated else np.searchsorted(owned, ids)
            _native.hadi_merge_rows(nxt, width, m, pos, got, grew, columns)
            del got, ids, pos
        rows, nxt = nxt, rows
        changed = grew
        idx = np.flatnonzero(changed)
        for lo in range(0, len(idx), HLL_COUNT_ROWS):  # in pieces: no temporary of every changed row
            part = idx[lo: lo + HLL_COUNT_ROWS]
            nxt[part] = rows[part]  # the two buffers agree again
            est[part] = _hll_estimate(rows[part, :m])
            if s_size:
                hits[part] = _popcount(rows[part, m:])
        sizes, sd = _combine(est, hits, m, n_vertices, s_size)
        total = np.concatenate([[sizes.sum(), sd.sum(), float(len(idx))], columns[:s_size].astype(np.float64)])
        group.allreduce(total)
        times.append(time.perf_counter() - t0)
        if total[2] == 0:
            break
        count, err = float(total[0]), float(total[1])
        nf.append(count)
        se.append(err)
        if s_size:
            by_sample.append(n_vertices * float(np.mean(total[3:])))
        if progress and me == 0:
            print(f"hop {hop:3d}  N(h) {count:.6g} (sd <= {err:.3g})  vertices changed {int(total[2])}", file=sys.stderr,
                  flush=True)
        if checkpoints is not None and checkpoints.after(
                hop, lambda: {"rows": rows, "changed": changed, "columns": columns, "nf": np.array(nf),
                              "se": np.array(se)}):
            break
    if stats is not None:
        stats["sd_bound"] = se
        stats["sample"] = s_size
        stats["sample_only"] = by_sample
        stats["rounds"] = rounds
        if flash_rows is not None:
            stats["last_hop"] = flash_rows.last_stats
    return nf, float(np.median(times)) if times else 0.0


def hadi(group, src, dst, n: int, method: str = "auto", k: int = 32, seed: int = 0, max_hops: int = 256,
         degrees="auto", progress: bool = False, isolated: bool = True, checkpoints=None,
         precision: int = HLL_PRECISION, *, memory_budget=None, flash_dir=None, flash_threads: int | None = None,
         stats: dict | None = None, sample: int | None = None):
    """Collective. ``src``/``dst``: this rank's edges (ids in ``[0, n)``). Returns
    ``(nf, encoding, seconds per hop)`` with ``nf[h]`` the neighbourhood function (the same
    list on every rank), up to the hop after which no set grew (or ``max_hops``); ``N(0)`` is
    the exact vertex count whatever the method. ``precision``: HyperLogLog registers a
    vertex, ``2^precision``. ``src`` may be the list ``[src, dst]`` (``dst=None``): it is
    emptied, so the caller's arrays go once the set-up has sent them. ``sample``: target
    vertices sampled for the second estimate of N(h) (``hll``; default 4096, 0 for registers
    alone; see :func:`_combine`). ``stats["sd_bound"]`` receives a bound on N(h)'s standard
    deviation per hop (the sum of the vertices'; ``hll``), ``stats["sample_only"]`` the
    sample's estimate alone.
    ``isolated=False``: ids on no edge are not vertices (``N(0)`` counts those on an edge;
    one alltoallv finds them), and memory is O(this rank's edges) whatever ``n`` is, so ids
    may be spread over a sparse space past 2**32 (with ``isolated=True`` every id in
    ``[0, n)`` is a vertex: O(n / size) per rank). ``checkpoints``: a
    :class:`~scalefree.checkpoint.Checkpoints` counting hops (the run resumes from it, saves
    this rank's sets to it, and ends early at its ``stop_after``).

    ``memory_budget`` (bytes or a size such as ``"64M"``; HyperLogLog only, which ``"auto"``
    then picks): this rank's edges grouped by source go to a scratch file of a flash runtime
    with that budget (in ``flash_dir``; unnamed, nothing is left behind even after a crash)
    and every round of a hop streams its rows' edges once, in blocks prefetched under the
    budget, through the in-memory hop's row loop; the rows (registers and sample bits) stay
    in memory. The same neighbourhood function bit for bit. ``stats`` (a dict) receives
    ``edge_bytes_on_flash`` and the last round's runtime statistics (``last_hop``)."""
    me, size = group.rank, group.size
    if memory_budget is not None:
        if method == "auto":
            method = "hll"
        if method != "hll":
            raise ValueError(f"memory_budget streams HADI's HyperLogLog hop; method {method!r} holds its edges in "
                             f"memory (use method 'hll')")
    enc = Encoding(method, n, k, seed, precision)
    edges = src if isinstance(src, list) and dst is None else [src, dst]
    src, dst = (np.asarray(a) for a in edges)  # no int64 copy held here: the hll hop needs none
    edges.clear()
    if len(src) != len(dst):
        raise ValueError(f"src and dst differ in length ({len(src)} vs {len(dst)})")
    if len(src) and (min(int(src.min()), int(dst.min())) < 0 or max(int(src.max()), int(dst.max())) >= n):
        raise ValueError(f"edge endpoints must lie in [0, {n})")
    if sample is None:
        sample = HLL_SAMPLE
    if sample < 0:
        raise ValueError(f"the target sample must be >= 0 vertices, got {sample}")
    if enc.method == "hll":
        edges = [src, dst]
        del src, dst
        nf, per_hop = _hadi_partitioned(group, edges, n, enc, int(sample), isolated, max_hops, progress,
                                        checkpoints, stats, memory_budget, flash_dir, flash_threads)
        return nf, enc, per_hop
    # exact bitsets and Flajolet-Martin strings: an OR sparse allreduce per hop
    src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
    usrc, ls = compact_ids(src, n)
    udst, ld = compact_ids(dst, n)
    if isolated:
        owned = np.arange(me, n, size, dtype=np.int64)
    else:
        # The ids on an edge that I own: every rank sends the ids it touches to their owners
        # (memory O(touched ids), whatever the id space: ids past 2**32 in a sparse space).
        touched = np.union1d(usrc, udst)
        dest = touched % size
        order = np.argsort(dest, kind="stable")
        got = group.alltoallv(touched[order], np.bincount(dest, minlength=size))
        owned = np.unique(got)
        del touched, dest, order, got
    sa = group.sparse_allreduce(n, op="or", degrees=degrees)
    # Out: partial ORs at this rank's edge sources, and the owned vertices' own strings.
    # In: the strings of this rank's edge targets (next hop) and of the owned vertices.
    sa.config(np.concatenate([usrc, owned]), np.concatenate([udst, owned]))
    b_dst = enc.initial(udst)
    b_own = enc.initial(owned)
    total = np.zeros(2)

    def measure(rows_own, changed: int) -> tuple[float, int]:
        total[0] = enc.count(rows_own).sum() if changed >= 0 else len(rows_own)
        total[1] = changed
        group.allreduce(total)
        return float(total[0]), int(round(total[1]))

    start, state = (0, None) if checkpoints is None else checkpoints.restore()
    if state is None:
        nf = [measure(b_own, -1)[0]]  # every vertex reaches itself: N(0) is the vertex count
    else:
        if state["b_dst"].shape != b_dst.shape or state["b_own"].shape != b_own.shape:
            raise InvalidArgumentError("checkpoint does not fit this rank's share of the graph")
        b_dst, b_own, nf = state["b_dst"], state["b_own"], [float(x) for x in state["nf"]]
    times = []
    # Edges grouped by source: one reduceat per hop ORs each source's targets.
    order = np.argsort(ls, kind="stable")
    ld_by_src = np.ascontiguousarray(ld[order], np.int64)
    starts = np.flatnonzero(np.r_[True, np.diff(ls[order]) != 0]) if len(ls) else np.zeros(0, np.int64)
    del order
    for hop in range(start + 1, max_hops + 1):
        t0 = time.perf_counter()
        if len(ls):
            partial = np.bitwise_or.reduceat(b_dst[ld_by_src], starts, axis=0)
        else:
            partial = np.zeros((0, enc.width), enc.dtype)
        got = sa.reduce(np.concatenate([partial, b_own]))
        b_dst, new_own = got[: len(udst)], got[len(udst):]
        changed = int(np.count_nonzero((new_own != b_own).any(axis=1))) if len(owned) else 0
        b_own = new_own
        count, changed_all = measure(b_own, changed)
        times.append(time.perf_counter() - t0)
        if changed_all == 0:
            break
        nf.append(count)
        if progress and me == 0:
            print(f"hop {hop:3d}  N(h) {count:.6g}  vertices changed {changed_all}", file=sys.stderr, flush=True)
        if checkpoints is not None and checkpoints.after(
                hop, lambda: {"b_dst": b_dst, "b_own": b_own, "nf": np.array(nf)}):
            break
    return nf, enc, float(np.median(times)) if times else 0.0
