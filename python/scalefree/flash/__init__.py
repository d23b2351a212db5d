"""SSD-resident matrices and out-of-core kernels (BLAS-on-flash), under a hard memory budget.

    from scalefree import flash
    rt = flash.Runtime(memory_budget="256M")          # scratch files in $SCALEFREE_FLASH_DIR or /tmp
    A = flash.Matrix.from_numpy(a, rt)                # a 2-D float32/float64 array, now on flash
    C = flash.gemm(A, B, runtime=rt)                  # a flash Matrix; C.to_numpy() reads it back
    y = flash.csrgemv(flash.Csr.from_scipy(S, rt), x, runtime=rt)
    Y = flash.csrmm(flash.load("docword.kos.txt.gz", rt), X, runtime=rt)   # numpy in, numpy out

``load`` opens ``.npy`` (dense), ``.npz`` (scipy sparse), Matrix Market (``.mtx``) and UCI
``docword`` files, plain or gzip.

``svds`` (``scipy.sparse.linalg.svds``'s arguments and return convention) and ``pca`` run
the block Krylov-Schur eigensolver of :mod:`scalefree.flash.eigen` with the matrix on flash.

``topics`` is ISLE's SVD-based topic model on those kernels (:mod:`scalefree.flash.topics`);
``planted_topics``, ``write_corpus`` and ``recovery_error`` make planted-topic corpora and
score a model against them (:mod:`scalefree.flash.corpus`).
"""

from .core import (
    Csr,
    Matrix,
    Runtime,
    csr_product,
    csrcsc,
    csrgemv,
    csrmm,
    csrtmm,
    default_runtime,
    gemm,
    kmeans,
    load,
    npy_header,
    npy_header_bytes,
    numpy_blas_path,
    sort,
)
from .eigen import KrylovSchurInfo, block_krylov_schur
from .svd import PCA, pca, svds
from .topics import Topics, topics
from .corpus import planted_topics, recovery_error, truth_path, write_corpus

__all__ = ["Csr", "KrylovSchurInfo", "Matrix", "PCA", "Runtime", "block_krylov_schur", "csr_product", "csrcsc",
           "csrgemv", "csrmm", "csrtmm", "default_runtime", "gemm", "kmeans", "load", "npy_header",
           "npy_header_bytes", "numpy_blas_path", "pca", "planted_topics", "recovery_error", "sort", "svds", "Topics",
           "topics", "truth_path", "write_corpus"]
