//! A rank's PageRank matrix on flash: the value-free CSR of [`crate::pagerank`] written to a
//! scratch file of the flash runtime, streamed once per iteration in row order while the
//! vertex state (the in and out vectors) stays in memory.
//!
//! File layout: the row starts (`nrows` u64, the matrix's first edge is 0), then, from the
//! next 4 KiB boundary, the columns (`nnz` u32): exactly the bytes the in-memory matrix holds.
//! The file is an unnamed scratch file (`O_TMPFILE` in the runtime's directory): nothing is
//! left behind when the process ends, however it ends.
//!
//! An iteration is one DAG run of the flash runtime: one task per row block, which declares
//! its block's row starts and columns as reads (the runtime prefetches them under its memory
//! budget with direct IO) and computes [`spmv_rows`] into its own slice of `y`. Blocks hold
//! at most `budget / (2 × tasks in flight)` bytes (a row longer than that is a block of its
//! own), so the blocks in flight and the next ones' prefetches fit the budget together. Task
//! `i` waits for task `i − w` (`w` = tasks in flight): the ready tasks are always the next `w`
//! blocks, so the file is read front to back, the kernel's order, whatever the prioritizer
//! prefers among them.
//!
//! Equal bits: every row is summed by [`spmv_rows`] exactly as the in-memory
//! [`crate::pagerank::spmv_step`] sums it, and the flow total afterwards in row order by
//! [`flow_total`], so the scores match the in-memory run bit for bit.
//!
//! Cost per iteration: one sequential read of the file (`8 × rows + 4 × edges` bytes) and
//! the in-memory SpMV's arithmetic, overlapped (blocks compute on the runtime's threads while
//! the next blocks are read).

use std::sync::Arc;

use scalefree_flash::{Access, FlashError, FlashFile, FlashPtr, FnTask, RunStats, Runtime, TaskId};

use crate::pagerank::{flow_total, scale_sources, spmv_rows, Real};

/// Sector alignment of the column region.
const ALIGN_BYTES: u64 = 4096;

/// A block of rows: `rows.0..rows.1`, edges `edges.0..edges.1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowBlock {
    rows: (usize, usize),
    edges: (u64, u64),
}

/// A rank's value-free PageRank CSR on flash (see the module docs).
pub struct FlashPageRankCsr {
    starts: FlashPtr<u64>,
    cols: FlashPtr<u32>,
    ncols: usize,
    blocks: Vec<RowBlock>,
    file: Arc<FlashFile>,
}

/// Row blocks of at most `max_edges` edges each (a longer row is a block alone).
fn row_blocks(indptr: &[u64], max_edges: u64) -> Vec<RowBlock> {
    let nrows = indptr.len() - 1;
    let mut blocks = Vec::new();
    let mut r0 = 0;
    while r0 < nrows {
        let e0 = indptr[r0];
        // The last row whose end stays within e0 + max_edges, at least one row.
        let limit = e0.saturating_add(max_edges.max(1));
        let r1 = (r0 + 1).max(indptr[r0 + 1..].partition_point(|&e| e <= limit) + r0);
        let r1 = r1.min(nrows);
        blocks.push(RowBlock { rows: (r0, r1), edges: (e0, indptr[r1]) });
        r0 = r1;
    }
    blocks
}

impl FlashPageRankCsr {
    /// Writes the CSR `(indptr, cols)` (`ncols` columns; `indptr[0] == 0`, as the in-memory
    /// matrix has it) to a scratch file in the runtime's directory and plans its row blocks
    /// for the runtime's budget. Fails with `OutOfBudget` when one row's edges alone do not
    /// fit the budget.
    pub fn write(runtime: &Runtime, indptr: &[u64], cols: &[u32], ncols: usize) -> scalefree_flash::Result<FlashPageRankCsr> {
        if indptr.is_empty() || indptr[0] != 0 || indptr[indptr.len() - 1] != cols.len() as u64 {
            return Err(FlashError::invalid(format!("FlashPageRankCsr: indptr must start at 0 and end at the {} columns", cols.len())));
        }
        let nrows = indptr.len() - 1;
        let starts_bytes = nrows as u64 * 8;
        let cols_at = starts_bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
        let file = FlashFile::scratch(runtime.dir(), cols_at + cols.len() as u64 * 4, &runtime.file_options())?;
        let starts = FlashPtr::<u64>::from_file(file.clone(), 0, nrows as u64)?;
        let cols_ptr = FlashPtr::<u32>::from_file(file.clone(), cols_at, cols.len() as u64)?;
        starts.write(0, &indptr[..nrows])?;
        cols_ptr.write(0, cols)?;
        let options = runtime.options();
        let budget = options.memory_budget_bytes;
        let share = budget / (2 * options.max_tasks_in_flight.max(1) as u64);
        // 4 bytes per edge and 8 per row; rows are counted against the share through the
        // edge bound (a block's rows are at most its edges + the empty ones, which R-MAT
        // graphs have few of) and checked below.
        let max_edges = (share / 4).max(1);
        let blocks = row_blocks(indptr, max_edges);
        if let Some(b) = blocks.iter().find(|b| (b.edges.1 - b.edges.0) * 4 + (b.rows.1 - b.rows.0) as u64 * 8 > budget) {
            return Err(FlashError::OutOfBudget {
                what: format!("PageRank row block {}..{} ({} edges)", b.rows.0, b.rows.1, b.edges.1 - b.edges.0),
                needed_bytes: (b.edges.1 - b.edges.0) * 4 + (b.rows.1 - b.rows.0) as u64 * 8,
                budget_bytes: budget,
            });
        }
        Ok(FlashPageRankCsr { starts, cols: cols_ptr, ncols, blocks, file })
    }

    /// Rows (out slots less the flow slot).
    pub fn nrows(&self) -> usize {
        self.starts.len() as usize
    }

    /// Columns (in slots).
    pub fn ncols(&self) -> usize {
        self.ncols
    }

    /// Edges.
    pub fn nnz(&self) -> u64 {
        self.cols.len()
    }

    /// Bytes of the file's data (row starts and columns), what an iteration reads.
    pub fn size_bytes(&self) -> u64 {
        self.starts.len() * 8 + self.cols.len() * 4
    }

    /// Row blocks (tasks per iteration).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the file bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.file.is_direct()
    }

    /// [`crate::pagerank::spmv_step`] with the matrix read from flash: `x` (scratch, ncols)
    /// gets the scaled sources, `y[..nrows]` the row sums, `y[nrows]` their total (returned
    /// with the run's statistics). `got`, `inv_deg`, `x`: ncols values; `y`: nrows + 1.
    #[allow(clippy::too_many_arguments)]
    pub fn spmv_step<T: Real>(&self, runtime: &Runtime, got: &[T], inv_deg: &[T], base: f64, damping: f64, x: &mut [T], y: &mut [T]) -> scalefree_flash::Result<(f64, RunStats)> {
        let nrows = self.nrows();
        if got.len() != self.ncols || inv_deg.len() != self.ncols || x.len() != self.ncols || y.len() != nrows + 1 {
            return Err(FlashError::shape(format!(
                "FlashPageRankCsr: {nrows} rows, {} columns, but got {}, inv_deg {}, x {}, y {} values",
                self.ncols,
                got.len(),
                inv_deg.len(),
                x.len(),
                y.len()
            )));
        }
        scale_sources(got, inv_deg, base, damping, x);
        let x = &*x;
        let window = runtime.options().max_tasks_in_flight.max(1);
        let dag = runtime.dag();
        let mut ids: Vec<TaskId> = Vec::with_capacity(self.blocks.len());
        let mut rest: &mut [T] = &mut y[..nrows];
        for (i, b) in self.blocks.iter().enumerate() {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(b.rows.1 - b.rows.0);
            rest = tail;
            let reads = vec![
                Access::read(self.starts.access(b.rows.0 as u64, (b.rows.1 - b.rows.0) as u64)?),
                Access::read(self.cols.access(b.edges.0, b.edges.1 - b.edges.0)?),
            ];
            let end = b.edges.1;
            let parents: &[TaskId] = if i >= window { &ids[i - window..i - window + 1] } else { &[] };
            let id = dag.add(
                FnTask::new("pagerank-spmv", reads, move |buffers, _| {
                    spmv_rows(buffers.read::<u64>(0), end, buffers.read::<u32>(1), x, mine);
                    Ok(())
                }),
                parents,
            )?;
            ids.push(id);
        }
        let stats = dag.run()?;
        Ok((flow_total(y), stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagerank::{csr_pattern, spmv_step};
    use scalefree_flash::RuntimeOptions;

    fn rng(seed: &mut u64, n: u32) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 33) % n.max(1) as u64) as u32
    }

    #[test]
    fn row_blocks_cover_every_row_once() {
        let indptr = [0u64, 3, 3, 10, 11, 30, 31];
        for max in [1u64, 2, 5, 11, 100] {
            let b = row_blocks(&indptr, max);
            assert_eq!(b.first().unwrap().rows.0, 0);
            assert_eq!(b.last().unwrap().rows.1, 6);
            for w in b.windows(2) {
                assert_eq!(w[0].rows.1, w[1].rows.0);
            }
            for x in &b {
                assert!(x.edges.1 - x.edges.0 <= max || x.rows.1 - x.rows.0 == 1, "{max} {x:?}");
                assert_eq!(x.edges, (indptr[x.rows.0], indptr[x.rows.1]));
            }
        }
        assert!(row_blocks(&[0], 4).is_empty());
    }

    #[test]
    fn flash_step_equals_the_in_memory_step_bit_for_bit() {
        let mut seed = 11u64;
        for &budget in &[4096u64, 64 << 10] {
            let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: budget, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
            for &(nr, nc, ne) in &[(1usize, 1usize, 0usize), (1, 3, 5), (7, 5, 40), (900, 700, 20_000)] {
                let rows: Vec<u32> = (0..ne).map(|_| rng(&mut seed, nr as u32)).collect();
                let cols: Vec<u32> = (0..ne).map(|_| rng(&mut seed, nc as u32)).collect();
                let (ip, cs) = csr_pattern(&rows, &cols, nr, nc).unwrap();
                let flash = FlashPageRankCsr::write(&rt, &ip, &cs, nc).unwrap();
                assert_eq!((flash.nrows(), flash.ncols(), flash.nnz()), (nr, nc, ne as u64));
                for dtype32 in [false, true] {
                    let got: Vec<f64> = (0..nc).map(|i| (i as f64 * 0.37).sin().abs() / nc as f64).collect();
                    let inv: Vec<f64> = (0..nc).map(|i| if i % 5 == 0 { 0.0 } else { 1.0 / (1 + i % 7) as f64 }).collect();
                    if dtype32 {
                        let (g, w): (Vec<f32>, Vec<f32>) = (got.iter().map(|&v| v as f32).collect(), inv.iter().map(|&v| v as f32).collect());
                        let (mut x1, mut y1) = (vec![0f32; nc], vec![0f32; nr + 1]);
                        let t1 = spmv_step(&ip, &cs, &g, &w, 0.01, 0.85, &mut x1, &mut y1);
                        let (mut x2, mut y2) = (vec![0f32; nc], vec![f32::NAN; nr + 1]);
                        let (t2, stats) = flash.spmv_step(&rt, &g, &w, 0.01, 0.85, &mut x2, &mut y2).unwrap();
                        assert_eq!((t1.to_bits(), y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (t2.to_bits(), y2.iter().map(|v| v.to_bits()).collect()));
                        assert!(stats.cache.peak_resident_bytes <= budget);
                    } else {
                        let (mut x1, mut y1) = (vec![0f64; nc], vec![0f64; nr + 1]);
                        let t1 = spmv_step(&ip, &cs, &got, &inv, 0.01, 0.85, &mut x1, &mut y1);
                        let (mut x2, mut y2) = (vec![0f64; nc], vec![f64::NAN; nr + 1]);
                        let (t2, stats) = flash.spmv_step(&rt, &got, &inv, 0.01, 0.85, &mut x2, &mut y2).unwrap();
                        assert_eq!((t1.to_bits(), y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (t2.to_bits(), y2.iter().map(|v| v.to_bits()).collect()));
                        assert_eq!(stats.cache.bytes_prefetched >= flash.size_bytes(), true);
                        assert!(stats.cache.peak_resident_bytes <= budget);
                    }
                }
                let mut y = vec![0f64; nr + 2];
                assert!(flash.spmv_step(&rt, &vec![0.0; nc], &vec![0.0; nc], 0.0, 0.0, &mut vec![0.0; nc], &mut y).is_err());
            }
        }
    }

    #[test]
    fn a_row_larger_than_the_budget_is_refused() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 4096, compute_threads: 1, io_threads: 1, max_tasks_in_flight: 2, ..RuntimeOptions::default() }).unwrap();
        let cols: Vec<u32> = (0..2000).collect();
        let err = FlashPageRankCsr::write(&rt, &[0, 2000], &cols, 2000).err().unwrap();
        assert!(matches!(err, FlashError::OutOfBudget { .. }), "{err}");
        assert!(FlashPageRankCsr::write(&rt, &[1, 2], &cols[..1], 2000).is_err());
    }
}
