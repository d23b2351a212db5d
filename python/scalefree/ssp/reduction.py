"""Stale-synchronous allreduce (SSP): an allreduce that may use other ranks' data up to
``slack`` clocks old instead of waiting for a slow rank.

Each call adds an *increment* (``contribution``); the result is the reduction of every
contribution made so far by every rank: with ``op="sum"`` the running model state. Your own
contributions are always in your result; other ranks' may lag by at most ``slack`` calls.
``flush()`` (on every rank) delivers the exact total: no contribution is ever lost or counted
twice. With ``slack=0`` every result is exact.

>>> red = group.ssp_reduction(model.size, "float32")          # collective, once
>>> for step in range(steps):
...     state = red.allreduce(gradient_step(state), slack=8)
>>> final = red.flush()

Variants (``variant=``): ``hypercube``; ``sharded`` (every shard of a result holds the same
set of contributions, as BPMF needs); ``sharded_async`` (each shard as fresh as it can be);
``sharded_thread`` / ``sharded_async_thread`` (the default), whose shard of the
parameter server runs on a background thread so updates are applied while you compute;
``ring``, a segmented ring for large vectors (each rank sends ``2(p-1)/p`` of the vector per
call, where the others move whole vectors); and ``auto``: ``sharded_async_thread``, or
``ring`` for vectors of at least ``SCALEFREE_SSP_RING_MIN_BYTES`` at three ranks or more when
that variable is set (unset, ``auto`` never takes the ring: no run on one machine found it
faster; ``red.variant`` says which was taken).

Push order (``push_order=``, sharded variants): ``cyclic`` (the default; rank r pushes to
shard r+1 first, mod p, and ends with its own, so no shard is hit by every rank at once)
or ``fixed`` (every rank starts at shard 0; kept to measure against).
"""

from __future__ import annotations

import json

import numpy as np

from .._callstats import CallStats
from ..errors import InvalidArgumentError

VARIANTS = ("hypercube", "sharded", "sharded_async", "sharded_thread", "sharded_async_thread", "ring", "auto")


class SspReduction:
    """Made by :meth:`scalefree.Group.ssp_reduction`."""

    def __init__(self, native):
        self._native = native
        self.count = native.count
        self.dtype = np.dtype(native.dtype)
        self.op = native.op
        self.variant = native.variant
        self.push_order = native.push_order
        self.last: CallStats | None = None

    def _check(self, a, what: str) -> np.ndarray:
        if not isinstance(a, np.ndarray):
            a = np.asarray(a)
        if a.size != self.count:
            raise InvalidArgumentError(f"{what} has {a.size} elements; this reduction has {self.count}")
        if a.dtype != self.dtype:
            raise InvalidArgumentError(f"{what} is {a.dtype}; this reduction is {self.dtype}")
        return np.ascontiguousarray(a)

    def allreduce(self, contribution, slack: int = 0, out=None) -> np.ndarray:
        """Adds ``contribution`` and returns the reduction of all contributions so far
        (shaped like ``contribution``; written into ``out`` if given)."""
        if int(slack) < 0:
            raise InvalidArgumentError(f"slack must be >= 0, got {slack}")
        c = self._check(contribution, "the contribution")
        if out is None:
            out = np.empty_like(c)
        else:
            self._check(out, "out")
        st = self._native._allreduce_into(c, out, int(slack))
        self.last = CallStats(*st)
        return out

    def allreduce_delta(self, inout: np.ndarray, slack: int = 0, scale: float = 1.0) -> np.ndarray:
        """Delta mode (sum of float32/float64): adds the contribution held in ``inout`` and
        writes back, in its place, the change of the result since this rank's previous call
        (the whole result at the first call) times ``scale``; returns ``inout``. What an
        optimizer applies, with no copy: DDP's SSP hook passes its gradient bucket and
        ``1 / size``. A reduction takes either these calls or :meth:`allreduce`.

        At two ranks (hypercube) this is one pass over the data and leaves the publish of
        this rank's new history to :meth:`publish` (call it once the result is used; the
        next call makes it otherwise), so the partner's data is not waited for on the
        critical path unless ``slack`` demands it."""
        if int(slack) < 0:
            raise InvalidArgumentError(f"slack must be >= 0, got {slack}")
        if not isinstance(inout, np.ndarray) or not inout.flags.c_contiguous or not inout.flags.writeable:
            raise InvalidArgumentError("allreduce_delta needs a writable contiguous numpy array")
        if inout.size != self.count:
            raise InvalidArgumentError(f"the contribution has {inout.size} elements; this reduction has {self.count}")
        st = self._native._allreduce_delta(inout.reshape(-1), int(slack), float(scale))
        self.last = CallStats(*st)
        return inout

    def publish(self) -> None:
        """Delta mode: publishes what the last :meth:`allreduce_delta` left unpublished."""
        self._native._publish()

    def flush_delta(self, out=None, scale: float = 1.0) -> np.ndarray:
        """Delta mode, collective, once at the end: :meth:`flush`, but returns the change of
        the exact total since this rank's last call (what the other ranks' last
        contributions add) times ``scale``."""
        if out is None:
            out = np.empty(self.count, dtype=self.dtype)
        else:
            self._check(out, "out")
        self._native._flush_delta_into(out, float(scale))
        return out

    def flush(self, out=None) -> np.ndarray:
        """Collective, once at the end: returns the exact reduction of every contribution
        of every rank. The reduction takes no more calls afterwards."""
        if out is None:
            out = np.empty(self.count, dtype=self.dtype)
        else:
            self._check(out, "out")
        self._native._flush_into(out)
        return out

    @property
    def clock(self) -> int:
        """Calls made so far."""
        return self._native.clock

    @property
    def age_diff(self) -> int:
        """Staleness of the last result: clock minus the age of the oldest data in it."""
        return 0 if self.last is None else self.last.age_diff

    def stats(self) -> dict[str, np.ndarray]:
        """Every call's metrics as arrays: clock, seconds, wait_seconds, age_diff."""
        rows = self._native.stats()
        cols = list(zip(*rows)) if rows else [(), (), (), ()]
        return {
            "clock": np.asarray(cols[0], dtype=np.int64),
            "seconds": np.asarray(cols[1], dtype=np.float64),
            "wait_seconds": np.asarray(cols[2], dtype=np.float64),
            "age_diff": np.asarray(cols[3], dtype=np.int64),
        }

    def write_metrics(self, path, **labels) -> None:
        """Appends one JSON line per call (plus ``labels``, e.g. rank=, slack=) to ``path``."""
        with open(path, "a") as f:
            for clock, sec, wait, age in self._native.stats():
                row = dict(labels, clock=clock, seconds=sec, wait_seconds=wait, age_diff=age,
                           variant=self.variant)
                f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        """Stops the background shard (Thread variants) and frees the regions."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"SspReduction({self.count} x {self.dtype}, op={self.op}, variant={self.variant}, clock={self.clock})"
