"""``scalefree sparse plan``: a cost model of the sparse allreduce's butterfly.

For each candidate layer-degree list ``k1 x ... x kd`` (product = ranks) it predicts, per
layer, the keys a node holds, the packet size per peer, and the time of one reduce
(down and up), beside the allgather schemes and a dense allreduce. Model: each rank holds
``nnz`` distinct keys spread uniformly over ``[0, dim)`` by the index hash; after a layer
that has combined ``K`` ranks' data a node holds the union restricted to ``1/K`` of the
space, ``(dim/K) * (1 - (1 - nnz/dim)^K)`` keys (the paper's section IV); a layer of degree
``k`` costs ``(k - 1)`` messages of ``latency + packet / bandwidth`` each way. The union
formula assumes independent uniform index sets — power-law sets overlap more, so the model
overestimates the keys of lower layers (it is pessimistic for the butterfly).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LATENCY_US = 5.0
DEFAULT_BANDWIDTH_GBPS = 5.0


def factorizations(n: int, largest: int | None = None) -> list[tuple[int, ...]]:
    """Every ordered list of degrees >= 2 whose product is n."""
    if n == 1:
        return [()]
    out = []
    for k in range(2, n + 1):
        if n % k == 0:
            for rest in factorizations(n // k):
                out.append((k,) + rest)
    return out


def predict(degrees, ranks, nnz, dim, vb, lat_s, bw):
    """Per layer (degree, keys before, packet bytes, seconds) and the total of one reduce."""
    layers, total = [], 0.0
    combined = 1
    keys = nnz
    for k in degrees:
        packet = keys / k * vb
        t = 2 * (k - 1) * (lat_s + packet / bw)
        layers.append((k, keys, packet, t))
        total += t
        combined *= k
        keys = dim / combined * (1 - (1 - min(nnz / dim, 1.0)) ** combined) if dim > 0 else 0.0
    return layers, total


@dataclass(frozen=True)
class Costs:
    """Cost parameters of one reduce: ``fixed_s`` per call (argument checks, the agreement
    allreduce), ``round_s`` per message round (a layer has two: down and up), ``msg_s``
    per message a rank sends in a round, ``s_per_byte`` per byte sent (and merged), and
    ``s_per_key`` per index of the caller (putting its values into hashed key order and
    the results back into its order; the same for every degree list)."""

    fixed_s: float = 0.0
    round_s: float = 0.0
    msg_s: float = DEFAULT_LATENCY_US * 1e-6
    s_per_byte: float = 1 / (DEFAULT_BANDWIDTH_GBPS * 1e9)
    s_per_key: float = 0.0

    @property
    def floor_bytes(self) -> float:
        """The packet floor: bytes whose transfer costs as much as a message's and a
        round's fixed cost (below it a packet costs about as much as an empty one)."""
        return (self.round_s + self.msg_s) / self.s_per_byte if self.s_per_byte > 0 else float("inf")


def predict_time(degrees, nnz, dim, vb, costs: Costs) -> float:
    """Predicted seconds of one reduce (down and up) with layer degrees ``degrees``."""
    layers, _ = predict(degrees, 0, nnz, dim, vb, 0.0, float("inf"))
    t = costs.fixed_s + costs.s_per_key * nnz
    for k, _, packet, _ in layers:
        t += 2 * (costs.round_s + (k - 1) * (costs.msg_s + packet * costs.s_per_byte))
    return t


def choose(ranks: int, nnz: int, dim: int, vb: int, costs: Costs) -> dict:
    """The cheapest degree list under the model (fewer layers on a tie within 2 %), with
    every candidate's prediction."""
    cands = [(predict_time(d, nnz, dim, vb, costs), d) for d in factorizations(ranks)]
    best_t = min(t for t, _ in cands)
    pick = min((d for t, d in cands if t <= best_t * 1.02), key=lambda d: (len(d), -d[0] if d else 0))
    return {"degrees": list(pick), "predicted_s": dict(("x".join(map(str, d)), t) for t, d in cands),
            "costs": costs, "floor_bytes": costs.floor_bytes}


_PROBED: dict = {}


def _configured(group, dim: int, degrees, indices, replication: int = 1):
    """The collective itself with fixed ``degrees`` and the probes' seeded hash, configured for
    ``indices`` out and in: the native object, since the Python one's "auto" calls the probes."""
    from .. import _native

    sa = _native.SparseAllreduce(group, dim, "sum", [int(d) for d in degrees], 0, replication)
    sa.config(indices, indices)
    return sa


def _reduce(sa, values):
    import numpy as np

    out = np.empty_like(values)
    sa._reduce_into(values, out, values.dtype.name, 1)
    return out


def probe(group, keys: int = 65536, reps: int = 9, replication: int = 1) -> Costs:
    """Measures :class:`Costs` of the sparse allreduce on ``group`` (collective; cached per
    process, group size and replication; with ``replication`` r > 1 the replicated collective
    itself, over its ``size / r`` logical ranks, every message pushed to each replica of its
    target): the agreement allreduce alone (``fixed_s``), a reduce of one
    key per rank over one layer of degree ``size`` and over two layers ``p x size/p``
    (``round_s`` and ``msg_s`` from the difference), and one of ``keys`` float64 values per
    rank (``s_per_byte``). Every rank gets the slowest rank's figures, so all choose alike.
    The part of the large reduce outside its layers, less ``fixed_s``, gives ``s_per_key``.
    ``SCALEFREE_SPARSE_COSTS=fixed_us,round_us,msg_us,gbps[,ns_per_key]`` sets them instead."""
    import os
    import statistics
    import time

    import numpy as np

    n = group.size // replication
    env = os.environ.get("SCALEFREE_SPARSE_COSTS")
    if env:
        try:
            v = [float(x) for x in env.split(",")]
            if len(v) not in (4, 5) or v[3] <= 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"SCALEFREE_SPARSE_COSTS={env!r}: expected fixed_us,round_us,msg_us,gbps[,ns_per_key]") from None
        return Costs(v[0] * 1e-6, v[1] * 1e-6, v[2] * 1e-6, 1 / (v[3] * 1e9), (v[4] if len(v) > 4 else 0.0) * 1e-9)
    key = n if replication == 1 else (n, "replicated", replication)
    if key in _PROBED:
        return _PROBED[key]
    me = group.rank % n  # the logical rank (replicas of node j: ranks j, j + n, ...)

    def med(f, local=None):
        for _ in range(2):
            f()
        ts, ls = [], []
        for _ in range(reps):
            group.barrier()
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
            if local:
                ls.append(ts[-1] - local())
        return statistics.median(ts), (statistics.median(ls) if ls else 0.0)

    def reduce_time(degrees, k):
        # Distinct per rank and hashed as callers' indices are; 1/16 dense (stays sparse).
        idx = (np.arange(k, dtype=np.int64) * n + me) * 16
        sa = _configured(group, max(1, k * n * 16), degrees, idx, replication)
        vals = np.ones(k, np.float64)
        # The time outside the layers (merge and wait+read) is the caller-order work.
        return med(lambda: _reduce(sa, vals), lambda: sum(s["merge_s"] + s["wait_s"] for s in sa.stats()))

    agree = np.zeros(6 * group.size, np.int64)
    p = factorize(n)[-1] if n > 1 else 1
    big, local = reduce_time([n], keys)
    t = np.array([med(lambda: group.allreduce(agree))[0], reduce_time([n], 1)[0],
                  reduce_time([p, n // p], 1)[0] if 1 < p < n else 0.0, big, local])
    t = group.allreduce(t, op="max")
    fixed, t1, t2, t3, local = (float(x) for x in t)
    h1 = max(t1 - fixed, 0.0) / 2  # one round of n - 1 messages
    if 1 < p < n:
        h2 = max(t2 - fixed, 0.0) / 2  # two rounds of (p - 1) + (n/p - 1) messages
        a1, a2 = n - 1, (p - 1) + (n // p - 1)
        rnd = (a1 * h2 - a2 * h1) / (2 * a1 - a2)
        rnd = min(max(rnd, 0.0), h1)
        msg = (h1 - rnd) / a1
    else:
        rnd, msg = h1, 0.0
    nbytes = 2 * (n - 1) * keys / n * 8
    local = min(max(local - fixed, 0.0), max(t3 - t1, 0.0))
    costs = Costs(fixed, rnd, msg, max(t3 - t1 - local, 1e-9) / nbytes if n > 1 else 0.0, local / keys)
    _PROBED[key] = costs
    return costs


def host_block(hosts) -> int | None:
    """Ranks per host when every host holds the same number ``p`` of consecutive ranks (the
    launchers' numbering) and there are several hosts; else None."""
    n = len(hosts)
    p = next((r for r in range(n) if hosts[r] != hosts[0]), n)
    blocked = all(hosts[r] == r // p for r in range(n))  # hosts are numbered by lowest rank
    return p if p < n and n % p == 0 and blocked else None


def _split(h1: float, h2: float, a1: int, a2: int) -> tuple[float, float]:
    """(round, message) costs from one round of ``a1`` messages taking ``h1`` and two rounds
    of ``a2`` messages in all taking ``h2``."""
    rnd = (a1 * h2 - a2 * h1) / (2 * a1 - a2)
    rnd = min(max(rnd, 0.0), h1)
    return rnd, (h1 - rnd) / a1


def _layer_times(group, degrees, k: int, reps: int) -> list[float]:
    """Median seconds of a reduce of ``k`` keys per rank with layer ``degrees`` (after 2
    untimed calls): the whole call, then each layer's ``wait_s + merge_s``."""
    import statistics
    import time

    import numpy as np

    n = group.size
    idx = (np.arange(k, dtype=np.int64) * n + group.rank) * 16
    sa = _configured(group, max(1, k * n * 16), degrees, idx)
    vals = np.ones(k, np.float64)
    rows = []
    for i in range(2 + reps):
        group.barrier()
        t0 = time.perf_counter()
        _reduce(sa, vals)
        total = time.perf_counter() - t0
        if i >= 2:
            rows.append([total] + [s["merge_s"] + s["wait_s"] for s in sa.stats()])
    return [statistics.median(c) for c in zip(*rows)]


def _agreement_time(group, reps: int) -> float:
    """Median seconds of the sparse allreduce's agreement (an allreduce of ``6 size``
    int64s), after 2 untimed calls."""
    import statistics
    import time

    import numpy as np

    agree = np.zeros(6 * group.size, np.int64)
    ts = []
    for _ in range(2 + reps):
        group.barrier()
        t0 = time.perf_counter()
        group.allreduce(agree)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[2:])


def probe_hosts(group, p: int, keys: int = 65536, reps: int = 9) -> tuple[Costs, Costs]:
    """:func:`probe` for a group of ``size / p`` hosts of ``p`` ranks each: (local, net)
    costs, every layer timed by itself (the per-layer ``wait_s + merge_s`` of
    ``sparse_allreduce.stats()``). Layers ``p x H`` (the host, then across the ``H`` hosts)
    at one key and at ``keys`` keys per rank give each kind's per-round and per-byte costs;
    ``q x p/q x H`` and ``p x q x H/q`` (when ``p`` or ``H`` has a factor ``q``) split a
    round's cost into a fixed part and one per message, as :func:`probe` does. Across hosts
    that is UCX or the TCP lanes, as the reduce itself goes. Collective; cached per process
    and group size."""

    import numpy as np

    n = group.size
    key = (n, p)
    if key in _PROBED:
        return _PROBED[key]

    hosts = n // p

    def layers(degrees, k):
        return _layer_times(group, degrees, k, reps)

    fixed = _agreement_time(group, reps)
    one = layers([p, hosts], 1)
    big = layers([p, hosts], keys)
    qp = factorize(p)[0] if len(factorize(p)) > 1 else None
    qh = factorize(hosts)[0] if len(factorize(hosts)) > 1 else None
    split_l = layers([qp, p // qp, hosts], 1) if qp else None
    split_n = layers([p, qh, hosts // qh], 1) if qh else None
    # Slowest rank's figures everywhere, so every rank chooses alike.
    flat = one + big + (split_l or []) + (split_n or []) + [fixed]
    flat = [float(x) for x in group.allreduce(np.array(flat), op="max")]
    one, big = flat[0:3], flat[3:6]
    rest = flat[6:-1]
    fixed = flat[-1]
    if split_l:
        split_l, rest = rest[:4], rest[4:]
    if split_n:
        split_n = rest[:4]
    h_l, h_n = one[1] / 2, one[2] / 2  # one round of p - 1 (host) / H - 1 (across) messages
    rl, ml = _split(h_l, (split_l[1] + split_l[2]) / 2, p - 1, (qp - 1) + (p // qp - 1)) if split_l else (h_l, 0.0)
    rn, mn = _split(h_n, (split_n[2] + split_n[3]) / 2, hosts - 1, (qh - 1) + (hosts // qh - 1)) if split_n else (h_n, 0.0)
    bytes_l = 2 * (p - 1) * keys / p * 8
    bytes_n = 2 * (hosts - 1) * keys / hosts * 8
    local = Costs(0.0, rl, ml, max(big[1] - one[1], 1e-12) / bytes_l, 0.0)
    net = Costs(fixed, rn, mn, max(big[2] - one[2], 1e-12) / bytes_n, 0.0)
    _PROBED[key] = (local, net)
    return local, net


def crossing_layers(degrees, hosts) -> list[bool]:
    """Per layer of ``degrees`` over ranks on ``hosts`` (host of each rank, in rank order):
    whether some group of the layer holds ranks of different hosts (the butterfly's groups:
    layer ``l`` joins the ranks that differ only in digit ``l``)."""
    n = len(hosts)
    out, stride = [], 1
    for k in degrees:
        out.append(any(len({hosts[me - ((me // stride) % k) * stride + j * stride] for j in range(k)}) > 1
                       for me in range(n)))
        stride *= k
    return out


def probe_uneven(group, keys: int = 65536, reps: int = 9) -> tuple[Costs, Costs] | None:
    """:func:`probe_hosts` for hosts of different sizes (collective; cached per process and
    host layout): (local, net) costs, or None when no degree list has a layer group within
    one host. A layer round's time is taken from the ranks whose group of that layer is on
    one host (local costs: the first factorization whose first layer has such a group, e.g.
    ``2x3`` on hosts of 1, 2 and 3 ranks, where ranks 4 and 5 share one) and from the
    single layer of every rank (net costs: it crosses hosts), at one key and at ``keys``
    keys per rank; each kind's round cost is all fixed (no split per message)."""

    import numpy as np

    hosts = [int(h) for h in group._hosts]
    n = group.size
    key = ("uneven", tuple(hosts))
    if key in _PROBED:
        return _PROBED[key]
    cands = [d for d in factorizations(n) if len(d) > 1]
    split = next((d for d in cands
                  if any(len({hosts[me - (me % d[0]) + j] for j in range(d[0])}) == 1 for me in range(n))), None)
    if split is None:
        _PROBED[key] = None
        return None
    mine_local = len({hosts[group.rank - (group.rank % split[0]) + j] for j in range(split[0])}) == 1

    def layers(degrees, k):
        return _layer_times(group, degrees, k, reps)

    fixed = _agreement_time(group, reps)
    one_n, big_n = layers([n], 1), layers([n], keys)
    one_l, big_l = layers(list(split), 1), layers(list(split), keys)
    # The local figures from the ranks whose first-layer group is on their host only.
    loc = [one_l[1], big_l[1]] if mine_local else [0.0, 0.0]
    flat = [float(x) for x in group.allreduce(np.array([fixed, one_n[1], big_n[1]] + loc),
                                              op="max")]
    fixed, h_n, b_n, h_l, b_l = flat
    k = split[0]
    bytes_l = 2 * (k - 1) * keys / k * 8
    bytes_n = 2 * (n - 1) * keys / n * 8
    local = Costs(0.0, h_l / 2, 0.0, max(b_l - h_l, 1e-12) / bytes_l, 0.0)
    net = Costs(fixed, h_n / 2, 0.0, max(b_n - h_n, 1e-12) / bytes_n, 0.0)
    _PROBED[key] = (local, net)
    return local, net


def _two_kinds_pick(cands, local: Costs, net: Costs) -> dict:
    """The plan of :func:`choose_hosts` and :func:`choose_uneven` from their ``(predicted
    seconds, degrees)`` candidates: the cheapest (fewer layers on a tie within 2 %)."""
    best_t = min(t for t, _ in cands)
    pick = min((d for t, d in cands if t <= best_t * 1.02), key=lambda d: (len(d), -d[0] if d else 0))
    return {"degrees": list(pick), "predicted_s": dict(("x".join(map(str, d)), t) for t, d in cands),
            "costs": net, "local_costs": local, "floor_bytes": net.floor_bytes}


def choose_uneven(hosts, nnz: int, dim: int, vb: int, local: Costs, net: Costs) -> dict:
    """:func:`choose` for ranks on ``hosts`` of different sizes: each layer of a degree list
    costs the ``net`` figures when one of its groups crosses hosts (:func:`crossing_layers`),
    else the ``local`` ones."""
    cands = []
    for d in factorizations(len(hosts)):
        layers, _ = predict(d, 0, nnz, dim, vb, 0.0, float("inf"))
        t = net.fixed_s
        for (k, _, packet, _), crosses in zip(layers, crossing_layers(d, hosts)):
            c = net if crosses else local
            t += 2 * (c.round_s + (k - 1) * (c.msg_s + packet * c.s_per_byte))
        cands.append((t, d))
    return _two_kinds_pick(cands, local, net)


def choose_hosts(p: int, hosts: int, nnz: int, dim: int, vb: int, local: Costs, net: Costs) -> dict:
    """:func:`choose` for ``hosts`` hosts of ``p`` ranks: the layers first combine each host
    (a factorization of ``p``, with the ``local`` costs), then cross the hosts (one of
    ``hosts``, with the ``net`` costs), so only host-merged data crosses the network."""
    cands = []
    for lf in factorizations(p):
        for nf in factorizations(hosts):
            d = lf + nf
            layers, _ = predict(d, 0, nnz, dim, vb, 0.0, float("inf"))
            t = net.fixed_s
            for i, (k, _, packet, _) in enumerate(layers):
                c = local if i < len(lf) else net
                t += 2 * (c.round_s + (k - 1) * (c.msg_s + packet * c.s_per_byte))
            cands.append((t, d))
    return _two_kinds_pick(cands, local, net)


def factorize(n: int) -> list[int]:
    """Prime factors of n, ascending."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def features(degrees, nnz, dim, vb) -> list[float]:
    """The model's terms for one reduce: [1, rounds, messages, bytes] (one rank, down and
    up), so that the predicted time is their dot product with [fixed, round, msg, per byte]."""
    layers, _ = predict(degrees, 0, nnz, dim, vb, 0.0, float("inf"))
    return [1.0, float(2 * len(layers)), float(sum(2 * (k - 1) for k, _, _, _ in layers)),
            float(sum(2 * (k - 1) * pk for k, _, pk, _ in layers))]


def fit(rows, measured_s) -> Costs:
    """Least-squares :class:`Costs` (non-negative) for measured reduce times, ``rows`` being
    :func:`features` of each measurement."""
    import itertools

    import numpy as np

    a = np.asarray(rows, float)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    a = a / scale
    y = np.asarray(measured_s, float)
    best = None
    for r in range(1, 5):  # non-negative least squares by trying every subset of 4 columns
        for cols in itertools.combinations(range(4), r):
            if len(cols) > len(y):
                continue
            c, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if (c < 0).any():
                continue
            full = np.zeros(4)
            full[list(cols)] = c
            res = float(((a @ full - y) ** 2).sum())
            if best is None or res < best[0] - 1e-18:
                best = (res, full)
    full = (best[1] if best else np.zeros(4)) / scale
    return Costs(*(float(x) for x in full))
