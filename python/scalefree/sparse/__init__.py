"""The sparse allreduce (Kylix) for power-law data (:mod:`.allreduce`) and the cost model
that chooses its layer degrees (:mod:`.plan`)."""

from .allreduce import SparseAllreduce

__all__ = ["SparseAllreduce"]
