//! csrgemv: `y := op(A) x` with a CSR matrix A on flash and x, y in memory. Tasks are row
//! blocks of A. For `A x` each task owns its slice of y; for `Aᵀ x` each task accumulates
//! into a private vector of length `cols` (outside the cache budget) and adds it to y.

use std::sync::Mutex;

use crate::dense::Transpose;
use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashCsrMatrix;
use crate::io::{Access, AccessSpec};
use crate::runtime::Runtime;
use crate::sched::{FnTask, RunStats};
use crate::sparse::CsrRef;

use super::csr_rows::{csr_rows_dot, csr_rows_transpose_accumulate, row_blocks};
use super::with_indices;

fn check_dims(rows: usize, cols: usize, transpose: Transpose, x_len: usize, y_len: usize) -> Result<()> {
    let (in_len, out_len) = match transpose {
        Transpose::No => (cols, rows),
        Transpose::Yes => (rows, cols),
    };
    if x_len != in_len || y_len != out_len {
        return Err(FlashError::shape(format!("op(A) is {out_len}x{in_len} but x has {x_len} and y has {y_len} elements")));
    }
    Ok(())
}

/// In-memory twin: `y := op(A) x`.
pub fn csrgemv_in_memory<T: Real>(transpose: Transpose, a: CsrRef<'_, T>, x: &[T], y: &mut [T]) -> Result<()> {
    a.validate()?;
    check_dims(a.rows, a.cols, transpose, x.len(), y.len())?;
    match transpose {
        Transpose::No => csr_rows_dot(a.indptr, a.indices, a.values, x, y),
        Transpose::Yes => {
            y.fill(T::ZERO);
            csr_rows_transpose_accumulate(a.indptr, a.indices, a.values, x, y);
        }
    }
    Ok(())
}

/// `y := op(A) x` with A on flash. Shapes are checked before any IO.
pub fn csrgemv<T: Real>(runtime: &Runtime, transpose: Transpose, a: &FlashCsrMatrix<T>, x: &[T], y: &mut [T]) -> Result<RunStats> {
    check_dims(a.rows(), a.cols(), transpose, x.len(), y.len())?;
    let indptr = a.indptr().to_vec()?;
    let size = std::mem::size_of::<T>() as u64;
    let options = runtime.options();
    let share = options.memory_budget_bytes / (2 * options.max_tasks_in_flight.max(1) as u64);
    let entry = a.indices().width_bytes() + size;
    let max_nnz = (share / entry).clamp(1, (64 << 20) / entry);
    let blocks = row_blocks(&indptr, max_nnz, usize::MAX);
    let wide = a.indices().is_wide();
    let block_accesses = |r0: usize, r1: usize| -> Result<(AccessSpec, AccessSpec)> {
        let (lo, hi) = (indptr[r0], indptr[r1]);
        Ok((a.indices().access(lo, hi - lo)?, a.values().access(lo, hi - lo)?))
    };
    match transpose {
        Transpose::No => {
            let dag = runtime.dag();
            let mut rest: &mut [T] = y;
            for &(r0, r1) in &blocks {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(r1 - r0);
                rest = tail;
                let (indices, values) = block_accesses(r0, r1)?;
                let local_indptr = &indptr[r0..=r1];
                dag.add(
                    FnTask::new("csrgemv", vec![Access::read(indices), Access::read(values)], move |buffers, _| {
                        with_indices!(wide, buffers, 0, |ix| csr_rows_dot(local_indptr, ix, buffers.read::<T>(1), x, mine));
                        Ok(())
                    }),
                    &[],
                )?;
            }
            dag.run()
        }
        Transpose::Yes => {
            y.fill(T::ZERO);
            let cols = y.len();
            let total = Mutex::new(y);
            let dag = runtime.dag();
            for &(r0, r1) in &blocks {
                let (indices, values) = block_accesses(r0, r1)?;
                let local_indptr = &indptr[r0..=r1];
                let x_block = &x[r0..r1];
                let total = &total;
                dag.add(
                    FnTask::new("csrgemv-t", vec![Access::read(indices), Access::read(values)], move |buffers, _| {
                        let mut partial = vec![T::ZERO; cols];
                        with_indices!(wide, buffers, 0, |ix| csr_rows_transpose_accumulate(local_indptr, ix, buffers.read::<T>(1), x_block, &mut partial));
                        let mut out = total.lock().expect("csrgemv output lock poisoned");
                        for (o, p) in out.iter_mut().zip(&partial) {
                            *o += *p;
                        }
                        Ok(())
                    }),
                    &[],
                )?;
            }
            dag.run()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_support::{assert_close, random_vec};
    use crate::runtime::RuntimeOptions;
    use crate::kernels::test_support::random_csr;
    use crate::sparse::CsrMatrix;

    fn dense_of(a: &CsrMatrix<f64>) -> Vec<f64> {
        let mut d = vec![0.0; a.rows * a.cols];
        for r in 0..a.rows {
            for e in a.indptr[r] as usize..a.indptr[r + 1] as usize {
                d[r * a.cols + a.indices[e] as usize] += a.values[e];
            }
        }
        d
    }

    #[test]
    fn flash_csrgemv_matches_twin_and_dense_reference() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 4096, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
        for &(rows, cols) in &[(0usize, 0usize), (1, 1), (5, 0), (37, 23), (300, 41)] {
            let a = random_csr(rows as u64 + 7, rows, cols);
            let flash = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
            let dense = dense_of(&a);
            for transpose in [Transpose::No, Transpose::Yes] {
                let (xl, yl) = if transpose == Transpose::No { (cols, rows) } else { (rows, cols) };
                let x = random_vec::<f64>(3, xl);
                let mut want = vec![0.0; yl];
                for r in 0..rows {
                    for c in 0..cols {
                        match transpose {
                            Transpose::No => want[r] += dense[r * cols + c] * x[c],
                            Transpose::Yes => want[c] += dense[r * cols + c] * x[r],
                        }
                    }
                }
                let mut twin = vec![f64::NAN; yl];
                csrgemv_in_memory(transpose, a.view(), &x, &mut twin).unwrap();
                assert_close(&twin, &want, 1e-12, &format!("twin {rows}x{cols} {transpose:?}"));
                let mut got = vec![f64::NAN; yl];
                let stats = csrgemv(&rt, transpose, &flash, &x, &mut got).unwrap();
                assert_close(&got, &want, 1e-12, &format!("flash {rows}x{cols} {transpose:?}"));
                assert!(stats.cache.peak_resident_bytes <= 4096);
            }
        }
        let a = random_csr(1, 4, 3);
        let flash = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
        assert!(matches!(csrgemv(&rt, Transpose::No, &flash, &[1.0; 4], &mut [0.0; 4]), Err(FlashError::ShapeMismatch(_))));
    }
}
