"""ISLE topic modelling (SVD-based, Bansal, Bhattacharyya and Kannan's TSVD as the
BLAS-on-flash paper runs it) with the document-word counts on flash, under the runtime's
memory budget.

``topics(A, k)`` takes a documents x words matrix of counts and runs the five steps of the
paper's section 5.4:

1. **threshold** the counts: each document's counts become frequencies; for each word ``i``
   ``zeta_i`` is the frequency that at least ``w0 s / 2`` of the ``s`` documents reach
   (``w0 = 1/k``, read off a per-word histogram of log-frequencies, 8 bins an octave), and
   the thresholded matrix ``B`` holds ``sqrt(zeta_i)`` where a document's frequency of word
   ``i`` reaches ``zeta_i`` and 0 elsewhere (words fewer than ``w0 s / 2`` documents use drop
   out). Two streaming passes over A in row blocks; ``B`` goes to flash;
2. the top-``k`` **truncated SVD** of ``B`` by the block Krylov-Schur eigensolver
   (:func:`scalefree.flash.svds`: ``B`` stays on flash when it exceeds the budget);
3. **k-means++ and Lloyd's k-means** of the documents projected on the ``k`` right singular
   vectors (``B v``, ``docs x k`` in memory);
4. **Lloyd's k-means in the original space** (the rows of ``B``) seeded by step 3's
   clusters, each iteration one ``flash.csrtmm`` (centers ``B^T Z``) and one ``flash.csrmm``
   (``B C^T``) over ``B`` on flash;
5. the **topic matrix**: for each cluster ``l`` its catchwords (words whose mean frequency in
   ``l`` is at least ``rho`` times that in every other cluster, ``rho = 1.1``), the
   ``eps0 w0 s / 2`` documents (``eps0 = 1/3``) with the largest total frequency of those
   catchwords, and topic ``l`` = the mean word frequencies of those dominant documents
   (clusters without catchwords: the cluster's mean). Columns sum to 1.

``sample`` < 1 runs steps 2 to 4 on that fraction of the documents (drawn by ``seed``), as
the paper does for large corpora. Steps 2 to 4 leave out documents with no thresholded word.
Every document is then assigned to its nearest original-space center in one more pass
(documents with no thresholded word: the center their frequencies align with best). Passes that touch every document read A in row
blocks of at most a quarter of the budget; the in-memory state is ``O((docs + words) k)``
(the projection, the labels, the centers), not the matrix.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from .._rss import trim_heap
from . import core as flash
from ..errors import InvalidArgumentError
from .state import CsrRows
from .svd import OnFlash, csr_flash_bytes, flash_operator, svds

_BINS_PER_OCTAVE = 8
_OCTAVES = 24  # frequencies down to 2^-24
_NBINS = _BINS_PER_OCTAVE * _OCTAVES
_RHO = 1.1
_EPS0 = 1.0 / 3.0
# A row-block pass over A holds up to about this many times a block's flash bytes at once
# (the block as float64 CSR, each entry's row, frequency, bin and sort key, the thresholded
# block, the distances to the centers; step 5 also the frequencies, their transpose and the
# per-cluster sums: measured ~35x on 1M documents, 2026-11-29; with a margin).
_ROW_TEMP = 40


@dataclass
class Topics:
    """The result of :func:`topics`. ``topic_word``: ``words x k``, each column a topic (a
    distribution over the words, sums to 1); ``labels``: each document's topic (its
    cluster, ``docs``); ``thresholds``: each word's ``zeta`` (inf: dropped);
    ``catchwords``: each topic's number of catchwords; ``seconds``: per step; ``stats``:
    bytes read and written, peak resident bytes of the flash kernels, passes."""

    topic_word: np.ndarray
    labels: np.ndarray
    thresholds: np.ndarray
    catchwords: np.ndarray
    singular_values: np.ndarray
    seconds: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    def top_words(self, n: int = 10) -> np.ndarray:
        """``k x n`` word ids (0-based), the heaviest first in each topic."""
        n = min(int(n), self.topic_word.shape[0])
        order = np.argsort(-self.topic_word, axis=0, kind="stable")[:n]
        return order.T.copy()


# ---------------------------------------------------------------------------------------
# Step 1: thresholds and the thresholded matrix


def _freq_bins(block, lengths):
    """The log-frequency bin of each entry of a row block (0: frequency 1, bin b covers
    ``(2^-(b+1)/R, 2^-b/R]``), and the frequencies."""
    rows = np.repeat(np.arange(block.shape[0]), np.diff(block.indptr))
    freq = block.data / np.maximum(lengths[rows], 1e-300)
    bins = np.floor(-np.log2(np.maximum(freq, 2.0 ** -_OCTAVES)) * _BINS_PER_OCTAVE).astype(np.int64)
    np.clip(bins, 0, _NBINS - 1, out=bins)
    return rows, freq, bins


def _thresholds(rows_a: CsrRows, q: int):
    """(document lengths, each word's last kept bin (-1: dropped), ``zeta`` per word)."""
    docs, words = rows_a.shape
    lengths = np.zeros(docs)
    hist = np.zeros((words, _NBINS), dtype=np.int32)
    for lo, hi, block in rows_a:
        lengths[lo:hi] = np.asarray(block.sum(axis=1)).ravel()
        _, _, bins = _freq_bins(block, lengths[lo:hi])
        keys, counts = np.unique(block.indices.astype(np.int64) * _NBINS + bins, return_counts=True)
        hist.ravel()[keys] += counts.astype(np.int32)
    cum = np.cumsum(hist, axis=1, out=hist)  # in place: int32 holds any count of documents below 2^31
    enough = cum[:, -1] >= q
    last = np.where(enough, np.argmax(cum >= q, axis=1), -1)
    zeta = np.where(enough, 2.0 ** (-(last + 1) / _BINS_PER_OCTAVE), np.inf)
    return lengths, last, zeta


def _threshold_block(block, lengths, last, root_zeta, unit=False):
    """The rows of ``B`` of one row block of A (scipy CSR, float64); ``unit``: each non-empty
    row scaled to norm 1."""
    import scipy.sparse as sp

    rows, _, bins = _freq_bins(block, lengths)
    keep = bins <= last[block.indices]
    indptr = np.zeros(block.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=block.shape[0]), out=indptr[1:])
    cols = block.indices[keep]
    b = sp.csr_matrix((root_zeta[cols], cols, indptr), shape=block.shape)
    if unit:
        norms = np.sqrt(np.asarray(b.multiply(b).sum(axis=1)).ravel())
        b = sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ b
    return b.tocsr()


class _CsrWriter:
    """Rows appended block by block, then one CSR matrix: in memory (scipy), or through
    files in ``dir`` (mapped read-only into ``flash.Csr.from_arrays``, then removed) when
    ``on_flash``."""

    def __init__(self, cols: int, dtype, on_flash: bool, dir):
        self.cols, self.dtype, self.on_flash = cols, np.dtype(dtype), on_flash
        self.counts: list[np.ndarray] = []
        self.nnz = 0
        self.parts: list = []
        if on_flash:
            self.tmp = tempfile.TemporaryDirectory(prefix="scalefree-topics-", dir=dir)
            self.ix = open(os.path.join(self.tmp.name, "indices"), "wb")
            self.dv = open(os.path.join(self.tmp.name, "data"), "wb")

    def append(self, block):
        self.counts.append(np.diff(block.indptr))
        self.nnz += block.nnz
        if self.on_flash:
            self.ix.write(np.ascontiguousarray(block.indices, dtype=flash.index_dtype(self.cols)).tobytes())
            self.dv.write(np.ascontiguousarray(block.data, dtype=self.dtype).tobytes())
        else:
            self.parts.append(block.astype(self.dtype))

    def finish(self, rt):
        import scipy.sparse as sp

        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, dtype=np.int64)
        rows = len(counts)
        if not self.on_flash:
            if not self.parts:
                return sp.csr_matrix((rows, self.cols), dtype=self.dtype)
            return sp.vstack(self.parts, format="csr").astype(self.dtype)
        self.ix.close()
        self.dv.close()
        indptr = np.zeros(rows + 1, dtype=np.uint64)
        np.cumsum(counts, out=indptr[1:])
        try:
            if self.nnz:
                ix = np.memmap(self.ix.name, dtype=flash.index_dtype(self.cols), mode="r", shape=(self.nnz,))
                dv = np.memmap(self.dv.name, dtype=self.dtype, mode="r", shape=(self.nnz,))
            else:
                ix, dv = np.zeros(0, dtype=flash.index_dtype(self.cols)), np.zeros(0, dtype=self.dtype)
            out = flash.Csr(_native.FlashCsr.from_arrays(rt._rt, rows, self.cols, indptr, ix, dv))
            del ix, dv
        finally:
            self.tmp.cleanup()
        return out


# ---------------------------------------------------------------------------------------
# Steps 3 and 4: k-means


def _sq_dist_argmin(x, centers, x_sq=None):
    """Nearest center of each row of dense ``x`` and the squared distance."""
    if x_sq is None:
        x_sq = np.einsum("ij,ij->i", x, x)
    # x_sq - 2 x c + |c|^2 in place: one rows x centers array, not four (the same bits).
    d = x @ centers.T
    d *= -2.0
    d += x_sq[:, None]
    d += np.einsum("ij,ij->i", centers, centers)[None, :]
    lab = np.argmin(d, axis=1)
    return lab, np.maximum(d[np.arange(len(lab)), lab], 0.0)


def _kmeans_pp(x, k, rng):
    """Greedy k-means++ seeding of the rows of dense ``x`` (Arthur and Vassilvitskii): each
    new center is the best of ``2 + log k`` candidates drawn proportionally to the squared
    distance to the centers so far (the one that lowers the potential most)."""
    n = x.shape[0]
    x_sq = np.einsum("ij,ij->i", x, x)
    trials = 2 + int(np.log(k))
    centers = np.empty((k, x.shape[1]), dtype=x.dtype)
    centers[0] = x[rng.integers(n)]
    d = np.maximum(x_sq - 2.0 * (x @ centers[0]) + centers[0] @ centers[0], 0.0)
    for c in range(1, k):
        total = d.sum()
        if total > 0:
            cand = np.searchsorted(np.cumsum(d), rng.random(trials) * total)
            cand = np.minimum(cand, n - 1)
        else:
            cand = rng.integers(n, size=trials)
        dc = np.maximum(x_sq[None, :] - 2.0 * (x[cand] @ x.T) + x_sq[cand][:, None], 0.0)  # trials x n
        new = np.minimum(d[None, :], dc)
        best = int(np.argmin(new.sum(axis=1)))
        centers[c] = x[cand[best]]
        d = new[best]
    return centers


def _lloyd_dense(x, centers, iterations):
    """Lloyd's k-means of the rows of dense ``x`` from ``centers``: (labels, centers,
    inertia)."""
    import scipy.sparse as sp

    x_sq = np.einsum("ij,ij->i", x, x)
    labels = None
    k = centers.shape[0]
    for _ in range(iterations):
        new, _ = _sq_dist_argmin(x, centers, x_sq)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        sizes = np.bincount(labels, minlength=k)
        sums = sp.csr_matrix((np.ones(len(labels)), (labels, np.arange(len(labels)))), shape=(k, len(labels))) @ x
        nonempty = sizes > 0
        centers[nonempty] = sums[nonempty] / sizes[nonempty, None]
    labels, d = _sq_dist_argmin(x, centers, x_sq)
    return labels, centers, float(d.sum())


def _one_hot(labels, k, scale=None):
    z = np.zeros((len(labels), k))
    z[np.arange(len(labels)), labels] = 1.0 if scale is None else scale
    return z


def _lloyd_sparse(op, row_sq, labels, k, iterations, tol):
    """Lloyd's k-means on the rows of ``op`` (``B``: flash or memory), from ``labels``. Each
    iteration: centers ``B^T Z / n`` (one pass), distances through ``B C^T`` (one pass).
    Stops when fewer than ``tol`` of the labels change. Returns (labels, centers k x words,
    iterations)."""
    centers = None
    it = 0
    for it in range(1, iterations + 1):
        sizes = np.bincount(labels, minlength=k).astype(np.float64)
        z = _one_hot(labels, k, 1.0 / np.maximum(sizes[labels], 1.0))
        new_centers = np.asarray(op.rmatmat(z), dtype=np.float64).T  # k x words
        del z
        if centers is not None:  # an emptied cluster keeps its center
            empty = sizes == 0
            new_centers[empty] = centers[empty]
        centers = new_centers
        # row_sq - 2 B c + |c|^2 in place: one docs x k array besides the product (same bits).
        d = np.asarray(op.matmat(np.ascontiguousarray(centers.T)), dtype=np.float64)
        d *= -2.0
        d += row_sq[:, None]
        d += np.einsum("ij,ij->i", centers, centers)[None, :]
        new = np.argmin(d, axis=1)
        del d
        changed = np.count_nonzero(new != labels)
        labels = new
        if changed <= tol * len(labels):
            break
    return labels, centers, it


def _add_sparse(dense, s):
    """``dense += s`` for a scipy sparse ``s``, touching only its entries (no dense copy of s)."""
    c = s.tocoo()
    c.sum_duplicates()
    dense[c.row, c.col] += c.data


def _cluster_sums(block, labels, k, out):
    """``out[l] += `` the sum of the rows of ``block`` (scipy CSR) labelled ``l``."""
    import scipy.sparse as sp

    n = block.shape[0]
    onehot = sp.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
    _add_sparse(out, onehot @ block)


def _lloyd_rows(rows_b, row_sq, labels, k, iterations, tol):
    """:func:`_lloyd_sparse` a row block of ``B`` at a time (``rows_b``: a :class:`CsrRows`
    over B, on flash or in memory), one pass per iteration: each block's labels from the
    current centers, and the sums of the next centers from those labels — the same iterates,
    with no ``docs x k`` array (the centers and their sums, ``k x words``, stay in memory)."""
    words = rows_b.shape[1]
    sums = np.zeros((k, words))
    for lo, hi, block in rows_b:
        _cluster_sums(block, labels[lo:hi], k, sums)
    sizes = np.bincount(labels, minlength=k).astype(np.float64)
    centers = sums / np.maximum(sizes, 1.0)[:, None]  # an empty cluster: the origin, as _lloyd_sparse
    it = 0
    for it in range(1, iterations + 1):
        c_sq = np.einsum("ij,ij->i", centers, centers)
        new = np.empty_like(labels)
        sums[:] = 0.0
        for lo, hi, block in rows_b:
            d = np.asarray(block @ centers.T, dtype=np.float64)
            d *= -2.0
            d += row_sq[lo:hi, None]
            d += c_sq[None, :]
            new[lo:hi] = lab = np.argmin(d, axis=1)
            del d
            _cluster_sums(block, lab, k, sums)
        changed = np.count_nonzero(new != labels)
        labels = new
        if changed <= tol * len(labels):
            break
        sizes = np.bincount(labels, minlength=k).astype(np.float64)
        nonempty = sizes > 0  # an emptied cluster keeps its center
        centers[nonempty] = sums[nonempty] / sizes[nonempty, None]
    return labels, centers, it


# ---------------------------------------------------------------------------------------


def _catchwords(g, thresholded):
    """Catchwords (words x clusters, bool) from the clusters' mean word frequencies ``g``:
    thresholded words at least ``rho`` times more frequent in their cluster than in any other.
    A block of words at a time: the temporaries (the partition, the runner-up) are a few MiB,
    not three more words x clusters arrays beside ``g`` (the peak of step 5 at 1M documents)."""
    words, c = g.shape
    out = np.empty((words, c), dtype=bool)
    step = max(1, (1 << 20) // max(1, c))
    for lo in range(0, words, step):
        gb = g[lo:lo + step]
        if c > 1:
            top2 = np.partition(gb, c - 2, axis=1)[:, c - 2:]
            runner_up = np.where(gb >= top2[:, [1]], top2[:, [0]], top2[:, [1]])
        else:
            runner_up = np.zeros_like(gb)
        out[lo:lo + step] = (gb >= _RHO * runner_up) & (gb > 0) & thresholded[lo:lo + step]
    return out


def check_k(k, shape):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidArgumentError(f"topics: k must be an integer, got {k!r}")
    if not 2 <= k < min(shape):
        raise InvalidArgumentError(f"topics: k must be between 2 and min(docs, words) - 1 = {min(shape) - 1} "
                                   f"for a {shape[0]} x {shape[1]} matrix, got k={k}")
    return int(k)


def topics(A, k: int, *, sample: float = 1.0, seed: int = 0, tol: float = 1e-4, kmeans_iterations: int = 20,
           kmeans_inits: int = 2, lloyd_iterations: int = 15, unit_rows: bool = True, extra_clusters=None, runtime=None, progress=None,
           checkpoints=None) -> Topics | None:
    """ISLE's topic model of the documents x words count matrix ``A`` with ``k`` topics
    (steps in the module docstring). ``A``: a :class:`flash.Csr` (stays on flash), or a
    scipy sparse matrix (in memory; copied to flash first when larger than the budget).
    Counts must be >= 0. ``sample``: fraction of documents for steps 2-4 (0 < sample <= 1).
    ``tol``: the SVD's relative eigen-residual (of ``B^T B``'s eigenpairs; :func:`svds` is
    called with ``tol=sqrt(tol)``, its tolerance of the singular values). ``kmeans_inits``: k-means++ seedings in step 3 (the
    run of least inertia is kept). ``progress``: called with a line per step. Returns a
    :class:`Topics`. ``checkpoints``: a :class:`~scalefree.checkpoint.Checkpoints` counting
    steps: after step 2 (the SVD: its ``u`` and singular values) and step 3 (the clusters)
    the state and the seeded RNG are saved when due; a resumed run redoes step 1 (two passes
    over A, the same B) and continues after the saved step with the uninterrupted run's
    result. Returns None when it stopped at the checkpoints' ``stop_after``."""
    import scipy.sparse as sp

    rt = runtime or flash.default_runtime()
    say = progress or (lambda line: None)
    if isinstance(A, flash.Csr) and (A.col_ids is not None or A.row_ids is not None):
        raise InvalidArgumentError(f"topics: A has id maps (shape {A.shape}); pass A.compact() and map word ids by A.col_ids")
    if not isinstance(A, flash.Csr):
        if not sp.issparse(A):
            raise InvalidArgumentError("topics: A must be a flash.Csr or a scipy sparse matrix of counts")
        A = A.tocsr()
        if A.dtype.kind not in "fiu":
            raise InvalidArgumentError(f"topics: A must hold counts, got {A.dtype}")
        A = A.astype(np.float64) if A.dtype.kind != "f" else A
        if csr_flash_bytes(A) > rt.memory_budget_bytes:
            A = flash.Csr.from_scipy(A, rt)
    shape = tuple(A.shape)
    k = check_k(k, shape)
    if not (isinstance(sample, (int, float)) and 0 < sample <= 1):
        raise InvalidArgumentError(f"topics: sample must be in (0, 1], got {sample!r}")
    docs, words = shape
    budget = rt.memory_budget_bytes
    kk = k + (max(1, math.ceil(k / 10)) if extra_clusters is None else int(extra_clusters))
    # The state that stays in memory whatever the budget: per document its length, label and
    # row start (the row blocks' index), the sample's ids, per word the histogram (step 1) or
    # the clusters' mean frequencies and centers (step 5). The row-block passes get the rest.
    fixed = docs * 24 + (8 * math.ceil(sample * docs) if sample < 1 else 0) \
        + max(words * _NBINS * 4, 2 * words * kk * 8)
    on_flash = isinstance(A, flash.Csr) and _csr_flash_bytes_of(A) + fixed > budget
    if isinstance(A, flash.Csr) and not on_flash:  # the budget holds A: read it once
        A = A.to_scipy()
    block_bytes = max(1 << 16, max(budget - fixed, budget // 4) // _ROW_TEMP)
    rows_a = CsrRows(A, block_bytes)
    rng = np.random.default_rng(seed)
    seconds: dict = {}
    t_all = time.perf_counter()

    # 1. Thresholds and B (only the sampled rows when sampling).
    t = time.perf_counter()
    w0 = 1.0 / k
    q = max(1, math.ceil(w0 * docs / 2))
    lengths, last, zeta = _thresholds(rows_a, q)
    if np.any(lengths < 0) or np.any(~np.isfinite(lengths)):
        raise InvalidArgumentError("topics: A must hold non-negative counts")
    root_zeta = np.sqrt(np.where(np.isfinite(zeta), zeta, 0.0))
    picked = np.sort(rng.choice(docs, max(k + 1, int(round(sample * docs))), replace=False)) if sample < 1 else None
    dtype = np.float32 if np.dtype(A.dtype) == np.float32 else np.float64
    writer = _CsrWriter(words, dtype, on_flash, rt.dir)
    row_sq = []
    for lo, hi, block in rows_a:
        b = _threshold_block(block, lengths[lo:hi], last, root_zeta, unit_rows)
        # Documents without a thresholded word carry no signal for the clustering (they would
        # gather at the origin as one junk cluster): steps 2-4 leave them out.
        use = np.flatnonzero(np.diff(b.indptr) > 0)
        if picked is not None:
            use = np.intersect1d(use, picked[(picked >= lo) & (picked < hi)] - lo, assume_unique=True)
        b = b[use]
        row_sq.append(np.asarray(b.multiply(b).sum(axis=1)).ravel())
        writer.append(b)
    B = writer.finish(rt)
    b_nnz = B.nnz
    row_sq = np.concatenate(row_sq)
    kept = int(np.isfinite(zeta).sum())
    seconds["threshold"] = time.perf_counter() - t
    trim_heap()  # what the step freed in the C heaps goes back (the budget bounds the process)
    say(f"1/5 threshold: {kept} of {words} words kept (in >= {q} documents' top frequencies), B has {B.shape[0]} "
        f"documents" + (f" (of {len(picked)} sampled)" if picked is not None else f" (of {docs})")
        + f", {B.nnz} entries{' on flash' if isinstance(B, flash.Csr) else ' in memory'}, {seconds['threshold']:.2f} s")
    if B.shape[0] <= k:
        raise InvalidArgumentError(f"topics: only {B.shape[0]} documents keep a word after thresholding, "
                                   f"too few for k={k} topics")
    kk = min(kk, B.shape[0] - 1)
    if kept < k:
        raise InvalidArgumentError(f"topics: only {kept} words pass the thresholds, fewer than k={k} "
                                   f"(too few documents for {k} topics?)")

    done, saved = (0, None) if checkpoints is None else checkpoints.restore()
    if saved is not None:
        if saved["s"].shape != (k,) or len(saved["u" if done == 2 else "labels"]) != B.shape[0]:
            raise InvalidArgumentError("topics: the checkpoint does not fit this run's thresholded matrix")
        rng.bit_generator.state = json.loads(saved["rng"].tobytes().decode())
        svd_stats = json.loads(saved["svd_stats"].tobytes().decode())
        s = saved["s"]

    def state(**arrays):
        return {**arrays, "s": s, "rng": np.frombuffer(json.dumps(rng.bit_generator.state).encode(), np.uint8),
                "svd_stats": np.frombuffer(json.dumps(svd_stats).encode(), np.uint8)}

    # 2. Truncated SVD of B.
    t = time.perf_counter()
    if done < 2:
        svd_stats: dict = {}
        # The SVD's budget: what the per-document vectors leave. Its u may come back on flash.
        held = lengths.nbytes + row_sq.nbytes + (picked.nbytes if picked is not None else 0)
        u, s, vt = svds(B, k=k, tol=math.sqrt(tol), runtime=rt.with_budget(max(budget - held, budget // 4)), rng=seed,
                        stats=svd_stats, u_on_flash=True)
        del vt
        seconds["svd"] = time.perf_counter() - t
        trim_heap()
        say(f"2/5 svd: top {k} singular values of B ({svd_stats.get('operator_columns', 0)} operator columns, "
            f"{svd_stats.get('restarts', 0)} restarts, B {'on flash' if svd_stats.get('on_flash') else 'in memory'}), "
            f"{seconds['svd']:.2f} s")
        if checkpoints is not None and checkpoints.after(
                2, lambda: state(u=u.to_numpy() if isinstance(u, flash.Matrix) else u)):
            return None
    elif done == 2:
        u = saved["u"]

    # 3. k-means++ and Lloyd in the projected space.
    t = time.perf_counter()
    if done < 3:
        if isinstance(u, flash.Matrix):  # u on flash: B v a row block at a time
            proj = np.empty(u.shape, dtype=np.float32)
            step = max(1, block_bytes // (8 * k))
            for lo in range(0, u.shape[0], step):
                blk = u.read_block(lo, 0, min(step, u.shape[0] - lo), k)
                blk *= s[None, :]
                proj[lo:lo + len(blk)] = blk
        else:
            if not u.flags.writeable:
                u = u.copy()
            u *= s[None, :]  # B v, the documents in the top-k right singular space (in place: no docs x k copy)
            proj = u.astype(np.float32)
        del u
        best = None
        for _ in range(kmeans_inits):
            run = _lloyd_dense(proj, _kmeans_pp(proj, kk, rng), kmeans_iterations)
            if best is None or run[2] < best[2]:
                best = run
        labels = best[0]
        del proj
        seconds["kmeans_projected"] = time.perf_counter() - t
        trim_heap()
        say(f"3/5 k-means++ and k-means ({kk} clusters) on the {k}-dim projection (best of {kmeans_inits} seedings), "
            f"{seconds['kmeans_projected']:.2f} s")
        if checkpoints is not None and checkpoints.after(3, lambda: state(labels=labels)):
            return None
    else:
        labels = saved["labels"]
    del saved

    # 4. Lloyd in the original space, seeded by step 3.
    t = time.perf_counter()
    # Lloyd's docs x k one-hot and distance matrices when they fit beside the per-document
    # vectors and the centers; else one pass over B's row blocks per iteration.
    dense_lloyd = 2 * B.shape[0] * kk * 8 + 2 * words * kk * 8 + lengths.nbytes + row_sq.nbytes \
        + csr_flash_bytes(B) <= budget
    if dense_lloyd:
        op = flash_operator(B, rt)
        labels, centers, iters = _lloyd_sparse(op, row_sq, labels, kk, lloyd_iterations, 1e-3)
    else:
        op = CsrRows(B, block_bytes)
        labels, centers, iters = _lloyd_rows(op, row_sq, labels, kk, lloyd_iterations, 1e-3)
    seconds["kmeans_original"] = time.perf_counter() - t
    trim_heap()
    say(f"4/5 k-means on B seeded by step 3: {iters} iterations, {seconds['kmeans_original']:.2f} s")
    lloyd = {key: getattr(op, key, 0) for key in ("bytes_read", "bytes_written", "peak_resident_bytes", "cache_hits",
                                                   "cache_misses", "compute_idle_seconds", "kernel_seconds")}
    lloyd_on_flash = isinstance(op, OnFlash) or (isinstance(op, CsrRows) and op.on_flash)
    if isinstance(op, CsrRows):
        lloyd["bytes_read"] = op.bytes_read
    del B, op

    # 5. All documents' clusters (when sampled) and cluster means, then catchwords, dominant
    # documents and the topics. Passes over A in row blocks.
    t = time.perf_counter()
    c_sq = np.einsum("ij,ij->i", centers, centers)
    all_labels = np.empty(docs, dtype=np.int64)
    g = np.zeros((words, kk))
    clustered = np.zeros(kk)
    for lo, hi, block in rows_a:
        b = _threshold_block(block, lengths[lo:hi], last, root_zeta, unit_rows)
        bsq = np.asarray(b.multiply(b).sum(axis=1)).ravel()
        d = np.asarray(b @ centers.T)  # bsq - 2 b c + |c|^2 in place (the same bits)
        d *= -2.0
        d += bsq[:, None]
        d += c_sq[None, :]
        lab = np.argmin(d, axis=1)
        del d
        freq = sp.diags(1.0 / np.maximum(lengths[lo:hi], 1e-300)) @ block
        empty = np.flatnonzero(bsq == 0)
        if len(empty):  # no thresholded word: the center its frequencies align with best
            lab[empty] = np.argmax(np.asarray(freq[empty] @ centers.T), axis=1)
        all_labels[lo:hi] = lab
        full = np.flatnonzero(bsq > 0)
        lab_full = lab[full]
        onehot = sp.csr_matrix((np.ones(len(full)), lab_full, np.arange(len(full) + 1)), shape=(len(full), kk))
        _add_sparse(g, freq[full].T @ onehot)
        clustered += np.bincount(lab_full, minlength=kk)
    g /= np.maximum(clustered, 1.0)[None, :]
    thresholded = np.isfinite(zeta)[:, None]
    if kk > k:
        # The k clusters with the most catchwords are the topics: a cluster of documents with
        # no dominant topic, or one topic split in two, has few.
        keep = np.sort(np.lexsort((-clustered, -_catchwords(g, thresholded).sum(axis=0)))[:k])
        new_index = np.full(kk, -1, dtype=np.int64)
        new_index[keep] = np.arange(k)
        g = g[:, keep]  # one at a time: the old and new copies of one array at once, not of both
        centers = centers[keep]
        c_sq = c_sq[keep]
        all_labels = new_index[all_labels]
    catch = _catchwords(g, thresholded)
    n_catch = catch.sum(axis=0)
    r = max(1, math.ceil(_EPS0 * w0 * docs / 2))
    best_score = np.full((r, k), -np.inf)
    best_doc = np.full((r, k), -1, dtype=np.int64)
    catch_f = sp.csr_matrix(catch, dtype=np.float64)  # catchwords are few: sparse (no dense float copy)
    for lo, hi, block in rows_a:
        freq = sp.diags(1.0 / np.maximum(lengths[lo:hi], 1e-300)) @ block
        lost = np.flatnonzero(all_labels[lo:hi] < 0)
        if len(lost):  # documents of a dropped cluster: the nearest kept center
            b = _threshold_block(block[lost], lengths[lo:hi][lost], last, root_zeta, unit_rows)
            bsq = np.asarray(b.multiply(b).sum(axis=1)).ravel()
            lab = np.argmin(bsq[:, None] - 2.0 * np.asarray(b @ centers.T) + c_sq[None, :], axis=1)
            empty = np.flatnonzero(bsq == 0)
            if len(empty):
                lab[empty] = np.argmax(np.asarray(freq[lost[empty]] @ centers.T), axis=1)
            all_labels[lo + lost] = lab
        score = (freq @ catch_f).toarray()  # rows x k
        # Each topic's r best documents, kept in order of score, then document: ties go to the
        # earlier document whatever the row blocks (a document enters only by beating the r-th).
        enter = np.flatnonzero((score > best_score[-1][None, :]).any(axis=1))
        if len(enter):
            allscore = np.vstack([best_score, score[enter]])
            alldoc = np.vstack([best_doc, np.broadcast_to((lo + enter)[:, None], (len(enter), k))])
            keep = np.argsort(-allscore.T, axis=1, kind="stable")[:, :r].T
            best_score = np.take_along_axis(allscore, keep, axis=0)
            best_doc = np.take_along_axis(alldoc, keep, axis=0)
    del centers, c_sq, catch_f
    # Topics: the mean frequencies of each topic's dominant documents (score > 0).
    chosen = [np.unique(best_doc[(best_score[:, l] > 0) & (best_doc[:, l] >= 0), l]) for l in range(k)]
    topic = np.zeros((words, k))
    mark = np.zeros(docs, dtype=bool)
    for c in chosen:
        mark[c] = True
    if mark.any():
        for lo, hi, block in rows_a:
            rows = np.flatnonzero(mark[lo:hi])
            if len(rows) == 0:
                continue
            freq = sp.diags(1.0 / np.maximum(lengths[lo:hi][rows], 1e-300)) @ block[rows]
            for l in range(k):
                mine = np.searchsorted(chosen[l], rows + lo)
                hit = (mine < len(chosen[l])) & (chosen[l][np.minimum(mine, len(chosen[l]) - 1)] == rows + lo) \
                    if len(chosen[l]) else np.zeros(len(rows), dtype=bool)
                if hit.any():
                    topic[:, l] += np.asarray(freq[np.flatnonzero(hit)].sum(axis=0)).ravel()
    for l in range(k):
        if n_catch[l] == 0 or len(chosen[l]) == 0:
            topic[:, l] = g[:, l]
    totals = topic.sum(axis=0)
    topic /= np.where(totals > 0, totals, 1.0)[None, :]
    seconds["topics"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t_all
    say(f"5/5 topics: catchwords per topic min {int(n_catch.min())} median {int(np.median(n_catch))}, "
        f"{int(mark.sum())} dominant documents, {seconds['topics']:.2f} s")
    both = (svd_stats, lloyd)
    stats = {
        "on_flash": bool(on_flash),
        "svd_on_flash": bool(svd_stats.get("on_flash")),
        "lloyd_on_flash": lloyd_on_flash,
        "row_block_bytes": block_bytes,
        "lloyd_row_blocks": not dense_lloyd,
        "svd_basis_on_flash": bool(svd_stats.get("basis_on_flash")),
        "svd_vectors_on_flash": bool(svd_stats.get("vectors_on_flash")),
        "row_passes": rows_a.passes,
        "row_bytes_read": rows_a.bytes_read,
        "bytes_read": sum(int(x.get("bytes_read", 0)) for x in both) + rows_a.bytes_read,
        "bytes_written": sum(int(x.get("bytes_written", 0)) for x in both),
        "cache_hits": sum(int(x.get("cache_hits", 0)) for x in both),
        "cache_misses": sum(int(x.get("cache_misses", 0)) for x in both),
        "compute_idle_seconds": sum(float(x.get("compute_idle_seconds", 0.0)) for x in both),
        "kernel_seconds": sum(float(x.get("kernel_seconds", 0.0)) for x in both),
        "peak_resident_bytes": max(int(x.get("peak_resident_bytes", 0)) for x in both),
        "svd_operator_columns": int(svd_stats.get("operator_columns", 0)),
        "lloyd_iterations": iters,
        "sampled_docs": len(picked) if picked is not None else docs,
        "thresholded_entries": int(b_nnz),
    }
    return Topics(topic_word=topic, labels=all_labels, thresholds=zeta, catchwords=n_catch, singular_values=s[::-1],
                  seconds=seconds, stats=stats)


def _csr_flash_bytes_of(a: flash.Csr) -> int:
    return int(a.nnz) * (np.dtype(a.dtype).itemsize + 4) + (a.shape[0] + 1) * 8
