//! Flash gemm (paper Fig. 1): `C := alpha op(A) op(B) + beta C` with A, B and C on flash.
//! C is tiled; each C tile is an accumulate chain of tasks `G(i,j,p)` over the reduction
//! tiles `p`, so a C tile stays in memory along its chain and is written back once, as soon
//! as the chain ends. When op(A)'s rows (op(B)'s columns) are contiguous on flash, each chain
//! reads the whole-k strip of that operand once with large IOs and keeps it, streaming blocks
//! of the other operand ([`GemmStream`]); the scheduler prefetches a chain's next block while
//! the current one computes, and chains are pipelined so the next chain's strip is read while
//! this one finishes. Blocks are multiplied with [`gemm_in_memory`].

use crate::dense::{DenseMut, DenseRef, Layout, Transpose};
use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashMatrix;
use crate::io::{Access, AccessSpec};
use crate::runtime::Runtime;
use crate::sched::{RunStats, Task, TaskBuffers, TaskContext};

use super::blas::ExternalBlas;
use super::block_gemm::{gemm_dims, gemm_in_memory, gemm_in_memory_with};
use super::tiling::{gemm_tiles, tile_ranges, GemmStream};

/// Tile sizes of a flash gemm (rows of C, columns of C, reduction) and how operands are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTiles {
    /// Rows of a C tile.
    pub m: usize,
    /// Columns of a C tile.
    pub n: usize,
    /// Length of the reduction per task.
    pub k: usize,
    /// Which operand, if any, is read as whole-k strips kept along each C tile's chain.
    pub stream: GemmStream,
}

/// A block of a stored operand: its access and its packed shape.
struct Block {
    spec: AccessSpec,
    rows: usize,
    cols: usize,
    layout: Layout,
}

/// An operand of a task: the block read (rows and columns of op(X)) and the part of it the
/// task multiplies, in stored coordinates relative to the block.
struct Operand {
    block: Block,
    transpose: Transpose,
    /// `(row0, col0, rows, cols)` of the stored block.
    part: (usize, usize, usize, usize),
}

impl Operand {
    /// Reads `op_rows x op_cols` of op(`matrix`) and multiplies its sub-range `use_rows x
    /// use_cols` (absolute indices of op(`matrix`), inside the block).
    fn new<T: Real>(matrix: &FlashMatrix<T>, transpose: Transpose, op_rows: (usize, usize), op_cols: (usize, usize), use_rows: (usize, usize), use_cols: (usize, usize)) -> Result<Operand> {
        let stored = |rows: (usize, usize), cols: (usize, usize)| match transpose {
            Transpose::No => (rows, cols),
            Transpose::Yes => (cols, rows),
        };
        let (rows, cols) = stored(op_rows, op_cols);
        let (part_rows, part_cols) = stored(use_rows, use_cols);
        let spec = matrix.block_access(rows.0, cols.0, rows.1 - rows.0, cols.1 - cols.0)?;
        let block = Block { spec, rows: rows.1 - rows.0, cols: cols.1 - cols.0, layout: matrix.layout() };
        let part = (part_rows.0 - rows.0, part_cols.0 - cols.0, part_rows.1 - part_rows.0, part_cols.1 - part_cols.0);
        Ok(Operand { block, transpose, part })
    }

    /// The multiplied part of the block's packed buffer.
    fn view<'a, T: Real>(&self, data: &'a [T]) -> Result<DenseRef<'a, T>> {
        let (row0, col0, rows, cols) = self.part;
        let (offset, leading_dim) = match self.block.layout {
            Layout::RowMajor => (row0 * self.block.cols + col0, self.block.cols),
            Layout::ColMajor => (col0 * self.block.rows + row0, self.block.rows),
        };
        DenseRef::new(&data[offset.min(data.len())..], rows, cols, self.block.layout, leading_dim.max(1))
    }
}

struct GemmTask<'s, T> {
    blas: Option<&'s ExternalBlas>,
    a: Option<Operand>,
    b: Option<Operand>,
    c: Block,
    alpha: T,
    beta: T,
    /// C is overwritten without being read (first task of a chain with `beta == 0`).
    overwrite_c: bool,
}

impl<'s, T: Real> Task<'s> for GemmTask<'s, T> {
    fn accesses(&self) -> Vec<Access> {
        let mut accesses = Vec::with_capacity(3);
        if let (Some(a), Some(b)) = (&self.a, &self.b) {
            accesses.push(Access::read(a.block.spec.clone()));
            accesses.push(Access::read(b.block.spec.clone()));
        }
        accesses.push(if self.overwrite_c { Access::write(self.c.spec.clone()) } else { Access::read_write(self.c.spec.clone()) });
        accesses
    }

    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, context: &TaskContext<'s>) -> Result<()> {
        let c_index = buffers.len() - 1;
        let c_data = buffers.take_write::<T>(c_index);
        let c = DenseMut::packed(c_data, self.c.rows, self.c.cols, self.c.layout)?;
        match (&self.a, &self.b) {
            (Some(a), Some(b)) => {
                let a_view = a.view(buffers.read::<T>(0))?;
                let b_view = b.view(buffers.read::<T>(1))?;
                gemm_in_memory_with(self.blas, a.transpose, b.transpose, self.alpha, a_view, b_view, self.beta, c, context.compute_threads())
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
    let stream = stream_for(a, trans_a, b, trans_b);
    let (tm, tn, tk) = gemm_tiles(m, n, k, std::mem::size_of::<T>(), runtime.options().memory_budget_bytes, stream);
    gemm_tiled(runtime, trans_a, trans_b, alpha, a, b, beta, c, GemmTiles { m: tm, n: tn, k: tk, stream })
}

/// The operand whose whole-k strips are contiguous on flash: rows of op(A) are stored rows
/// of a row-major A (or columns of a column-major A transposed); likewise for columns of op(B).
fn stream_for<T: Real>(a: &FlashMatrix<T>, trans_a: Transpose, b: &FlashMatrix<T>, trans_b: Transpose) -> GemmStream {
    let a_rows_contiguous = (a.layout() == Layout::RowMajor) == (trans_a == Transpose::No);
    let b_cols_contiguous = (b.layout() == Layout::ColMajor) == (trans_b == Transpose::No);
    if a_rows_contiguous {
        GemmStream::ARows
    } else if b_cols_contiguous {
        GemmStream::BColumns
    } else {
        GemmStream::Square
    }
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
    // Chains sharing a strip are added together (the prioritizer breaks ties by order).
    let (row_tiles, col_tiles) = (tile_ranges(m, tiles.m), tile_ranges(n, tiles.n));
    let c_tiles: Vec<((usize, usize), (usize, usize))> = if tiles.stream == GemmStream::BColumns {
        col_tiles.iter().flat_map(|&j| row_tiles.iter().map(move |&i| (i, j))).collect()
    } else {
        row_tiles.iter().flat_map(|&i| col_tiles.iter().map(move |&j| (i, j))).collect()
    };
    let mut pipeline_parent = None;
    for &((i0, i1), (j0, j1)) in &c_tiles {
        let c_block = || -> Result<Block> { Ok(Block { spec: c.block_access(i0, j0, i1 - i0, j1 - j0)?, rows: i1 - i0, cols: j1 - j0, layout: c.layout() }) };
        let k_tiles = tile_ranges(k, tiles.k);
        if k_tiles.is_empty() || alpha == T::ZERO {
            dag.add(GemmTask { blas: None, a: None, b: None, c: c_block()?, alpha, beta, overwrite_c: beta == T::ZERO }, &[])?;
            continue;
        }
        let mut previous = None;
        let mut chain = Vec::with_capacity(k_tiles.len());
        for (index, &(p0, p1)) in k_tiles.iter().enumerate() {
            let first = index == 0;
            let a_k = if tiles.stream == GemmStream::ARows { (0, k) } else { (p0, p1) };
            let b_k = if tiles.stream == GemmStream::BColumns { (0, k) } else { (p0, p1) };
            let task = GemmTask {
                blas: runtime.blas(),
                a: Some(Operand::new(a, trans_a, (i0, i1), a_k, (i0, i1), (p0, p1))?),
                b: Some(Operand::new(b, trans_b, b_k, (j0, j1), (p0, p1), (j0, j1))?),
                c: c_block()?,
                alpha,
                beta: if first { beta } else { T::ONE },
                overwrite_c: first && beta == T::ZERO,
            };
            let mut parents: Vec<_> = previous.into_iter().collect();
            if first && tiles.stream != GemmStream::Square {
                parents.extend(pipeline_parent);
            }
            previous = Some(dag.add(task, &parents)?);
            chain.push(previous.expect("just added"));
        }
        if tiles.stream != GemmStream::Square {
            // Chains run one after another (each task uses every compute thread): the next
            // chain's head waits for this chain's second-to-last task, so its strip is
            // prefetched while this chain's last tasks compute.
            pipeline_parent = chain.get(chain.len().saturating_sub(2)).copied();
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
        for stream in [GemmStream::Square, GemmStream::ARows, GemmStream::BColumns] {
            let tiles = GemmTiles { m: 4, n: 3, k: 5, stream };
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
                                assert_close(&got, &want, 1e-12, &format!("{m}x{n}x{k} {layout:?} {ta:?} {tb:?} beta {beta} {stream:?}"));
                            }
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
        // Row-major A streams A strips; column-major A and B stream B strips; column-major A
        // with row-major B has no contiguous strips (square tiles).
        for (a_layout, b_layout, stream) in [(Layout::RowMajor, Layout::ColMajor, GemmStream::ARows), (Layout::ColMajor, Layout::ColMajor, GemmStream::BColumns), (Layout::ColMajor, Layout::RowMajor, GemmStream::Square)] {
            assert_eq!(stream_for(&FlashMatrix::<f32>::scratch(rt.dir(), 1, 1, a_layout, &rt.file_options()).unwrap(), Transpose::No, &FlashMatrix::<f32>::scratch(rt.dir(), 1, 1, b_layout, &rt.file_options()).unwrap(), Transpose::No), stream);
            let (a_stored, b_stored) = (to_layout(&a_data, m, k, a_layout), to_layout(&b_data, k, n, b_layout));
            let a = FlashMatrix::from_slice(rt.dir(), &a_stored, m, k, a_layout, &rt.file_options()).unwrap();
            let b = FlashMatrix::from_slice(rt.dir(), &b_stored, k, n, b_layout, &rt.file_options()).unwrap();
            let c = FlashMatrix::from_slice(rt.dir(), &c_data, m, n, Layout::RowMajor, &rt.file_options()).unwrap();
            let stats = gemm(&rt, Transpose::No, Transpose::No, 2.0, &a, &b, -1.0, &c).unwrap();
            assert!(stats.cache.peak_resident_bytes <= budget, "{stream:?}: peak {} > budget {budget}", stats.cache.peak_resident_bytes);
            assert!(stats.tasks_completed > 8);
            let mut want = c_data.clone();
            let av = DenseRef::packed(&a_stored, m, k, a_layout).unwrap();
            let bv = DenseRef::packed(&b_stored, k, n, b_layout).unwrap();
            gemm_in_memory(Transpose::No, Transpose::No, 2.0, av, bv, -1.0, DenseMut::packed(&mut want, m, n, Layout::RowMajor).unwrap(), 2).unwrap();
            assert_close(&c.to_vec().unwrap(), &want, 1e-4, &format!("budgeted gemm, {stream:?}"));
            // C is written back once per tile: bytes written equal C's size.
            assert_eq!(stats.cache.bytes_written_back, (m * n * 4) as u64, "{stream:?}");
        }
    }

    /// A row-major `rows x cols` matrix stored in `layout`.
    fn to_layout(row_major: &[f32], rows: usize, cols: usize, layout: Layout) -> Vec<f32> {
        match layout {
            Layout::RowMajor => row_major.to_vec(),
            Layout::ColMajor => (0..rows * cols).map(|at| row_major[(at % rows) * cols + at / rows]).collect(),
        }
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
        let err = gemm_tiled(&tiny, Transpose::No, Transpose::No, 1.0, &a, &a.transposed(), 0.0, &FlashMatrix::<f32>::scratch(rt.dir(), 3, 3, Layout::RowMajor, &rt.file_options()).unwrap(), GemmTiles { m: 3, n: 3, k: 4, stream: GemmStream::Square }).unwrap_err();
        assert!(matches!(err, FlashError::OutOfBudget { .. }), "{err}");
    }
}
