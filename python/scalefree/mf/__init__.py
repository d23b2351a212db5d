"""Matrix factorization R ≈ P Qᵀ by SGD: one machine (:mod:`.modes.local`, kernels in Rust), a
ring of ranks (:mod:`.modes.rima`) or a parameter server (:mod:`.modes.dsgd_ps`), on the data of
:mod:`.data`; the SSP modes (:mod:`.modes.ssp_gd`, :mod:`.modes.ssp_bpmf`) run on the
stale-synchronous allreduce. See :mod:`.model`."""

from .model import MODES, MatrixFactorization, load_ratings, split_ratings

__all__ = ["MODES", "MatrixFactorization", "load_ratings", "split_ratings"]
