//! csrtmm: `Z := Aᵀ X` or `Z := Aᵀ A X` (the Gram operator) with a CSR matrix A on flash and
//! row-major X, Z in memory, in one pass over A and without its transpose. Tasks are row
//! blocks of A; for the Gram product a task first forms `Y = A_block X` (rows of the block,
//! in parallel) and then scatters `A_blockᵀ Y` (see below). This is what an eigensolver on `AᵀA` needs from a matrix that
//! stays on flash: one streaming read of A per operator application, no `csrcsc`.
//!
//! The flash kernel scatters into one `cols x n` accumulator per compute thread (allocated
//! on a thread's first scatter, summed into Z after the pass), so tasks on different threads
//! never wait for each other; the extra memory is at most `compute_threads` times Z, like Z
//! outside the cache's budget. A thread's accumulator sits behind a lock that only that
//! thread takes; no rayon work runs while it is held (a thread waiting inside a parallel
//! loop may pick up another task, which would then deadlock on it). The in-memory twin
//! scatters sequentially into Z.

use std::sync::Mutex;

use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashCsrMatrix;
use crate::io::Access;
use crate::runtime::Runtime;
use crate::sched::{FnTask, RunStats};
use crate::sparse::{ColIndex, CsrRef};

use super::csr_rows::{csr_rows_times_dense, row_blocks, OpDense, RowsOut};
use super::with_indices;

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

/// `Y := A_block X` for the local rows of a block (X row-major `cols x n`).
fn block_times<T: Real, I: ColIndex>(indptr: &[u64], indices: &[I], values: &[T], x: &[T], n: usize) -> Vec<T> {
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
    match product {
        TransposedProduct::Transpose => scatter_rows(a.indptr, a.indices, a.values, x, n, z),
        TransposedProduct::Gram => {
            let y = block_times(a.indptr, a.indices, a.values, x, n);
            scatter_rows(a.indptr, a.indices, a.values, &y, n, z);
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
    let entry = a.indices().width_bytes() + size;
    let max_nnz = (share / entry).clamp(1, (64 << 20) / entry);
    // The block's `Y` (Gram only) stays within a share of the budget too.
    let max_rows = match product {
        TransposedProduct::Gram => ((share / (n as u64 * size).max(1)) as usize).max(1),
        TransposedProduct::Transpose => usize::MAX,
    };
    let blocks = row_blocks(&indptr, max_nnz, max_rows);
    let threads = options.compute_threads.max(1);
    let accumulators: Vec<Mutex<Vec<T>>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
    let accumulators = &accumulators;
    let wide = a.indices().is_wide();
    let dag = runtime.dag();
    for &(r0, r1) in &blocks {
        let (lo, hi) = (indptr[r0], indptr[r1]);
        let indices = a.indices().access(lo, hi - lo)?;
        let values = a.values().access(lo, hi - lo)?;
        let local_indptr = &indptr[r0..=r1];
        dag.add(
            FnTask::new("csrtmm", vec![Access::read(indices), Access::read(values)], move |buffers, _| {
                let val = buffers.read::<T>(1);
                let block = TmmBlock { product, indptr: local_indptr, x, rows: r0..r1, n, cols, accumulators };
                with_indices!(wide, buffers, 0, |idx| block.run(idx, val));
                Ok(())
            }),
            &[],
        )?;
    }
    let stats = dag.run()?;
    let partial: Vec<Vec<T>> = accumulators.iter().map(|m| std::mem::take(&mut *m.lock().expect("csrtmm accumulator poisoned"))).filter(|v| !v.is_empty()).collect();
    let chunk = (64 * n).max(1);
    runtime.install(|| {
        use rayon::prelude::*;
        z.par_chunks_mut(chunk).enumerate().for_each(|(i, dst)| {
            for acc in &partial {
                let len = dst.len();
                for (d, &s) in dst.iter_mut().zip(&acc[i * chunk..i * chunk + len]) {
                    *d += s;
                }
            }
        })
    });
    Ok(stats)
}

/// One row block's share of [`csrtmm`]: forms `Y` (Gram only) and scatters `A_blockᵀ Y` into
/// the calling thread's accumulator.
struct TmmBlock<'a, T> {
    product: TransposedProduct,
    indptr: &'a [u64],
    x: &'a [T],
    rows: std::ops::Range<usize>,
    n: usize,
    cols: usize,
    accumulators: &'a [Mutex<Vec<T>>],
}

impl<T: Real> TmmBlock<'_, T> {
    fn run<I: ColIndex>(&self, idx: &[I], val: &[T]) {
        let n = self.n;
        let y_block;
        let y: &[T] = match self.product {
            TransposedProduct::Transpose => &self.x[self.rows.start * n..self.rows.end * n],
            TransposedProduct::Gram => {
                y_block = block_times(self.indptr, idx, val, self.x, n);
                &y_block
            }
        };
        // Tasks run on the compute pool; a thread outside it (none today) shares slot 0.
        let slot = rayon::current_thread_index().unwrap_or(0) % self.accumulators.len();
        let mut acc = self.accumulators[slot].lock().expect("csrtmm accumulator poisoned");
        if acc.is_empty() {
            acc.resize(self.cols * n, T::ZERO);
        }
        scatter_rows(self.indptr, idx, val, y, n, &mut acc);
    }
}

/// `z += A_blockᵀ Y` for the local rows of a CSR block (`Y` row-major with `n` columns, `z`
/// `cols x n`), sequentially; AVX2 when the CPU has it.
fn scatter_rows<T: Real, I: ColIndex>(indptr: &[u64], indices: &[I], values: &[T], y: &[T], n: usize, z: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        unsafe { scatter_rows_avx2(indptr, indices, values, y, n, z) };
        return;
    }
    scatter_rows_generic(indptr, indices, values, y, n, z)
}

/// [`scatter_rows_generic`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scatter_rows_avx2<T: Real, I: ColIndex>(indptr: &[u64], indices: &[I], values: &[T], y: &[T], n: usize, z: &mut [T]) {
    scatter_rows_generic(indptr, indices, values, y, n, z)
}

#[inline(always)]
fn scatter_rows_generic<T: Real, I: ColIndex>(indptr: &[u64], indices: &[I], values: &[T], y: &[T], n: usize, z: &mut [T]) {
    let base = indptr.first().copied().unwrap_or(0);
    for r in 0..indptr.len().saturating_sub(1) {
        let yr = &y[r * n..(r + 1) * n];
        let (lo, hi) = ((indptr[r] - base) as usize, (indptr[r + 1] - base) as usize);
        for (&col, &v) in indices[lo..hi].iter().zip(&values[lo..hi]) {
            // Out-of-range columns panic here (the task fails with the message).
            let dst = &mut z[col.col() * n..(col.col() + 1) * n];
            for (d, &yv) in dst.iter_mut().zip(yr) {
                *d += v * yv;
            }
        }
    }
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
