"""Errors agreed across the ranks of a group: one rank's bad input or bad checkpoint raises on
every rank (its own error on the lowest failing rank, :class:`ShareFailedElsewhere` naming that
rank on the others), so no rank waits in a collective for a peer that gave up. Below everything
that reads a share of a file or a checkpoint (the MF data, :mod:`scalefree.checkpoint`)."""

from __future__ import annotations

import numpy as np

from .errors import DataError

_MSG_BYTES = 1024  # an error message as every rank learns it


class ShareFailedElsewhere(DataError):
    """Another rank's share of the input was bad; that rank raised the ``DataError`` itself."""

    def __init__(self, rank: int, msg: str):
        super().__init__(f"rank {rank}: {msg}")
        self.failed_rank = rank


def agree(group, err: BaseException | None) -> None:
    """Collective: raise on every rank if any rank failed — its own error on the lowest failing
    rank, :class:`ShareFailedElsewhere` on the others."""
    if group.size == 1:
        if err is not None:
            raise err
        return
    msg = np.zeros(_MSG_BYTES, np.uint8)
    if err is not None:
        b = str(err).encode()[:_MSG_BYTES - 1]
        msg[:len(b)] = np.frombuffer(b, np.uint8)
        msg[-1] = 1
    got = group.allgather(msg)
    bad = np.flatnonzero(got[:, -1])
    if not len(bad):
        return
    first = int(bad[0])
    if first == group.rank:
        raise err
    raise ShareFailedElsewhere(first, bytes(got[first, :-1]).rstrip(b"\0").decode(errors="replace"))
