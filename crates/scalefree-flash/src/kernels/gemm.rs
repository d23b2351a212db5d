//! Flash gemm (paper Fig. 1): `C := alpha op(A) op(B) + beta C` with A, B and C on flash.
//! C is tiled; each C tile is an accumulate chain of tasks `G(i,j,p)` over the reduction
//! tiles `p`, so with the prioritizer a C tile stays in memory along its chain and is written
//! back once. Blocks are multiplied with [`gemm_in_memory`].

use crate::dense::{DenseMut, DenseRef, Layout, Transpose};
use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashMatrix;
use crate::io::{Access, AccessSpec};
use crate::runtime::Runtime;
use crate::sched::{RunStats, Task, TaskBuffers, TaskContext};

use super::block_gemm::{gemm_dims, gemm_in_memory};
use super::tiling::{gemm_tiles, tile_ranges};

/// Tile sizes of a flash gemm (rows of C, columns of C, reduction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTiles {
    /// Rows of a C tile.
    pub m: usize,
    /// Columns of a C tile.
    pub n: usize,
    /// Length of the reduction per task.
    pub k: usize,
}

/// A block of a stored operand: its access and its packed shape.
struct Block {
    spec: AccessSpec,
    rows: usize,
    cols: usize,
    layout: Layout,
}

fn operand_block<T: Real>(matrix: &FlashMatrix<T>, transpose: Transpose, op_rows: (usize, usize), op_cols: (usize, usize)) -> Result<Block> {
    let (rows, cols) = match transpose {
        Transpose::No => (op_rows, op_cols),
        Transpose::Yes => (op_cols, op_rows),
    };
    let spec = matrix.block_access(rows.0, cols.0, rows.1 - rows.0, cols.1 - cols.0)?;
    Ok(Block { spec, rows: rows.1 - rows.0, cols: cols.1 - cols.0, layout: matrix.layout() })
}

struct GemmTask<T> {
    a: Option<(Block, Transpose)>,
    b: Option<(Block, Transpose)>,
    c: Block,
    alpha: T,
    beta: T,
    /// C is overwritten without being read (first task of a chain with `beta == 0`).
    overwrite_c: bool,
}

impl<'s, T: Real> Task<'s> for GemmTask<T> {
    fn accesses(&self) -> Vec<Access> {
        let mut accesses = Vec::with_capacity(3);
        if let (Some((a, _)), Some((b, _))) = (&self.a, &self.b) {
            accesses.push(Access::read(a.spec.clone()));
            accesses.push(Access::read(b.spec.clone()));
        }
        accesses.push(if self.overwrite_c { Access::write(self.c.spec.clone()) } else { Access::read_write(self.c.spec.clone()) });
        accesses
    }

    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, context: &TaskContext<'s>) -> Result<()> {
        let c_index = buffers.len() - 1;
        let c_data = buffers.take_write::<T>(c_index);
        let c = DenseMut::packed(c_data, self.c.rows, self.c.cols, self.c.layout)?;
        match (&self.a, &self.b) {
            (Some((a, ta)), Some((b, tb))) => {
                let a_view = DenseRef::packed(buffers.read::<T>(0), a.rows, a.cols, a.layout)?;
                let b_view = DenseRef::packed(buffers.read::<T>(1), b.rows, b.cols, b.layout)?;
                gemm_in_memory(*ta, *tb, self.alpha, a_view, b_view, self.beta, c, context.compute_threads())
            }
            _ => {
                // k == 0: C := beta C.
                let empty: [T; 0] = [];
                let (m, n) = (self.c.rows, self.c.cols);
                let a_view = DenseRef::packed(&empty, m, 0, Layout::RowMajor)?;
                let b_view = DenseRef::packed(&empty, 0, n, Layout::RowMajor)?;
                gemm_in_memory(Transpose::No, Transpose::No, self.alpha, a_view, b_view, self.beta, c, 1)
            }
        }
    }

    fn name(&self) -> String {
        "gemm".into()
    }
}

/// `C := alpha op(A) op(B) + beta C` on flash, with tiles chosen from the memory budget.
/// Shapes are checked before any IO. With `beta == 0`, C is not read.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Real>(runtime: &Runtime, trans_a: Transpose, trans_b: Transpose, alpha: T, a: &FlashMatrix<T>, b: &FlashMatrix<T>, beta: T, c: &FlashMatrix<T>) -> Result<RunStats> {
    let (m, n, k) = gemm_dims(trans_a, &a.shape(), trans_b, &b.shape(), &c.shape())?;
    let (tm, tn, tk) = gemm_tiles(m, n, k, std::mem::size_of::<T>(), runtime.options().memory_budget_bytes);
    gemm_tiled(runtime, trans_a, trans_b, alpha, a, b, beta, c, GemmTiles { m: tm, n: tn, k: tk })
}

/// [`gemm`] with explicit tile sizes.
#[allow(clippy::too_many_arguments)]
pub fn gemm_tiled<T: Real>(runtime: &Runtime, trans_a: Transpose, trans_b: Transpose, alpha: T, a: &FlashMatrix<T>, b: &FlashMatrix<T>, beta: T, c: &FlashMatrix<T>, tiles: GemmTiles) -> Result<RunStats> {
    let (m, n, k) = gemm_dims(trans_a, &a.shape(), trans_b, &b.shape(), &c.shape())?;
    if tiles.m == 0 || tiles.n == 0 || tiles.k == 0 {
        return Err(FlashError::invalid(format!("gemm tiles must be positive, got {tiles:?}")));
    }
    if !c.data().file().is_writable() {
        return Err(FlashError::invalid(format!("C is in {}, which is read-only", c.data().file().path().display())));
    }
    let dag = runtime.dag();
    for &(i0, i1) in &tile_ranges(m, tiles.m) {
        for &(j0, j1) in &tile_ranges(n, tiles.n) {
            let c_block = || -> Result<Block> { Ok(Block { spec: c.block_access(i0, j0, i1 - i0, j1 - j0)?, rows: i1 - i0, cols: j1 - j0, layout: c.layout() }) };
            let k_tiles = tile_ranges(k, tiles.k);
            if k_tiles.is_empty() || alpha == T::ZERO {
                dag.add(GemmTask { a: None, b: None, c: c_block()?, alpha, beta, overwrite_c: beta == T::ZERO }, &[])?;
                continue;
            }
            let mut previous = None;
            for (index, &(p0, p1)) in k_tiles.iter().enumerate() {
                let first = index == 0;
                let task = GemmTask {
                    a: Some((operand_block(a, trans_a, (i0, i1), (p0, p1))?, trans_a)),
                    b: Some((operand_block(b, trans_b, (p0, p1), (j0, j1))?, trans_b)),
                    c: c_block()?,
                    alpha,
                    beta: if first { beta } else { T::ONE },
                    overwrite_c: first && beta == T::ZERO,
                };
                let parents: Vec<_> = previous.into_iter().collect();
                previous = Some(dag.add(task, &parents)?);
            }
        }
    }
    dag.run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::DenseShape;
    use crate::kernels::block_gemm::gemm_naive;
    use crate::kernels::test_support::{assert_close, random_vec};
    use crate::runtime::RuntimeOptions;

    fn runtime(budget_bytes: u64) -> Runtime {
        Runtime::new(RuntimeOptions { memory_budget_bytes: budget_bytes, compute_threads: 2, io_threads: 2, ..RuntimeOptions::default() }).unwrap()
    }

    /// Flash gemm against the naive reference, with explicit small tiles that do not divide
    /// the dimensions, padded leading dimensions, both layouts and all transposes.
    #[test]
    fn flash_gemm_matches_reference() {
        let rt = runtime(1 << 20);
        let tiles = GemmTiles { m: 4, n: 3, k: 5 };
        for &(m, n, k) in &[(0usize, 3usize, 2usize), (1, 1, 1), (9, 7, 0), (9, 7, 11), (13, 10, 6)] {
            for layout in [Layout::RowMajor, Layout::ColMajor] {
                for ta in [Transpose::No, Transpose::Yes] {
                    for tb in [Transpose::No, Transpose::Yes] {
                        for beta in [0.0, 0.75] {
                            let (ar, ac) = if ta == Transpose::No { (m, k) } else { (k, m) };
                            let (br, bc) = if tb == Transpose::No { (k, n) } else { (n, k) };
                            let make = |seed: u64, rows: usize, cols: usize, pad: usize| {
                                let ld = DenseShape::packed(rows, cols, layout).leading_dim + pad;
                                let data = random_vec::<f64>(seed, ld * rows.max(cols).max(1));
                                let ptr = crate::file::FlashPtr::from_slice(rt.dir(), &data, &rt.file_options()).unwrap();
                                (FlashMatrix::new(ptr, rows, cols, layout, ld).unwrap(), data, ld)
                            };
                            let (a, a_data, lda) = make(1, ar, ac, 3);
                            let (b, b_data, ldb) = make(2, br, bc, 0);
                            let (c, c_data, ldc) = make(3, m, n, 5);
                            gemm_tiled(&rt, ta, tb, 1.5, &a, &b, beta, &c, tiles).unwrap();
                            let mut want = c_data.clone();
                            let av = DenseRef::new(&a_data, ar, ac, layout, lda).unwrap();
                            let bv = DenseRef::new(&b_data, br, bc, layout, ldb).unwrap();
                            gemm_naive(ta, tb, 1.5, av, bv, beta, &mut DenseMut::new(&mut want, m, n, layout, ldc).unwrap());
                            let got = c.data().to_vec().unwrap();
                            assert_close(&got, &want, 1e-12, &format!("{m}x{n}x{k} {layout:?} {ta:?} {tb:?} beta {beta}"));
                        }
                    }
                }
            }
        }
    }

    /// A budget far below the data: tiles are chosen from it, peak memory stays under it,
    /// and the result matches the in-memory twin.
    #[test]
    fn gemm_under_a_small_budget_matches_in_memory() {
        let (m, n, k) = (150, 130, 170);
        let data_bytes = ((m * k + k * n + m * n) * 4) as u64;
        let budget = data_bytes / 8;
        let rt = runtime(budget);
        let a_data = random_vec::<f32>(11, m * k);
        let b_data = random_vec::<f32>(12, k * n);
        let c_data = random_vec::<f32>(13, m * n);
        let a = FlashMatrix::from_slice(rt.dir(), &a_data, m, k, Layout::RowMajor, &rt.file_options()).unwrap();
        let b = FlashMatrix::from_slice(rt.dir(), &b_data, k, n, Layout::ColMajor, &rt.file_options()).unwrap();
        let c = FlashMatrix::from_slice(rt.dir(), &c_data, m, n, Layout::RowMajor, &rt.file_options()).unwrap();
        let stats = gemm(&rt, Transpose::No, Transpose::No, 2.0, &a, &b, -1.0, &c).unwrap();
        assert!(stats.cache.peak_resident_bytes <= budget, "peak {} > budget {budget}", stats.cache.peak_resident_bytes);
        assert!(stats.tasks_completed > 8);
        let mut want = c_data.clone();
        let av = DenseRef::packed(&a_data, m, k, Layout::RowMajor).unwrap();
        let bv = DenseRef::packed(&b_data, k, n, Layout::ColMajor).unwrap();
        gemm_in_memory(Transpose::No, Transpose::No, 2.0, av, bv, -1.0, DenseMut::packed(&mut want, m, n, Layout::RowMajor).unwrap(), 2).unwrap();
        assert_close(&c.to_vec().unwrap(), &want, 1e-4, "budgeted gemm");
        // C is written back once per tile: bytes written equal C's size.
        assert_eq!(stats.cache.bytes_written_back, (m * n * 4) as u64);
    }

    #[test]
    fn shape_mismatch_is_caught_before_io() {
        let rt = runtime(1 << 20);
        let a = FlashMatrix::<f32>::scratch(rt.dir(), 3, 4, Layout::RowMajor, &rt.file_options()).unwrap();
        let b = FlashMatrix::<f32>::scratch(rt.dir(), 5, 2, Layout::RowMajor, &rt.file_options()).unwrap();
        let c = FlashMatrix::<f32>::scratch(rt.dir(), 3, 2, Layout::RowMajor, &rt.file_options()).unwrap();
        let err = gemm(&rt, Transpose::No, Transpose::No, 1.0, &a, &b, 0.0, &c).unwrap_err();
        assert!(matches!(err, FlashError::ShapeMismatch(_)), "{err}");
        let tiny = runtime(64);
        let err = gemm_tiled(&tiny, Transpose::No, Transpose::No, 1.0, &a, &a.transposed(), 0.0, &FlashMatrix::<f32>::scratch(rt.dir(), 3, 3, Layout::RowMajor, &rt.file_options()).unwrap(), GemmTiles { m: 3, n: 3, k: 4 }).unwrap_err();
        assert!(matches!(err, FlashError::OutOfBudget { .. }), "{err}");
    }
}
