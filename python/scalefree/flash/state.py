"""The state of the out-of-core algorithms (``svds``, ``topics``) that grows with the data,
within the memory budget: dense matrices kept in memory when they fit their share of the
budget and otherwise on flash (a scratch :class:`~scalefree.flash.core.Matrix`, read and
written a row block at a time straight between flash and numpy buffers), and row blocks of a
CSR matrix (on flash or in memory).

    v = DenseState(rows, cols, np.float64, rt, on_flash=True, order="F")
    for lo, hi in v.row_ranges(block_bytes):
        blk = v.read(lo, hi, 0, j)       # rows lo:hi, columns 0:j
        v.write(lo, 0, blk @ y)          # in place

In memory ``read`` returns a view and ``write`` assigns into it, so the same code runs
either way; only a block of rows is resident at a time on flash.
"""

from __future__ import annotations

import numpy as np

from . import core as flash


class DenseState:
    """A ``rows x cols`` dense matrix of ``dtype``: a numpy array (``on_flash=False``) or a
    scratch flash matrix in ``order`` (``"C"``: a row block is one read; ``"F"``: a column
    block is one write, a row block one read per column)."""

    def __init__(self, rows: int, cols: int, dtype, rt, on_flash: bool, order: str = "C"):
        self.shape, self.dtype, self.on_flash, self.order = (int(rows), int(cols)), np.dtype(dtype), bool(on_flash), order
        if self.on_flash:
            self.m = flash.Matrix.zeros(self.shape, self.dtype, order=order, runtime=rt)
            self.a = None
        else:
            self.m = None
            self.a = np.zeros(self.shape, dtype=self.dtype, order=order)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def row_ranges(self, block_bytes: int, cols: int | None = None):
        """``(lo, hi)`` row ranges of at most ``block_bytes`` of ``cols`` columns each (all
        rows at once in memory)."""
        rows = self.shape[0]
        if not self.on_flash:
            return [(0, rows)] if rows else []
        width = max(1, self.shape[1] if cols is None else cols) * self.dtype.itemsize
        step = max(1, int(block_bytes) // width)
        return [(lo, min(rows, lo + step)) for lo in range(0, rows, step)]

    def read(self, lo: int, hi: int, c0: int = 0, c1: int | None = None) -> np.ndarray:
        """Rows ``lo:hi``, columns ``c0:c1`` (a view in memory, a new array from flash)."""
        c1 = self.shape[1] if c1 is None else c1
        if not self.on_flash:
            return self.a[lo:hi, c0:c1]
        return self.m.read_block(lo, c0, hi - lo, c1 - c0)

    def write(self, lo: int, c0: int, block) -> None:
        """``self[lo:lo + len(block), c0:c0 + block.shape[1]] = block``."""
        block = np.asarray(block)
        if not self.on_flash:
            self.a[lo:lo + block.shape[0], c0:c0 + block.shape[1]] = block
        elif block.size:
            self.m.write_block(lo, c0, block)

    def to_numpy(self) -> np.ndarray:
        return self.a if not self.on_flash else self.m.to_numpy()


class CsrRows:
    """Row blocks of a CSR matrix (a :class:`flash.Csr`, read with its row reader, or a scipy
    CSR matrix in memory) of at most ``block_bytes`` of entries each (one row may exceed it),
    as scipy CSR blocks of ``dtype`` (float64 by default; None: the matrix's). Counts
    ``passes`` and ``bytes_read``."""

    def __init__(self, a, block_bytes: int, dtype=np.float64):
        self.a, self.shape = a, tuple(a.shape)
        self.on_flash = isinstance(a, flash.Csr)
        self.dtype = np.dtype(a.dtype if dtype is None else dtype)
        self.bytes_read = 0
        self.passes = 0
        if self.on_flash:
            self.indptr = np.empty(self.shape[0] + 1, dtype=np.uint64)
            a._m._read_indptr(0, self.indptr)
            self.bytes_read += self.indptr.nbytes
            entry = np.dtype(a.dtype).itemsize + a.index_bytes
        else:
            self.indptr = np.asarray(a.indptr, dtype=np.uint64)
            entry = a.dtype.itemsize + a.indices.dtype.itemsize
        per = max(1, int(block_bytes) // entry)
        # Block boundaries: the largest row range whose entries fit ``per`` (at least one row).
        bounds = [0]
        rows = self.shape[0]
        while bounds[-1] < rows:
            lo = bounds[-1]
            hi = int(np.searchsorted(self.indptr, self.indptr[lo] + np.uint64(per), side="right")) - 1
            bounds.append(min(rows, max(hi, lo + 1)))
        self.bounds = bounds

    def __iter__(self):
        import scipy.sparse as sp

        self.passes += 1
        cols = self.shape[1]
        for lo, hi in zip(self.bounds[:-1], self.bounds[1:]):
            if self.on_flash:
                ip = np.empty(hi - lo + 1, dtype=np.uint64)
                n = int(self.indptr[hi] - self.indptr[lo])
                wide = self.a.index_bytes == 8
                ix = np.empty(n, dtype=np.uint64 if wide else np.uint32)
                dv = np.empty(n, dtype=self.a.dtype)
                self.a._m._read_rows(lo, ip, ix, dv)
                self.bytes_read += ip.nbytes + ix.nbytes + dv.nbytes
                block = sp.csr_matrix((dv.astype(self.dtype, copy=False), ix.view(np.int64 if wide else np.int32),
                                       (ip - ip[0]).astype(np.int64)), shape=(hi - lo, cols))
            else:
                block = self.a[lo:hi]
                if block.dtype != self.dtype:
                    block = block.astype(self.dtype)
            yield lo, hi, block
