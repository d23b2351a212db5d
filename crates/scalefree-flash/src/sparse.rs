//! In-memory CSR matrices (the twins of [`crate::FlashCsrMatrix`]).

use crate::element::Element;
use crate::error::{FlashError, Result};

/// A column index type: `u32` (the default: half the bytes) or `u64` (matrices of more than
/// 2^32 columns).
pub trait ColIndex: Element + Ord {
    /// Whether this is the 64-bit type.
    const WIDE: bool;
    /// The column number.
    fn col(self) -> usize;
}

macro_rules! col_index {
    ($($t:ty => $wide:expr),*) => {$(
        impl ColIndex for $t {
            const WIDE: bool = $wide;
            #[inline(always)]
            fn col(self) -> usize {
                self as usize
            }
        }
    )*};
}
col_index!(u32 => false, u64 => true);

/// Whether a matrix of `cols` columns needs 64-bit column indices (more than 2^32 columns).
pub fn needs_wide_indices(cols: usize) -> bool {
    cols as u64 > u32::MAX as u64 + 1
}

/// A borrowed CSR matrix: row `r` holds entries `indptr[r] .. indptr[r + 1]` of `indices`
/// (column numbers, `u32` unless `I = u64`) and `values`.
#[derive(Clone, Copy, Debug)]
pub struct CsrRef<'a, T, I = u32> {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row starts, `rows + 1` entries, non-decreasing, from 0 to `nnz`.
    pub indptr: &'a [u64],
    /// Column of each stored entry.
    pub indices: &'a [I],
    /// Value of each stored entry.
    pub values: &'a [T],
}

/// An owned CSR matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct CsrMatrix<T, I = u32> {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row starts (`rows + 1` entries).
    pub indptr: Vec<u64>,
    /// Column of each entry.
    pub indices: Vec<I>,
    /// Value of each entry.
    pub values: Vec<T>,
}

impl<'a, T: Element, I: ColIndex> CsrRef<'a, T, I> {
    /// Checks the structure: lengths, monotone `indptr` from 0 to nnz, columns in range.
    pub fn new(rows: usize, cols: usize, indptr: &'a [u64], indices: &'a [I], values: &'a [T]) -> Result<Self> {
        let csr = CsrRef { rows, cols, indptr, indices, values };
        csr.validate()?;
        Ok(csr)
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.values.len()
    }

    /// Checks the structure (see [`CsrRef::new`]).
    pub fn validate(&self) -> Result<()> {
        if !I::WIDE && needs_wide_indices(self.cols) {
            return Err(FlashError::invalid(format!("{} columns do not fit 32-bit column indices", self.cols)));
        }
        if self.indptr.len() != self.rows + 1 {
            return Err(FlashError::shape(format!("indptr has {} entries for {} rows (needs rows + 1)", self.indptr.len(), self.rows)));
        }
        if self.indices.len() != self.values.len() {
            return Err(FlashError::shape(format!("{} column indices but {} values", self.indices.len(), self.values.len())));
        }
        if self.indptr[0] != 0 || self.indptr[self.rows] != self.values.len() as u64 {
            return Err(FlashError::invalid(format!("indptr must run from 0 to nnz = {}", self.values.len())));
        }
        if let Some(r) = self.indptr.windows(2).position(|w| w[0] > w[1]) {
            return Err(FlashError::invalid(format!("indptr decreases at row {r}")));
        }
        if let Some(at) = self.indices.iter().position(|&c| c.col() >= self.cols) {
            return Err(FlashError::invalid(format!("entry {at} has column {} but the matrix has {} columns", self.indices[at].col(), self.cols)));
        }
        Ok(())
    }

    /// Copies into an owned matrix.
    pub fn to_owned(&self) -> CsrMatrix<T, I> {
        CsrMatrix { rows: self.rows, cols: self.cols, indptr: self.indptr.to_vec(), indices: self.indices.to_vec(), values: self.values.to_vec() }
    }
}

impl<T: Element, I: ColIndex> CsrMatrix<T, I> {
    /// A borrowed view.
    pub fn view(&self) -> CsrRef<'_, T, I> {
        CsrRef { rows: self.rows, cols: self.cols, indptr: &self.indptr, indices: &self.indices, values: &self.values }
    }
}

impl<T: Element> CsrMatrix<T> {

    /// Builds from `(row, col, value)` triplets (kept in the given order within each row).
    pub fn from_triplets(rows: usize, cols: usize, triplets: &[(usize, usize, T)]) -> Result<Self> {
        let mut counts = vec![0u64; rows + 1];
        for &(r, c, _) in triplets {
            if r >= rows || c >= cols {
                return Err(FlashError::invalid(format!("entry ({r}, {c}) outside a {rows}x{cols} matrix")));
            }
            counts[r + 1] += 1;
        }
        for r in 0..rows {
            counts[r + 1] += counts[r];
        }
        let mut fill = counts.clone();
        let mut indices = vec![0u32; triplets.len()];
        let mut values = vec![T::default(); triplets.len()];
        for &(r, c, v) in triplets {
            let at = fill[r] as usize;
            indices[at] = c as u32;
            values[at] = v;
            fill[r] += 1;
        }
        Ok(CsrMatrix { rows, cols, indptr: counts, indices, values })
    }
}
