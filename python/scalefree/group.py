"""The Python face of a group: the native collectives plus the conveniences that
allocate outputs."""

from __future__ import annotations

import numpy as np

from . import _native
from .errors import InvalidArgumentError


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

    def ssp_reduction(self, count: int, dtype="float32", op: str = "sum",
                      variant: str = "sharded_async_thread"):
        """Collective: sets up a stale-synchronous reduction of ``count`` elements (see
        :mod:`scalefree.ssp`). Several may be live at once."""
        from .ssp import SspReduction

        if int(count) < 0:
            raise InvalidArgumentError(f"count must be >= 0, got {count}")
        return SspReduction(self._ssp_reduction(int(count), np.dtype(dtype).name, op, variant))

    def tensor_slots(self, specs):
        """Collective: static zero-copy tensor slots (see :func:`scalefree.tensors.static_slots`)."""
        from .tensors import static_slots

        return static_slots(self, specs)

    def tensor_channels(self, pairs):
        """Collective: dynamic tensor channels (see :func:`scalefree.tensors.dynamic_channels`)."""
        from .tensors import dynamic_channels

        return dynamic_channels(self, pairs)

    def sparse_allreduce(self, dim: int, op: str = "sum", degrees="auto", replication: int = 1, seed: int = 0,
                         hash: bool = True):
        """A sparse allreduce over ``[0, dim)``: see :class:`scalefree.sparse.SparseAllreduce`."""
        from .sparse import SparseAllreduce

        return SparseAllreduce(self, dim, op=op, degrees=degrees, replication=replication, seed=seed, hash=hash)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _require_array(a, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise InvalidArgumentError(f"{what}: expected a numpy array, got {type(a).__name__}")
    return a
