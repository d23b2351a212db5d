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
        let indices = buffers.read::<u32>(0);
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
        unsafe { csr_rows_times_dense(self.alpha, self.indptr, indices, values, op_b, self.beta, out) };
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
    let max_nnz = (share / (4 + size)).max(1);
    let max_rows = match &c {
        DenseOutput::Flash(_) => ((share / (col_tile as u64 * size).max(1)) as usize).max(1),
        DenseOutput::Memory(_) => usize::MAX,
    };
    let blocks = row_blocks(&indptr, max_nnz, max_rows);
    let mut c_memory = match c {
        DenseOutput::Memory(view) => Some(view),
        DenseOutput::Flash(_) => None,
    };
    let c_flash = match &c_shape_source(&c_memory) {
        true => None,
        false => None,
    };
    let _ = c_flash;
    let dag = runtime.dag();
    for &(j0, j1) in &col_tiles {
        let b_source = match &b {
            DenseInput::Memory(view) => {
                let (rs, cs) = op_strides(&view.shape(), trans_b);
                let offset = j0 * cs;
                BSource::Memory(OpDense { data: &view.data()[offset.min(view.data().len())..], row_stride: rs, col_stride: cs, cols: j1 - j0 })
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
            let c_target = match (&mut c_memory, &c_flash_matrix(&c_shape, None::<&FlashMatrix<T>>)) {
                (Some(view), _) => {
                    let (rs, cs) = view.shape().strides();
                    let (rs, cs) = (rs as usize, cs as usize);
                    // SAFETY: the offset stays inside C's storage (row r0 < m, column j0 < n).
                    let ptr = unsafe { view.data().as_mut_ptr().add(r0 * rs + j0 * cs) };
                    CTarget::Memory(RowsOut { ptr, row_stride: rs, col_stride: cs, cols: j1 - j0 })
                }
                (None, _) => unreachable!(),
            };
            let task = CsrmmTask {
                alpha,
                beta,
                indptr: &indptr[r0..=r1],
                a_indices: a.indices().access(lo, hi - lo)?,
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
