"""Seeded sparse matrices with power-law row and column degrees and exactly ``nnz`` distinct
entries, in memory (:func:`power_law_csr`) or written to a scipy ``.npz`` a row block at a time
(:func:`write_power_law`) — the 1M × 100K, 47M-entry matrix of the flash benchmarks.

The law: positions drawn independently with probability ``p_r q_c`` (row weights
``1/rank^0.9``, column weights ``1/rank^1.1``, the ranks a seeded permutation of the rows and of
the columns), the distinct positions of ``D`` draws, then a uniform random ``nnz`` of them;
values uniform in [0.5, 1.5). ``D`` is chosen up front so that the expected number of distinct
positions (Poisson approximation, ``Σ_r Σ_c 1 − exp(−D p_r q_c)``) is ``nnz`` plus a margin;
in the rare case of a shortfall the draws are repeated with a larger ``D`` (next seed stream).

Why it is fast: given ``D``, the draws per row are one multinomial over the rows, and each
row's columns are independent draws from ``q`` — so rows are made a block at a time (columns
by Walker's alias table: one uniform per draw, no search), duplicates removed by sorting
within the block only, and nothing global is sorted. Every stream is consumed in row order by
``Generator.random`` (one double per draw), so the matrix depends on ``seed`` only, never on
the block size. Cost: the ``D ≈ 2.2 nnz`` draws and their sort per block; memory: the kept
column indices (4 bytes per entry) and a block's work arrays (``block_draws`` × ~40 bytes).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from .._atomic import atomic_path
from ..errors import InvalidArgumentError

ROW_EXPONENT = 0.9
COL_EXPONENT = 1.1
_MARGIN = 0.002  # expected distinct positions above nnz, relative (plus 8 standard deviations)


@dataclass
class PowerLawParts:
    """A power-law matrix as row blocks: ``row_counts`` (entries per row, int64) and, per block
    of rows in order, the sorted column indices of its rows (int32, row after row). Values are
    drawn by :meth:`values` in row order, a block at a time."""

    rows: int
    cols: int
    nnz: int
    row_counts: np.ndarray
    blocks: list
    value_rng: np.random.Generator

    def values(self, n: int) -> np.ndarray:
        """The next ``n`` values (float64, uniform in [0.5, 1.5)) in row order."""
        return self.value_rng.random(n) + 0.5


def _alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of ``weights``: ``(prob, alias)``; a uniform ``u`` picks
    ``i = floor(u n)`` and keeps it when ``frac(u n) < prob[i]``, else takes ``alias[i]``."""
    n = len(weights)
    scaled = weights * (n / weights.sum())
    prob = np.ones(n)
    alias = np.arange(n, dtype=np.int64)
    small = list(np.flatnonzero(scaled < 1.0))
    large = list(np.flatnonzero(scaled >= 1.0))
    scaled = scaled.tolist()
    while small and large:
        s, g = small.pop(), large[-1]
        prob[s] = scaled[s]
        alias[s] = g
        scaled[g] -= 1.0 - scaled[s]
        if scaled[g] < 1.0:
            small.append(large.pop())
    return prob, alias


class _ExpectedDistinct:
    """``E(D) = Σ_r Σ_c 1 − exp(−D p_r q_c)``: per row a function ``f(λ)`` of ``λ = D p_r``
    only, tabulated once on a log grid of λ (log f interpolated against log λ)."""

    def __init__(self, p: np.ndarray, q: np.ndarray, lo_draws: float, hi_draws: float):
        self.p, self.draws_hi = p, hi_draws
        lam_lo, lam_hi = lo_draws * float(p.min()), hi_draws * float(p.max())
        points = max(2, min(2048, int(32 * np.log10(max(lam_hi / lam_lo, 1.0 + 1e-9))) + 2))
        self.grid = np.log(np.geomspace(lam_lo, lam_hi, points))
        g = np.exp(self.grid)
        step = max(1, (1 << 22) // len(q))
        self.table = np.concatenate([np.sum(-np.expm1(-np.outer(g[i:i + step], q)), axis=1)
                                     for i in range(0, points, step)])
        self.table = np.log(np.maximum(self.table, 1e-300))

    def __call__(self, draws: float) -> float:
        return float(np.sum(np.exp(np.interp(np.log(draws * self.p), self.grid, self.table))))


def _draws_for(nnz: int, p: np.ndarray, q: np.ndarray) -> int:
    """The draws whose expected distinct positions are ``nnz`` plus the margin (bisection)."""
    target = nnz * (1 + _MARGIN) + 8 * np.sqrt(nnz) + 8
    capacity = len(p) * len(q)
    target = min(target, nnz + 0.5 * (capacity - nnz))
    lo, hi = float(nnz), 2.0 * nnz + 16
    expected = _ExpectedDistinct(p, q, lo, 16 * hi)
    while expected(hi) < target and hi < 1e4 * nnz + 1e6:
        lo, hi = hi, hi * 2
        if 2 * hi > expected.draws_hi:
            expected = _ExpectedDistinct(p, q, lo, 16 * hi)
    while hi - lo > max(1.0, 1e-5 * hi):
        mid = 0.5 * (lo + hi)
        if expected(mid) < target:
            lo = mid
        else:
            hi = mid
    return int(np.ceil(hi))


def power_law_parts(rows: int, cols: int, nnz: int, seed: int = 0, *, block_draws: int = 1 << 22) -> PowerLawParts:
    """The matrix as :class:`PowerLawParts` (the column indices in memory, values not yet drawn)."""
    rows, cols, nnz = int(rows), int(cols), int(nnz)
    if rows < 1 or cols < 1 or nnz < 0:
        raise InvalidArgumentError(f"power law: rows and cols must be >= 1 and nnz >= 0, got {rows}, {cols}, {nnz}")
    if nnz > rows * cols:
        raise InvalidArgumentError(f"power law: {nnz} distinct entries do not fit in {rows}x{cols}")
    if cols >= 1 << 31:
        raise InvalidArgumentError(f"power law: {cols} columns do not fit int32 column indices")
    streams = np.random.SeedSequence(seed).spawn(3)
    perm = np.random.default_rng(streams[0])
    p = np.empty(rows)
    p[perm.permutation(rows)] = 1.0 / np.arange(1, rows + 1) ** ROW_EXPONENT  # p[position] = weight of its rank
    q = np.empty(cols)
    q[perm.permutation(cols)] = 1.0 / np.arange(1, cols + 1) ** COL_EXPONENT
    p /= p.sum()
    q /= q.sum()
    prob, alias = _alias_table(q)
    alias32 = alias.astype(np.int32)
    draws = _draws_for(nnz, p, q) if nnz else 0
    for attempt in range(8):
        rng = np.random.default_rng(streams[1].spawn(attempt + 1)[-1])
        per_row = rng.multinomial(draws, p) if draws else np.zeros(rows, dtype=np.int64)
        counts = np.zeros(rows, dtype=np.int64)
        blocks = []
        row_lo = 0
        ends = np.cumsum(per_row)
        while row_lo < rows:
            base = int(ends[row_lo - 1]) if row_lo else 0
            row_hi = max(int(np.searchsorted(ends, base + block_draws, side="right")), row_lo + 1)
            row_hi = min(row_hi, rows)
            n = int(ends[row_hi - 1]) - base
            u = rng.random(n) * cols
            c = u.astype(np.int32)
            np.minimum(c, cols - 1, out=c)
            u -= c
            swap = u >= prob[c]
            c[swap] = alias32[c[swap]]
            del u, swap
            local = np.repeat(np.arange(row_hi - row_lo, dtype=np.int64), per_row[row_lo:row_hi])
            keys = local * cols + c
            del c
            keys.sort()
            keep = np.empty(len(keys), dtype=bool)
            if len(keys):
                keep[0] = True
                np.not_equal(keys[1:], keys[:-1], out=keep[1:])
            keys = keys[keep]
            del keep, local
            starts = np.searchsorted(keys, np.arange(row_hi - row_lo + 1, dtype=np.int64) * cols)
            block_counts = np.diff(starts)
            counts[row_lo:row_hi] = block_counts
            keys -= np.repeat(np.arange(row_hi - row_lo, dtype=np.int64) * cols, block_counts)
            blocks.append(keys.astype(np.int32))
            del keys
            row_lo = row_hi
        total = int(counts.sum())
        if total >= nnz:
            break
        draws = int(draws * 1.25) + 16
    else:
        raise InvalidArgumentError(f"power law: only {total} of {nnz} distinct entries could be drawn")
    excess = total - nnz
    if excess:
        drop = np.sort(rng.choice(total, excess, replace=False))
        starts = np.concatenate([[0], np.cumsum(counts)])
        counts -= np.bincount(np.searchsorted(starts, drop, side="right") - 1, minlength=rows)
        offset = 0
        for i, c in enumerate(blocks):
            lo, hi = np.searchsorted(drop, [offset, offset + len(c)])
            if hi > lo:
                mask = np.ones(len(c), dtype=bool)
                mask[drop[lo:hi] - offset] = False
                blocks[i] = c[mask]
            offset += len(c)
    return PowerLawParts(rows, cols, nnz, counts, blocks, np.random.default_rng(streams[2]))


def _index_dtype(rows: int, cols: int, nnz: int):
    return np.int32 if max(rows, cols, nnz) < (1 << 31) else np.int64


def power_law_csr(rows: int, cols: int, nnz: int, seed: int = 0):
    """The matrix as a scipy ``csr_matrix`` (float64), the one :func:`write_power_law` writes."""
    import scipy.sparse as sp

    parts = power_law_parts(rows, cols, nnz, seed)
    itype = _index_dtype(rows, cols, nnz)
    indptr = np.zeros(rows + 1, dtype=itype)
    np.cumsum(parts.row_counts, out=indptr[1:])
    indices = np.concatenate(parts.blocks).astype(itype, copy=False) if parts.blocks else np.zeros(0, itype)
    return sp.csr_matrix((parts.values(nnz), indices, indptr), shape=(rows, cols))


def _stream_member(zf: zipfile.ZipFile, name: str, dtype, n: int, chunks) -> None:
    """One ``name.npy`` member of length ``n``, its data written chunk by chunk."""
    dtype = np.dtype(dtype)
    with zf.open(f"{name}.npy", "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                   "fortran_order": False, "shape": (n,)})
        written = 0
        for c in chunks:
            c = np.ascontiguousarray(c, dtype=dtype)
            out.write(memoryview(c).cast("B"))
            written += len(c)
        assert written == n, (name, written, n)


def write_power_law(path, rows: int, cols: int, nnz: int, seed: int = 0) -> int:
    """Writes the matrix of :func:`power_law_csr` to ``path`` as an uncompressed scipy ``.npz``
    (``scipy.sparse.load_npz`` and ``flash.load`` read it), a row block at a time, atomically
    (a temporary name beside ``path``, renamed when complete and synced). Returns ``nnz``."""
    parts = power_law_parts(rows, cols, nnz, seed)
    itype = _index_dtype(rows, cols, nnz)
    indptr = np.zeros(rows + 1, dtype=itype)
    np.cumsum(parts.row_counts, out=indptr[1:])
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                _stream_member(zf, "indices", itype, nnz, parts.blocks)
                _stream_member(zf, "indptr", itype, rows + 1, [indptr])
                for name, a in (("format", np.array("csr")), ("shape", np.array((rows, cols)))):
                    with zf.open(f"{name}.npy", "w") as out:
                        np.lib.format.write_array(out, a, allow_pickle=False)
                _stream_member(zf, "data", np.float64, nnz, (parts.values(len(c)) for c in parts.blocks))
            f.flush()
            os.fsync(f.fileno())
    return nnz
