"""Column ids past 32 bits in flash CSR matrices and docword files (issue 28): a small matrix
in a huge id space keeps its used columns' ids once (``Csr.col_ids``) and 32-bit positions per
entry; nothing is allocated per id of the space. A matrix of more than 2**32 stored columns
holds 64-bit indices (issue 41)."""

import numpy as np
import pytest
import scipy.sparse as sp

from scalefree import _native, flash
from scalefree.flash.state import CsrRows
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


def _coo_ref(rows, cols, entries):
    r, c, v = (np.array(x) for x in zip(*entries))
    return sp.coo_matrix((v.astype(np.float64), (r.astype(np.int64), c.astype(np.int64))), shape=(rows, cols))


def _same(a, b):
    a, b = a.tocoo(), b.tocoo()
    a.sum_duplicates()
    b.sum_duplicates()
    return a.shape == b.shape and sorted(zip(a.row.tolist(), a.col.tolist(), a.data.tolist())) == \
        sorted(zip(b.row.tolist(), b.col.tolist(), b.data.tolist()))


def test_matrix_market_with_rows_and_columns_past_32_bits(rt, tmp_path):
    """A .mtx of 2**40 x 2**33 (ids as written, 1-based): the used rows and columns are
    mapped (nothing per id of the space), the kernels run on the compact matrix, csrcsc swaps
    the maps, and the ids come back as written."""
    rows, cols = 2**40, 2**33
    entries = [(2**32 + 4, 0, 1.5), (2**32 + 4, 2**32 + 1, -2.0), (7, 2**33 - 1, 3.0), (rows - 1, 5, 4.0),
               (7, 0, 0.5), (7, 0, 0.25)]  # a duplicate: summed
    path = tmp_path / "wide.mtx"
    path.write_text(f"%%MatrixMarket matrix coordinate real general\n% ids past 2**32\n{rows} {cols} {len(entries)}\n"
                    + "".join(f"{r + 1} {c + 1} {v}\n" for r, c, v in entries))
    A = flash.load(path, rt)
    assert A.shape == (rows, cols) and A.compact_shape == (3, 4)
    assert A.row_ids.tolist() == [7, 2**32 + 4, rows - 1]
    assert A.col_ids.tolist() == [0, 5, 2**32 + 1, 2**33 - 1]
    want = _coo_ref(rows, cols, entries)
    assert _same(A.to_coo(), want)
    c = np.array([[0.75, 0, 0, 3.0], [1.5, 0, -2.0, 0], [0, 4.0, 0, 0]])  # row_ids x col_ids order
    x = np.array([1.0, -1.0, 0.5, 2.0])
    np.testing.assert_allclose(flash.csrgemv(A, x, runtime=rt), c @ x)
    T = flash.csrcsc(A, runtime=rt)
    assert T.shape == (cols, rows) and T.compact_shape == (4, 3)
    assert np.array_equal(T.row_ids, A.col_ids) and np.array_equal(T.col_ids, A.row_ids)
    assert _same(T.to_coo(), want.T)
    # symmetric, up to 2**64 - 1: both triangles; past scipy's int64 ids only the compact form reads back
    n = 2**64 - 1
    path = tmp_path / "sym.mtx"
    path.write_text(f"%%MatrixMarket matrix coordinate real symmetric\n{n} {n} 2\n{2**63 + 1} 3 2.5\n{n} {n} 1\n")
    S = flash.Csr.from_matrix_market(path, runtime=rt)
    assert S.shape == (n, n) and S.row_ids.tolist() == [2, 2**63, n - 1] and np.array_equal(S.col_ids, S.row_ids)
    assert S.compact().to_scipy().toarray().tolist() == [[0, 2.5, 0], [2.5, 0, 0], [0, 0, 1]]
    with pytest.raises(InvalidArgumentError, match="int64"):
        S.to_coo()


def test_from_scipy_coo_with_rows_past_32_bits(rt, tmp_path):
    rows, cols = 2**40 + 3, 2**36
    entries = [(2**40 + 2, 2**35, 1.0), (5, 2**35, 2.0), (2**32, 9, -1.0), (5, 9, 4.0)]
    a = _coo_ref(rows, cols, entries)
    A = flash.Csr.from_scipy(a, rt)
    assert A.shape == (rows, cols) and A.compact_shape == (3, 2)
    assert A.row_ids.tolist() == [5, 2**32, 2**40 + 2] and A.col_ids.tolist() == [9, 2**35]
    assert _same(A.to_coo(), a)
    c = np.array([[4.0, 2.0], [-1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(flash.csrmm(A, np.eye(2), runtime=rt), c)
    np.testing.assert_allclose(flash.csrgemv(A, np.arange(3.0), transpose=True, runtime=rt), c.T @ np.arange(3.0))
    # rows past 2**32, columns few: only the rows are mapped
    b = _coo_ref(2**33, 4, [(2**33 - 1, 3, 1.0), (0, 0, 2.0)])
    B = flash.Csr.from_scipy(b, rt)
    assert B.compact_shape == (2, 4) and B.col_ids is None and B.row_ids.tolist() == [0, 2**33 - 1]
    assert _same(B.to_coo(), b)
    # a .npz of such a coo matrix (scipy.sparse.save_npz keeps the format) loads the same way
    sp.save_npz(tmp_path / "wide.npz", a)
    C = flash.load(tmp_path / "wide.npz", rt)
    assert C.compact_shape == (3, 2) and np.array_equal(C.row_ids, A.row_ids) and _same(C.to_coo(), a)


@pytest.mark.parametrize("form", ["uci", "uci-unsorted", "csv"])
def test_docword_with_documents_past_32_bits(rt, tmp_path, form):
    """D = 2**34 documents, a few used (ids like 2**33 + k): a row per used document
    (``row_ids``), nothing per id of the space; streamed (ascending docIDs), in memory
    (docIDs going back) and as exported triples without the UCI lines."""
    big, b = 2**34, 2**33
    entries = [(5, 2, 1.0), (b + 1, 3, 2.0), (b + 1, 1, 4.0), (b + 1, 3, 1.0), (b + 7, 2, 5.0), (big, 1, 6.0)]
    if form == "uci-unsorted":
        entries = entries[::-1]
    if form == "csv":
        path = tmp_path / "bow.csv"
        path.write_text("doc,word,count\n" + "".join(f"{d},{w},{c}\n" for d, w, c in entries))
    else:
        path = tmp_path / "docword.docs.txt"
        path.write_text(f"{big}\n3\n{len(entries)}\n" + "".join(f"{d} {w} {c}\n" for d, w, c in entries))
    A = flash.Csr.from_docword(path, runtime=rt)
    assert A.shape == (big, 3) and A.compact_shape == (4, 3) and A.col_ids is None
    assert A.row_ids.tolist() == [4, b, b + 6, big - 1]
    want = _coo_ref(big, 3, [(d - 1, w - 1, c) for d, w, c in entries])
    assert _same(A.to_coo(), want)


def test_cli_topics_on_ids_past_32_bits_equals_small_ids(tmp_path):
    """`flash topics` on a docword whose documents and words sit past 2**33 (D = W = 2**34):
    the same topics as on the same corpus with small ids, the top words reported by their ids."""
    import json
    import subprocess
    import sys

    small = tmp_path / "docword.small.txt"
    truth = flash.planted_topics(50, 3, beta=0.5, seed=4)
    flash.write_corpus(small, truth, 500, alpha=0.05, mean_length=80, seed=4)
    lines = small.read_text().split("\n")
    docs, words, nnz = (int(x) for x in lines[:3])
    body = np.array([ln.split() for ln in lines[3:] if ln], np.int64)
    assert len(np.unique(body[:, 0])) == docs and len(np.unique(body[:, 1])) == words  # every id used
    off, space = 2**33, 2**34
    wide = tmp_path / "docword.wide.txt"
    wide.write_text(f"{space}\n{space}\n{nnz}\n" + "".join(f"{d + off} {w + off} {c}\n" for d, w, c in body.tolist()))
    got = {}
    for name, path in (("small", small), ("wide", wide)):
        js, out = tmp_path / f"{name}.json", tmp_path / f"{name}.npz"
        p = subprocess.run([sys.executable, "-m", "scalefree.cli", "flash", "topics", str(path), "-k", "3", "--top", "5",
                            "--json", str(js), "--out", str(out), "--dir", str(tmp_path), "-q"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        got[name] = json.loads(js.read_text()), np.load(out), p.stdout
    (rs, ms, out_s), (rw, mw, out_w) = got["small"], got["wide"]
    assert rw["top_words"] == [[w + off for w in t] for t in rs["top_words"]]
    np.testing.assert_array_equal(mw["topic_word"], ms["topic_word"])
    np.testing.assert_array_equal(mw["labels"], ms["labels"])
    assert mw["doc_ids"].tolist() == list(range(off, off + docs)) and mw["word_ids"].tolist() == list(range(off, off + words))
    assert str(rs["top_words"][0][0] + off) in out_w.splitlines()[0]


def test_more_than_2_to_the_32_stored_columns(rt, tmp_path):
    """A matrix of 2**32 + 10 stored columns (no id map, a handful of entries): 64-bit column
    indices on flash (8 bytes each; 4 for every matrix up to 2**32 columns), read back whole
    and by rows, and multiplied by x and B of 2**32 + 10 rows held in sparse memory-mapped
    files (only the pages at the used columns are ever touched): the result of the small
    equivalent with numpy."""

    cols = 2**32 + 10
    rows = np.array([0, 0, 1, 3, 3, 3, 4])
    ids = np.array([3, 2**32, 2**32 + 9, 0, 3, 2**32 + 9, 2**32 - 1], dtype=np.int64)
    a = sp.csr_matrix((np.arange(1.0, 8.0), (rows, ids)), shape=(5, cols))
    m = _native.FlashCsr.from_arrays(rt._rt, 5, cols, a.indptr.astype(np.uint64), a.indices.astype(np.uint64), a.data)
    A = flash.Csr(m)
    assert A.index_bytes == 8 and A.shape == (5, cols) and A.col_ids is None
    assert flash.Csr.from_scipy(a[:, :2**32], rt).index_bytes == 4  # 2**32 columns: 32-bit
    back = A.to_scipy()
    assert back.shape == a.shape and (back != a).nnz == 0 and np.array_equal(back.indices, a.indices)
    blocks = list(CsrRows(A, block_bytes=20))  # a row or two per block
    assert sum(b.nnz for _, _, b in blocks) == a.nnz and (sp.vstack([b for _, _, b in blocks]) != a).nnz == 0
    used = np.unique(ids)
    small = _compact(a, used.astype(np.uint64)).toarray()
    n = 2

    def sparse_file(name, shape):
        path = tmp_path / name
        with open(path, "wb") as f:
            f.truncate(int(np.prod(shape)) * 8)
        return np.memmap(path, dtype=np.float64, mode="r+", shape=shape)

    x = sparse_file("x", (cols,))
    x[used] = xs = np.arange(1.0, len(used) + 1)
    np.testing.assert_allclose(flash.csrgemv(A, x, runtime=rt), small @ xs)
    b = sparse_file("b", (cols, n))
    b[used] = bs = np.arange(len(used) * n, dtype=np.float64).reshape(-1, n) - 3
    np.testing.assert_allclose(flash.csrmm(A, b, runtime=rt), small @ bs)
    with pytest.raises(InvalidArgumentError, match="64-bit column indices"):
        flash.csrcsc(A, runtime=rt)
