"""The stale-synchronous allreduce (:mod:`.reduction`) and the straggler schedule its benchmarks
and applications inject (:mod:`.straggler`). The applications trained on it, matrix
factorization by gradient descent and BPMF, are modes of :mod:`scalefree.mf`
(:mod:`scalefree.mf.modes.ssp_gd`, :mod:`scalefree.mf.modes.ssp_bpmf`)."""

from .reduction import VARIANTS, CallStats, SspReduction

__all__ = ["VARIANTS", "CallStats", "SspReduction"]
