"""What a stretch of code moved between ranks, measured at the transport
(:meth:`scalefree.Group.traffic`: per-peer counters of every one-sided write, post,
notification and read, counted where it is issued)."""

from __future__ import annotations

import numpy as np

#: Columns of a traffic matrix row.
WRITTEN, READ, OPS = 0, 1, 2


class Meter:
    """Counts this rank's traffic from construction on, leaving out paused stretches
    (e.g. evaluation that is not part of training)."""

    def __init__(self, group):
        self._group = group
        self._start = group.traffic()
        self._excluded = np.zeros_like(self._start)
        self._paused = None

    def pause(self) -> None:
        self._paused = self._group.traffic()

    def resume(self) -> None:
        self._excluded += self._group.traffic() - self._paused
        self._paused = None

    def moved(self) -> np.ndarray:
        """``(size, 3)`` int64: per peer, bytes written, bytes read, operations."""
        return self._group.traffic() - self._start - self._excluded


def summarize(moved: np.ndarray) -> dict:
    """Per rank, from every rank's :meth:`Meter.moved` stacked as ``(size, size, 3)``:
    bytes sent (written to peers), bytes received (peers' writes to it plus its own reads),
    operations issued, and connections: peers it exchanged any operation with, in either
    direction."""
    moved = np.asarray(moved, dtype=np.int64)
    n = moved.shape[0]
    written, read, ops = moved[:, :, WRITTEN], moved[:, :, READ], moved[:, :, OPS]
    talk = (ops > 0) | (ops.T > 0)
    np.fill_diagonal(talk, False)
    return {
        "bytes_sent": [int(x) for x in written.sum(axis=1) - np.diag(written)],
        "bytes_received": [int(x) for x in written.sum(axis=0) - np.diag(written) + read.sum(axis=1) - np.diag(read)],
        "operations": [int(x) for x in ops.sum(axis=1) - np.diag(ops)],
        "connections": [int(x) for x in talk.sum(axis=1)],
        "peers": [[int(q) for q in np.flatnonzero(talk[r])] for r in range(n)],
    }
