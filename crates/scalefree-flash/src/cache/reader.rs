//! [`CacheReader`]: the program cache for a consumer that computes on its own threads — the
//! matrix-factorization trainers, whose rating blocks live on flash — instead of through DAG
//! tasks. The consumer asks for blocks by access specifier ([`CacheReader::get`]); the reader
//! holds them in program-cache buffers under the same hard budget, reads them with the
//! runtime's IO executor (O_DIRECT where the file takes it) and prefetches the blocks the
//! consumer said it will ask for next ([`CacheReader::push_ahead`]: a ring schedule's next
//! steps, a grid pass's block order), in that order, as far as the budget allows — the DAG
//! scheduler's "prefetch the next task's inputs", for a schedule known in advance.
//!
//! Protocol (the scheduler's, per block instead of per task): COMMIT a reader reference
//! (allocating and starting the read when memory allows, evicting blocks nobody holds, least
//! recently used first), wait until the buffer is valid, RELEASE when the consumer drops its
//! [`CachedBlock`]. A prefetched block keeps its reference (it is pinned) until a `get` takes
//! it over, so prefetches are never evicted before use; a `get` that finds no memory drops the
//! pins first, then waits for other holders. Released blocks stay cached (a later `get` of the
//! same specifier is a hit) until memory is needed. Read-only: the consumer never writes a
//! buffer, so nothing is ever written back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::buffer::BufferCell;
use super::program_cache::{CacheAction, CacheStats, Commit, EntryId, ProgramCache};
use crate::error::{FlashError, Result};
use crate::io::executor::IoDirection;
use crate::io::{AccessMode, AccessSpec};
use crate::runtime::Runtime;

/// The waiter id of the cache's wake-up lists for the reader's own references (nobody is
/// woken through them: waiters watch the condition variable).
const READER: u64 = u64::MAX;

/// Counters of a reader's life.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReaderStats {
    /// Program-cache counters (peak memory since the last [`CacheReader::reset_peak`], hits,
    /// bytes read).
    pub cache: CacheStats,
    /// Bytes of buffers allocated now.
    pub resident_bytes: u64,
    /// Blocks handed out by `get`.
    pub gets: u64,
    /// Of those, blocks that were not valid yet when asked for (the consumer waited).
    pub waits: u64,
    /// Time `get` spent waiting for reads or memory.
    pub wait: Duration,
}

struct State {
    cache: ProgramCache,
    /// Blocks the consumer will ask for, in order, not prefetched yet.
    ahead: VecDeque<AccessSpec>,
    /// Prefetched blocks not taken by a `get` yet: a reader reference each (a specifier twice
    /// in `ahead` is pinned twice).
    pinned: HashMap<AccessSpec, Vec<EntryId>>,
    pinned_count: usize,
    /// At most this many blocks pinned ahead.
    max_ahead: usize,
    error: Option<String>,
    /// IO the cache asked for inside an IO completion (after a write-back), started by the
    /// next call of the consumer.
    deferred: Vec<CacheAction>,
    stats: ReaderStats,
}

/// What the IO completions share with the consumer. It holds no reference to the runtime: a
/// completion runs on an IO thread and must never be the one that drops the runtime (its IO
/// threads would join themselves); the reader and its blocks hold the runtime instead.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// Reads blocks of flash files through a program cache of its own, under a hard budget.
pub struct CacheReader {
    shared: Arc<Shared>,
    runtime: Arc<Runtime>,
}

/// A block held in memory: its bytes as [`CachedBlock::bytes`] (the packed strides of its
/// specifier). Dropping it releases the buffer to the cache.
pub struct CachedBlock {
    shared: Arc<Shared>,
    runtime: Arc<Runtime>,
    entry: EntryId,
    cell: Arc<BufferCell>,
    len: usize,
}

impl CachedBlock {
    /// The block's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the reader only takes reader references (it never writes a buffer), so no
        // writer holds this one while `self` keeps its reference.
        unsafe { &self.cell.bytes()[..self.len] }
    }
}

impl Drop for CachedBlock {
    fn drop(&mut self) {
        let mut actions = Vec::new();
        {
            let mut st = lock(&self.shared);
            st.cache.release(&[self.entry], &[AccessMode::Read]);
            fill(&mut st, &mut actions);
        }
        perform(&self.shared, &self.runtime, actions);
        self.shared.changed.notify_all();
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pins the next blocks of `ahead` while they fit (in order: stops at the first that does not).
fn fill(st: &mut State, actions: &mut Vec<CacheAction>) {
    while st.pinned_count < st.max_ahead {
        let Some(spec) = st.ahead.front().cloned() else { break };
        if spec.size_bytes() > st.cache.budget_bytes() {
            st.ahead.pop_front(); // `get` will say so
            continue;
        }
        match st.cache.commit(READER, &[(spec.clone(), AccessMode::Read)], actions) {
            Commit::Done { entries, .. } => {
                st.ahead.pop_front();
                st.pinned.entry(spec).or_default().push(entries[0]);
                st.pinned_count += 1;
            }
            Commit::Blocked => break,
        }
    }
}

/// Drops every pin (the blocks stay cached, evictable). True if there were any.
fn unpin_all(st: &mut State) -> bool {
    let ids: Vec<EntryId> = st.pinned.drain().flat_map(|(_, ids)| ids).collect();
    st.pinned_count = 0;
    st.cache.release(&ids, &vec![AccessMode::Read; ids.len()]);
    !ids.is_empty()
}

/// Hands the cache's IO to the runtime's executor (never under the state lock: a completion
/// may run on the calling thread), with any deferred by a completion.
fn perform(shared: &Arc<Shared>, runtime: &Runtime, mut actions: Vec<CacheAction>) {
    {
        let mut st = lock(shared);
        if !st.deferred.is_empty() {
            actions.extend(std::mem::take(&mut st.deferred));
        }
    }
    for action in actions {
        match action {
            CacheAction::Read { entry, spec, buffer } => {
                let me = shared.clone();
                runtime.io().submit_with(IoDirection::Read, spec, buffer, move |result, buffer| {
                    {
                        let mut st = lock(&me);
                        st.cache.read_done(entry, buffer);
                        if let Err(err) = result {
                            st.error.get_or_insert_with(|| err.to_string());
                        }
                    }
                    me.changed.notify_all();
                });
            }
            CacheAction::Write { entry, spec, buffer } => {
                // Nothing the reader holds is dirty; kept for completeness of the protocol.
                let me = shared.clone();
                runtime.io().submit_with(IoDirection::Write, spec, buffer, move |result, buffer| {
                    {
                        let mut st = lock(&me);
                        let mut follow = Vec::new();
                        st.cache.write_done(entry, buffer, &mut follow);
                        st.deferred.extend(follow);
                        if let Err(err) = result {
                            st.error.get_or_insert_with(|| err.to_string());
                        }
                    }
                    me.changed.notify_all();
                });
            }
            CacheAction::Ready { entry } => {
                let _ = lock(shared).cache.take_waiting(entry);
            }
        }
    }
}

impl CacheReader {
    /// A reader with a cache of `budget_bytes` (its own budget, beside the runtime's kernels')
    /// that prefetches at most `max_ahead` blocks ahead of the consumer.
    pub fn new(runtime: Arc<Runtime>, budget_bytes: u64, max_ahead: usize) -> Result<CacheReader> {
        if budget_bytes == 0 {
            return Err(FlashError::invalid("a cache reader needs a positive memory budget"));
        }
        let state = State {
            cache: ProgramCache::new(budget_bytes),
            ahead: VecDeque::new(),
            pinned: HashMap::new(),
            pinned_count: 0,
            max_ahead,
            error: None,
            deferred: Vec::new(),
            stats: ReaderStats::default(),
        };
        Ok(CacheReader { shared: Arc::new(Shared { state: Mutex::new(state), changed: Condvar::new() }), runtime })
    }

    /// The budget of the reader's cache.
    pub fn budget_bytes(&self) -> u64 {
        lock(&self.shared).cache.budget_bytes()
    }

    /// Blocks the consumer will ask for next, in that order (after those already announced):
    /// they are prefetched as memory allows.
    pub fn push_ahead(&self, specs: impl IntoIterator<Item = AccessSpec>) {
        let mut actions = Vec::new();
        {
            let mut st = lock(&self.shared);
            st.ahead.extend(specs);
            fill(&mut st, &mut actions);
        }
        perform(&self.shared, &self.runtime, actions);
    }

    /// Forgets the announced blocks and drops the prefetched ones' pins (the consumer stops
    /// early: nothing more is read for it).
    pub fn clear_ahead(&self) {
        let mut st = lock(&self.shared);
        st.ahead.clear();
        unpin_all(&mut st);
        drop(st);
        self.shared.changed.notify_all();
    }

    /// The block `spec` in memory, waiting for its read (and for memory, held by other
    /// [`CachedBlock`]s, if need be). `OutOfBudget` if it alone exceeds the budget, or if
    /// nothing else holds memory and it still does not fit.
    pub fn get(&self, spec: &AccessSpec) -> Result<CachedBlock> {
        let shared = &self.shared;
        let began = Instant::now();
        let mut actions = Vec::new();
        let mut st = lock(shared);
        let budget = st.cache.budget_bytes();
        if spec.size_bytes() > budget {
            return Err(FlashError::OutOfBudget { what: "a block read through the cache".into(), needed_bytes: spec.size_bytes(), budget_bytes: budget });
        }
        let pinned = st.pinned.get_mut(spec).and_then(|ids| ids.pop());
        let entry = match pinned {
            Some(id) => {
                st.pinned_count -= 1;
                if st.pinned.get(spec).is_some_and(|ids| ids.is_empty()) {
                    st.pinned.remove(spec);
                }
                id
            }
            None => {
                // Asked for out of the announced order: it is not to be prefetched any more.
                if let Some(at) = st.ahead.iter().position(|s| s == spec) {
                    st.ahead.remove(at);
                }
                loop {
                    if let Some(msg) = &st.error {
                        return Err(FlashError::invalid(format!("reading a block failed: {msg}")));
                    }
                    match st.cache.commit(READER, &[(spec.clone(), AccessMode::Read)], &mut actions) {
                        Commit::Done { entries, .. } => break entries[0],
                        Commit::Blocked => {
                            if unpin_all(&mut st) {
                                continue;
                            }
                            if !st.cache.any_held() {
                                return Err(FlashError::OutOfBudget { what: "a block read through the cache (nothing else held)".into(), needed_bytes: spec.size_bytes(), budget_bytes: budget });
                            }
                            if !actions.is_empty() {
                                drop(st);
                                perform(shared, &self.runtime, std::mem::take(&mut actions));
                                st = lock(shared);
                                continue;
                            }
                            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                        }
                    }
                }
            }
        };
        fill(&mut st, &mut actions);
        drop(st);
        perform(shared, &self.runtime, actions);
        let mut st = lock(shared);
        let mut waited = false;
        let cell = loop {
            if let Some(cell) = st.cache.ready_buffer(entry) {
                break cell;
            }
            if let Some(msg) = &st.error {
                let msg = msg.clone();
                st.cache.release(&[entry], &[AccessMode::Read]);
                return Err(FlashError::invalid(format!("reading a block failed: {msg}")));
            }
            waited = true;
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        st.stats.gets += 1;
        if waited {
            st.stats.waits += 1;
        }
        st.stats.wait += began.elapsed();
        Ok(CachedBlock { shared: shared.clone(), runtime: self.runtime.clone(), entry, cell, len: spec.size_bytes() as usize })
    }

    /// Counters so far.
    pub fn stats(&self) -> ReaderStats {
        let st = lock(&self.shared);
        ReaderStats { cache: st.cache.stats(), resident_bytes: st.cache.resident_bytes(), ..st.stats }
    }

    /// Starts a new peak of resident bytes (e.g. per iteration of the consumer).
    pub fn reset_peak(&self) {
        lock(&self.shared).cache.reset_peak();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{FileOptions, FlashFile};
    use crate::runtime::RuntimeOptions;

    fn setup(blocks: usize, block_bytes: u64) -> (Arc<Runtime>, Arc<FlashFile>) {
        let rt = Arc::new(Runtime::new(RuntimeOptions { compute_threads: 1, ..RuntimeOptions::default() }).unwrap());
        let file = FlashFile::scratch(rt.dir(), blocks as u64 * block_bytes, &FileOptions::default()).unwrap();
        for b in 0..blocks {
            let data: Vec<u8> = (0..block_bytes).map(|i| (b as u64 * 31 + i) as u8).collect();
            file.write_bytes(b as u64 * block_bytes, &data).unwrap();
        }
        (rt, file)
    }

    fn spec(file: &Arc<FlashFile>, b: usize, size: u64) -> AccessSpec {
        AccessSpec::contiguous(file.clone(), b as u64 * size, size).unwrap()
    }

    fn want(b: usize, size: u64) -> Vec<u8> {
        (0..size).map(|i| (b as u64 * 31 + i) as u8).collect()
    }

    #[test]
    fn a_sequence_read_in_order_within_the_budget() {
        let size = 8192;
        let (rt, file) = setup(6, size);
        let reader = CacheReader::new(rt, 3 * size, 8).unwrap();
        let order = [0usize, 1, 2, 3, 4, 5, 5, 0, 3, 1];
        reader.push_ahead(order.iter().map(|&b| spec(&file, b, size)));
        for &b in &order {
            let got = reader.get(&spec(&file, b, size)).unwrap();
            assert_eq!(got.bytes(), &want(b, size)[..], "block {b}");
        }
        let s = reader.stats();
        assert!(s.cache.peak_resident_bytes <= 3 * size, "peak {} over the budget", s.cache.peak_resident_bytes);
        assert_eq!(s.gets, order.len() as u64);
        assert!(s.cache.hits > 0, "a block asked for twice in a row is served from the cache");
    }

    #[test]
    fn out_of_order_gets_and_concurrent_holders() {
        let size = 4096;
        let (rt, file) = setup(8, size);
        let reader = Arc::new(CacheReader::new(rt, 2 * size, 4).unwrap());
        reader.push_ahead((0..8).map(|b| spec(&file, b, size)));
        std::thread::scope(|sc| {
            for t in 0..2usize {
                let (reader, file) = (reader.clone(), file.clone());
                sc.spawn(move || {
                    for round in 0..20usize {
                        let b = (t * 3 + round * 5) % 8;
                        let got = reader.get(&spec(&file, b, size)).unwrap();
                        assert_eq!(got.bytes(), &want(b, size)[..]);
                    }
                });
            }
        });
        assert!(reader.stats().cache.peak_resident_bytes <= 2 * size);
    }

    #[test]
    fn dropped_with_reads_in_flight() {
        // The reader, its runtime and a block dropped while prefetches are still being read:
        // the runtime goes on this thread (never on an IO thread), nothing hangs.
        for _ in 0..20 {
            let size = 4096;
            let (rt, file) = setup(16, size);
            let reader = CacheReader::new(rt, 16 * size, 64).unwrap();
            reader.push_ahead((0..16).map(|b| spec(&file, b, size)));
            let block = reader.get(&spec(&file, 0, size)).unwrap();
            drop(reader);
            drop(block);
        }
    }

    #[test]
    fn a_block_larger_than_the_budget_is_refused() {
        let size = 8192;
        let (rt, file) = setup(2, size);
        let reader = CacheReader::new(rt, size - 1, 2).unwrap();
        reader.push_ahead([spec(&file, 0, size)]);
        assert!(matches!(reader.get(&spec(&file, 0, size)), Err(FlashError::OutOfBudget { .. })));
        // A holder that keeps its block while asking for another that cannot fit beside it.
        let reader = CacheReader::new(reader.runtime.clone(), size, 2).unwrap();
        let held = reader.get(&spec(&file, 0, size)).unwrap();
        drop(held);
        assert!(reader.get(&spec(&file, 1, size)).is_ok(), "the released block is evicted for the next");
    }
}
