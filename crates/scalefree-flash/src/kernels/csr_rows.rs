//! Row kernels shared by the CSR kernels and their in-memory twins, and the partition of a
//! CSR matrix into row blocks of bounded size.

use rayon::prelude::*;

use crate::element::Real;
use crate::sparse::ColIndex;

/// Rows `[start, end)` blocks with at most `max_nnz` entries and `max_rows` rows each (a row
/// with more entries than `max_nnz` gets a block of its own).
pub fn row_blocks(indptr: &[u64], max_nnz: u64, max_rows: usize) -> Vec<(usize, usize)> {
    let rows = indptr.len().saturating_sub(1);
    let mut blocks = Vec::new();
    let mut start = 0;
    while start < rows {
        let mut end = start + 1;
        while end < rows && end - start < max_rows.max(1) && indptr[end + 1] - indptr[start] <= max_nnz {
            end += 1;
        }
        blocks.push((start, end));
        start = end;
    }
    blocks
}

/// A dense operand seen as `op(B)`: element `(p, j)` at `data[p * row_stride + j * col_stride]`.
#[derive(Clone, Copy)]
pub(crate) struct OpDense<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
    pub(crate) cols: usize,
}

/// Where output rows go: element `(r, j)` at `ptr + r * row_stride + j * col_stride`.
/// Different tasks and threads write disjoint rows (or disjoint column ranges of a row).
#[derive(Clone, Copy)]
pub(crate) struct RowsOut<T> {
    pub(crate) ptr: *mut T,
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
    pub(crate) cols: usize,
}

impl<T> RowsOut<T> {
    /// First element of row `r` (a method, so closures capture the whole `Sync` value).
    fn row(&self, r: usize) -> *mut T {
        self.ptr.wrapping_add(r * self.row_stride)
    }
}

// SAFETY: writers of a `RowsOut` touch disjoint elements (see the type's doc).
unsafe impl<T: Send> Send for RowsOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for RowsOut<T> {}

/// `acc += sum_e values[e] * op(B)[indices[e], ..]` for a row-major op(B).
#[inline(always)]
fn accumulate_contiguous<T: Real, I: ColIndex>(acc: &mut [T], indices: &[I], values: &[T], data: &[T], row_stride: usize) {
    let n = acc.len();
    for (&col, &v) in indices.iter().zip(values) {
        let start = col.col() * row_stride;
        for (a, &x) in acc.iter_mut().zip(&data[start..start + n]) {
            *a += v * x;
        }
    }
}

/// [`accumulate_contiguous`] compiled for AVX2 (8 float32 / 4 float64 lanes).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn accumulate_contiguous_avx2<T: Real, I: ColIndex>(acc: &mut [T], indices: &[I], values: &[T], data: &[T], row_stride: usize) {
    accumulate_contiguous(acc, indices, values, data, row_stride)
}

fn accumulate<T: Real, I: ColIndex>(acc: &mut [T], indices: &[I], values: &[T], b: &OpDense<'_, T>) {
    if b.col_stride == 1 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked above).
            unsafe { accumulate_contiguous_avx2(acc, indices, values, b.data, b.row_stride) };
            return;
        }
        accumulate_contiguous(acc, indices, values, b.data, b.row_stride);
    } else {
        for (&col, &v) in indices.iter().zip(values) {
            let start = col.col() * b.row_stride;
            for (j, a) in acc.iter_mut().enumerate() {
                *a += v * b.data[start + j * b.col_stride];
            }
        }
    }
}

/// Local rows `0..indptr.len()-1` of a CSR block (entries `indptr[r] - base ..` of
/// `indices`/`values`) times `op(B)`: `out(r) := alpha * A(r) op(B) + beta * out(r)`,
/// parallel over rows on the current rayon pool. `beta == 0` does not read `out`. (Cutting a
/// wide `op(B)` into column tiles that stay cached was measured slower on a power-law A
/// times a 100K x 256 B: the hot B rows stay cached anyway; see the git history of docs/benchmarks.md.)
///
/// # Safety
/// `out` must address `indptr.len() - 1` rows of `b.cols` valid elements that nobody else
/// accesses meanwhile.
pub(crate) unsafe fn csr_rows_times_dense<T: Real, I: ColIndex>(alpha: T, indptr: &[u64], indices: &[I], values: &[T], b: OpDense<'_, T>, beta: T, out: RowsOut<T>) {
    let rows = indptr.len().saturating_sub(1);
    let base = indptr.first().copied().unwrap_or(0);
    let n = b.cols;
    debug_assert_eq!(n, out.cols, "op(B) and the output have different widths");
    if rows == 0 || n == 0 {
        return;
    }
    (0..rows).into_par_iter().with_min_len(8).for_each_init(
        || vec![T::ZERO; n],
        |acc, r| {
            acc.fill(T::ZERO);
            let (lo, hi) = ((indptr[r] - base) as usize, (indptr[r + 1] - base) as usize);
            accumulate(acc, &indices[lo..hi], &values[lo..hi], &b);
            // SAFETY: row `r` of `out` belongs to this call alone (function contract).
            unsafe {
                let row = out.row(r);
                if out.col_stride == 1 {
                    let dst = std::slice::from_raw_parts_mut(row, n);
                    store_row(dst.iter_mut(), acc, alpha, beta);
                } else {
                    for (j, &a) in acc.iter().enumerate() {
                        let p = row.add(j * out.col_stride);
                        *p = if beta == T::ZERO { alpha * a } else { alpha * a + beta * *p };
                    }
                }
            }
        },
    );
}

fn store_row<'a, T: Real>(dst: impl Iterator<Item = &'a mut T>, acc: &[T], alpha: T, beta: T) {
    if beta == T::ZERO {
        dst.zip(acc).for_each(|(d, &a)| *d = alpha * a);
    } else {
        dst.zip(acc).for_each(|(d, &a)| *d = alpha * a + beta * *d);
    }
}

/// `y(r) := A(r) · x` for the local rows of a CSR block, parallel over rows.
pub(crate) fn csr_rows_dot<T: Real, I: ColIndex>(indptr: &[u64], indices: &[I], values: &[T], x: &[T], y: &mut [T]) {
    let base = indptr.first().copied().unwrap_or(0);
    y.par_iter_mut().with_min_len(64).enumerate().for_each(|(r, out)| {
        let (lo, hi) = ((indptr[r] - base) as usize, (indptr[r + 1] - base) as usize);
        let mut sum = T::ZERO;
        for (&col, &v) in indices[lo..hi].iter().zip(&values[lo..hi]) {
            sum += v * x[col.col()];
        }
        *out = sum;
    });
}

/// `y += A_blockᵀ · x_block` for the local rows of a CSR block (sequential; callers
/// parallelise over blocks).
pub(crate) fn csr_rows_transpose_accumulate<T: Real, I: ColIndex>(indptr: &[u64], indices: &[I], values: &[T], x: &[T], y: &mut [T]) {
    let base = indptr.first().copied().unwrap_or(0);
    for (r, &xr) in x.iter().enumerate().take(indptr.len().saturating_sub(1)) {
        let (lo, hi) = ((indptr[r] - base) as usize, (indptr[r + 1] - base) as usize);
        for (&col, &v) in indices[lo..hi].iter().zip(&values[lo..hi]) {
            y[col.col()] += v * xr;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_respect_limits() {
        let indptr = [0u64, 5, 5, 6, 20, 21, 22];
        assert_eq!(row_blocks(&indptr, 6, 100), vec![(0, 3), (3, 4), (4, 6)]);
        assert_eq!(row_blocks(&indptr, 1000, 2), vec![(0, 2), (2, 4), (4, 6)]);
        assert!(row_blocks(&[0], 10, 10).is_empty());
    }
}
