"""Sparse allreduce (Kylix) over a nested butterfly: config once per sparsity pattern,
reduce many times. The collective is in Rust (``scalefree-collectives/src/sparse``); this
wrapper checks shapes and allocates results."""

from __future__ import annotations

import numpy as np

from .. import _native
from .._callstats import CallStats
from ..errors import InvalidArgumentError
from . import plan as sparse_plan

_DTYPES = {"float32", "float64", "int32", "int64", "uint8", "uint32", "uint64"}


def _indices(a, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise InvalidArgumentError(f"{what} must be 1-D, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise InvalidArgumentError(f"{what} must hold integers, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _values(v, n: int, what: str) -> np.ndarray:
    if not isinstance(v, np.ndarray):
        raise InvalidArgumentError(f"{what}: expected a numpy array, got {type(v).__name__}")
    if v.dtype.name not in _DTYPES:
        raise InvalidArgumentError(f"{what} must be one of {sorted(_DTYPES)}, got {v.dtype}")
    if v.ndim not in (1, 2):
        raise InvalidArgumentError(f"{what} must have shape ({n},) or ({n}, width), got {v.shape}")
    # A wrong row count is left to the native call, which raises it on every rank (a local
    # raise here would leave the other ranks waiting in the collective).
    return np.ascontiguousarray(v)


class SparseAllreduce:
    """``sa = group.sparse_allreduce(dim, op="sum", degrees="auto")``.

    ``sa.config(out_indices, in_indices)`` saves the routing for one sparsity pattern
    (collective); ``sa.reduce(out_values)`` then returns the op-reduction over all ranks of
    the values at ``in_indices`` (in the caller's order; indices nobody contributed read as
    the op's identity). ``sa.config_reduce(out_indices, out_values, in_indices)`` does
    both in one pass. Indices are int64 in ``[0, dim)``, unsorted, duplicates combined
    locally. Values: 1-D, or 2-D ``(n, width)`` with one row per index.
    Ops: sum, max, min (any dtype; uint8 e.g. for HyperLogLog registers), or (uint32/uint64).

    ``replication=r`` runs the group's ``size`` ranks as ``size / r`` logical nodes: rank
    ``p`` is replica ``p // (size / r)`` of logical node ``p % (size / r)``, and replicas
    must pass the same indices and values. Every message goes to every replica of its
    target and the first copy to arrive is used, so the reduce completes while one replica
    of every logical node lives (run the job with ``scalefree run --allow-rank-failure``).
    ``config`` needs every rank alive; each message must fit ``SCALEFREE_REPLICA_SLOT`` bytes
    (default 32 MiB). Across hosts every message is pushed to every live replica of its
    target (over UCX or the TCP lanes); a host that dies takes its ranks with it, and the
    others carry on while one replica of every logical node lives.

    ``hash=False`` keeps the indices as the keys (no seeded hash): for callers whose
    numbering already spreads heavy indices over the ranks' key ranges. A caller whose
    indices are distinct and ascending then pays no permutation on either side: its
    values are sent as they are and the result is written straight into its buffer.

    ``slack=s`` (bounded staleness, SSP): a ``reduce`` may combine other ranks'
    contributions up to ``s`` reductions old instead of waiting for a slow rank (a layer
    message a peer has not sent yet is replaced by its last one while that is fresh enough);
    the caller's own contribution is always the current one (with ``max``/``min``/``or``
    it is in the result, possibly beside an older one of its own). Every rank calls
    ``reduce`` as often, but none waits for another within the slack. ``flush()``
    (collective) returns the exact reduction of every rank's latest contribution; reduces
    may follow it. ``last`` holds the last call's statistics (``age_diff``: how many
    reductions old the oldest contribution in it was; ``wait_seconds``: time blocked for
    fresher data). ``reduce(..., slack=t)`` overrides the slack for one call. The first
    reduce fixes the dtype and width; all ranks on one host.
    """

    def __init__(self, group, dim: int, op: str = "sum", degrees="auto", replication: int = 1, seed: int = 0,
                 hash: bool = True, slack: int | None = None):
        replication = int(replication)
        if replication < 1 or group.size % replication:
            raise InvalidArgumentError(f"replication must be >= 1 and divide the group size {group.size}, got {replication}")
        if int(dim) < 0:
            raise InvalidArgumentError(f"dim must be >= 0, got {dim}")
        if isinstance(degrees, str):
            if degrees != "auto":
                raise InvalidArgumentError(f'degrees must be "auto" or a list of ints, got {degrees!r}')
            degrees = None
        else:
            degrees = [int(d) for d in degrees]
        if slack is not None and int(slack) < 0:
            raise InvalidArgumentError(f"slack must be >= 0, got {slack}")
        self.slack = None if slack is None else int(slack)
        self.last: CallStats | None = None
        self._in_shape = None
        self.group = group
        self.dim = int(dim)
        self.op = op
        self._n_out = self._n_in = None
        self.replication = replication
        self._seed = int(seed) if hash else None
        self._native = _native.SparseAllreduce(group, self.dim, op, degrees, self._seed, replication,
                                               self.slack is not None)
        # "auto": the degrees come from the cost model of `sparse_plan` with the transport's
        # probed costs, at the first config: on one host over shared memory; across hosts
        # over UCX and the TCP lanes, with costs of their own for the layers within a host
        # (hosts of equal or of different sizes); replicated jobs probe the replicated
        # collective itself.
        self._auto = degrees is None and group.size // replication > 1
        self.plan = None

    def _choose(self, n_out: int, n_in: int) -> None:
        """Collective, first config with degrees="auto": agree on the largest index count,
        probe the transport (once per process and group size), pick the cheapest degrees."""
        if not self._auto:
            return
        self._auto = False
        nnz = int(self.group.allreduce(np.array([max(n_out, n_in)], np.int64), op="max")[0])
        ranks = self.group.size // self.replication
        hosts = list(self.group._hosts)
        several = self.group.transport != "shm" and self.replication == 1 and 1 < len(set(hosts)) < len(hosts)
        p = sparse_plan.host_block(hosts) if several else None
        uneven = sparse_plan.probe_uneven(self.group) if several and p is None else None
        if p is not None and p > 1:
            local, net = sparse_plan.probe_hosts(self.group, p)
            self.plan = sparse_plan.choose_hosts(p, ranks // p, nnz, self.dim, 8, local, net)
        elif uneven is not None:
            self.plan = sparse_plan.choose_uneven(hosts, nnz, self.dim, 8, *uneven)
        else:  # one kind of link between every pair of (logical) ranks
            self.plan = sparse_plan.choose(ranks, nnz, self.dim, 8,
                                           sparse_plan.probe(self.group, replication=self.replication))
        self._native = _native.SparseAllreduce(self.group, self.dim, self.op, list(self.plan["degrees"]), self._seed,
                                               self.replication, self.slack is not None)

    @property
    def degrees(self) -> list[int]:
        """Layer degrees in use (after the first config when "auto")."""
        return self._native.degrees

    def stats(self) -> list[dict]:
        """Per layer of the last call: degree, bytes_sent, messages, max_packet, merge_s,
        wait_s, out_keys, in_keys."""
        return self._native.stats()

    def config(self, out_indices, in_indices) -> None:
        o = _indices(out_indices, "out_indices")
        i = _indices(in_indices, "in_indices")
        self._choose(len(o), len(i))
        self._native.config(o, i)
        self._n_out, self._n_in = len(o), len(i)
        self._in_shape, self.last = None, None

    def reduce(self, out_values, out=None, slack: int | None = None) -> np.ndarray:
        if self._n_out is None:
            raise InvalidArgumentError("sparse_allreduce.reduce called before config")
        v = _values(out_values, self._n_out, "out_values")
        width = 1 if v.ndim == 1 else v.shape[1]
        if out is None:
            out = np.empty((self._n_in,) + v.shape[1:], dtype=v.dtype)
        slack = self.slack if slack is None else int(slack)
        if slack is None:
            self._native._reduce_into(v, out, v.dtype.name, width)
            return out
        if self.slack is None:
            raise InvalidArgumentError("sparse_allreduce: reduce(slack=) needs slack= when the allreduce is made")
        if slack < 0:
            raise InvalidArgumentError(f"slack must be >= 0, got {slack}")
        self.last = CallStats(*self._native._reduce_ssp_into(v, out, v.dtype.name, width, slack))
        self._in_shape = ((self._n_in,) + v.shape[1:], v.dtype)
        return out

    def flush(self, out=None) -> np.ndarray:
        """Collective (slack= only): the exact reduction of every rank's latest contribution
        (the last one passed to ``reduce``), at ``in_indices``. Reduces may follow."""
        if self._in_shape is None:
            raise InvalidArgumentError("sparse_allreduce.flush: no reduce with slack since config")
        shape, dtype = self._in_shape
        if out is None:
            out = np.empty(shape, dtype=dtype)
        elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
            raise InvalidArgumentError(f"flush: out must be a contiguous {dtype} array of shape {shape}")
        self._native._flush_into(out)
        return out

    def ssp_stats(self) -> dict[str, np.ndarray]:
        """Every reduce with slack since config: clock, seconds, wait_seconds, age_diff."""
        rows = self._native.ssp_stats()
        cols = list(zip(*rows)) if rows else [(), (), (), ()]
        return {"clock": np.asarray(cols[0], dtype=np.int64), "seconds": np.asarray(cols[1], dtype=np.float64),
                "wait_seconds": np.asarray(cols[2], dtype=np.float64), "age_diff": np.asarray(cols[3], dtype=np.int64)}

    def config_reduce(self, out_indices, out_values, in_indices) -> np.ndarray:
        o = _indices(out_indices, "out_indices")
        i = _indices(in_indices, "in_indices")
        v = _values(out_values, len(o), "out_values")
        width = 1 if v.ndim == 1 else v.shape[1]
        out = np.empty((len(i),) + v.shape[1:], dtype=v.dtype)
        self._choose(len(o), len(i))
        self._native._config_reduce_into(o, v, i, out, v.dtype.name, width)
        self._n_out, self._n_in = len(o), len(i)
        return out
