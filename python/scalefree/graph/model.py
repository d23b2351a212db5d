"""A cost and memory model of ``scalefree graph pagerank`` per rank, for planning past one
machine (``scalefree sparse plan --pagerank``; the formulas, the calibration and the check
against measured runs are in ``docs/scale-model.md``). Pure functions, no I/O but
:func:`histogram_shape`, which reads a degree histogram file.

The crux is ``T(P)``, the distinct vertices a rank touches when every distinct edge is
placed on one of ``P`` ranks by a hash (:func:`~scalefree.graph.io.edge_owner`): a vertex
whose ``d`` distinct edges each land on a given rank with probability ``1/P`` is missed by
that rank with probability ``(1 - 1/P)**d``, so ``T(P) = sum_v 1 - (1 - 1/P)**deg(v)``.
Two sources of degrees:

* :class:`RmatShape`: the R-MAT generator's expected degrees in closed form (the graph of
  ``scalefree graph rmat``: quadrant probabilities (a, b, c, d), one id permutation for
  sources and targets), exact in expectation for any scale, duplicates dropped;
* :class:`HistogramShape`: a measured degree histogram (``{"total": [[deg, count], ...]}``),
  scaled to a larger graph by copies (more vertices of the same degrees).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..sparse.plan import Costs, choose, predict_time

# --- degree shapes ----------------------------------------------------------------------


def _log1m(x: np.ndarray) -> np.ndarray:
    """log(1 - x), accurate for small x (x clipped just below 1: finite)."""
    return np.log1p(-np.minimum(x, 1.0 - 1e-16))


@dataclass(frozen=True)
class RmatShape:
    """Expected degrees of an R-MAT graph of ``2**scale`` ids and ``generated`` edges (before
    duplicates are dropped). Vertices are grouped by the number ``k`` of one bits of their
    id (before the permutation): ``C(scale, k)`` vertices share the same edge probabilities.
    ``_edge_prob[k]`` lists, for a vertex with ``k`` one bits, the presence probability
    ``1 - exp(-generated * p)`` of each group of its possible out-edges with multiplicity,
    and likewise for its in-edges."""

    scale: int
    generated: float
    a: float = 0.57
    b: float = 0.19
    c: float = 0.19
    spread: int = 1  # ids multiplied by this (an id space larger than 2**scale, same degrees)

    @property
    def d(self) -> float:
        return 1.0 - self.a - self.b - self.c

    @property
    def ids(self) -> int:
        return (1 << self.scale) * self.spread

    def _groups(self, k: int, out: bool):
        """(multiplicity, presence probability) of the possible out- (or in-) edges of a
        vertex with k one bits."""
        s, a, b, c, d = self.scale, self.a, self.b, self.c, self.d
        # Out-edges: at the vertex's 0 bits the quadrant is a (other end 0) or b (1); at its
        # 1 bits c (0) or d (1). In-edges: at its 0 bits a (0) or c (1); at 1 bits b or d.
        z0, z1 = (a, b) if out else (a, c)
        o0, o1 = (c, d) if out else (b, d)
        j = np.arange(s - k + 1)[:, None]  # of the vertex's 0 bits, how many have the other end 1
        i = np.arange(k + 1)[None, :]  # of its 1 bits, how many have the other end 1
        mult = _comb(s - k, j) * _comb(k, i)
        with np.errstate(divide="ignore"):
            logp = (s - k - j) * math.log(z0) + j * math.log(z1) + (k - i) * math.log(o0) + i * math.log(o1)
        q = -np.expm1(-self.generated * np.exp(logp))
        return mult.ravel(), q.ravel()

    def _untouched_log(self, k: int, ranks: float, which: str) -> float:
        """log of the probability that a given rank holds none of the edges of a vertex with
        k one bits (edges present independently; each on the rank with probability 1/P)."""
        tot = 0.0
        for out in ((True, False) if which == "total" else (which == "out",)):
            m, q = self._groups(k, out)
            tot += float((m * _log1m(q / ranks)).sum())
        if which == "total":  # the self-loop was counted as an out- and an in-edge
            loop = -math.expm1(-self.generated * self.a ** (self.scale - k) * self.d ** k)
            tot -= float(_log1m(np.array(loop / ranks)))
        return tot

    def touched(self, ranks: float, which: str = "total") -> float:
        """Expected distinct vertices one rank's edges touch (``which``: "total" any end,
        "out" as a source, "in" as a target) when the distinct edges are spread over
        ``ranks`` by a hash."""
        return float(sum(_comb(self.scale, k) * -math.expm1(self._untouched_log(k, ranks, which))
                         for k in range(self.scale + 1)))

    @property
    def edges(self) -> float:
        """Expected distinct edges."""
        total = 0.0
        for k in range(self.scale + 1):
            m, q = self._groups(k, True)
            total += _comb(self.scale, k) * float((m * q).sum())
        return total

    @property
    def vertices(self) -> float:
        return self.touched(1)

    def describe(self) -> str:
        return (f"R-MAT scale {self.scale} ({self.ids} ids{f', spread x{self.spread}' if self.spread > 1 else ''}), "
                f"{self.generated:.4g} generated edges, "
                f"(a, b, c) = ({self.a}, {self.b}, {self.c}), expected degrees in closed form")


def _comb(n, k):
    from scipy.special import comb

    return comb(n, k)


@dataclass(frozen=True)
class HistogramShape:
    """A measured degree histogram (of distinct edges) scaled by ``copies``: the target
    graph has ``copies`` times the vertices, ids and edges, with the same degrees."""

    ids_ref: int
    edges_ref: int
    generated_ref: int
    total: np.ndarray  # shape (m, 2): degree, vertices with that degree
    out: np.ndarray
    inn: np.ndarray
    copies: float = 1.0
    source: str = ""

    @property
    def ids(self) -> int:
        return round(self.ids_ref * self.copies)

    @property
    def generated(self) -> float:
        return self.generated_ref * self.copies

    @property
    def edges(self) -> float:
        return self.edges_ref * self.copies

    @property
    def vertices(self) -> float:
        return float(self.total[:, 1].sum()) * self.copies

    def touched(self, ranks: float, which: str = "total") -> float:
        h = {"total": self.total, "out": self.out, "in": self.inn}[which]
        deg, cnt = h[:, 0].astype(float), h[:, 1].astype(float)
        return float((cnt * -np.expm1(deg * _log1m(np.full(len(deg), 1.0 / ranks)))).sum()) * self.copies

    def scaled_to(self, generated: float) -> HistogramShape:
        return replace(self, copies=generated / self.generated_ref)

    def describe(self) -> str:
        return (f"degree histogram of {self.source or 'a measured graph'} ({self.edges_ref} edges) "
                f"x {self.copies:.3g} copies")


def histogram_shape(path, generated: float | None = None) -> HistogramShape:
    """A :class:`HistogramShape` from a JSON file with ``ids``, ``edges``, ``generated``
    (edges in the file before duplicates are dropped; default ``edges``) and histograms
    ``total``, ``out``, ``in`` (``[[degree, vertices], ...]``); scaled to ``generated``."""
    with open(path) as f:
        rec = json.load(f)
    h = HistogramShape(int(rec["ids"]), int(rec["edges"]), int(rec.get("generated", rec["edges"])),
                       np.asarray(rec["total"], np.int64), np.asarray(rec["out"], np.int64),
                       np.asarray(rec["in"], np.int64), 1.0, rec.get("graph", str(path)))
    return h.scaled_to(generated) if generated else h


# --- machines and constants -------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """Where the job runs: ``hosts`` hosts of ``ranks_per_host`` ranks and ``cores_per_host``
    cores; ``net_gbps`` GB/s per host each way (12.5 = 100 Gb/s), ``latency_us`` per
    message; ``storage_gbps`` GB/s a host reads its input at (inf: in the page cache)."""

    hosts: int
    ranks_per_host: int = 1
    cores_per_host: float = 2
    net_gbps: float = 12.5
    latency_us: float = 5.0
    storage_gbps: float = math.inf

    @property
    def ranks(self) -> int:
        return self.hosts * self.ranks_per_host

    @property
    def oversubscription(self) -> float:
        """CPU time a rank's compute takes per second of its own work (ranks share cores)."""
        return max(1.0, self.ranks_per_host / max(self.cores_per_host, 1))


INPUT_BYTES_PER_EDGE = {"npz": 8.0, "text": 15.5}  # int32 pairs; R-MAT text at scale 22-26


@dataclass(frozen=True)
class Constants:
    """Single-core costs (seconds per item) and memory (bytes per item); defaults calibrated
    on this repository's 2-core machine, see docs/scale-model.md."""

    # Defaults: calibrate(docs/results/scale-model/check.json) (the test keeps them in step).
    read_s_per_edge: dict = field(default_factory=lambda: {"npz": 26.4e-9, "text": 48.9e-9})
    partition_s_per_edge: float = 14.4e-9  # _native.owner_partition (0.23 s / 16M)
    dedup_s_per_edge: float = 53.8e-9  # one rank: the sort-dedup and its conversions (kernel alone: 25)
    exchange_local_s_per_edge: float = 28.4e-9  # P > 1: the alltoallv's copies, fresh pages, the rest
    # compaction, degree counts, from_edges, glue; by set-up path (the sparse one sorts)
    setup_s_per_edge: dict = field(default_factory=lambda: {"dense": 69.6e-9, "sparse": 586e-9})
    setup_s_per_id: float = 25.0e-9  # dense path: arrays over the id space
    setup_s_per_touched: float = 700.0e-9  # sparse path: the two config_reduce calls (profiled at 1 and 2 ranks)
    iteration_s_per_edge: float = 2.51e-9  # SpMV, per distinct edge of the rank
    iteration_s_per_touched: float = 2.0e-9  # vectors over the rank's slots
    # The sparse reduce on one host, as ``scalefree.sparse.plan.probe`` measured it here at 2
    # and 4 ranks: (fixed_s, round_s, msg_s, s_per_byte, s_per_key). The 2-rank figures (one
    # rank per core) are the CPU part of a reduce across hosts too, added to the network's.
    probed: dict = field(default_factory=lambda: {
        2: (0.66e-6, 2.95e-6, 0.0, 1.30e-11, 1.39e-10),
        4: (1.80e-3, 0.0, 0.0, 3.01e-9, 0.0)})
    # Memory per rank: a baseline, bytes per edge read (input share), per distinct edge,
    # per id of the id space (dense set-up path), per touched vertex.
    base_bytes: float = 55e6  # graph pagerank of a 100k-edge graph: 52-58 MB per rank
    bytes_per_read_edge: dict = field(default_factory=lambda: {"npz": 0.0, "text": 0.0})
    bytes_per_edge: dict = field(default_factory=lambda: {"dense": 34.7, "sparse": 47.2})
    bytes_per_id: float = 40.0
    bytes_per_touched: float = 100.0
    value_bytes: int = 8  # float64 scores


# --- the model --------------------------------------------------------------------------


def _log2(n: float) -> float:
    return math.log2(n) if n > 1 else 0.0


def reduce_costs(cluster: Cluster, k: Constants):
    """:class:`~scalefree.sparse.plan.Costs` of the sparse reduce on ``cluster``: on one host
    the probed figures for its rank count (else the 2-rank ones, CPU terms times the
    oversubscription); across hosts the 2-rank CPU figures plus the network's latency per
    message and round and its bandwidth (the host's link shared by its ranks) per byte."""
    p, over = cluster.ranks, cluster.oversubscription
    if cluster.hosts == 1 and p in k.probed:
        return Costs(*k.probed[p])
    fixed, rnd, msg, per_byte, per_key = k.probed[2]
    if cluster.hosts == 1:
        return Costs(fixed, rnd, msg, per_byte * over, per_key * over)
    lat = cluster.latency_us * 1e-6
    return Costs(fixed + 2 * _log2(p) * lat, rnd + lat, msg + lat,
                 per_byte * over + cluster.ranks_per_host / (cluster.net_gbps * 1e9), per_key * over)


def dense_setup(ids: float, edges: float, ranks: int) -> bool:
    """Whether set-up takes the dense path (``vertex_keys``: id space no larger than twice
    a rank's distinct edges)."""
    return ids <= 2 * (edges // ranks) + 1


def predict(shape, cluster: Cluster, fmt: str = "npz", k: Constants | None = None) -> dict:
    """Per-rank predictions for PageRank of the graph ``shape`` (:class:`RmatShape` or
    :class:`HistogramShape`) read from a ``fmt`` ("npz" or "text") file on ``cluster``:
    seconds of each stage and peak bytes. Keys: ``ranks``, ``edges_read`` and ``edges``
    (distinct) per rank, ``touched``, ``touched_out``, ``touched_in``, ``read_s``,
    ``exchange_s``, ``load_s``, ``setup_s``, ``setup_path``, ``iteration_s`` (with
    ``spmv_s`` and ``reduce_s``), ``reduce_degrees``, ``peak_bytes``."""
    k = k or Constants()
    if fmt not in INPUT_BYTES_PER_EDGE:
        raise ValueError(f"format must be one of {sorted(INPUT_BYTES_PER_EDGE)}, got {fmt!r}")
    p, h, r = cluster.ranks, cluster.hosts, cluster.ranks_per_host
    over = cluster.oversubscription
    lat = cluster.latency_us * 1e-6
    net = cluster.net_gbps * 1e9 / r  # a rank's share of its host's link
    ids = float(shape.ids)
    e_read = shape.generated / p
    e = shape.edges / p
    t = shape.touched(p)
    t_out = shape.touched(p, "in")  # out slots: the targets of the rank's edges
    t_in = shape.touched(p, "out") + shape.vertices / p  # in slots: sources and owned vertices
    leave_host = (h - 1) / h if h > 1 else 0.0  # of a rank's bytes, the part that crosses the network

    def allreduce_s(nbytes: float) -> float:  # dense: hierarchical ring over the hosts
        return (2 * leave_host * nbytes / (cluster.net_gbps * 1e9) + 2 * _log2(h) * lat) if h > 1 else 0.0

    # 1. read: parse (CPU) or storage, whichever is slower
    read = max(over * e_read * k.read_s_per_edge[fmt],
               r * e_read * INPUT_BYTES_PER_EDGE[fmt] / (cluster.storage_gbps * 1e9))
    # 2. owner exchange: partition, alltoallv of 8-byte pairs, radix sort-dedup
    wire = 8 * e_read * leave_host / net + (p - 1) * lat if h > 1 else 0.0
    if p == 1:  # owner_dedup on one rank: the sort-dedup alone
        exchange = over * e_read * k.dedup_s_per_edge
    else:
        exchange = over * e_read * (k.partition_s_per_edge + k.dedup_s_per_edge + k.exchange_local_s_per_edge) + wire
    # 3. set-up
    dense = dense_setup(ids, shape.edges, p)
    costs = reduce_costs(cluster, k)
    keys = shape.vertices * 1.0  # nkeys: owners' widths x P ~ the vertices
    plan = choose(p, t_out, keys, k.value_bytes, costs)
    reduce_s = predict_time(plan["degrees"], t_out, keys, k.value_bytes, costs) if p > 1 else 0.0
    config_s = predict_time(plan["degrees"], t_out, keys, 8 + k.value_bytes, costs) if p > 1 else 0.0
    path = "dense" if dense else "sparse"
    local = over * (e * k.setup_s_per_edge[path])
    if dense:
        setup = local + over * ids * k.setup_s_per_id + allreduce_s(24 * ids) + config_s
    else:
        sp = predict_time(plan["degrees"], t, ids, 8 + 16, costs) + predict_time(plan["degrees"], t, ids, 8 + 8, costs)
        setup = local + over * t * k.setup_s_per_touched + 2 * sp + config_s
    # 4. one iteration: SpMV, the sparse reduce, a scalar allreduce
    spmv = over * (e * k.iteration_s_per_edge + (t_in + t_out) * k.iteration_s_per_touched)
    iteration = spmv + reduce_s + (2 * _log2(h) * lat if h > 1 else 0.0)
    # memory
    peak = (k.base_bytes + k.bytes_per_read_edge[fmt] * e_read + k.bytes_per_edge[path] * e
            + (k.bytes_per_id * ids if dense else 0.0) + k.bytes_per_touched * t)
    return {"ranks": p, "hosts": h, "edges_read": e_read, "edges": e, "touched": t, "touched_out": t_out,
            "touched_in": t_in, "read_s": read, "exchange_s": exchange, "load_s": read + exchange,
            "setup_s": setup, "setup_path": path, "iteration_s": iteration,
            "spmv_s": spmv, "reduce_s": reduce_s, "reduce_degrees": plan["degrees"], "peak_bytes": peak}


def run_shape(run: dict):
    """The :class:`RmatShape` of a measured run's record (``scale``, ``generated``,
    ``spread``; see benchmarks/scale_model/collect.py)."""
    return RmatShape(int(run["scale"]), float(run["generated"]), spread=int(run.get("spread", 1)))


def calibrate(runs: list, k: Constants | None = None) -> Constants:
    """Constants from measured ``scalefree graph pagerank`` runs (medians; the records of
    benchmarks/scale_model/collect.py). From the 1-rank runs, per edge: the read (per
    format), the sort-dedup (one rank exchanges nothing), the set-up per path (less the
    per-id term on the dense path, the per-touched term on the sparse one), the SpMV (less
    the per-slot term) and the bytes (per path, less the baseline, id and touched terms;
    text's extra bytes per edge read over npz's). From the 2-rank runs: the exchange's local
    part beyond the kernels (partition, the alltoallv's copies). The per-id, per-touched,
    per-slot, partition and memory per-id/per-touched constants of ``k`` are kept (kernel
    timings, profiles and code reading). The rest of the runs are the check."""
    k = k or Constants()
    read, setup, nbytes = dict(k.read_s_per_edge), dict(k.setup_s_per_edge), dict(k.bytes_per_edge)
    read_bytes = dict(k.bytes_per_read_edge)
    dedup, it, local = [], [], []
    peak_npz = None
    for r in sorted(runs, key=lambda r: r["ranks"]):
        shape = run_shape(r)
        p = r["ranks"]
        e_read, e, n = shape.generated / p, shape.edges / p, float(shape.ids)
        t = shape.touched(p)
        path = "dense" if dense_setup(n, shape.edges, p) else "sparse"
        if p == 1 and r.get("spread", 1) == 1:
            if "read_s" in r:
                read[r["format"]] = r["read_s"] / e_read
            if "exchange_s" in r:
                dedup.append(r["exchange_s"] / e_read)
        if p == 1 and r["format"] == "npz":
            setup[path] = (r["setup_s"] - (k.setup_s_per_id * n if path == "dense" else k.setup_s_per_touched * t)) / e
            slots = shape.touched(1, "out") + t + shape.touched(1, "in")  # in slots (sources, owned), out slots
            it.append((r["per_iteration_s"] - slots * k.iteration_s_per_touched) / e)
            rest = r["peak_rss_bytes"] - k.base_bytes - (k.bytes_per_id * n if path == "dense" else 0.0) \
                - k.bytes_per_touched * t
            nbytes[path] = rest / e
            if path == "dense":
                peak_npz = r["peak_rss_bytes"]
        if p == 1 and r["format"] == "text" and peak_npz is not None and r.get("spread", 1) == 1:
            read_bytes["text"] = max(0.0, (r["peak_rss_bytes"] - peak_npz) / e_read)
    d = float(np.median(dedup)) if dedup else k.dedup_s_per_edge
    for r in runs:
        if r["ranks"] == 2 and r.get("spread", 1) == 1 and "exchange_s" in r:
            e_read = run_shape(r).generated / 2
            local.append(r["exchange_s"] / e_read - k.partition_s_per_edge - d)
    return replace(k, read_s_per_edge=read, setup_s_per_edge=setup, bytes_per_edge=nbytes,
                   bytes_per_read_edge=read_bytes, dedup_s_per_edge=d,
                   exchange_local_s_per_edge=max(0.0, float(np.median(local))) if local else k.exchange_local_s_per_edge,
                   iteration_s_per_edge=float(np.median(it)) if it else k.iteration_s_per_edge)
