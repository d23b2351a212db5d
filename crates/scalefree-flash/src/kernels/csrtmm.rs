//! csrtmm: `Z := Aᵀ X` or `Z := Aᵀ A X` (the Gram operator) with a CSR matrix A on flash and
//! row-major X, Z in memory, in one pass over A and without its transpose. Tasks are row
//! blocks of A; for the Gram product a task first forms `Y = A_block X` (rows of the block,
//! in parallel) and then, holding the lock on Z, scatters `A_blockᵀ Y` into Z in parallel
//! over column ranges of Z. This is what an eigensolver on `AᵀA` needs from a matrix that
//! stays on flash: one streaming read of A per operator application, no `csrcsc`.
//!
//! Z is split into column ranges, each behind its own lock; a task scatters into one range
//! at a time, sequentially, starting from a different range than its neighbours. No rayon
//! work runs while a lock is held: a thread waiting inside a parallel loop may pick up
//! another task, which would deadlock on a lock its own thread holds.

use std::sync::Mutex;

use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashCsrMatrix;
use crate::io::Access;
use crate::runtime::Runtime;
use crate::sched::{FnTask, RunStats};
use crate::sparse::CsrRef;

use super::csr_rows::{csr_rows_times_dense, row_blocks, OpDense, RowsOut};

/// Which product [`csrtmm`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransposedProduct {
    /// `Z := Aᵀ X`, X `rows x n`.
    Transpose,
    /// `Z := Aᵀ A X`, X `cols x n`.
    Gram,
}

fn check_dims(rows: usize, cols: usize, product: TransposedProduct, x_len: usize, n: usize, z_len: usize) -> Result<()> {
    let x_rows = match product {
        TransposedProduct::Transpose => rows,
        TransposedProduct::Gram => cols,
    };
    if x_len != x_rows * n || z_len != cols * n {
        return Err(FlashError::shape(format!(
            "A is {rows}x{cols}: {product:?} needs X of {x_rows}x{n} and Z of {cols}x{n} elements, got {x_len} and {z_len}"
        )));
    }
    Ok(())
}

/// A pointer into Z shared by the tasks of one run; column range `i` of Z is written only
/// while `locks[i]` is held.
#[derive(Clone, Copy)]
struct SharedZ<T>(*mut T);

impl<T> SharedZ<T> {
    /// Element `i` (a method, so closures capture the whole `Sync` value).
    fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

// SAFETY: writers hold the lock of the column range they write (see `ColumnLocks`).
unsafe impl<T: Send> Send for SharedZ<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedZ<T> {}

/// Column ranges of Z (`n` columns), each with its lock.
struct ColumnLocks {
    ranges: Vec<(usize, usize)>,
    locks: Vec<Mutex<()>>,
}

impl ColumnLocks {
    fn new(n: usize, parts: usize) -> ColumnLocks {
        let width = n.div_ceil(parts.max(1)).max(1);
        let ranges: Vec<(usize, usize)> = (0..n).step_by(width).map(|j0| (j0, (j0 + width).min(n))).collect();
        let locks = ranges.iter().map(|_| Mutex::new(())).collect();
        ColumnLocks { ranges, locks }
    }
}

/// `Z[:, j0..j1] += (A_blockᵀ Y)[:, j0..j1]` for the local rows of a CSR block (`Y`
/// row-major with `n` columns, Z `cols x n`), sequentially.
///
/// # Safety
/// `z` must address `cols * n` elements, and nobody else may access columns `j0..j1` of Z
/// meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn scatter_columns<T: Real>(indptr: &[u64], indices: &[u32], values: &[T], y: &[T], n: usize, cols: usize, z: SharedZ<T>, (j0, j1): (usize, usize)) {
    let rows = indptr.len().saturating_sub(1);
    let base = indptr.first().copied().unwrap_or(0);
    for r in 0..rows {
        let yr = &y[r * n + j0..r * n + j1];
        let (lo, hi) = ((indptr[r] - base) as usize, (indptr[r + 1] - base) as usize);
        for (&col, &v) in indices[lo..hi].iter().zip(&values[lo..hi]) {
            let col = col as usize;
            assert!(col < cols, "column index {col} out of range");
            let dst = z.at(col * n + j0);
            for (j, &yv) in yr.iter().enumerate() {
                // SAFETY: inside Z (checked above) and in columns this call owns (contract).
                unsafe { *dst.add(j) += v * yv };
            }
        }
    }
}

/// `Z += A_blockᵀ Y`, one column range at a time under its lock, starting at range `first`.
#[allow(clippy::too_many_arguments)]
fn scatter_transpose<T: Real>(indptr: &[u64], indices: &[u32], values: &[T], y: &[T], n: usize, cols: usize, z: SharedZ<T>, locks: &ColumnLocks, first: usize) {
    let parts = locks.ranges.len();
    for i in 0..parts {
        let p = (first + i) % parts;
        let _held = locks.locks[p].lock().expect("csrtmm column lock poisoned");
        // SAFETY: the range's lock is held; `z` addresses Z (callers' contract).
        unsafe { scatter_columns(indptr, indices, values, y, n, cols, z, locks.ranges[p]) };
    }
}

/// `Y := A_block X` for the local rows of a block (X row-major `cols x n`).
fn block_times<T: Real>(indptr: &[u64], indices: &[u32], values: &[T], x: &[T], n: usize) -> Vec<T> {
    let rows = indptr.len().saturating_sub(1);
    let mut y = vec![T::ZERO; rows * n];
    if rows > 0 && n > 0 {
        let op_x = OpDense { data: x, row_stride: n, col_stride: 1, cols: n };
        let out = RowsOut { ptr: y.as_mut_ptr(), row_stride: n, col_stride: 1, cols: n };
        // SAFETY: `out` addresses `y`, owned here, with `rows` rows of `n` elements.
        unsafe { csr_rows_times_dense(T::ONE, indptr, indices, values, op_x, T::ZERO, out) };
    }
    y
}

/// In-memory twin: `Z := Aᵀ X` or `Z := Aᵀ A X` (X and Z row-major with `n` columns).
pub fn csrtmm_in_memory<T: Real>(product: TransposedProduct, a: CsrRef<'_, T>, x: &[T], n: usize, z: &mut [T]) -> Result<()> {
    a.validate()?;
    check_dims(a.rows, a.cols, product, x.len(), n, z.len())?;
    z.fill(T::ZERO);
    if n == 0 {
        return Ok(());
    }
    let locks = ColumnLocks::new(n, 1);
    let shared = SharedZ(z.as_mut_ptr());
    match product {
        TransposedProduct::Transpose => scatter_transpose(a.indptr, a.indices, a.values, x, n, a.cols, shared, &locks, 0),
        TransposedProduct::Gram => {
            let y = block_times(a.indptr, a.indices, a.values, x, n);
            scatter_transpose(a.indptr, a.indices, a.values, &y, n, a.cols, shared, &locks, 0);
        }
    }
    Ok(())
}

/// `Z := Aᵀ X` or `Z := Aᵀ A X` with A on flash (one read of A), X and Z row-major in memory
/// with `n` columns. Shapes are checked before any IO.
pub fn csrtmm<T: Real>(runtime: &Runtime, product: TransposedProduct, a: &FlashCsrMatrix<T>, x: &[T], n: usize, z: &mut [T]) -> Result<RunStats> {
    let (rows, cols) = (a.rows(), a.cols());
    check_dims(rows, cols, product, x.len(), n, z.len())?;
    z.fill(T::ZERO);
    if rows == 0 || n == 0 {
        return Ok(RunStats::default());
    }
    let indptr = a.indptr().to_vec()?;
    let size = std::mem::size_of::<T>() as u64;
    let options = runtime.options();
    let share = options.memory_budget_bytes / (2 * options.max_tasks_in_flight.max(1) as u64);
    let max_nnz = (share / (4 + size)).clamp(1, (64 << 20) / (4 + size));
    // The block's `Y` (Gram only) stays within a share of the budget too.
    let max_rows = match product {
        TransposedProduct::Gram => ((share / (n as u64 * size).max(1)) as usize).max(1),
        TransposedProduct::Transpose => usize::MAX,
    };
    let blocks = row_blocks(&indptr, max_nnz, max_rows);
    let locks = ColumnLocks::new(n, 2 * options.compute_threads.max(1));
    let shared = SharedZ(z.as_mut_ptr());
    let locks = &locks;
    let dag = runtime.dag();
    for (b, &(r0, r1)) in blocks.iter().enumerate() {
        let (lo, hi) = (indptr[r0], indptr[r1]);
        let indices = a.indices().access(lo, hi - lo)?;
        let values = a.values().access(lo, hi - lo)?;
        let local_indptr = &indptr[r0..=r1];
        dag.add(
            FnTask::new("csrtmm", vec![Access::read(indices), Access::read(values)], move |buffers, _| {
                let (idx, val) = (buffers.read::<u32>(0), buffers.read::<T>(1));
                let y_block;
                let y: &[T] = match product {
                    TransposedProduct::Transpose => &x[r0 * n..r1 * n],
                    TransposedProduct::Gram => {
                        y_block = block_times(local_indptr, idx, val, x, n);
                        &y_block
                    }
                };
                scatter_transpose(local_indptr, idx, val, y, n, cols, shared, locks, b);
                Ok(())
            }),
            &[],
        )?;
    }
    dag.run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_support::{assert_close, random_csr, random_vec};
    use crate::runtime::RuntimeOptions;

    fn dense_of(a: &crate::sparse::CsrMatrix<f64>) -> Vec<f64> {
        let mut d = vec![0.0; a.rows * a.cols];
        for r in 0..a.rows {
            for e in a.indptr[r] as usize..a.indptr[r + 1] as usize {
                d[r * a.cols + a.indices[e] as usize] += a.values[e];
            }
        }
        d
    }

    /// `Aᵀ X` from the dense A (`rows x cols`), X `rows x n`.
    fn dense_t_times(d: &[f64], rows: usize, cols: usize, x: &[f64], n: usize) -> Vec<f64> {
        let mut z = vec![0.0; cols * n];
        for r in 0..rows {
            for c in 0..cols {
                for j in 0..n {
                    z[c * n + j] += d[r * cols + c] * x[r * n + j];
                }
            }
        }
        z
    }

    #[test]
    fn flash_csrtmm_matches_twin_and_dense_reference() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 4096, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
        for &(rows, cols) in &[(0usize, 0usize), (1, 1), (5, 0), (0, 4), (37, 23), (300, 41), (41, 300)] {
            let a = random_csr(rows as u64 + 11, rows, cols);
            let flash = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
            let d = dense_of(&a);
            for n in [1usize, 3, 16] {
                for product in [TransposedProduct::Transpose, TransposedProduct::Gram] {
                    let x_rows = if product == TransposedProduct::Gram { cols } else { rows };
                    let x = random_vec::<f64>(5 + n as u64, x_rows * n);
                    let want = match product {
                        TransposedProduct::Transpose => dense_t_times(&d, rows, cols, &x, n),
                        TransposedProduct::Gram => {
                            let mut y = vec![0.0; rows * n];
                            for r in 0..rows {
                                for c in 0..cols {
                                    for j in 0..n {
                                        y[r * n + j] += d[r * cols + c] * x[c * n + j];
                                    }
                                }
                            }
                            dense_t_times(&d, rows, cols, &y, n)
                        }
                    };
                    let what = format!("{rows}x{cols} n={n} {product:?}");
                    let mut twin = vec![f64::NAN; cols * n];
                    csrtmm_in_memory(product, a.view(), &x, n, &mut twin).unwrap();
                    assert_close(&twin, &want, 1e-12, &format!("twin {what}"));
                    let mut got = vec![f64::NAN; cols * n];
                    let stats = csrtmm(&rt, product, &flash, &x, n, &mut got).unwrap();
                    assert_close(&got, &want, 1e-12, &format!("flash {what}"));
                    assert!(stats.cache.peak_resident_bytes <= 4096, "{what}: over budget");
                }
            }
        }
        let a = random_csr(1, 4, 3);
        let flash = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
        let mut z = [0.0; 6];
        assert!(matches!(csrtmm(&rt, TransposedProduct::Gram, &flash, &[1.0; 8], 2, &mut z), Err(FlashError::ShapeMismatch(_))));
        assert!(matches!(csrtmm(&rt, TransposedProduct::Transpose, &flash, &[1.0; 6], 2, &mut z), Err(FlashError::ShapeMismatch(_))));
    }
}
