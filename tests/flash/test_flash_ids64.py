"""Column ids past 32 bits in flash CSR matrices and docword files (issue 28): a small matrix
in a huge id space keeps its used columns' ids once (``Csr.col_ids``) and 32-bit positions per
entry; nothing is allocated per id of the space."""

import numpy as np
import pytest
import scipy.sparse as sp

from scalefree import flash
from scalefree.errors import InvalidArgumentError


def _wide(cols):
    rows = np.array([0, 0, 1, 3, 3, 3, 4])
    ids = np.array([3, 2**32 + 7, 2**32, 3, 2**32 + 7, cols - 1, 2**32], dtype=np.int64)
    vals = np.arange(1.0, 8.0)
    return sp.csr_matrix((vals, (rows, ids)), shape=(5, cols))


def _compact(a, col_ids):
    """a's stored columns, in col_ids order (scipy's column indexing allocates per id)."""
    coo = a.tocoo()
    return sp.csr_matrix((coo.data, (coo.row, np.searchsorted(col_ids, coo.col.astype(np.uint64)))),
                         shape=(a.shape[0], len(col_ids)))


@pytest.fixture
def rt(tmp_path):
    return flash.Runtime(memory_budget="4M", threads=2, dir=tmp_path)


@pytest.mark.parametrize("cols", [2**32 + 9, 2**40, 2**63 - 1])
def test_round_trip_keeps_ids_past_32_bits(rt, cols):
    a = _wide(cols)
    A = flash.Csr.from_scipy(a, rt)
    assert A.shape == (5, cols)
    assert A.compact_shape == (5, 4)
    assert A.col_ids.tolist() == [3, 2**32, 2**32 + 7, cols - 1]
    back = A.to_scipy()
    assert back.shape == a.shape
    assert back.indices.dtype == np.int64
    assert (back != a).nnz == 0
    assert np.array_equal(back.indices, a.indices)


def test_kernels_work_in_the_compact_space(rt):
    a = _wide(2**40)
    A = flash.Csr.from_scipy(a, rt)
    c = _compact(a, A.col_ids).toarray()  # the 4 stored columns, col_ids order
    x = np.array([1.0, -2.0, 0.5, 3.0])
    np.testing.assert_allclose(flash.csrgemv(A, x, runtime=rt), c @ x)
    y = np.arange(5.0)
    np.testing.assert_allclose(flash.csrgemv(A, y, transpose=True, runtime=rt), c.T @ y)
    b = np.arange(12.0).reshape(4, 3)
    np.testing.assert_allclose(flash.csrmm(A, b, runtime=rt), c @ b)
    np.testing.assert_allclose(flash.csrtmm(A, y[:, None], runtime=rt), c.T @ y[:, None])
    np.testing.assert_allclose(flash.csrtmm(A, b, gram=True, runtime=rt), c.T @ (c @ b))
    with pytest.raises(InvalidArgumentError, match="compact"):
        flash.svds(A, k=1)
    s = flash.svds(A.compact(), k=2, return_singular_vectors=False, runtime=rt)
    np.testing.assert_allclose(np.sort(s), np.sort(np.linalg.svd(c, compute_uv=False))[-2:], rtol=1e-8)


def test_transpose_has_a_row_per_used_column(rt):
    a = _wide(2**40)
    A = flash.Csr.from_scipy(a, rt)
    T = flash.csrcsc(A, runtime=rt)
    assert T.shape == (2**40, 5) and T.compact_shape == (4, 5)
    assert np.array_equal(T.row_ids, A.col_ids) and T.col_ids is None
    c = _compact(a, A.col_ids)
    assert (T.compact().to_scipy() != c.T.tocsr()).nnz == 0
    # back again: the maps swap back, and the ids come out as they went in
    back = flash.csrcsc(T, runtime=rt).to_scipy()
    assert back.shape == a.shape and (back != a).nnz == 0


def test_docword_with_a_vocabulary_past_32_bits(rt, tmp_path):
    w = 2**40
    path = tmp_path / "docword.wide.txt"
    path.write_text(f"3\n{w}\n4\n1 {2**32 + 2} 2\n1 4 1\n3 {w} 5\n3 4 1\n")
    A = flash.load(path, rt)
    assert A.shape == (3, w) and A.compact_shape == (3, 3)
    assert A.col_ids.tolist() == [3, 2**32 + 1, w - 1]
    want = sp.csr_matrix(([1.0, 2.0, 1.0, 5.0], ([0, 0, 2, 2], [3, 2**32 + 1, 3, w - 1])), shape=(3, w))
    got = A.to_scipy()
    assert got.shape == want.shape and (got != want).nnz == 0
