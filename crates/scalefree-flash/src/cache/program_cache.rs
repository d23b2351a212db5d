//! The program cache (paper §4): maps each exact access specifier to one shared buffer,
//! tagged Active / Prefetch / Write-back / Zero-reference, and keeps the bytes of all
//! buffers within a hard budget. It does no IO itself: it returns [`CacheAction`]s (start a
//! read, start a write) for the scheduler to hand to the IO executor, so it can be tested
//! alone.
//!
//! Invariants:
//! * `resident_bytes` (allocated buffers) never exceeds the budget: a buffer is allocated
//!   only when it fits; committed entries wait in a backlog until then.
//! * `committed_bytes` (entries not being evicted, allocated or not) never exceeds the
//!   budget, so the backlog always drains once evictions finish.
//! * An entry with an active writer has no other reference; an entry being written back gets
//!   no new reference until the write completes.
//! * Overlapping but different specifiers are kept coherent: before a task writes bytes that
//!   another entry holds, that entry is written back (if dirty) and dropped; before a task
//!   reads bytes that a dirty entry holds, that entry is written back.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::buffer::BufferCell;
use crate::io::{AccessMode, AccessSpec, AlignedBuf};

/// Index of an entry in the cache.
pub(crate) type EntryId = usize;

/// The paper's four tags of a cache entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryTag {
    /// At least one task holds the buffer.
    Active,
    /// The buffer is waiting for memory or being read.
    Prefetch,
    /// The buffer is being written back.
    WriteBack,
    /// Valid in memory, held by no task: may be evicted.
    ZeroReference,
}

/// Counters of one cache's life (one run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Memory budget in force.
    pub budget_bytes: u64,
    /// Largest number of buffer bytes allocated at once (never above the budget).
    pub peak_resident_bytes: u64,
    /// Task accesses served by a buffer already present or in flight.
    pub hits: u64,
    /// Task accesses that needed a new buffer.
    pub misses: u64,
    /// Bytes read from flash into buffers.
    pub bytes_prefetched: u64,
    /// Bytes written back from buffers to flash.
    pub bytes_written_back: u64,
    /// Buffers evicted to make room.
    pub evictions: u64,
}

/// IO the scheduler must start on behalf of the cache.
pub(crate) enum CacheAction {
    /// Read `spec` into the buffer, then call [`ProgramCache::read_done`].
    Read { entry: EntryId, spec: AccessSpec, buffer: AlignedBuf },
    /// Write the buffer to `spec`, then call [`ProgramCache::write_done`].
    Write { entry: EntryId, spec: AccessSpec, buffer: AlignedBuf },
    /// The entry became valid without IO (a fresh output buffer): wake its waiting tasks.
    Ready { entry: EntryId },
}

enum Residency {
    /// Committed, waiting for memory.
    Pending,
    /// Read in flight.
    Loading,
    /// Valid in memory.
    Ready(Arc<BufferCell>),
    /// Write-back in flight (the executor holds the buffer).
    Writing,
}

struct Entry {
    spec: AccessSpec,
    size_bytes: u64,
    residency: Residency,
    readers: u32,
    writer: bool,
    dirty: bool,
    /// Being evicted: freed when its write-back completes.
    evicting: bool,
    needs_read: bool,
    last_use: u64,
    /// Tasks that wait for this entry to become valid.
    waiting: Vec<u64>,
}

impl Entry {
    fn references(&self) -> u32 {
        self.readers + u32::from(self.writer)
    }

    #[cfg(test)]
    fn tag(&self) -> EntryTag {
        match self.residency {
            Residency::Pending | Residency::Loading => EntryTag::Prefetch,
            Residency::Writing => EntryTag::WriteBack,
            Residency::Ready(_) if self.references() > 0 => EntryTag::Active,
            Residency::Ready(_) => EntryTag::ZeroReference,
        }
    }

    fn is_idle_ready(&self) -> bool {
        matches!(self.residency, Residency::Ready(_)) && self.references() == 0
    }
}

/// Result of a COMMIT request.
pub(crate) enum Commit {
    /// References taken. `entries[i]` serves the task's i-th unique access; `missing` of
    /// them are not valid yet (the task is told through `read_done` / `Ready` actions).
    Done { entries: Vec<EntryId>, missing: usize },
    /// Not possible now (memory, a conflicting writer, a write-back in flight); retry after
    /// the next event. The cache may have started write-backs that make progress possible.
    Blocked,
}

pub(crate) struct ProgramCache {
    budget_bytes: u64,
    entries: Vec<Option<Entry>>,
    free_slots: Vec<EntryId>,
    index: HashMap<AccessSpec, EntryId>,
    committed_bytes: u64,
    resident_bytes: u64,
    backlog: VecDeque<EntryId>,
    clock: u64,
    in_flight_io: usize,
    stats: CacheStats,
    /// Freed buffers kept for reuse by later reads of the same size (a fresh buffer costs a
    /// page fault per 4 KiB on first touch and an unmap on free; gemm alone allocates hundreds
    /// of megabytes of same-sized blocks per call). `resident_bytes + spare_bytes` never
    /// exceeds the budget, so the memory held stays within it.
    spare: Vec<AlignedBuf>,
    spare_bytes: u64,
}

/// Buffers smaller than this are not kept for reuse (the local trainer's blocks of tens of
/// KiB are: a fresh one is zeroed under the reader's lock on the training thread).
const MIN_SPARE_BYTES: usize = 16 << 10;

impl ProgramCache {
    pub(crate) fn new(budget_bytes: u64) -> ProgramCache {
        ProgramCache {
            budget_bytes,
            entries: Vec::new(),
            free_slots: Vec::new(),
            index: HashMap::new(),
            committed_bytes: 0,
            resident_bytes: 0,
            backlog: VecDeque::new(),
            clock: 0,
            in_flight_io: 0,
            stats: CacheStats { budget_bytes, ..CacheStats::default() },
            spare: Vec::new(),
            spare_bytes: 0,
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Bytes of buffers allocated now.
    pub(crate) fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }

    /// The budget in force.
    pub(crate) fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Starts a new peak: from now on `peak_resident_bytes` counts from what is resident now.
    pub(crate) fn reset_peak(&mut self) {
        self.stats.peak_resident_bytes = self.resident_bytes;
    }

    /// The buffer of an entry if it is valid now (None while it waits for memory or its read).
    pub(crate) fn ready_buffer(&self, id: EntryId) -> Option<Arc<BufferCell>> {
        match &self.entry(id).residency {
            Residency::Ready(cell) => Some(cell.clone()),
            _ => None,
        }
    }

    /// IO requests started and not yet completed.
    pub(crate) fn in_flight_io(&self) -> usize {
        self.in_flight_io
    }

    fn entry(&self, id: EntryId) -> &Entry {
        self.entries[id].as_ref().expect("stale cache entry id")
    }

    fn entry_mut(&mut self, id: EntryId) -> &mut Entry {
        self.entries[id].as_mut().expect("stale cache entry id")
    }

    /// The tag of the entry for `spec`, if any.
    #[cfg(test)]
    pub(crate) fn tag_of(&self, spec: &AccessSpec) -> Option<EntryTag> {
        self.index.get(spec).map(|&id| self.entry(id).tag())
    }

    /// HIT/MISS for a batch: bytes that would have to be read from flash to commit these
    /// accesses now (present or in-flight buffers cost nothing; outputs cost nothing).
    pub(crate) fn bytes_to_fetch(&self, accesses: &[(AccessSpec, AccessMode)]) -> u64 {
        accesses.iter().filter(|(spec, mode)| mode.reads() && !self.index.contains_key(spec)).map(|(spec, _)| spec.size_bytes()).sum()
    }

    /// The buffer of a valid entry.
    pub(crate) fn buffer(&self, id: EntryId) -> Arc<BufferCell> {
        match &self.entry(id).residency {
            Residency::Ready(cell) => cell.clone(),
            _ => panic!("buffer of an entry that is not valid"),
        }
    }

    /// COMMIT: take references for a task's unique accesses, allocating and prefetching as
    /// memory allows. All or nothing: on `Blocked` no reference is taken.
    pub(crate) fn commit(&mut self, task: u64, accesses: &[(AccessSpec, AccessMode)], actions: &mut Vec<CacheAction>) -> Commit {
        // 1. Conflicts with present entries and with overlapping entries.
        let mut blocked = false;
        let mut new_bytes = 0u64;
        let mut reused = Vec::new();
        for (spec, mode) in accesses {
            if let Some(&id) = self.index.get(spec) {
                let e = self.entry(id);
                let busy = matches!(e.residency, Residency::Writing) || e.writer || (mode.writes() && e.readers > 0);
                blocked |= busy;
                reused.push(id);
            } else {
                new_bytes += spec.size_bytes();
            }
            blocked |= self.resolve_overlaps(spec, *mode, actions);
        }
        if blocked {
            return Commit::Blocked;
        }
        // 2. Memory: evict zero-reference entries (clean first, least recently used first).
        if self.committed_bytes + new_bytes > self.budget_bytes {
            let mut candidates: Vec<EntryId> = (0..self.entries.len())
                .filter(|&id| self.entries[id].as_ref().is_some_and(|e| e.is_idle_ready() && !e.evicting) && !reused.contains(&id))
                .collect();
            let reclaimable: u64 = candidates.iter().map(|&id| self.entry(id).size_bytes).sum();
            if self.committed_bytes + new_bytes > self.budget_bytes + reclaimable {
                return Commit::Blocked;
            }
            // Writing a dirty buffer back early usually means reading it again later (an
            // accumulate chain's output): while other tasks hold buffers and will release
            // clean ones, wait for those instead.
            let clean: u64 = candidates.iter().filter(|&&id| !self.entry(id).dirty).map(|&id| self.entry(id).size_bytes).sum();
            if self.committed_bytes + new_bytes > self.budget_bytes + clean && self.any_held() {
                return Commit::Blocked;
            }
            candidates.sort_by_key(|&id| (self.entry(id).dirty, self.entry(id).last_use));
            for id in candidates {
                if self.committed_bytes + new_bytes <= self.budget_bytes {
                    break;
                }
                self.evict(id, actions);
            }
        }
        // 3. References and new entries.
        self.clock += 1;
        let mut entries = Vec::with_capacity(accesses.len());
        let mut missing = 0;
        for (spec, mode) in accesses {
            let id = match self.index.get(spec) {
                Some(&id) => {
                    self.stats.hits += 1;
                    id
                }
                None => {
                    self.stats.misses += 1;
                    self.insert_pending(spec.clone(), mode.reads())
                }
            };
            let clock = self.clock;
            let e = self.entry_mut(id);
            if mode.writes() {
                e.writer = true;
            } else {
                e.readers += 1;
            }
            e.last_use = clock;
            if !matches!(e.residency, Residency::Ready(_)) {
                e.waiting.push(task);
                missing += 1;
            }
            entries.push(id);
        }
        self.service(actions);
        Commit::Done { entries, missing }
    }

    /// True when some task holds an entry or a prefetch is pending: memory will be released.
    pub(crate) fn any_held(&self) -> bool {
        self.entries.iter().flatten().any(|e| e.references() > 0 || matches!(e.residency, Residency::Pending | Residency::Loading))
    }

    /// Makes other entries overlapping `spec` coherent for an access in `mode`. Returns true
    /// when the access must wait.
    fn resolve_overlaps(&mut self, spec: &AccessSpec, mode: AccessMode, actions: &mut Vec<CacheAction>) -> bool {
        let own = self.index.get(spec).copied();
        let overlapping: Vec<EntryId> = (0..self.entries.len())
            .filter(|&id| Some(id) != own && self.entries[id].as_ref().is_some_and(|e| e.spec.overlaps(spec)))
            .collect();
        let mut wait = false;
        for id in overlapping {
            let e = self.entry(id);
            let idle = e.is_idle_ready();
            if mode.writes() {
                // The other copy would go stale: write it back if dirty, then drop it.
                if idle && !e.dirty {
                    self.remove(id);
                } else {
                    if idle && e.dirty {
                        self.evict(id, actions);
                    }
                    wait = true;
                }
            } else if e.dirty || e.writer || matches!(e.residency, Residency::Writing) {
                // Our read must see the other buffer's newer bytes: write them back first.
                if idle {
                    self.start_write_back(id, false, actions);
                }
                wait = true;
            }
        }
        wait
    }

    fn insert_pending(&mut self, spec: AccessSpec, needs_read: bool) -> EntryId {
        let size_bytes = spec.size_bytes();
        let entry = Entry { spec: spec.clone(), size_bytes, residency: Residency::Pending, readers: 0, writer: false, dirty: false, evicting: false, needs_read, last_use: self.clock, waiting: Vec::new() };
        let id = match self.free_slots.pop() {
            Some(slot) => {
                self.entries[slot] = Some(entry);
                slot
            }
            None => {
                self.entries.push(Some(entry));
                self.entries.len() - 1
            }
        };
        self.index.insert(spec, id);
        self.committed_bytes += size_bytes;
        self.backlog.push_back(id);
        id
    }

    /// Removes an idle clean entry and frees its memory.
    fn remove(&mut self, id: EntryId) {
        let e = self.entries[id].take().expect("stale cache entry id");
        debug_assert!(e.references() == 0);
        self.index.remove(&e.spec);
        self.free_slots.push(id);
        if !e.evicting {
            self.committed_bytes -= e.size_bytes;
        }
        if matches!(e.residency, Residency::Ready(_) | Residency::Writing | Residency::Loading) {
            self.resident_bytes -= e.size_bytes;
        }
        if let Residency::Ready(cell) = e.residency {
            if let Ok(cell) = Arc::try_unwrap(cell) {
                self.recycle(cell.into_inner());
            }
        }
    }

    /// Keeps a freed buffer for reuse if the budget leaves room for it.
    fn recycle(&mut self, buffer: AlignedBuf) {
        let len = buffer.len() as u64;
        if buffer.len() >= MIN_SPARE_BYTES && self.resident_bytes + self.spare_bytes + len <= self.budget_bytes {
            self.spare_bytes += len;
            self.spare.push(buffer);
        }
    }

    /// A buffer of `size` bytes for an entry about to become resident: a spare one of that
    /// size for a read (the read overwrites all of it), else a fresh zeroed one. Spares are
    /// dropped as needed to keep `resident_bytes + spare_bytes` within the budget (call after
    /// `resident_bytes` counts the new buffer).
    fn take_buffer(&mut self, size: u64, for_read: bool) -> AlignedBuf {
        let reused = if for_read { self.spare.iter().position(|b| b.len() as u64 == size) } else { None };
        let buffer = match reused {
            Some(i) => {
                self.spare_bytes -= size;
                self.spare.swap_remove(i)
            }
            None => {
                while self.resident_bytes + self.spare_bytes > self.budget_bytes {
                    let dropped = self.spare.pop().expect("spare bytes without spare buffers");
                    self.spare_bytes -= dropped.len() as u64;
                }
                AlignedBuf::zeroed(size as usize)
            }
        };
        debug_assert!(self.resident_bytes + self.spare_bytes <= self.budget_bytes);
        buffer
    }

    /// Evicts an idle entry: frees it now if clean, else writes it back and frees it after.
    fn evict(&mut self, id: EntryId, actions: &mut Vec<CacheAction>) {
        self.stats.evictions += 1;
        if self.entry(id).dirty {
            self.start_write_back(id, true, actions);
        } else {
            self.remove(id);
        }
    }

    fn start_write_back(&mut self, id: EntryId, evicting: bool, actions: &mut Vec<CacheAction>) {
        let e = self.entry_mut(id);
        let Residency::Ready(cell) = std::mem::replace(&mut e.residency, Residency::Writing) else {
            panic!("write-back of an entry that is not valid");
        };
        let cell = Arc::try_unwrap(cell).unwrap_or_else(|_| panic!("write-back of a buffer a task still holds"));
        let size = e.size_bytes;
        if evicting {
            e.evicting = true;
        }
        let spec = e.spec.clone();
        if evicting {
            self.committed_bytes -= size;
        }
        self.in_flight_io += 1;
        actions.push(CacheAction::Write { entry: id, spec, buffer: cell.into_inner() });
    }

    /// SERVICE: allocates backlog entries while memory allows, starting their prefetches.
    pub(crate) fn service(&mut self, actions: &mut Vec<CacheAction>) {
        while let Some(&id) = self.backlog.front() {
            let size = self.entry(id).size_bytes;
            if self.resident_bytes + size > self.budget_bytes {
                break;
            }
            self.backlog.pop_front();
            self.resident_bytes += size;
            self.stats.peak_resident_bytes = self.stats.peak_resident_bytes.max(self.resident_bytes);
            let for_read = self.entry(id).needs_read && size > 0;
            let buffer = self.take_buffer(size, for_read);
            let e = self.entry_mut(id);
            if e.needs_read && size > 0 {
                e.residency = Residency::Loading;
                let spec = e.spec.clone();
                self.in_flight_io += 1;
                actions.push(CacheAction::Read { entry: id, spec, buffer });
            } else {
                e.residency = Residency::Ready(Arc::new(BufferCell::new(buffer)));
                actions.push(CacheAction::Ready { entry: id });
            }
        }
    }

    /// Tasks waiting on an entry that just became valid.
    pub(crate) fn take_waiting(&mut self, id: EntryId) -> Vec<u64> {
        std::mem::take(&mut self.entry_mut(id).waiting)
    }

    /// GET: a prefetch finished. Returns the tasks that were waiting for it.
    pub(crate) fn read_done(&mut self, id: EntryId, buffer: AlignedBuf) -> Vec<u64> {
        self.in_flight_io -= 1;
        let e = self.entry_mut(id);
        e.residency = Residency::Ready(Arc::new(BufferCell::new(buffer)));
        let size = e.size_bytes;
        self.stats.bytes_prefetched += size;
        self.take_waiting(id)
    }

    /// A write-back finished: the entry is clean, or freed if it was being evicted.
    pub(crate) fn write_done(&mut self, id: EntryId, buffer: AlignedBuf, actions: &mut Vec<CacheAction>) {
        self.in_flight_io -= 1;
        let e = self.entry_mut(id);
        e.dirty = false;
        let size = e.size_bytes;
        let evicting = e.evicting;
        self.stats.bytes_written_back += size;
        if evicting {
            self.remove(id);
            self.recycle(buffer);
        } else {
            self.entry_mut(id).residency = Residency::Ready(Arc::new(BufferCell::new(buffer)));
        }
        self.service(actions);
    }

    /// RELEASE: a task finished with its entries; written ones become dirty.
    pub(crate) fn release(&mut self, entries: &[EntryId], modes: &[AccessMode]) {
        self.clock += 1;
        let clock = self.clock;
        for (&id, mode) in entries.iter().zip(modes) {
            let e = self.entry_mut(id);
            if mode.writes() {
                e.writer = false;
                e.dirty = true;
            } else {
                e.readers -= 1;
            }
            e.last_use = clock;
        }
    }

    /// No known task will use this entry again: if nothing holds it, write it back now when
    /// dirty (and free it after), or free it when clean. The write-back overlaps later work
    /// instead of delaying the commit that would otherwise evict it.
    pub(crate) fn retire(&mut self, id: EntryId, actions: &mut Vec<CacheAction>) {
        let Some(e) = self.entries[id].as_ref() else { return };
        if !e.is_idle_ready() || e.evicting || !e.waiting.is_empty() {
            return;
        }
        if e.dirty {
            self.start_write_back(id, true, actions);
        } else {
            self.remove(id);
        }
        self.service(actions);
    }

    /// Drops a task's references without marking anything dirty (the task failed or never ran).
    pub(crate) fn abandon(&mut self, entries: &[EntryId], modes: &[AccessMode]) {
        for (&id, mode) in entries.iter().zip(modes) {
            let e = self.entry_mut(id);
            if mode.writes() {
                e.writer = false;
            } else {
                e.readers -= 1;
            }
        }
    }

    /// FLUSH: starts write-backs of every idle dirty entry. Returns how many were started.
    pub(crate) fn flush(&mut self, actions: &mut Vec<CacheAction>) -> usize {
        let dirty: Vec<EntryId> = (0..self.entries.len()).filter(|&id| self.entries[id].as_ref().is_some_and(|e| e.is_idle_ready() && e.dirty)).collect();
        for &id in &dirty {
            self.start_write_back(id, false, actions);
        }
        dirty.len()
    }

    /// Drops every idle clean entry (end of a run).
    pub(crate) fn clear_clean(&mut self) {
        let clean: Vec<EntryId> = (0..self.entries.len()).filter(|&id| self.entries[id].as_ref().is_some_and(|e| e.is_idle_ready() && !e.dirty)).collect();
        for id in clean {
            self.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{FileOptions, FlashFile};

    fn specs(n: usize, size: u64) -> Vec<AccessSpec> {
        let file = FlashFile::scratch(&std::env::temp_dir(), n as u64 * size, &FileOptions::default()).unwrap();
        (0..n).map(|i| AccessSpec::contiguous(file.clone(), i as u64 * size, size).unwrap()).collect()
    }

    fn complete_io(cache: &mut ProgramCache, actions: Vec<CacheAction>) -> Vec<u64> {
        let mut woken = Vec::new();
        let mut pending = actions;
        while let Some(action) = pending.pop() {
            match action {
                CacheAction::Read { entry, buffer, .. } => woken.extend(cache.read_done(entry, buffer)),
                CacheAction::Write { entry, buffer, .. } => cache.write_done(entry, buffer, &mut pending),
                CacheAction::Ready { entry } => woken.extend(cache.take_waiting(entry)),
            }
        }
        woken
    }

    #[test]
    fn shared_buffer_for_equal_specs() {
        let s = specs(2, 1000);
        let mut cache = ProgramCache::new(10_000);
        let mut actions = Vec::new();
        let Commit::Done { entries: a, missing } = cache.commit(1, &[(s[0].clone(), AccessMode::Read)], &mut actions) else { panic!() };
        assert_eq!(missing, 1);
        let Commit::Done { entries: b, .. } = cache.commit(2, &[(s[0].clone(), AccessMode::Read)], &mut actions) else { panic!() };
        assert_eq!(a, b, "one buffer per access specifier");
        assert_eq!(actions.len(), 1, "one read for both tasks");
        assert_eq!(cache.tag_of(&s[0]), Some(EntryTag::Prefetch));
        let mut woken = complete_io(&mut cache, actions);
        woken.sort();
        assert_eq!(woken, vec![1, 2]);
        assert_eq!(cache.tag_of(&s[0]), Some(EntryTag::Active));
        cache.release(&a, &[AccessMode::Read]);
        cache.release(&b, &[AccessMode::Read]);
        assert_eq!(cache.tag_of(&s[0]), Some(EntryTag::ZeroReference));
        assert_eq!(cache.stats().hits, 1);
        assert_eq!(cache.bytes_to_fetch(&[(s[0].clone(), AccessMode::Read), (s[1].clone(), AccessMode::Read)]), 1000);
    }

    #[test]
    fn budget_is_hard_and_dirty_victims_are_written_back() {
        let s = specs(10, 1000);
        let mut cache = ProgramCache::new(2500);
        for (task, spec) in s.iter().enumerate() {
            let mut actions = Vec::new();
            let Commit::Done { entries, .. } = cache.commit(task as u64, &[(spec.clone(), AccessMode::Write)], &mut actions) else { panic!("task {task} blocked") };
            complete_io(&mut cache, actions);
            assert!(cache.resident_bytes() <= 2500);
            cache.release(&entries, &[AccessMode::Write]);
        }
        assert!(cache.stats().peak_resident_bytes <= 2500);
        assert_eq!(cache.stats().bytes_written_back, 8000, "eight dirty victims written back");
        let mut actions = Vec::new();
        assert_eq!(cache.flush(&mut actions), 2);
        complete_io(&mut cache, actions);
        cache.clear_clean();
        assert_eq!(cache.resident_bytes(), 0);
    }

    #[test]
    fn writer_excludes_readers_and_overlaps_wait() {
        let s = specs(2, 1000);
        let mut cache = ProgramCache::new(10_000);
        let mut actions = Vec::new();
        let Commit::Done { entries, .. } = cache.commit(1, &[(s[0].clone(), AccessMode::Write)], &mut actions) else { panic!() };
        complete_io(&mut cache, std::mem::take(&mut actions));
        assert!(matches!(cache.commit(2, &[(s[0].clone(), AccessMode::Read)], &mut actions), Commit::Blocked));
        cache.release(&entries, &[AccessMode::Write]);
        // A different specifier overlapping the dirty entry: it must be written back first.
        let wider = AccessSpec::contiguous(s[0].file().clone(), 500, 1000).unwrap();
        assert!(matches!(cache.commit(3, &[(wider.clone(), AccessMode::Read)], &mut actions), Commit::Blocked));
        assert_eq!(cache.tag_of(&s[0]), Some(EntryTag::WriteBack));
        complete_io(&mut cache, std::mem::take(&mut actions));
        assert!(matches!(cache.commit(3, &[(wider, AccessMode::Read)], &mut actions), Commit::Done { .. }));
    }

    #[test]
    fn blocked_commit_changes_nothing() {
        let s = specs(3, 1000);
        let mut cache = ProgramCache::new(1500);
        let mut actions = Vec::new();
        let Commit::Done { .. } = cache.commit(1, &[(s[0].clone(), AccessMode::Read)], &mut actions) else { panic!() };
        complete_io(&mut cache, std::mem::take(&mut actions));
        // s[0] is still held: no room for s[1].
        assert!(matches!(cache.commit(2, &[(s[1].clone(), AccessMode::Read)], &mut actions), Commit::Blocked));
        assert!(actions.is_empty());
        assert_eq!(cache.tag_of(&s[1]), None);
        assert_eq!(cache.tag_of(&s[0]), Some(EntryTag::Active));
    }
}
