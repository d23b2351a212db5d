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
        the counts, then a barrier tells the receivers the data landed. Every rank must pass
        the same dtype and row width."""
        send = _require_array(send, "alltoallv")
        if send.ndim not in (1, 2):
            raise InvalidArgumentError(f"alltoallv: send must be 1-D or 2-D, got shape {send.shape}")
        counts = np.asarray(counts, np.int64).reshape(-1)
        if counts.size != self.size or (counts < 0).any() or int(counts.sum()) != len(send):
            raise InvalidArgumentError(f"alltoallv: counts must be {self.size} non-negative numbers summing to "
                                       f"{len(send)}, got {counts.tolist()}")
        width = 1 if send.ndim == 1 else send.shape[1]
        row = send.dtype.itemsize * width
        table = self.allgather(counts)  # table[s, d]: rows s sends to d
        recv_rows = table[:, self.rank]
        shape = (int(recv_rows.sum()),) + send.shape[1:]
        if self.size == 1:
            return send.copy()
        dev = self.device
        region = dev.alloc_region(max(shape[0] * row, 1))
        handles = self.allgather(np.frombuffer(region.handle, np.uint8))
        # Rows from sender s land after those of ranks before s.
        offset_in = np.cumsum(table, axis=0) - table  # offset_in[s, d]: where s's rows start at d
        lo = np.concatenate([[0], np.cumsum(counts)])
        send = np.ascontiguousarray(send)
        out = region.array(np.uint8)
        mine = send[lo[self.rank]:lo[self.rank + 1]].reshape(-1).view(np.uint8)
        out[offset_in[self.rank, self.rank] * row:][:mine.size] = mine
        staging = stage = None
        pos = 0
        done = []
        for k in range(1, self.size):
            d = (self.rank + k) % self.size  # everyone starts with a different peer
            nbytes = int(counts[d]) * row
            if nbytes == 0:
                continue
            piece = send[lo[d]:lo[d + 1]].reshape(-1).view(np.uint8)
            at = int(offset_in[self.rank, d]) * row
            remote = dev.attach(bytes(handles[d]))
            if remote.mapped:  # shared memory: store straight into the peer's region
                np.frombuffer(remote, np.uint8)[at:at + nbytes] = piece
                continue
            if staging is None:
                staging = dev.alloc_region(max(int(counts.sum() - counts[self.rank]) * row, 1))
                stage = np.frombuffer(staging, np.uint8)
            stage[pos:pos + nbytes] = piece
            done.append(dev.channel(d).write(staging, pos, remote, at, nbytes))
            pos += nbytes
        for c in done:
            c.wait()
        self.barrier()
        return out[:shape[0] * row].view(send.dtype).reshape(shape)

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
