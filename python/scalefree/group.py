"""The Python face of a group: the native collectives plus the conveniences that
allocate outputs."""

from __future__ import annotations

import numpy as np

from . import _native
from .errors import InvalidArgumentError
from .sparse.allreduce import SparseAllreduce
from .ssp.reduction import SspReduction
from .tensors.slots import dynamic_channels, static_slots


class Group(_native.Group):
    """The ranks of a job and the collectives between them.

    Every collective works in place on contiguous numpy arrays (any shape); arrays that
    live in a region from :attr:`device` are read by peers without any copy, ordinary
    arrays through one kernel copy (cross-memory attach). All ranks must make the same
    calls in the same order with the same sizes and dtypes; a mismatch raises
    :class:`~scalefree.MismatchError` on every rank.
    """

    # allreduce, broadcast and barrier are the native methods themselves (no extra frame).

    def share_bounds(self, n: int, rank: int | None = None) -> tuple[int, int]:
        """Element range ``[lo, hi)`` of rank's share of ``n`` elements in reduce_scatter."""
        r = self.rank if rank is None else rank
        return (n * r) // self.size, (n * (r + 1)) // self.size

    def reduce_scatter(self, a, op: str = "sum", out=None, algorithm: str = "auto"):
        """Reduces ``a`` (flattened) over all ranks and returns this rank's share
        ``[n*rank//size, n*(rank+1)//size)`` as a 1-D array (written into ``out`` if given)."""
        a = _require_array(a, "reduce_scatter")
        lo, hi = self.share_bounds(a.size)
        if out is None:
            out = np.empty(hi - lo, dtype=a.dtype)
        self._reduce_scatter_into(a, out, op, algorithm)
        return out

    def allgather(self, a, out=None, algorithm: str = "auto"):
        """Gathers ``a`` from every rank into an array of shape ``(size, *a.shape)``."""
        a = _require_array(a, "allgather")
        if out is None:
            out = np.empty((self.size,) + a.shape, dtype=a.dtype)
        self._allgather_into(a, out, algorithm)
        return out

    def alltoallv(self, send, counts) -> np.ndarray:
        """Collective: every rank sends ``counts[r]`` consecutive elements of ``send`` (1-D, or
        2-D with rows as elements) to rank ``r``, in rank order, and returns what it received
        from every rank, concatenated in rank order (rows keep their width).

        Each rank exposes a registered region holding everything it receives; senders write
        their pieces into it with one-sided writes at offsets agreed through one allgather of
        the counts, then a notification from each sender tells its receivers the data landed
        (:meth:`_landed`). Every rank must pass the same dtype and row width."""
        send = _require_array(send, "alltoallv")
        if send.ndim not in (1, 2):
            raise InvalidArgumentError(f"alltoallv: send must be 1-D or 2-D, got shape {send.shape}")
        counts = np.asarray(counts, np.int64).reshape(-1)
        if counts.size != self.size or (counts < 0).any() or int(counts.sum()) != len(send):
            raise InvalidArgumentError(f"alltoallv: counts must be {self.size} non-negative numbers summing to "
                                       f"{len(send)}, got {counts.tolist()}")
        if self.size == 1:
            return send.copy()
        lo = np.concatenate([[0], np.cumsum(counts)])
        send = np.ascontiguousarray(send)

        def copy(pieces):
            for d, piece in enumerate(pieces):
                piece[...] = send[lo[d]:lo[d + 1]].reshape(-1).view(np.uint8)

        out = self._exchange(counts, send.dtype.itemsize * (1 if send.ndim == 1 else send.shape[1]), copy)
        return out.view(send.dtype).reshape((-1,) + send.shape[1:])

    def alltoallv_fill(self, counts, dtype, fill) -> np.ndarray:
        """Collective: :meth:`alltoallv` of ``counts[r]`` elements of ``dtype`` to every rank
        ``r``, with the pieces written in place instead of copied from a send buffer:
        ``fill(pieces)`` is called once with, for every rank ``r``, a writable 1-D array of
        ``counts[r]`` elements where the piece for ``r`` goes (straight into ``r``'s receive
        region when it is mapped — shared memory —, else a staging buffer sent after ``fill``
        returns) and must write every element. Returns what this rank received, in rank
        order, as a 1-D array viewing its receive region."""
        counts = np.asarray(counts, np.int64).reshape(-1)
        if counts.size != self.size or (counts < 0).any():
            raise InvalidArgumentError(f"alltoallv_fill: counts must be {self.size} non-negative numbers, "
                                       f"got {counts.tolist()}")
        dtype = np.dtype(dtype)
        out = self._exchange(counts, dtype.itemsize, lambda pieces: fill([p.view(dtype) for p in pieces]))
        return out.view(dtype)

    def _exchange(self, counts, row: int, fill) -> np.ndarray:
        """The one-sided exchange under :meth:`alltoallv` and :meth:`alltoallv_fill`: the
        receive region (``uint8``, every sender's rows in rank order), after ``fill`` wrote
        this rank's piece for every rank ``d`` into the uint8 array it was handed (its place
        in ``d``'s region, or staging) and every rank's pieces landed."""
        table = self.allgather(counts)  # table[s, d]: rows s sends to d
        nbytes = int(table[:, self.rank].sum()) * row
        dev = self.device
        region = dev.alloc_region(max(nbytes, 1))
        handles = self.allgather(np.frombuffer(region.handle, np.uint8))
        # Rows from sender s land after those of ranks before s.
        offset_in = np.cumsum(table, axis=0) - table  # offset_in[s, d]: where s's rows start at d
        out = region.array(np.uint8)
        staging = stage = None
        pieces, sends = [], []
        pos = 0
        for d in range(self.size):
            size = int(counts[d]) * row
            at = int(offset_in[self.rank, d]) * row
            if d == self.rank or size == 0:
                pieces.append(out[at:at + size])
                continue
            remote = dev.attach(bytes(handles[d]))
            if remote.mapped:  # shared memory: store straight into the peer's region
                pieces.append(np.frombuffer(remote, np.uint8)[at:at + size])
                continue
            if staging is None:
                staging = dev.alloc_region(max(int(counts.sum() - counts[self.rank]) * row, 1))
                stage = np.frombuffer(staging, np.uint8)
            pieces.append(stage[pos:pos + size])
            sends.append((d, pos, remote, at, size))
            pos += size
        fill(pieces)
        del pieces
        # Everyone starts with a different peer.
        done = [self.device.channel(d).write(staging, p, remote, at, size)
                for d, p, remote, at, size in sorted(sends, key=lambda x: (x[0] - self.rank) % self.size)]
        for c in done:
            c.wait()
        self._landed(table)
        return out[:nbytes]

    def _landed(self, table) -> None:
        """End of :meth:`_exchange`: returns once every piece sent to this rank has landed.
        A write's completion is local (its source may be reused) and a barrier does not
        order it either (its messages take other paths: across hosts, recursive doubling
        hears of a sender through a third rank, on another socket), so every sender
        notifies each rank it wrote to — seen there after its writes (docs/transport.md,
        "Ordering") — and every receiver waits for the senders that wrote to it. Sender
        ``s`` uses slot ``NOTIFY_SLOTS - 1 - s % k`` (the top ``k`` slots, ``k`` at most
        half of them); with more ranks than ``k``, senders take turns in waves of ``k``, a
        barrier between waves."""
        top = _native.NOTIFY_SLOTS - 1
        k = min(self.size, _native.NOTIFY_SLOTS // 2)
        me, dev = self.rank, self.device
        for wave in range(0, self.size, k):
            if wave:
                self.barrier()  # every notification of the wave before was consumed
            if wave <= me < wave + k:
                for i in range(1, self.size):
                    d = (me + i) % self.size
                    if table[me, d]:
                        dev.channel(d).notify(top - me % k, 1)
            for s in range(wave, min(wave + k, self.size)):
                if s != me and table[s, me]:
                    dev.wait(top - s % k)

    def ssp_reduction(self, count: int, dtype="float32", op: str = "sum",
                      variant: str = "sharded_async_thread", push_order: str = "cyclic"):
        """Collective: sets up a stale-synchronous reduction of ``count`` elements (see
        :mod:`scalefree.ssp.reduction`; ``variant="auto"`` takes ``ring`` for large vectors).
        Several may be live at once. ``push_order``
        (sharded variants): ``"cyclic"`` (rank r pushes to shard r+1 first) or ``"fixed"``
        (every rank starts at shard 0)."""
        if int(count) < 0:
            raise InvalidArgumentError(f"count must be >= 0, got {count}")
        return SspReduction(self._ssp_reduction(int(count), np.dtype(dtype).name, op, variant, push_order))

    def traffic(self) -> np.ndarray:
        """What this rank's channels moved to each peer since the group started: an int64
        array of shape ``(size, 3)``, one row per peer rank: bytes written into it, bytes
        read from it, one-sided operations issued to it (see ``docs/transport.md``). Counted
        in the transport where each write, post, notification or read is issued; take two
        snapshots and subtract to measure a stretch of code."""
        return np.array(self._traffic(), dtype=np.int64).reshape(self.size, 3)

    def tensor_slots(self, specs):
        """Collective: static zero-copy tensor slots (see :func:`scalefree.tensors.slots.static_slots`)."""
        return static_slots(self, specs)

    def tensor_channels(self, pairs):
        """Collective: dynamic tensor channels (see :func:`scalefree.tensors.slots.dynamic_channels`)."""
        return dynamic_channels(self, pairs)

    def sparse_allreduce(self, dim: int, op: str = "sum", degrees="auto", replication: int = 1, seed: int = 0,
                         hash: bool = True, slack: int | None = None):
        """A sparse allreduce over ``[0, dim)`` (``slack=``: bounded staleness): see
        :class:`scalefree.sparse.allreduce.SparseAllreduce`."""
        return SparseAllreduce(self, dim, op=op, degrees=degrees, replication=replication, seed=seed, hash=hash,
                               slack=slack)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _require_array(a, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise InvalidArgumentError(f"{what}: expected a numpy array, got {type(a).__name__}")
    return a
