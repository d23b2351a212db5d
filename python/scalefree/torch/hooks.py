"""DDP communication hooks on the scalefree backend.

    from scalefree.torch import hooks
    ddp.register_comm_hook(None, hooks.bf16)                  # bfloat16 on the wire
    state = hooks.ssp(slack=4); ddp.register_comm_hook(state, hooks.ssp_hook)
    ... train ...; state.finish()                              # deliver what is still in flight

:func:`register` does either from a name (``"bf16"``, ``"ssp:4"``). The hooks need the
process group to be a scalefree one (the default group after
``init_process_group("scalefree")``).
"""

import numpy as np
import torch
import torch.distributed as dist

from .backend import MOVE_AS, ProcessGroupScalefree, as_numpy



def _errors_to(inner, fut):
    """Hands an exception of the worker's future `inner` to DDP's future `fut` (which the
    worker completes itself on success); returns `fut`."""

    def forward(f):
        try:
            f.value()
        except Exception as e:  # noqa: BLE001 - handed to DDP through the future
            if not fut.done():
                fut.set_exception(e)

    inner.add_done_callback(forward)
    return fut

def _pg(process_group) -> ProcessGroupScalefree:
    pg = process_group if process_group is not None else dist.group.WORLD
    if not isinstance(pg, ProcessGroupScalefree):
        raise TypeError("scalefree.torch.hooks need a process group of the \"scalefree\" backend, got "
                        f"{type(pg).__name__}")
    return pg


# --- bfloat16 on the wire ---------------------------------------------------------------------

def bf16(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: averages the bucket with bfloat16 on the wire between hosts and float32
    arithmetic, the counterpart of DDP's ``bf16_compress_hook`` / ``fp16_compress_hook``.

    The bucket (as float32) goes through ``g.allreduce(x, wire="bf16")``: within a host the
    ranks reduce in float32 over shared memory; between hosts each host's partial sum is
    rounded to bfloat16 once, the partials are summed in float32 and the sum is rounded once
    more (docs/algorithms.md, "Compressed allreduce", for the error bound): half the bytes of
    a float32 allreduce across hosts. On one host nothing is rounded."""
    pg = _pg(process_group)
    buf = bucket.buffer()
    n, g = pg.size(), pg.group

    def run():
        if n == 1 or buf.numel() == 0:
            return
        exact = buf.dtype == torch.float32 and buf.is_contiguous()
        work = buf.detach() if exact else buf.detach().float().contiguous()
        g.allreduce(work.view(-1).numpy(), wire="bf16")
        work.div_(n)
        if not exact:
            buf.copy_(work)

    return pg.run_async(run, buf)


# --- bounded staleness (SSP) ------------------------------------------------------------------

class SspState:
    """The state of :func:`ssp_hook`: one stale-synchronous reduction per DDP bucket.

    Each step, a bucket's gradients are added to the running sum over ranks and steps; the
    gradient applied is this rank's change of that sum since its last step, divided by the
    number of ranks. Other ranks' contributions may arrive up to ``slack`` steps late (never
    lost, never counted twice); this rank's own are always in. ``finish()`` after training
    (on every rank) adds what was still in flight, so that with plain SGD every rank ends on
    the same weights as synchronous DDP would after the same gradients.

    The reduction runs in delta mode (:meth:`scalefree.ssp.reduction.SspReduction.allreduce_delta`):
    the bucket's buffer is handed to it as it is (float32/float64, no copy) and receives the
    averaged change in place, in one pass at two ranks; this rank's new contribution is
    published to the peers after DDP has the result, off the step's critical path."""

    def __init__(self, slack: int, variant: str = "hypercube", process_group=None):
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.slack = int(slack)
        self.variant = variant
        self.process_group = process_group
        self._red: dict = {}  # (bucket index, numel, dtype) -> reduction
        self._params: dict = {}  # the same keys -> the bucket's parameters, in buffer order
        self._size = 1

    def _reduction(self, g, key):
        red = self._red.get(key)
        fresh = red is None
        if fresh:
            red = self._red[key] = g.ssp_reduction(key[1], key[2], "sum", self.variant)
        return red, fresh

    def finish(self) -> list:
        """Flushes every reduction (collective: every rank calls it) and returns, per bucket
        key ``(index, numel, dtype)``, the averaged gradient still missing on this rank (what
        the peers' last contributions add). It also leaves that gradient in the ``.grad`` of
        the parameters of the buckets of the last step, so one more ``opt.step()`` applies it
        (with plain SGD every rank then holds the same weights)."""
        out = [(key, self._red[key].flush_delta(scale=1.0 / self._size)) for key in sorted(self._red)]
        with torch.no_grad():
            # Zero first, then add: DDP's first bucket layout (before it rebuilds its buckets)
            # has its own keys, over the same parameters.
            for params in self._params.values():
                for p in params:
                    p.grad = torch.zeros_like(p)
            for key, missing in out:
                at = 0
                for p in self._params.get(key, []):
                    p.grad += torch.from_numpy(missing[at:at + p.numel()]).view(p.shape).to(p.dtype)
                    at += p.numel()
        return out


def ssp(slack: int = 4, variant: str = "hypercube", process_group=None) -> SspState:
    """The state for :func:`ssp_hook` with the given slack (steps a peer may lag), on
    ``process_group`` (the default group when None). ``variant``: the SSP design
    (:mod:`scalefree.ssp.reduction`); the hypercube, the default here, takes the one-pass
    path at two ranks (``docs/benchmarks/torch.md``: the sharded designs were slower and
    ended on a worse held-out loss under a straggler)."""
    return SspState(slack, variant, process_group)


_SSP_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def ssp_hook(state: SspState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: bounded-staleness gradient averaging (see :class:`SspState`)."""
    pg = _pg(state.process_group)
    buf = bucket.buffer()
    n, g = pg.size(), pg.group
    # float32/float64 buckets in place; others (bfloat16, float16) through a float32 copy.
    work = buf if buf.dtype in _SSP_DTYPES else buf.detach().float()
    key = (bucket.index(), buf.numel(), _SSP_DTYPES[work.dtype])
    state._params[key] = bucket.parameters()  # the layout's order (DDP may rebuild its buckets)
    fut = torch.futures.Future()

    def run():
        state._size = n
        red, fresh = state._reduction(g, key)
        # The first step of a bucket layout is exact (DDP may rebuild its buckets after it).
        red.allreduce_delta(work.detach().view(-1).numpy(), slack=0 if fresh else state.slack, scale=1.0 / n)
        if work is not buf:
            buf.copy_(work)
        fut.set_result(buf)
        red.publish()  # this step's contribution to the peers, once DDP has its result

    inner = pg.run_async(run, None)
    return _errors_to(inner, fut)


# --- sparse gradients (nn.Embedding(sparse=True)) -----------------------------------------------

class SparseState:
    """The state of :func:`sparse_hook`. ``method``: ``"auto"`` (the default), ``"allgather"``
    or ``"sparse_allreduce"`` (see :func:`sparse_hook`). Dense buckets are averaged with the
    backend's allreduce."""

    METHODS = ("auto", "allgather", "sparse_allreduce")

    def __init__(self, process_group=None, method: str = "auto"):
        if method not in self.METHODS:
            raise ValueError(f"sparse hook: method must be one of {', '.join(self.METHODS)}, got {method!r}")
        self.process_group = process_group
        self.method = method
        self._sa: dict = {}  # row count -> scalefree SparseAllreduce, made at first use
        self.last_method = ""  # what the last sparse exchange used
        self.last_seconds = 0.0  # the last sparse exchange, wall time on the worker thread


def sparse(process_group=None, method: str = "auto") -> SparseState:
    """The state for :func:`sparse_hook` (the default group when ``process_group`` is None)."""
    return SparseState(process_group, method)


def _gather_padded(g, a: np.ndarray, width: int) -> np.ndarray:
    """Every rank's ``a`` (rows, ...) padded to ``width`` rows, in rank order:
    ``(size * width, ...)``. No copy of ``a`` when it has ``width`` rows already."""
    if a.shape[0] != width:
        pad = np.zeros((width,) + a.shape[1:], a.dtype)
        pad[:a.shape[0]] = a
        a = pad
    out = np.empty((g.size * width,) + a.shape[1:], a.dtype)
    g._allgather_into(a.reshape(-1), out.reshape(-1))
    return out


def sparse_hook(state: SparseState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook for sparse gradients (``nn.Embedding(sparse=True)``): the averaged
    gradient as a coalesced sparse tensor on the union of the rows any rank touched, the
    same on every rank (what DDP's own sparse allreduce on gloo gives).

    The row counts and the row indices are gathered first (8 bytes a row). Then the rows'
    values travel one of two ways, the same on every rank: all of them to everyone (one
    allgather; torch's coalesce sums the rows that several ranks touched), or through
    scalefree's sparse allreduce (a nested butterfly: each row's sum is formed once and
    routed to the ranks that need it). Everyone must end up with every row of the union, so
    the allgather receives fewer bytes unless ranks share many rows: ``"auto"`` takes it
    when the rows the other ranks send are at most twice the union's share of the rows
    a rank receives from the butterfly (always at 2 ranks). Dense buckets are averaged with
    the ordinary allreduce."""
    import time

    pg = _pg(state.process_group)
    buf = bucket.buffer()
    n, g = pg.size(), pg.group
    if not buf.is_sparse:
        def run_dense():
            pg._reduce_into(buf, "avg")

        return pg.run_async(run_dense, buf)
    fut = torch.futures.Future()

    def run_sparse():
        t0 = time.perf_counter()
        grad = buf if buf.is_coalesced() else buf.coalesce()
        rows = grad.indices()[0].contiguous()
        vals = grad.values().contiguous()
        row_shape = tuple(buf.shape[1:])
        dim = buf.shape[0]
        counts = g.allgather(np.array([rows.numel()], np.int64)).reshape(-1)
        width = int(counts.max())
        if width == 0:  # no rank touched a row
            state.last_method, state.last_seconds = "none", time.perf_counter() - t0
            fut.set_result(torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64),
                                                   torch.zeros((0,) + row_shape, dtype=buf.dtype), buf.shape))
            return
        every = _gather_padded(g, rows.numpy(), width)
        valid = every if bool((counts == width).all()) else \
            np.concatenate([every[r * width:r * width + int(c)] for r, c in enumerate(counts)])
        method = state.method
        union = None
        if method == "auto":
            if n <= 2:
                method = "allgather"
            else:
                union = np.unique(valid)
                received = int(counts.sum()) - int(counts.min())
                method = "allgather" if received <= 2 * len(union) * (n - 1) / n else "sparse_allreduce"
        if method == "allgather":
            # Values as they are (bfloat16/float16 as 16-bit words), padded to the widest rank.
            moved = as_numpy(vals).reshape(rows.numel(), -1) if vals.numel() else \
                np.empty((0, max(1, int(np.prod(row_shape)))), as_numpy(vals[:0]).dtype)
            allv = torch.from_numpy(_gather_padded(g, moved, width))
            if vals.dtype in MOVE_AS:
                allv = allv.view(vals.dtype)
            allv = allv.view((n * width,) + row_shape)
            idx = torch.from_numpy(every)
            if not bool((counts == width).all()):
                keep = torch.cat([torch.arange(r * width, r * width + int(c)) for r, c in enumerate(counts)])
                idx, allv = idx[keep], allv[keep]
            out = torch.sparse_coo_tensor(idx.unsqueeze(0), allv, buf.shape, check_invariants=False).coalesce()
            out.values().div_(n)
        else:
            if union is None:
                union = np.unique(valid)
            sa = state._sa.get(dim)
            if sa is None:
                sa = state._sa[dim] = g.sparse_allreduce(dim)
            flat = vals.reshape(rows.numel(), -1).float().contiguous()
            summed = sa.config_reduce(rows.numpy(), flat.numpy(), union)
            summed /= n
            out = torch.sparse_coo_tensor(torch.from_numpy(union).unsqueeze(0),
                                          torch.from_numpy(summed).to(buf.dtype).reshape((len(union),) + row_shape),
                                          buf.shape, is_coalesced=True, check_invariants=False)
        state.last_method = method
        state.last_seconds = time.perf_counter() - t0
        fut.set_result(out)

    inner = pg.run_async(run_sparse, None)
    return _errors_to(inner, fut)


def register(ddp, name: str):
    """Registers a hook by name on a DDP module: ``"bf16"``, ``"ssp:SLACK[:VARIANT]"`` or ``"sparse[:METHOD]"``;
    returns its state."""
    if name == "bf16":
        ddp.register_comm_hook(None, bf16)
        return None
    if name == "sparse" or name.startswith("sparse:"):
        state = sparse(method=name.split(":", 1)[1] if ":" in name else "auto")
        ddp.register_comm_hook(state, sparse_hook)
        return state
    if name.startswith("ssp:"):
        parts = name.split(":")  # ssp:SLACK[:VARIANT]
        state = ssp(int(parts[1]), *parts[2:3])
        ddp.register_comm_hook(state, ssp_hook)
        return state
    raise ValueError(f"unknown hook {name!r} (bf16, ssp:SLACK, sparse)")
