"""Mini-batch SGD on the sparse allreduce: sparse logistic regression (:mod:`.logreg`)."""

from .logreg import SparseRows, SvmlightError, accuracy, generate_rows, predict, read_svmlight, train, write_svmlight

__all__ = ["SparseRows", "SvmlightError", "accuracy", "generate_rows", "predict", "read_svmlight", "train",
           "write_svmlight"]
