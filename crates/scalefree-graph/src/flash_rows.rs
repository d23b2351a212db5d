//! A rank's edges on flash, grouped by row, streamed once per hop or iteration through the
//! flash runtime while the vertex state stays in memory: the matrix of
//! `graph pagerank --memory-budget` ([`FlashRows::pagerank_step`], the SpMV of
//! [`crate::pagerank`]) and of `graph diameter --memory-budget` ([`FlashRows::union_changed`],
//! HADI's hop of [`crate::hadi`], a range of rows (one round of a hop) at a time).
//!
//! File layout: the row starts (`nrows` u64, the first edge is 0), then, from the next 4 KiB
//! boundary, the columns (`nnz` slots, u32 or u64 as in memory): the bytes the in-memory
//! PageRank matrix holds. The file
//! is an unnamed scratch file (`O_TMPFILE` in the runtime's directory): nothing is left
//! behind when the process ends, however it ends.
//!
//! A pass is one DAG run of the flash runtime: one task per row block, which declares its
//! block's row starts and columns as reads (the runtime prefetches them under its memory
//! budget with direct IO) and computes its rows' outputs into its own slice of the output.
//! Blocks hold at most `budget / (2 × tasks in flight)` bytes (a row longer than that is a
//! block of its own), so the blocks in flight and the next ones' prefetches fit the budget
//! together. Task `i` waits for task `i − w` (`w` = tasks in flight): the ready tasks are
//! always the next `w` blocks, so the file is read front to back, the kernels' order,
//! whatever the prioritizer prefers among them.
//!
//! Equal bits: every row is computed by the in-memory kernel's own row loop
//! ([`spmv_rows`], [`union_changed_rows`]) and PageRank's flow total afterwards in row order
//! by [`flow_total`], so the results match the in-memory runs bit for bit.
//!
//! Cost per pass: one sequential read of the file (`8 × rows + 4 × edges` bytes) and the
//! in-memory kernel's arithmetic, overlapped (blocks compute on the runtime's threads while
//! the next blocks are read).

use std::sync::Arc;

use scalefree_flash::{Access, Element, FlashError, FlashFile, FlashPtr, FnTask, RunStats, Runtime, TaskId};

use crate::hadi::{check_union, pack_rows, union_changed_rows, ID_BYTES};
use crate::pagerank::{flow_total, scale_sources, spmv_rows, Real};
use crate::Id;

/// Sector alignment of the column region.
const ALIGN_BYTES: u64 = 4096;

/// A block of rows: `rows.0..rows.1`, edges `edges.0..edges.1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowBlock {
    rows: (usize, usize),
    edges: (u64, u64),
}

/// A rank's rows of edges on flash (see the module docs), columns as `S` (u32 or u64).
pub struct FlashRows<S = u32> {
    starts: FlashPtr<u64>,
    cols: FlashPtr<S>,
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

impl<S: Id + Element> FlashRows<S> {
    /// Writes the rows `(indptr, cols)` (`ncols` columns; `indptr[0] == 0`, every column
    /// below `ncols`) to a scratch file in the runtime's directory and plans its row blocks
    /// for the runtime's budget. Fails with `OutOfBudget` when one row's edges alone do not
    /// fit the budget, `InvalidArgument` on a malformed `indptr` or a column out of range.
    pub fn write(runtime: &Runtime, indptr: &[u64], cols: &[S], ncols: usize) -> scalefree_flash::Result<FlashRows<S>> {
        if indptr.is_empty() || indptr[0] != 0 || indptr[indptr.len() - 1] != cols.len() as u64 || indptr.windows(2).any(|w| w[0] > w[1]) {
            return Err(FlashError::invalid(format!("FlashRows: indptr must ascend from 0 to the {} columns", cols.len())));
        }
        if let Some(c) = cols.iter().find(|&&c| c.u64() >= ncols as u64) {
            return Err(FlashError::invalid(format!("FlashRows: column {} is not below {ncols}", c.u64())));
        }
        let nrows = indptr.len() - 1;
        let starts_bytes = nrows as u64 * 8;
        let cols_at = starts_bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
        let options = runtime.options();
        let budget = options.memory_budget_bytes;
        let share = budget / (2 * options.max_tasks_in_flight.max(1) as u64);
        // A slot per edge and 8 bytes per row; a block's rows are counted in the check below.
        let slot = std::mem::size_of::<S>() as u64;
        let blocks = row_blocks(indptr, (share / slot).max(1));
        let block_bytes = |b: &RowBlock| (b.edges.1 - b.edges.0) * slot + (b.rows.1 - b.rows.0) as u64 * 8;
        if let Some(b) = blocks.iter().find(|b| block_bytes(b) > budget) {
            return Err(FlashError::OutOfBudget {
                what: format!("row block {}..{} ({} edges)", b.rows.0, b.rows.1, b.edges.1 - b.edges.0),
                needed_bytes: block_bytes(b),
                budget_bytes: budget,
            });
        }
        let file = FlashFile::scratch(runtime.dir(), cols_at + cols.len() as u64 * slot, &runtime.file_options())?;
        let starts = FlashPtr::<u64>::from_file(file.clone(), 0, nrows as u64)?;
        let cols_ptr = FlashPtr::<S>::from_file(file.clone(), cols_at, cols.len() as u64)?;
        starts.write(0, &indptr[..nrows])?;
        cols_ptr.write(0, cols)?;
        Ok(FlashRows { starts, cols: cols_ptr, ncols, blocks, file })
    }

    /// Rows.
    pub fn nrows(&self) -> usize {
        self.starts.len() as usize
    }

    /// Columns.
    pub fn ncols(&self) -> usize {
        self.ncols
    }

    /// Edges.
    pub fn nnz(&self) -> u64 {
        self.cols.len()
    }

    /// Bytes of the file's data (row starts and columns), what a pass reads.
    pub fn size_bytes(&self) -> u64 {
        self.starts.len() * 8 + self.cols.len() * std::mem::size_of::<S>() as u64
    }

    /// Row blocks (tasks per pass).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the file bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.file.is_direct()
    }

    /// One pass: `rows(starts, end, cols, out)` for every row block in order, `out` the
    /// block's `per_row` outputs per row of `out` (`nrows × per_row` values), `starts` its
    /// rows' first edges (counted from the matrix's first edge), `end` its last edge + 1,
    /// `cols` its columns. Blocks run on the runtime's threads as they arrive.
    pub fn pass<O: Send, F>(&self, runtime: &Runtime, out: &mut [O], per_row: usize, rows: F) -> scalefree_flash::Result<RunStats>
    where
        F: Fn(&[u64], u64, &[S], &mut [O]) + Sync,
    {
        if out.len() != self.nrows() * per_row {
            return Err(FlashError::shape(format!("FlashRows: {} rows of {per_row} outputs, but {} outputs given", self.nrows(), out.len())));
        }
        self.pass_range(runtime, 0, self.nrows(), out, per_row, &mut [] as &mut [u8], 0, |_, starts, end, cols, out, _| rows(starts, end, cols, out))
    }

    /// [`FlashRows::pass`] over rows `lo..hi` only, with a second output (`aux`,
    /// `per_aux` values per row): `rows(at, starts, end, cols, out, aux)` for the part of
    /// every row block that lies in the range, `at` its first row counted from `lo`, `out`
    /// and `aux` its rows' outputs (the whole `out` holds `(hi - lo) × per_row` values). A
    /// block cut by the range is read whole.
    #[allow(clippy::too_many_arguments)]
    pub fn pass_range<O: Send, P: Send, F>(&self, runtime: &Runtime, lo: usize, hi: usize, out: &mut [O], per_row: usize, aux: &mut [P], per_aux: usize, rows: F) -> scalefree_flash::Result<RunStats>
    where
        F: Fn(usize, &[u64], u64, &[S], &mut [O], &mut [P]) + Sync,
    {
        if lo > hi || hi > self.nrows() || out.len() != (hi - lo) * per_row || aux.len() != (hi - lo) * per_aux {
            return Err(FlashError::shape(format!(
                "FlashRows: rows {lo}..{hi} of {} with {per_row} + {per_aux} outputs each, but {} + {} outputs given",
                self.nrows(),
                out.len(),
                aux.len()
            )));
        }
        let window = runtime.options().max_tasks_in_flight.max(1);
        let dag = runtime.dag();
        let mut ids: Vec<TaskId> = Vec::new();
        let (mut rest, mut rest_aux): (&mut [O], &mut [P]) = (out, aux);
        let rows = &rows;
        // The blocks that meet lo..hi, and the rows of each within it.
        let first = self.blocks.partition_point(|b| b.rows.1 <= lo);
        for (i, b) in self.blocks[first..].iter().take_while(|b| b.rows.0 < hi).enumerate() {
            let (r0, r1) = (b.rows.0.max(lo), b.rows.1.min(hi));
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut((r1 - r0) * per_row);
            rest = tail;
            let (mine_aux, tail_aux) = std::mem::take(&mut rest_aux).split_at_mut((r1 - r0) * per_aux);
            rest_aux = tail_aux;
            let reads = vec![
                Access::read(self.starts.access(b.rows.0 as u64, (b.rows.1 - b.rows.0) as u64)?),
                Access::read(self.cols.access(b.edges.0, b.edges.1 - b.edges.0)?),
            ];
            let (b0, e0, e1) = (b.rows.0, b.edges.0, b.edges.1);
            let parents: &[TaskId] = if i >= window { &ids[i - window..i - window + 1] } else { &[] };
            let id = dag.add(
                FnTask::new("graph-rows", reads, move |buffers, _| {
                    let starts = buffers.read::<u64>(0);
                    let cols = buffers.read::<S>(1);
                    let end = if r1 - b0 < starts.len() { starts[r1 - b0] } else { e1 };
                    let (a, z) = ((starts[r0 - b0] - e0) as usize, (end - e0) as usize);
                    rows(r0 - lo, &starts[r0 - b0..r1 - b0], end, &cols[a..z], mine, mine_aux);
                    Ok(())
                }),
                parents,
            )?;
            ids.push(id);
        }
        dag.run()
    }

    /// [`crate::pagerank::spmv_step`] with the matrix read from flash: `x` (scratch, ncols)
    /// gets the scaled sources, `y[..nrows]` the row sums, `y[nrows]` their total (returned
    /// with the pass's statistics). `got`, `inv_deg`, `x`: ncols values; `y`: nrows + 1.
    #[allow(clippy::too_many_arguments)]
    pub fn pagerank_step<T: Real>(&self, runtime: &Runtime, got: &[T], inv_deg: &[T], base: f64, damping: f64, x: &mut [T], y: &mut [T]) -> scalefree_flash::Result<(f64, RunStats)> {
        let nrows = self.nrows();
        if got.len() != self.ncols || inv_deg.len() != self.ncols || x.len() != self.ncols || y.len() != nrows + 1 {
            return Err(FlashError::shape(format!(
                "FlashRows: {nrows} rows, {} columns, but got {}, inv_deg {}, x {}, y {} values",
                self.ncols,
                got.len(),
                inv_deg.len(),
                x.len(),
                y.len()
            )));
        }
        scale_sources(got, inv_deg, base, damping, x);
        let x = &*x;
        let stats = self.pass(runtime, &mut y[..nrows], 1, |starts, end, cols, out| spmv_rows(starts, end, cols, x, out))?;
        Ok((flow_total(y), stats))
    }
}

impl FlashRows<u32> {
    /// [`crate::hadi::union_changed`] over rows `lo..hi` with the edges read from flash:
    /// `ids`, `hit` and `out` (rows of `ID_BYTES + width` bytes) are the range's; the rows
    /// with a changed target are packed at the front of `out`, in order. Returns their
    /// number and the pass's statistics.
    #[allow(clippy::too_many_arguments)]
    pub fn union_changed(&self, runtime: &Runtime, rows: &[u8], width: usize, width_max: usize, changed: &[u8], lo: usize, hi: usize, ids: &[i64], out: &mut [u8], hit: &mut [u8]) -> scalefree_flash::Result<(usize, RunStats)> {
        check_union(rows, width, width_max, changed, hi.saturating_sub(lo), ids, out, hit).map_err(FlashError::shape)?;
        if rows.len() != self.ncols * width {
            return Err(FlashError::shape(format!("FlashRows: rows must be {} rows of {width} bytes, got {} bytes", self.ncols, rows.len())));
        }
        let stats = self.pass_range(runtime, lo, hi, out, ID_BYTES + width, hit, 1, |at, starts, end, cols, out, hit| {
            union_changed_rows(rows, width, width_max, changed, starts, end, cols, &ids[at..at + hit.len()], out, hit)
        })?;
        Ok((pack_rows(out, ID_BYTES + width, hit), stats))
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
                let flash = FlashRows::write(&rt, &ip, &cs, nc).unwrap();
                assert_eq!((flash.nrows(), flash.ncols(), flash.nnz()), (nr, nc, ne as u64));
                for dtype32 in [false, true] {
                    let got: Vec<f64> = (0..nc).map(|i| (i as f64 * 0.37).sin().abs() / nc as f64).collect();
                    let inv: Vec<f64> = (0..nc).map(|i| if i % 5 == 0 { 0.0 } else { 1.0 / (1 + i % 7) as f64 }).collect();
                    if dtype32 {
                        let (g, w): (Vec<f32>, Vec<f32>) = (got.iter().map(|&v| v as f32).collect(), inv.iter().map(|&v| v as f32).collect());
                        let (mut x1, mut y1) = (vec![0f32; nc], vec![0f32; nr + 1]);
                        let t1 = spmv_step(&ip, &cs, &g, &w, 0.01, 0.85, &mut x1, &mut y1);
                        let (mut x2, mut y2) = (vec![0f32; nc], vec![f32::NAN; nr + 1]);
                        let (t2, stats) = flash.pagerank_step(&rt, &g, &w, 0.01, 0.85, &mut x2, &mut y2).unwrap();
                        assert_eq!((t1.to_bits(), y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (t2.to_bits(), y2.iter().map(|v| v.to_bits()).collect()));
                        assert!(stats.cache.peak_resident_bytes <= budget);
                    } else {
                        let (mut x1, mut y1) = (vec![0f64; nc], vec![0f64; nr + 1]);
                        let t1 = spmv_step(&ip, &cs, &got, &inv, 0.01, 0.85, &mut x1, &mut y1);
                        let (mut x2, mut y2) = (vec![0f64; nc], vec![f64::NAN; nr + 1]);
                        let (t2, stats) = flash.pagerank_step(&rt, &got, &inv, 0.01, 0.85, &mut x2, &mut y2).unwrap();
                        assert_eq!((t1.to_bits(), y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (t2.to_bits(), y2.iter().map(|v| v.to_bits()).collect()));
                        assert!(stats.cache.bytes_prefetched >= flash.size_bytes());
                        assert!(stats.cache.peak_resident_bytes <= budget);
                    }
                }
                let mut y = vec![0f64; nr + 2];
                assert!(flash.pagerank_step(&rt, &vec![0.0; nc], &vec![0.0; nc], 0.0, 0.0, &mut vec![0.0; nc], &mut y).is_err());
            }
        }
    }

    #[test]
    fn u64_slots_on_flash_equal_the_u32_step_bit_for_bit() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 4096, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
        let mut seed = 17u64;
        let (nr, nc, ne) = (300usize, 200usize, 5000usize);
        let rows: Vec<u32> = (0..ne).map(|_| rng(&mut seed, nr as u32)).collect();
        let cols: Vec<u32> = (0..ne).map(|_| rng(&mut seed, nc as u32)).collect();
        let (ip, cs) = csr_pattern(&rows, &cols, nr, nc).unwrap();
        let cs64: Vec<u64> = cs.iter().map(|&c| c as u64).collect();
        let narrow = FlashRows::write(&rt, &ip, &cs, nc).unwrap();
        let wide = FlashRows::write(&rt, &ip, &cs64, nc).unwrap();
        assert_eq!(wide.size_bytes(), narrow.size_bytes() + 4 * ne as u64); // 8 bytes per edge, not 4
        assert!(wide.blocks() > narrow.blocks()); // the same budget holds half the edges per block
        let got: Vec<f64> = (0..nc).map(|i| (i as f64 * 0.37).sin().abs() / nc as f64).collect();
        let inv: Vec<f64> = (0..nc).map(|i| if i % 5 == 0 { 0.0 } else { 1.0 / (1 + i % 7) as f64 }).collect();
        let (mut x1, mut y1) = (vec![0f64; nc], vec![0f64; nr + 1]);
        let t1 = spmv_step(&ip, &cs, &got, &inv, 0.01, 0.85, &mut x1, &mut y1);
        let (mut x2, mut y2) = (vec![0f64; nc], vec![f64::NAN; nr + 1]);
        let (t2, stats) = wide.pagerank_step(&rt, &got, &inv, 0.01, 0.85, &mut x2, &mut y2).unwrap();
        assert_eq!((t1.to_bits(), y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (t2.to_bits(), y2.iter().map(|v| v.to_bits()).collect()));
        assert!(stats.cache.peak_resident_bytes <= 4096);
    }

    #[test]
    fn flash_union_equals_the_in_memory_kernel_on_every_range() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 8192, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
        let mut seed = 5u64;
        for &(nr, nc, ne, width, wm) in &[(1usize, 1usize, 0usize, 1usize, 1usize), (3, 4, 9, 3, 2), (500, 300, 6000, 12, 4)] {
            let rows: Vec<u32> = (0..ne).map(|_| rng(&mut seed, nr as u32)).collect();
            let cols: Vec<u32> = (0..ne).map(|_| rng(&mut seed, nc as u32)).collect();
            let (ip, cs) = csr_pattern(&rows, &cols, nr, nc).unwrap();
            let regs: Vec<u8> = (0..nc * width).map(|_| rng(&mut seed, 250) as u8).collect();
            let changed: Vec<u8> = (0..nc).map(|_| (rng(&mut seed, 3) != 0) as u8).collect();
            let ids: Vec<i64> = (0..nr as i64).map(|i| i * 7 - 3).collect();
            let ip64: Vec<i64> = ip.iter().map(|&v| v as i64).collect();
            let flash = FlashRows::write(&rt, &ip, &cs, nc).unwrap();
            assert!(nr < 100 || flash.blocks() > 3, "{}", flash.blocks());
            let rb = ID_BYTES + width;
            for (lo, hi) in [(0, nr), (0, 0), (nr / 3, nr / 3 + 1), (nr / 5, nr - nr / 7), (nr - 1, nr)] {
                let mut want = vec![0u8; (hi - lo) * rb];
                let mut want_hit = vec![0u8; hi - lo];
                let k = crate::hadi::union_changed(&regs, width, wm, &changed, &cs, &ip64[lo..hi + 1], &ids[lo..hi], &mut want, &mut want_hit).unwrap();
                let mut got = vec![99u8; (hi - lo) * rb];
                let mut hit = vec![7u8; hi - lo];
                let (k2, stats) = flash.union_changed(&rt, &regs, width, wm, &changed, lo, hi, &ids[lo..hi], &mut got, &mut hit).unwrap();
                assert_eq!((k2, &got[..k * rb], &hit), (k, &want[..k * rb], &want_hit), "{nr} {nc} {ne} {width} {lo}..{hi}");
                assert!(stats.cache.peak_resident_bytes <= 8192);
            }
            let mut got = vec![0u8; nr * rb];
            let mut hit = vec![0u8; nr];
            assert!(flash.union_changed(&rt, &regs[1..], width, wm, &changed, 0, nr, &ids, &mut got, &mut hit).is_err());
            assert!(flash.union_changed(&rt, &regs, width, wm, &changed, 0, nr + 1, &ids, &mut got, &mut hit).is_err());
        }
        assert!(FlashRows::write(&rt, &[0, 1], &[7u32], 7).is_err());
    }

    #[test]
    fn a_row_larger_than_the_budget_is_refused() {
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: 4096, compute_threads: 1, io_threads: 1, max_tasks_in_flight: 2, ..RuntimeOptions::default() }).unwrap();
        let cols: Vec<u32> = (0..2000).collect();
        let err = FlashRows::write(&rt, &[0, 2000], &cols, 2000).err().unwrap();
        assert!(matches!(err, FlashError::OutOfBudget { .. }), "{err}");
        assert!(FlashRows::write(&rt, &[1, 2], &cols[..1], 2000).is_err());
    }
}
