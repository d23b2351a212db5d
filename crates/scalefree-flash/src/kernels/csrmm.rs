//! csrmm: `C := alpha A op(B) + beta C` with a CSR matrix A on flash and dense B and C on
//! flash or in memory. Tasks are (row block of A) x (column block of op(B)); a flash B is cut
//! into column blocks that fit the budget and shared by all row blocks through the program
//! cache; rows are computed in parallel inside a task.

use crate::dense::{DenseMut, DenseRef, DenseShape, Transpose};
use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::{FlashCsrMatrix, FlashMatrix};
use crate::io::{Access, AccessSpec};
use crate::runtime::Runtime;
use crate::sched::{RunStats, Task, TaskBuffers, TaskContext};
use crate::sparse::CsrRef;

use super::csr_rows::{csr_rows_times_dense, row_blocks, OpDense, RowsOut};
use super::tiling::tile_ranges;
use super::with_indices;

/// A dense input: in memory or on flash.
pub enum DenseInput<'a, T> {
    /// In memory.
    Memory(DenseRef<'a, T>),
    /// On flash.
    Flash(&'a FlashMatrix<T>),
}

/// A dense output: in memory or on flash.
pub enum DenseOutput<'a, T> {
    /// In memory.
    Memory(DenseMut<'a, T>),
    /// On flash.
    Flash(&'a FlashMatrix<T>),
}

/// `op(B)` strides of a stored matrix shape: element `(p, j)` of `op(B)`.
fn op_strides(shape: &DenseShape, transpose: Transpose) -> (usize, usize) {
    let (rs, cs) = shape.strides();
    match transpose {
        Transpose::No => (rs as usize, cs as usize),
        Transpose::Yes => (cs as usize, rs as usize),
    }
}

/// In-memory twin: `C := alpha A op(B) + beta C`, parallel over rows on the current rayon
/// pool. `beta == 0` does not read C.
pub fn csrmm_in_memory<T: Real>(alpha: T, a: CsrRef<'_, T>, trans_b: Transpose, b: DenseRef<'_, T>, beta: T, mut c: DenseMut<'_, T>) -> Result<()> {
    a.validate()?;
    check_dims(a.rows, a.cols, &b.shape(), trans_b, &c.shape())?;
    let (brs, bcs) = op_strides(&b.shape(), trans_b);
    let (crs, ccs) = c.shape().strides();
    let op_b = OpDense { data: b.data(), row_stride: brs, col_stride: bcs, cols: c.shape().cols };
    let out = RowsOut { ptr: c.data().as_mut_ptr(), row_stride: crs as usize, col_stride: ccs as usize, cols: c.shape().cols };
    if a.rows == 0 || c.shape().cols == 0 {
        return Ok(());
    }
    // SAFETY: `out` addresses C's rows, which `c` borrows mutably for this call.
    unsafe { csr_rows_times_dense(alpha, a.indptr, a.indices, a.values, op_b, beta, out) };
    Ok(())
}

fn check_dims(m: usize, k: usize, b: &DenseShape, trans_b: Transpose, c: &DenseShape) -> Result<usize> {
    let (bk, n) = b.op_dims(trans_b);
    if bk != k {
        return Err(FlashError::shape(format!("A is {m}x{k} but op(B) is {bk}x{n}")));
    }
    if (c.rows, c.cols) != (m, n) {
        return Err(FlashError::shape(format!("A op(B) is {m}x{n} but C is {}x{}", c.rows, c.cols)));
    }
    Ok(n)
}

enum BSource<'a, T> {
    Memory(OpDense<'a, T>),
    Flash { spec: AccessSpec, row_stride: usize, col_stride: usize },
}

enum CTarget<T> {
    Memory(RowsOut<T>),
    Flash { spec: AccessSpec, row_stride: usize, col_stride: usize, overwrite: bool },
}

struct CsrmmTask<'a, T> {
    alpha: T,
    beta: T,
    indptr: &'a [u64],
    a_indices: AccessSpec,
    wide: bool,
    a_values: AccessSpec,
    b: BSource<'a, T>,
    c: CTarget<T>,
    cols: usize,
}

impl<'s, T: Real> Task<'s> for CsrmmTask<'_, T> {
    fn accesses(&self) -> Vec<Access> {
        let mut accesses = vec![Access::read(self.a_indices.clone()), Access::read(self.a_values.clone())];
        if let BSource::Flash { spec, .. } = &self.b {
            accesses.push(Access::read(spec.clone()));
        }
        if let CTarget::Flash { spec, overwrite, .. } = &self.c {
            accesses.push(if *overwrite { Access::write(spec.clone()) } else { Access::read_write(spec.clone()) });
        }
        accesses
    }

    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, _context: &TaskContext<'s>) -> Result<()> {
        let values = buffers.read::<T>(1);
        let op_b = match &self.b {
            BSource::Memory(op) => *op,
            BSource::Flash { row_stride, col_stride, .. } => OpDense { data: buffers.read::<T>(2), row_stride: *row_stride, col_stride: *col_stride, cols: self.cols },
        };
        let out = match &self.c {
            CTarget::Memory(out) => *out,
            CTarget::Flash { row_stride, col_stride, .. } => {
                let index = buffers.len() - 1;
                let data = buffers.take_write::<T>(index);
                RowsOut { ptr: data.as_mut_ptr(), row_stride: *row_stride, col_stride: *col_stride, cols: self.cols }
            }
        };
        // SAFETY: `out` addresses this task's own C block: a cache buffer it holds alone, or
        // rows/columns of the caller's C that no other task writes.
        unsafe { with_indices!(self.wide, buffers, 0, |indices| csr_rows_times_dense(self.alpha, self.indptr, indices, values, op_b, self.beta, out)) };
        Ok(())
    }

    fn name(&self) -> String {
        "csrmm".into()
    }
}

/// `C := alpha A op(B) + beta C` with A on flash; B and C in memory or on flash. Shapes are
/// checked before any IO. Fastest when `op(B)` and C are row-major in memory/storage.
pub fn csrmm<T: Real>(runtime: &Runtime, alpha: T, a: &FlashCsrMatrix<T>, trans_b: Transpose, b: DenseInput<'_, T>, beta: T, c: DenseOutput<'_, T>) -> Result<RunStats> {
    let (m, k) = (a.rows(), a.cols());
    let b_shape = match &b {
        DenseInput::Memory(view) => view.shape(),
        DenseInput::Flash(matrix) => matrix.shape(),
    };
    let c_shape = match &c {
        DenseOutput::Memory(view) => view.shape(),
        DenseOutput::Flash(matrix) => matrix.shape(),
    };
    let n = check_dims(m, k, &b_shape, trans_b, &c_shape)?;
    if m == 0 || n == 0 {
        return Ok(RunStats::default());
    }
    let size = std::mem::size_of::<T>() as u64;
    let budget = runtime.options().memory_budget_bytes;
    let share = budget / 6;
    let col_tile = match &b {
        DenseInput::Flash(_) => {
            let per_column = (k as u64 * size).max(1);
            if per_column > share {
                return Err(FlashError::OutOfBudget { what: format!("one column of op(B) ({k} elements)"), needed_bytes: per_column * 6, budget_bytes: budget });
            }
            ((share / per_column) as usize).clamp(1, n)
        }
        DenseInput::Memory(_) => n,
    };
    let col_tiles = tile_ranges(n, super::tiling::balanced_tile(n, col_tile));
    let indptr = a.indptr().to_vec()?;
    let max_nnz = (share / (a.indices().width_bytes() + size)).max(1);
    let max_rows = match &c {
        DenseOutput::Flash(_) => ((share / (col_tile as u64 * size).max(1)) as usize).max(1),
        DenseOutput::Memory(_) => usize::MAX,
    };
    let blocks = row_blocks(&indptr, max_nnz, max_rows);
    let (mut c_memory, c_flash) = match c {
        DenseOutput::Memory(view) => (Some(view), None),
        DenseOutput::Flash(matrix) => {
            if !matrix.data().file().is_writable() {
                return Err(FlashError::invalid(format!("C is in {}, which is read-only", matrix.data().file().path().display())));
            }
            (None, Some(matrix))
        }
    };
    let dag = runtime.dag();
    for &(j0, j1) in &col_tiles {
        let b_source = match &b {
            DenseInput::Memory(view) => {
                let (rs, cs) = op_strides(&view.shape(), trans_b);
                BSource::Memory(OpDense { data: &view.data()[j0 * cs..], row_stride: rs, col_stride: cs, cols: j1 - j0 })
            }
            DenseInput::Flash(matrix) => {
                let (spec, block_shape) = match trans_b {
                    Transpose::No => (matrix.block_access(0, j0, k, j1 - j0)?, DenseShape::packed(k, j1 - j0, matrix.layout())),
                    Transpose::Yes => (matrix.block_access(j0, 0, j1 - j0, k)?, DenseShape::packed(j1 - j0, k, matrix.layout())),
                };
                let (rs, cs) = op_strides(&block_shape, trans_b);
                BSource::Flash { spec, row_stride: rs, col_stride: cs }
            }
        };
        for &(r0, r1) in &blocks {
            let (lo, hi) = (indptr[r0], indptr[r1]);
            let c_target = match (&mut c_memory, c_flash) {
                (_, Some(matrix)) => {
                    let spec = matrix.block_access(r0, j0, r1 - r0, j1 - j0)?;
                    let (rs, cs) = DenseShape::packed(r1 - r0, j1 - j0, matrix.layout()).strides();
                    CTarget::Flash { spec, row_stride: rs as usize, col_stride: cs as usize, overwrite: beta == T::ZERO }
                }
                (Some(view), None) => {
                    let (rs, cs) = view.shape().strides();
                    let (rs, cs) = (rs as usize, cs as usize);
                    // SAFETY: row r0 < m and column j0 < n, so the offset is inside C's storage.
                    let ptr = unsafe { view.data().as_mut_ptr().add(r0 * rs + j0 * cs) };
                    CTarget::Memory(RowsOut { ptr, row_stride: rs, col_stride: cs, cols: j1 - j0 })
                }
                (None, None) => unreachable!("C is in memory or on flash"),
            };
            let task = CsrmmTask {
                alpha,
                beta,
                indptr: &indptr[r0..=r1],
                a_indices: a.indices().access(lo, hi - lo)?,
                wide: a.indices().is_wide(),
                a_values: a.values().access(lo, hi - lo)?,
                b: match &b_source {
                    BSource::Memory(op) => BSource::Memory(*op),
                    BSource::Flash { spec, row_stride, col_stride } => BSource::Flash { spec: spec.clone(), row_stride: *row_stride, col_stride: *col_stride },
                },
                c: c_target,
                cols: j1 - j0,
            };
            dag.add(task, &[])?;
        }
    }
    dag.run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::Layout;
    use crate::kernels::test_support::{assert_close, random_csr, random_vec};
    use crate::runtime::RuntimeOptions;

    /// Naive `C := alpha A op(B) + beta C` on explicit indices.
    fn reference(alpha: f64, a: &crate::sparse::CsrMatrix<f64>, trans_b: Transpose, b: &DenseRef<'_, f64>, beta: f64, c: &mut DenseMut<'_, f64>) {
        let n = c.shape().cols;
        for r in 0..a.rows {
            for j in 0..n {
                let mut sum = 0.0;
                for e in a.indptr[r] as usize..a.indptr[r + 1] as usize {
                    let p = a.indices[e] as usize;
                    sum += a.values[e] * if trans_b == Transpose::No { b.get(p, j) } else { b.get(j, p) };
                }
                let old = if beta == 0.0 { 0.0 } else { beta * c.get(r, j) };
                c.set(r, j, alpha * sum + old);
            }
        }
    }

    #[test]
    fn csrmm_matches_reference_memory_and_flash_operands() {
        // Small budget: B is cut into column blocks, A into many row blocks, C into blocks.
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 24 << 10, compute_threads: 2, io_threads: 2, ..RuntimeOptions::default() }).unwrap();
        for &(m, k, n) in &[(0usize, 3usize, 2usize), (1, 1, 1), (7, 0, 3), (45, 31, 9), (130, 50, 17)] {
            let a = random_csr(m as u64 * 3 + k as u64, m, k);
            let flash_a = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
            for layout in [Layout::RowMajor, Layout::ColMajor] {
                for trans_b in [Transpose::No, Transpose::Yes] {
                    for beta in [0.0, -0.5] {
                        let (br, bc) = if trans_b == Transpose::No { (k, n) } else { (n, k) };
                        let ldb = DenseShape::packed(br, bc, layout).leading_dim + 2;
                        let b_data = random_vec::<f64>(5, ldb * br.max(bc) + 3);
                        let b = DenseRef::new(&b_data, br, bc, layout, ldb).unwrap();
                        let c0 = random_vec::<f64>(6, m * n);
                        let mut want = c0.clone();
                        reference(1.25, &a, trans_b, &b, beta, &mut DenseMut::packed(&mut want, m, n, layout).unwrap());
                        let what = format!("{m}x{k}x{n} {layout:?} {trans_b:?} beta {beta}");
                        // In-memory twin.
                        let mut twin = c0.clone();
                        csrmm_in_memory(1.25, a.view(), trans_b, b, beta, DenseMut::packed(&mut twin, m, n, layout).unwrap()).unwrap();
                        assert_close(&twin, &want, 1e-12, &format!("twin {what}"));
                        // Flash A, memory B and C.
                        let mut got = c0.clone();
                        csrmm(&rt, 1.25, &flash_a, trans_b, DenseInput::Memory(b), beta, DenseOutput::Memory(DenseMut::packed(&mut got, m, n, layout).unwrap())).unwrap();
                        assert_close(&got, &want, 1e-12, &format!("memory B/C {what}"));
                        // Everything on flash.
                        let b_ptr = crate::file::FlashPtr::from_slice(rt.dir(), &b_data, &rt.file_options()).unwrap();
                        let flash_b = FlashMatrix::new(b_ptr, br, bc, layout, ldb).unwrap();
                        let flash_c = FlashMatrix::from_slice(rt.dir(), &c0, m, n, layout, &rt.file_options()).unwrap();
                        let stats = csrmm(&rt, 1.25, &flash_a, trans_b, DenseInput::Flash(&flash_b), beta, DenseOutput::Flash(&flash_c)).unwrap();
                        assert_close(&flash_c.to_vec().unwrap(), &want, 1e-12, &format!("flash B/C {what}"));
                        assert!(stats.cache.peak_resident_bytes <= 24 << 10);
                    }
                }
            }
        }
    }

    #[test]
    fn csrmm_checks_shapes_and_budget() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 600, compute_threads: 1, io_threads: 1, ..RuntimeOptions::default() }).unwrap();
        let a = random_csr(9, 10, 200);
        let flash_a = FlashCsrMatrix::from_csr(rt.dir(), a.view(), &rt.file_options()).unwrap();
        let b = vec![0.0; 200 * 3];
        let mut c = vec![0.0; 10 * 3];
        let bv = DenseRef::packed(&b, 200, 3, Layout::RowMajor).unwrap();
        let err = csrmm(&rt, 1.0, &flash_a, Transpose::Yes, DenseInput::Memory(bv), 0.0, DenseOutput::Memory(DenseMut::packed(&mut c, 10, 3, Layout::RowMajor).unwrap())).unwrap_err();
        assert!(matches!(err, FlashError::ShapeMismatch(_)), "{err}");
        let flash_b = FlashMatrix::from_slice(rt.dir(), &b, 200, 3, Layout::RowMajor, &rt.file_options()).unwrap();
        let err = csrmm(&rt, 1.0, &flash_a, Transpose::No, DenseInput::Flash(&flash_b), 0.0, DenseOutput::Memory(DenseMut::packed(&mut c, 10, 3, Layout::RowMajor).unwrap())).unwrap_err();
        assert!(matches!(err, FlashError::OutOfBudget { .. }), "{err}");
    }
}
