"""Matrix factorization R ≈ P Qᵀ by SGD: one machine (:mod:`.local` kernels in Rust), a ring
of ranks (:mod:`.rima`) or a parameter server (:mod:`.dsgd_ps`). See :mod:`.model`."""

from .model import MODES, MatrixFactorization, load_ratings, split_ratings

__all__ = ["MODES", "MatrixFactorization", "load_ratings", "split_ratings"]
