//! `local` mode: one process, several threads, FPSGD-style block scheduling.
//!
//! R is cut into `nb × nb` blocks (default max(20, 2t + 1) per side for t threads, LIBMF's
//! `nr_bins`) after a random permutation of users and items, so blocks hold similar numbers
//! of ratings. Every epoch runs each block once, in a random order drawn from the seed and
//! the epoch number (LIBMF draws a random priority per block and round): a thread takes the
//! next block of that order whose row block and column block are both free, so the blocks
//! running at once touch disjoint rows of P and Q and need no locks. There is no barrier
//! between epochs: a thread that finds the epoch's blocks all handed out starts on the next
//! epoch's while the others finish theirs (as LIBMF's threads do); only at an epoch's tail,
//! when every block left shares a row or column block with a running one, does a thread
//! wait. The scheduler's lock is taken once per block (hundreds to thousands of ratings),
//! never per update; the kernel itself
//! uses no locks or atomics.
//!
//! Layout: users and items are renumbered by the seeded permutation, so a block row is a
//! contiguous range of rows of P (and of the AdaGrad accumulators), a block column one of Q:
//! two threads never write to the same cache line except at a range's ends. Rows are numbered
//! in 64 bits from the ratings' dense base ([`Ratings::base`], 0 but under the test knob
//! `SCALEFREE_TEST_MF_DENSE_BASE`), and each block row and column has a 64-bit first row
//! ([`block_starts`]). The ratings of all blocks sit in one array of 12-byte entries (u32 user,
//! u32 item, f32 rating), block after block; an entry's user and item are offsets from its
//! block's first row and column (the kernel gets P and Q from there on), so the id space may
//! pass 2^32 while no block spans more than 2^32 rows or columns. Each block is sorted by user
//! when there are more users than items and by item otherwise (LIBMF's order), then its two halves interleaved (see
//! [`interleave_halves`]: consecutive updates rarely share a row, so they overlap). P and Q rows are
//! padded to k rounded up to 8 floats (zeros in the padding) and the arrays start on a
//! 64-byte boundary, so the SIMD kernels load whole rows without a scalar tail.
//!
//! Out of core ([`LocalOptions::memory_budget`]): the blocks are written once to a scratch
//! file on flash (each at a 4 KiB boundary, so O_DIRECT reads them whole) and the in-memory
//! copy is dropped; a thread that takes a block reads it through the flash runtime's program
//! cache ([`scalefree_flash::CacheReader`], at most the budget resident), which prefetches the
//! blocks of the pass's order ahead of the threads as far as the budget allows; the next pass's
//! order is announced while the current one runs (across calls too), so the reads do not stop
//! at a pass's tail. The blocks, their order inside and the schedule are those of the
//! in-memory run.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

use scalefree_flash::{AccessSpec, CacheReader, FlashFile, ReaderStats, Runtime, RuntimeOptions};

use crate::data::DenseIds;
use crate::error::{MfError, Result};
use crate::kernel::{padded_k, sgd_block_ld, sq_error_ld, Entry, Factors, Isa, Schedule, SgdParams};
use crate::model::Model;
use crate::rng::Rng;
use crate::Ratings;

#[derive(Clone, Debug)]
pub struct LocalOptions {
    pub k: usize,
    pub eta: f32,
    pub lambda: f32,
    pub schedule: Schedule,
    pub threads: usize,
    /// Blocks per side; default max(20, 2 × threads + 1) (LIBMF's).
    pub blocks: Option<usize>,
    pub seed: u64,
    /// Factors start uniform in [0, init_max]; default 1/√k (LIBMF's scale).
    pub init_max: Option<f32>,
    /// Kernel build; default [`Isa::best`].
    pub isa: Option<Isa>,
    /// Train on ratings divided by their standard deviation s with λ divided by s, as LIBMF
    /// does: the same objective on the raw ratings, better conditioned steps; predictions
    /// are scaled back. Default on.
    pub normalize: bool,
    /// Out of core: bytes of rating blocks held in memory at most (the program cache's
    /// budget); the blocks stay on flash. None (the default): all in memory.
    pub memory_budget: Option<u64>,
    /// Directory of the blocks' scratch file (default: the flash runtime's, see
    /// [`scalefree_flash::default_scratch_dir`]).
    pub flash_dir: Option<PathBuf>,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions { k: 40, eta: 0.1, lambda: 0.05, schedule: Schedule::Adagrad, threads: 2, blocks: None, seed: 0, init_max: None, isa: None, normalize: true, memory_budget: None, flash_dir: None }
    }
}

struct Sched {
    row_busy: Vec<bool>,
    col_busy: Vec<bool>,
    counts: Vec<u32>,
    /// The blocks of pass `pass` not handed out yet, in the pass's random order.
    pending: Vec<u32>,
    /// The pass (0-based within this call) whose blocks are being handed out.
    pass: usize,
    /// Σ e² of each pass of this call.
    loss: Vec<f64>,
    /// A block read failed: every thread stops.
    error: Option<MfError>,
}

/// Bytes a block of `n` ratings takes on flash and in the cache: whole 4 KiB pages.
fn padded_bytes(n: usize) -> u64 {
    (n as u64 * std::mem::size_of::<Entry>() as u64).div_ceil(4096) * 4096
}

/// The blocks on flash and the reader that brings them into memory.
struct FlashBlocks {
    reader: CacheReader,
    /// Block b's pages in the scratch file.
    specs: Vec<AccessSpec>,
    /// The first pass (counted from the first pass ever) whose order the reader has not been
    /// told yet; None before the first call.
    next_announced: Mutex<Option<u64>>,
}

impl FlashBlocks {
    /// Writes the blocks to a scratch file; checks that `threads` blocks fit the budget at once.
    fn write(entries: &[Entry], starts: &[usize], nb: usize, threads: usize, budget: u64, dir: Option<&std::path::Path>) -> Result<FlashBlocks> {
        let sizes: Vec<u64> = starts.windows(2).map(|w| padded_bytes(w[1] - w[0])).collect();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let need = largest * threads as u64;
        if need > budget {
            return Err(MfError::OutOfBudget(format!(
                "memory budget of {budget} bytes is smaller than the blocks {threads} thread(s) hold at once: the largest of the {nb} x {nb} blocks takes {largest} bytes (whole 4 KiB pages); raise the budget to at least {need} bytes or cut R into more blocks (--blocks)"
            )));
        }
        let flash = |e: scalefree_flash::FlashError| MfError::Flash(e.to_string());
        let mut o = RuntimeOptions::from_env().map_err(flash)?;
        o.memory_budget_bytes = budget;
        o.compute_threads = 1;
        o.max_tasks_in_flight = 3;
        // Blocks are small (tens to hundreds of KiB) and the reader keeps many in flight: each
        // is one read (the runtime's default splits a request across its IO threads, which
        // turns a 56 KiB block into four 14 KiB reads), and more reads at once than its
        // default 4 threads (a virtio disk's throughput grows with the queue depth;
        // `SCALEFREE_FLASH_IO_THREADS` still decides when set).
        o.io_min_job_bytes = o.io_chunk_bytes;
        if std::env::var_os("SCALEFREE_FLASH_IO_THREADS").is_none() {
            o.io_threads = o.io_threads.max(8);
        }
        if let Some(d) = dir {
            o.dir = d.to_path_buf();
        }
        let rt = Arc::new(Runtime::new(o).map_err(flash)?);
        let total: u64 = sizes.iter().sum();
        let file = FlashFile::scratch(rt.dir(), total.max(4096), &rt.file_options()).map_err(flash)?;
        let mut specs = Vec::with_capacity(sizes.len());
        let mut at = 0u64;
        for (b, &size) in sizes.iter().enumerate() {
            let blk = &entries[starts[b]..starts[b + 1]];
            // SAFETY: Entry is three 4-byte plain fields, repr(C), no padding.
            let bytes = unsafe { std::slice::from_raw_parts(blk.as_ptr() as *const u8, std::mem::size_of_val(blk)) };
            file.write_bytes(at, bytes).map_err(flash)?;
            specs.push(AccessSpec::contiguous(file.clone(), at, size).map_err(flash)?);
            at += size;
        }
        // Prefetch depth: as far as the budget goes (the budget, not this, is the limit).
        let reader = CacheReader::new(rt, budget, 1 << 16).map_err(flash)?;
        Ok(FlashBlocks { reader, specs, next_announced: Mutex::new(None) })
    }

    /// Tells the reader the hand-out order of every pass up to `last` (inclusive) not told
    /// yet (`order(e)` is pass e's pending list, handed out from the end). Announcing the next
    /// pass while the current one runs keeps the reads going across the pass boundary — at a
    /// pass's tail the threads still work on its last blocks while the next pass's first are
    /// read — and across calls (a call of one pass announces the next call's). `first`: the
    /// pass the caller starts now; an announcement that does not continue at it (state restored
    /// from a checkpoint) is dropped first.
    fn announce_through(&self, first: u64, last: u64, order: impl Fn(u64) -> Vec<u32>) {
        let mut next = self.next_announced.lock().unwrap();
        let from = match *next {
            Some(e) if e >= first && e <= first + 1 => e,
            Some(_) => {
                self.reader.clear_ahead();
                first
            }
            None => first,
        };
        for e in from..=last {
            self.reader.push_ahead(order(e).iter().rev().map(|&b| self.specs[b as usize].clone()));
        }
        *next = Some(from.max(last + 1));
    }
}

/// Reorders a block sorted by item (or user) so that its first and second halves alternate:
/// e0, e_h, e1, e_h+1, ... (h = ⌈len/2⌉). Consecutive updates then belong to two different
/// runs of the same item (user), so they rarely share a row, and the CPU overlaps one update's
/// dot product and step with the other's instead of waiting for the shared row's store; the
/// ratings of each item (user) keep their order.
fn interleave_halves(blk: &mut [Entry]) {
    if blk.len() < 3 {
        return;
    }
    let src = blk.to_vec();
    let (a, b) = src.split_at(src.len().div_ceil(2));
    for (j, e) in blk.iter_mut().enumerate() {
        *e = if j % 2 == 0 { a[j / 2] } else { b[j / 2] };
    }
}

/// The first row of each of the `nb` block rows (columns) of `rows` rows numbered from `base`,
/// then `base + rows`: block row `b` holds the rows `base + r` with `r · nb / rows == b` (the
/// rule [`LocalTrainer::new`] sorts ratings into blocks by), i.e. from `base + ⌈b · rows / nb⌉`.
/// An entry holds its row as a 32-bit offset from its block's first row, so a block of more
/// than 2^32 rows is an error naming `side` and the blocks per side it would take.
pub fn block_starts(rows: u64, nb: usize, base: u64, side: &str) -> Result<Vec<u64>> {
    let nb128 = nb.max(1) as u128;
    if base.checked_add(rows).is_none() || (rows as u128) * nb128 > u64::MAX as u128 {
        return Err(MfError::InvalidArgument(format!("local mode: {rows} {side} from dense id {base} with {nb} blocks per side overflow 64 bits")));
    }
    let starts: Vec<u64> = (0..=nb as u128).map(|b| base + (b * rows as u128).div_ceil(nb128) as u64).collect();
    let tallest = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    if tallest > 1 << 32 {
        let need = rows.div_ceil(1 << 32);
        return Err(MfError::InvalidArgument(format!(
            "local mode: a block of the {nb} x {nb} grid spans {tallest} {side}, past 2^32 (rows within a block are 32-bit): use at least {need} blocks per side (--blocks)"
        )));
    }
    Ok(starts)
}

/// The seeded permutation of `rows` rows numbered from `base` (`rows[d]`: the row of dense id
/// `d`), 4 bytes each while every row fits. The shuffle's draws depend on the count alone, so
/// the permutation is the same at either width and at any base.
fn permuted_rows(rows: usize, base: u64, rng: &mut Rng) -> DenseIds {
    if rows as u64 <= 1 << 32 && base + rows as u64 <= 1 << 32 {
        let mut v: Vec<u32> = (0..rows).map(|x| base as u32 + x as u32).collect();
        rng.shuffle(&mut v);
        DenseIds::Narrow(v)
    } else {
        let mut v: Vec<u64> = (0..rows as u64).map(|x| base + x).collect();
        rng.shuffle(&mut v);
        DenseIds::Wide(v)
    }
}

/// `rows × ld` floats starting on a 64-byte boundary.
struct Rows {
    buf: Vec<Align64>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Align64([f32; 16]);

impl Rows {
    fn zeros(len: usize) -> Rows {
        Rows { buf: vec![Align64([0.0; 16]); len.div_ceil(16)], len }
    }
    fn as_slice(&self) -> &[f32] {
        // SAFETY: Align64 is 16 plain f32s with no padding; `len` ≤ 16 × buf.len().
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const f32, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr() as *mut f32, self.len) }
    }
}

/// A [`LocalTrainer`]'s mutable state (see [`LocalTrainer::state`]).
pub struct TrainerState {
    pub p: Vec<f32>,
    pub q: Vec<f32>,
    pub pg: Vec<f32>,
    pub qg: Vec<f32>,
    pub counts: Vec<u32>,
    pub epochs: u64,
}

pub struct LocalTrainer {
    prm: SgdParams,
    isa: Isa,
    ld: usize,
    threads: usize,
    nb: usize,
    /// Block b's ratings are `entries[starts[b]..starts[b + 1]]` (empty when on flash), rows
    /// as offsets from the block's first row and column (`ustart`, `istart`).
    entries: Vec<Entry>,
    /// Out of core: the blocks on flash.
    flash: Option<FlashBlocks>,
    starts: Vec<usize>,
    counts: Vec<u32>,
    p: Rows,
    q: Rows,
    pg: Vec<f32>,
    qg: Vec<f32>,
    user_ids: Vec<u64>,
    item_ids: Vec<u64>,
    mean: f32,
    /// Ratings were divided by this for training (1 unless `normalize`).
    scale: f32,
    /// Whether each internal user / item had ratings (indexed like the rows of P / Q).
    known_u: Vec<bool>,
    known_i: Vec<bool>,
    /// Row of dense user (item) id `u − base`: the seeded permutation of the rows `base..base
    /// + m`; P (Q) holds row `r` at `r − base`.
    user_row: DenseIds,
    item_row: DenseIds,
    /// The first row (column) of each block row (column), and the end: [`block_starts`].
    ustart: Vec<u64>,
    istart: Vec<u64>,
    /// The ratings' dense base: the first row.
    base: u64,
    n: usize,
    seed: u64,
    epochs: u64,
}

impl LocalTrainer {
    pub fn new(train: &Ratings, o: &LocalOptions) -> Result<LocalTrainer> {
        if o.k == 0 || o.threads == 0 {
            return Err(MfError::InvalidArgument("k and threads must be at least 1".into()));
        }
        if !(o.eta > 0.0 && o.eta.is_finite() && o.lambda >= 0.0 && o.lambda.is_finite()) {
            return Err(MfError::InvalidArgument(format!("need eta > 0 and lambda >= 0, got {} and {}", o.eta, o.lambda)));
        }
        if train.is_empty() {
            return Err(MfError::InvalidArgument("no training ratings".into()));
        }
        let nb = o.blocks.unwrap_or((2 * o.threads + 1).max(20)).max(1);
        if nb < o.threads + 1 && o.threads > 1 {
            return Err(MfError::InvalidArgument(format!("blocks per side ({nb}) must exceed threads ({})", o.threads)));
        }
        let (m, n, k) = (train.n_users(), train.n_items(), o.k);
        let base = train.base;
        // Rows are 64-bit; only a block's rows (its entries' offsets) are 32-bit.
        let ustart = block_starts(m as u64, nb, base, "users")?;
        let istart = block_starts(n as u64, nb, base, "items")?;
        let mut rng = Rng::new(o.seed);
        let up = permuted_rows(m, base, &mut rng);
        let ip = permuted_rows(n, base, &mut rng);
        // Counting sort of the ratings by block, then a seeded shuffle inside each block. `u`,
        // `i`: rows counted from the base (below m, n; m · nb fits 64 bits: `block_starts`).
        let block_of = |u: u64, i: u64| (u as usize * nb / m) * nb + i as usize * nb / n;
        let mut starts = vec![0usize; nb * nb + 1];
        for (u, i, _) in train.rows() {
            starts[block_of(up.get(u) - base, ip.get(i) - base) + 1] += 1;
        }
        for b in 0..nb * nb {
            starts[b + 1] += starts[b];
        }
        let scale = if o.normalize {
            let mean = train.mean();
            let var = train.values.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / train.len() as f64;
            (var.sqrt() as f32).max(1e-4)
        } else {
            1.0
        };
        let mut fill = starts.clone();
        let mut entries = vec![Entry { u: 0, i: 0, r: 0.0 }; train.len()];
        let (mut known_u, mut known_i) = (vec![false; m], vec![false; n]);
        for (u, i, r) in train.rows() {
            let (u, i) = (up.get(u), ip.get(i));
            let b = block_of(u - base, i - base);
            // Offsets within the block's rows and columns: below 2^32 (`block_starts`).
            entries[fill[b]] = Entry { u: (u - ustart[b / nb]) as u32, i: (i - istart[b % nb]) as u32, r: r / scale };
            fill[b] += 1;
            known_u[(u - base) as usize] = true;
            known_i[(i - base) as usize] = true;
        }
        // LIBMF's order inside a block: by user when users outnumber items, else by item
        // (after the seeded shuffle, so ties keep a seeded order); then the halves interleaved.
        for b in 0..nb * nb {
            let blk = &mut entries[starts[b]..starts[b + 1]];
            rng.shuffle(blk);
            if m > n {
                blk.sort_by_key(|e| e.u);
            } else {
                blk.sort_by_key(|e| e.i);
            }
            interleave_halves(blk);
        }
        let flash = match o.memory_budget {
            None => None,
            Some(budget) => Some(FlashBlocks::write(&entries, &starts, nb, o.threads, budget, o.flash_dir.as_deref())?),
        };
        if flash.is_some() {
            entries = Vec::new();
        }
        let mean = train.mean() as f32;
        // `adagrad` in local mode is LIBMF's split rule (see `Schedule::AdagradSplit`).
        let schedule = match o.schedule {
            Schedule::Adagrad => Schedule::AdagradSplit { slow_only: false },
            s => s,
        };
        let init_max = o.init_max.unwrap_or(1.0 / (k as f32).sqrt());
        let ld = padded_k(k);
        let mut init = |rows: usize| {
            let mut a = Rows::zeros(rows * ld);
            for row in a.as_mut_slice().chunks_exact_mut(ld) {
                for x in &mut row[..k] {
                    *x = rng.unit_f32() * init_max;
                }
            }
            a
        };
        let p = init(m);
        let q = init(n);
        Ok(LocalTrainer {
            // λ in the units of the scaled ratings (LIBMF: lambda_p2 /= scale).
            prm: SgdParams { k, eta: o.eta, lambda: o.lambda / scale, schedule },
            isa: o.isa.filter(|i| i.available()).unwrap_or_else(Isa::best),
            ld,
            threads: o.threads,
            nb,
            counts: vec![0; nb * nb],
            entries,
            flash,
            starts,
            p,
            q,
            pg: vec![1.0; m * schedule.acc_per_row()],
            qg: vec![1.0; n * schedule.acc_per_row()],
            user_ids: train.user_ids.clone(),
            item_ids: train.item_ids.clone(),
            mean,
            scale,
            known_u,
            known_i,
            user_row: up,
            item_row: ip,
            ustart,
            istart,
            base,
            n: train.len(),
            seed: o.seed,
            epochs: 0,
        })
    }

    pub fn epochs(&self) -> u64 {
        self.epochs
    }
    pub fn n_ratings(&self) -> usize {
        self.n
    }
    /// The kernel build in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// One pass (nb² block runs over `threads` threads). Returns the mean squared error seen
    /// during the pass (each rating's error just before its update).
    pub fn epoch(&mut self) -> f64 {
        self.run_epochs(1)[0]
    }

    /// Whether the rating blocks are on flash ([`LocalOptions::memory_budget`]).
    pub fn out_of_core(&self) -> bool {
        self.flash.is_some()
    }

    /// Out of core: the block reader's counters (peak bytes resident, bytes read, waits).
    pub fn flash_stats(&self) -> Option<ReaderStats> {
        self.flash.as_ref().map(|f| f.reader.stats())
    }

    /// The order in which pass `epoch` (counted from the first pass ever) hands out its
    /// blocks: a random permutation of the nb² blocks from the seed and the pass number.
    fn pass_order(&self, epoch: u64) -> Vec<u32> {
        let mut v: Vec<u32> = (0..(self.nb * self.nb) as u32).collect();
        Rng::new(self.seed.wrapping_mul(0x100_0000).wrapping_add(epoch.wrapping_mul(1000))).shuffle(&mut v);
        v.reverse(); // handed out from the end
        v
    }

    /// The factors of block `b`: `f` moved to the block's first row of P (and of P's
    /// accumulators) and first column of Q, which its entries' offsets count from.
    #[inline]
    fn block_factors(&self, f: Factors, b: usize) -> Factors {
        let (ur, ir) = ((self.ustart[b / self.nb] - self.base) as usize, (self.istart[b % self.nb] - self.base) as usize);
        let (ld, acc) = (self.ld, self.prm.schedule.acc_per_row());
        Factors { p: f.p.wrapping_add(ur * ld), q: f.q.wrapping_add(ir * ld), pg: f.pg.wrapping_add(ur * acc), qg: f.qg.wrapping_add(ir * acc) }
    }

    /// The first row of each block row and the first column of each block column (then the
    /// ends), counted from the ratings' dense base: what the entries' 32-bit offsets add to.
    pub fn block_starts(&self) -> (&[u64], &[u64]) {
        (&self.ustart, &self.istart)
    }

    /// `n` passes on one set of threads; returns each pass's mean squared error seen during
    /// the pass.
    ///
    /// Each pass runs every block once, in a random order (LIBMF's scheduler draws a random
    /// priority per block and round): a thread takes the next block of that order whose row
    /// and column blocks are free. No barrier between passes: once a pass has handed out its
    /// last block, threads go on with the next pass's blocks (still only free ones) while the
    /// others finish theirs, as LIBMF's threads do.
    ///
    /// Panics if a block read from flash fails (out of core); [`LocalTrainer::try_run_epochs`]
    /// returns the error instead.
    pub fn run_epochs(&mut self, n: usize) -> Vec<f64> {
        self.try_run_epochs(n).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`LocalTrainer::run_epochs`], with the error of a failed block read.
    pub fn try_run_epochs(&mut self, n: usize) -> Result<Vec<f64>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let nb = self.nb;
        let first = self.epochs;
        let sched = Mutex::new(Sched {
            row_busy: vec![false; nb],
            col_busy: vec![false; nb],
            counts: std::mem::take(&mut self.counts),
            pending: self.pass_order(first),
            pass: 0,
            loss: vec![0.0; n],
            error: None,
        });
        let flash = self.flash.as_ref();
        if let Some(fb) = flash {
            fb.announce_through(first, first + 1, |e| self.pass_order(e));
        }
        let freed = Condvar::new();
        let f = Factors { p: self.p.as_mut_slice().as_mut_ptr(), q: self.q.as_mut_slice().as_mut_ptr(), pg: self.pg.as_mut_ptr(), qg: self.qg.as_mut_ptr() };
        let (entries, starts, prm, ld, isa) = (&self.entries, &self.starts, &self.prm, self.ld, self.isa);
        let n_ratings = self.n as f64 / (self.scale as f64).powi(2);
        let this = &*self;
        let work = || {
            let mut held: Option<(usize, usize, f64)> = None; // (block, pass, Σ e²)
            loop {
                let (b, pass) = {
                    let mut s = sched.lock().unwrap();
                    if let Some((h, pass, l)) = held.take() {
                        s.row_busy[h / nb] = false;
                        s.col_busy[h % nb] = false;
                        s.counts[h] += 1;
                        s.loss[pass] += l;
                        freed.notify_all();
                    }
                    loop {
                        if s.error.is_some() {
                            break None;
                        }
                        if s.pending.is_empty() {
                            if s.pass + 1 == n {
                                break None;
                            }
                            s.pass += 1;
                            s.pending = this.pass_order(first + s.pass as u64);
                            if let Some(fb) = flash {
                                let now = first + s.pass as u64;
                                fb.announce_through(now, now + 1, |e| this.pass_order(e));
                            }
                        }
                        // The next block of the order whose row and column blocks are free.
                        let free = s.pending.iter().rposition(|&c| !(s.row_busy[c as usize / nb] || s.col_busy[c as usize % nb]));
                        match free {
                            Some(at) => {
                                let c = s.pending.remove(at) as usize;
                                s.row_busy[c / nb] = true;
                                s.col_busy[c % nb] = true;
                                break Some((c, s.pass));
                            }
                            // Only blocks sharing a row or column with running ones are left in
                            // this pass: wait for one of those to finish.
                            None => s = freed.wait(s).unwrap(),
                        }
                    }
                }
                .map_or((usize::MAX, 0), |x| x);
                if b == usize::MAX {
                    return;
                }
                // LIBMF updates only the first SLOW lanes in its first pass.
                let prm_b = match prm.schedule {
                    Schedule::AdagradSplit { .. } => SgdParams { schedule: Schedule::AdagradSplit { slow_only: first + pass as u64 == 0 }, ..*prm },
                    _ => *prm,
                };
                // Block b's entries index P and Q from its first row and column on.
                let f = this.block_factors(f, b);
                // SAFETY: block b's rows and columns are marked busy, so no other thread
                // touches the rows of P/Q (and their accumulators) it indexes; its offsets are
                // below its height and width (`new`); rows are ld = padded_k(k) floats with
                // zero padding.
                let l = match flash {
                    None => unsafe { sgd_block_ld(&entries[starts[b]..starts[b + 1]], f, &prm_b, ld, isa) },
                    Some(_) if starts[b] == starts[b + 1] => 0.0,
                    Some(fb) => match fb.reader.get(&fb.specs[b]) {
                        Ok(blk) => {
                            let count = starts[b + 1] - starts[b];
                            // SAFETY: the block's bytes are `count` entries written by `FlashBlocks::write`
                            // (then padding), in a 4 KiB-aligned buffer; the rest as above.
                            unsafe {
                                let ents = std::slice::from_raw_parts(blk.bytes().as_ptr() as *const Entry, count);
                                sgd_block_ld(ents, f, &prm_b, ld, isa)
                            }
                        }
                        Err(e) => {
                            sched.lock().unwrap().error.get_or_insert(MfError::Flash(e.to_string()));
                            freed.notify_all();
                            0.0
                        }
                    },
                };
                held = Some((b, pass, l));
            }
        };
        if self.threads == 1 {
            work();
        } else {
            std::thread::scope(|sc| {
                for _ in 1..self.threads {
                    sc.spawn(work);
                }
                work();
            });
        }
        let s = sched.into_inner().unwrap();
        self.counts = s.counts;
        if let Some(e) = s.error {
            return Err(e);
        }
        self.epochs += n as u64;
        Ok(s.loss.iter().map(|l| l / n_ratings).collect())
    }

    /// RMSE on ratings sharing the training id maps (e.g. the test half of `Ratings::split`).
    pub fn rmse(&self, r: &Ratings) -> Result<f64> {
        if !r.shares_ids_with(&self.user_ids, &self.item_ids) {
            return Err(MfError::InvalidArgument("ratings do not share the training id maps (numbered separately: align them to the training set first)".into()));
        }
        if r.is_empty() {
            return Ok(f64::NAN);
        }
        let (k, ld) = (self.prm.k, self.ld);
        let t = self.threads.max(1);
        let chunk = r.len().div_ceil(t);
        // The factors predict ratings divided by `scale`; compare in those units.
        let (p, q, ku, ki, scale) = (self.p.as_slice(), self.q.as_slice(), &self.known_u, &self.known_i, self.scale);
        let mean = self.mean / scale;
        let (ur, ir, base) = (&self.user_row, &self.item_row, self.base);
        let total: f64 = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..t)
                .map(|c| {
                    sc.spawn(move || {
                        let lo = (c * chunk).min(r.len());
                        let hi = ((c + 1) * chunk).min(r.len());
                        // Ids past the training maps (unseen in training) map past the rows: the mean.
                        let row = |map: &DenseIds, d: usize| if d < map.len() { (map.get(d) - base) as usize } else { usize::MAX };
                        let it = (lo..hi).map(|n| (row(ur, r.user_row(n)), row(ir, r.item_row(n)), r.values[n] / scale));
                        sq_error_ld(it, p, q, k, ld, ku, ki, mean)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        Ok((total / r.len() as f64).sqrt() * scale as f64)
    }

    /// Everything a later run needs to continue exactly (a checkpoint): the padded factor
    /// rows P and Q, the AdaGrad accumulators, the per-block run counts of the scheduler and
    /// the epochs done (each epoch's thread RNGs derive from the seed and this count).
    pub fn state(&self) -> TrainerState {
        TrainerState {
            p: self.p.as_slice().to_vec(),
            q: self.q.as_slice().to_vec(),
            pg: self.pg.clone(),
            qg: self.qg.clone(),
            counts: self.counts.clone(),
            epochs: self.epochs,
        }
    }

    /// Restores a [`LocalTrainer::state`] of a trainer built from the same ratings and options.
    pub fn set_state(&mut self, s: TrainerState) -> Result<()> {
        let same = s.p.len() == self.p.len && s.q.len() == self.q.len && s.pg.len() == self.pg.len() && s.qg.len() == self.qg.len() && s.counts.len() == self.nb * self.nb;
        if !same {
            return Err(MfError::InvalidArgument("checkpoint state does not match this trainer's sizes (other data, k, blocks or schedule)".into()));
        }
        self.p.as_mut_slice().copy_from_slice(&s.p);
        self.q.as_mut_slice().copy_from_slice(&s.q);
        self.pg = s.pg;
        self.qg = s.qg;
        self.counts = s.counts;
        self.epochs = s.epochs;
        if let Some(fb) = &self.flash {
            // The passes announced ahead belong to the state being replaced.
            fb.reader.clear_ahead();
            *fb.next_announced.lock().unwrap() = None;
        }
        Ok(())
    }

    pub fn model(&self) -> Model {
        let (k, ld) = (self.prm.k, self.ld);
        // Back to dense-id order, without the padding.
        let c = self.scale.sqrt();
        let base = self.base;
        let unpad = |a: &Rows, rows: &DenseIds| -> Vec<f32> { rows.iter().map(|r| (r - base) as usize).flat_map(|r| a.as_slice()[r * ld..r * ld + k].iter().map(|&x| x * c)).collect() };
        let known = |k: &[bool], rows: &DenseIds| -> Vec<bool> { rows.iter().map(|r| k[(r - base) as usize]).collect() };
        Model {
            k,
            p: unpad(&self.p, &self.user_row),
            q: unpad(&self.q, &self.item_row),
            user_ids: self.user_ids.clone(),
            item_ids: self.item_ids.clone(),
            mean: self.mean,
            known_u: known(&self.known_u, &self.user_row),
            known_i: known(&self.known_i, &self.item_row),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = (1 << 32) + 12_345;

    /// `r` with its dense ids numbered from `base` (8 bytes wide past 2^32).
    fn rebased(r: &Ratings, base: u64) -> Ratings {
        let shift = |d: &DenseIds| DenseIds::from_u64s(d.iter().map(|x| x - r.base + base).collect());
        Ratings { users: shift(&r.users), items: shift(&r.items), base, ..r.clone() }
    }

    fn ratings(m: u64, n: u64, nnz: usize, seed: u64) -> Ratings {
        let mut rng = Rng::new(seed);
        let (mut us, mut is, mut vs) = (vec![], vec![], vec![]);
        for _ in 0..nnz {
            us.push(rng.below(m as usize) as u64 * 3 + 1);
            is.push(rng.below(n as usize) as u64 * 5 + 2);
            vs.push(1.0 + 4.0 * rng.unit_f32());
        }
        Ratings::from_triples(&us, &is, &vs).unwrap()
    }

    #[test]
    fn block_starts_are_64_bit_and_only_a_block_past_2_to_the_32_rows_is_refused() {
        // The rule ratings are sorted by: row r (from the base) in block r · nb / rows.
        for (rows, nb) in [(1u64, 1usize), (1, 20), (7, 3), (37, 5), (1000, 20), (19, 20)] {
            let s = block_starts(rows, nb, BASE, "users").unwrap();
            assert_eq!((s.len(), s[0], s[nb]), (nb + 1, BASE, BASE + rows));
            for r in 0..rows {
                let b = (r * nb as u64 / rows) as usize;
                assert!(s[b] <= BASE + r && BASE + r < s[b + 1], "rows {rows} nb {nb} row {r}");
            }
        }
        // 2^34 + 7 users fit 5 or more blocks per side (each at most 2^32 rows), not 4; the
        // starts pass 2^32 from block 2 on.
        let rows = (1u64 << 34) + 7;
        let s = block_starts(rows, 5, 0, "users").unwrap();
        assert!(s.windows(2).all(|w| w[1] - w[0] <= 1 << 32) && s[1] < 1 << 32 && s[2] > 1 << 32 && s[5] == rows, "{s:?}");
        let e = block_starts(rows, 4, 0, "users").unwrap_err().to_string();
        assert!(e.contains("past 2^32") && e.contains("at least 5 blocks per side") && !e.contains('\n'), "{e}");
        assert!(block_starts(1 << 32, 1, 0, "items").is_ok());
        assert!(block_starts((1 << 32) + 1, 1, 0, "items").unwrap_err().to_string().contains("items"));
        assert!(block_starts(u64::MAX, 2, 2, "users").unwrap_err().to_string().contains("overflow"));
    }

    #[test]
    fn permuted_rows_are_the_same_permutation_at_any_base_and_width() {
        for rows in [1usize, 2, 7, 100] {
            let narrow = permuted_rows(rows, 0, &mut Rng::new(9));
            let wide = permuted_rows(rows, BASE, &mut Rng::new(9));
            assert_eq!((narrow.width(), wide.width()), (4, 8));
            assert!(narrow.iter().zip(wide.iter()).all(|(a, b)| a + BASE == b));
            let mut v: Vec<u64> = narrow.iter().collect();
            v.sort_unstable();
            assert_eq!(v, (0..rows as u64).collect::<Vec<_>>());
        }
    }

    /// Dense ids numbered from 2^32 + 12345: every row and block start is past 2^32, the entries
    /// hold offsets below their block's height and width, and training (in memory and from
    /// flash, one thread) gives the factors, losses, RMSE and model of ids from 0, bit for bit.
    /// Sizes: one rating, fewer users than blocks, odd counts.
    #[test]
    fn dense_ids_past_2_to_the_32_train_as_ids_from_0() {
        let dir = std::env::temp_dir().join(format!("sfmf-local64-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (m, n, nnz, nb) in [(1u64, 1u64, 1usize, 20usize), (3, 40, 31, 20), (37, 23, 555, 5), (101, 67, 2_001, 7)] {
            let plain = ratings(m, n, nnz, m + n);
            let wide = rebased(&plain, BASE);
            assert_eq!((plain.users.width(), wide.users.width()), (4, 8));
            for budget in [None, Some(1 << 20)] {
                let o = LocalOptions { k: 5, threads: 1, blocks: Some(nb), memory_budget: budget, flash_dir: Some(dir.clone()), ..Default::default() };
                let (mut a, mut b) = (LocalTrainer::new(&plain, &o).unwrap(), LocalTrainer::new(&wide, &o).unwrap());
                let (su, si) = b.block_starts();
                assert!(su[0] == BASE && si[0] == BASE && su[nb] == BASE + plain.n_users() as u64 && si[nb] == BASE + plain.n_items() as u64);
                assert_eq!(b.user_row.width(), 8);
                assert!(a.user_row.iter().zip(b.user_row.iter()).all(|(x, y)| x + BASE == y));
                for (x, y) in a.block_starts().0.iter().zip(su) {
                    assert_eq!(x + BASE, *y);
                }
                if budget.is_none() {
                    assert_eq!(a.entries, b.entries);
                    for blk in 0..nb * nb {
                        let (h, w) = (su[blk / nb + 1] - su[blk / nb], si[blk % nb + 1] - si[blk % nb]);
                        assert!(b.entries[b.starts[blk]..b.starts[blk + 1]].iter().all(|e| (e.u as u64) < h && (e.i as u64) < w), "block {blk}");
                    }
                }
                assert_eq!(a.run_epochs(3), b.run_epochs(3), "m {m} n {n} budget {budget:?}");
                let (sa, sb) = (a.state(), b.state());
                assert_eq!((sa.p, sa.q, sa.pg, sa.qg, sa.counts), (sb.p, sb.q, sb.pg, sb.qg, sb.counts));
                assert_eq!(a.rmse(&plain).unwrap().to_bits(), b.rmse(&wide).unwrap().to_bits());
                assert_eq!(a.model(), b.model());
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// More threads (not repeatable run to run): with ids past 2^32 every block still runs once
    /// per epoch and the fit matches the run of ids from 0 closely.
    #[test]
    fn dense_ids_past_2_to_the_32_on_several_threads() {
        let plain = ratings(150, 110, 9_000, 4);
        let wide = rebased(&plain, BASE);
        for threads in [2, 3] {
            let o = LocalOptions { k: 8, threads, lambda: 0.01, ..Default::default() };
            let mut rmse = vec![];
            for r in [&plain, &wide] {
                let mut t = LocalTrainer::new(r, &o).unwrap();
                t.run_epochs(10);
                assert!(t.state().counts.iter().all(|&c| c == 10));
                rmse.push(t.rmse(r).unwrap());
            }
            assert!(rmse[1] <= rmse[0] * 1.1 && rmse[0] <= rmse[1] * 1.1, "threads {threads}: {rmse:?}");
        }
    }

    #[test]
    fn interleave_halves_alternates_and_keeps_each_half_in_order() {
        for len in [0usize, 1, 2, 3, 4, 7, 10] {
            let mut v: Vec<Entry> = (0..len as u32).map(|x| Entry { u: x, i: 0, r: 0.0 }).collect();
            interleave_halves(&mut v);
            let got: Vec<u32> = v.iter().map(|e| e.u).collect();
            let want: Vec<u32> = if len < 3 {
                (0..len as u32).collect()
            } else {
                let h = len.div_ceil(2) as u32;
                (0..len as u32).map(|j| if j % 2 == 0 { j / 2 } else { h + j / 2 }).collect()
            };
            assert_eq!(got, want, "len {len}");
        }
    }
}
