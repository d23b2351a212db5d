"""Graph analytics on the sparse allreduce: reading edge files (:mod:`.io`), PageRank
(:mod:`.pagerank`; the dense-allreduce baseline in :mod:`.pagerank_dense`), HADI
(:mod:`.hadi`) and R-MAT graphs (:mod:`.rmat`). The functions named like their modules
(``pagerank.pagerank``, ``hadi.hadi``) are reached through the module."""

from .hadi import effective_diameter
from .io import EdgeListError, GraphFormatError, read_edge_list, read_edges
from .pagerank import SparsePageRank
from .rmat import rmat_edges, write_rmat

__all__ = ["EdgeListError", "GraphFormatError", "SparsePageRank", "effective_diameter", "read_edge_list",
           "read_edges", "rmat_edges", "write_rmat"]
