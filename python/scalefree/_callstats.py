"""Statistics of one call of a stale-synchronous (bounded-staleness) collective: the dense
SSP reduction (:mod:`scalefree.ssp`) and the sparse allreduce with slack
(:mod:`scalefree.sparse`) report the same record."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallStats:
    """One call: ``clock`` after it, wall ``seconds`` inside it, ``wait_seconds`` blocked
    for fresh data, and ``age_diff`` = clock minus the age of the oldest data used."""

    clock: int
    seconds: float
    wait_seconds: float
    age_diff: int
