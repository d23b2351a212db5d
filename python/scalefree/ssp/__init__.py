"""The stale-synchronous allreduce (:mod:`.reduction`) and the applications trained on it:
matrix factorization by gradient descent (:mod:`.mf`) and BPMF (:mod:`.bpmf`)."""

from .reduction import VARIANTS, CallStats, SspReduction

__all__ = ["VARIANTS", "CallStats", "SspReduction"]
