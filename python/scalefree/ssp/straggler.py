"""A straggler schedule every rank computes alike: before timed call ``i`` one rank, drawn
from ``Random(seed, i)``, sleeps up to ``max_ms``. The SSP applications and the benchmarks
use it to make one slow worker at a time, the same on every rank and in every peer."""

from __future__ import annotations

import random


class StragglerSchedule:
    """Which rank sleeps how long before timed call ``i``: drawn from ``Random(seed, i)``, so
    every rank (and every implementation) computes the same schedule without talking."""

    def __init__(self, max_ms: float, seed: int, world_size: int):
        if max_ms < 0:
            raise ValueError(f"straggler delay must be >= 0 ms, got {max_ms}")
        self.max_ms = float(max_ms)
        self.seed = int(seed)
        self.world_size = int(world_size)

    def straggler(self, call_index: int) -> tuple[int, float]:
        """(rank, seconds) of the straggler before call ``call_index``."""
        rng = random.Random(self.seed * 1_000_003 + call_index)
        rank = rng.randrange(self.world_size)
        return rank, rng.uniform(0.0, self.max_ms) / 1e3

    def delays_s(self, rank: int, calls: int) -> list[float]:
        """This rank's sleep before each of ``calls`` calls (0 where another rank straggles)."""
        if self.max_ms <= 0:
            return [0.0] * calls
        out = []
        for i in range(calls):
            r, d = self.straggler(i)
            out.append(d if r == rank else 0.0)
        return out
