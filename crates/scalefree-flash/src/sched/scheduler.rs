//! The run loop (paper §4, "Scheduler"): tasks move wait → prefetch → compute → complete.
//! One thread (the caller of [`Dag::run`]) owns the DAG and the program cache and reacts to
//! events — an injection, a finished read or write, a finished computation — arriving on one
//! channel. Nothing sleeps or polls.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::prioritizer::candidates;
use super::task::{unique_accesses, Inbox, Injected, Injector, Slot, Task, TaskBuffers, TaskContext, TaskId};
use crate::cache::program_cache::{CacheAction, CacheStats, Commit, EntryId, ProgramCache};
use crate::error::{FlashError, Result};
use crate::io::executor::IoDirection;
use crate::io::{AccessMode, AccessSpec, AlignedBuf};
use crate::runtime::{Progress, Runtime};

/// Something the run loop reacts to.
pub(crate) enum Event {
    Injected,
    InjectorDropped,
    ReadDone { entry: EntryId, result: Result<()>, buffer: AlignedBuf },
    WriteDone { entry: EntryId, result: Result<()>, buffer: AlignedBuf },
    ComputeDone { id: TaskId, result: Result<()>, busy: Duration },
}

/// What one run did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Tasks that completed.
    pub tasks_completed: u64,
    /// Program-cache counters (peak memory, hits, bytes prefetched and written back).
    pub cache: CacheStats,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Sum over tasks of the time spent in [`Task::execute`].
    pub compute_busy: Duration,
    /// Wall time during which no task was computing (waiting for IO, memory or the DAG).
    pub compute_idle: Duration,
}

impl RunStats {
    /// The statistics of this run followed by `next` (one kernel made of several DAG runs):
    /// counts and times add up, the peak is the larger one.
    pub fn add(&self, next: &RunStats) -> RunStats {
        let (a, b) = (&self.cache, &next.cache);
        RunStats {
            tasks_completed: self.tasks_completed + next.tasks_completed,
            cache: CacheStats {
                budget_bytes: a.budget_bytes.max(b.budget_bytes),
                peak_resident_bytes: a.peak_resident_bytes.max(b.peak_resident_bytes),
                hits: a.hits + b.hits,
                misses: a.misses + b.misses,
                bytes_prefetched: a.bytes_prefetched + b.bytes_prefetched,
                bytes_written_back: a.bytes_written_back + b.bytes_written_back,
                evictions: a.evictions + b.evictions,
            },
            elapsed: self.elapsed + next.elapsed,
            compute_busy: self.compute_busy + next.compute_busy,
            compute_idle: self.compute_idle + next.compute_idle,
        }
    }
}

/// The waiter recorded for prefetches on behalf of a task that cannot commit yet: no task
/// has this id, so the read's completion wakes nobody.
const PREFETCH_WAITER: u64 = u64::MAX;

/// Candidates scored per scheduling decision.
const CANDIDATES_PER_DECISION: usize = 8;

/// A DAG of tasks to run on a [`Runtime`]. Tasks may borrow data that outlives `'s`.
pub struct Dag<'s> {
    runtime: &'s Runtime,
    inbox: Arc<Inbox<'s>>,
    events: mpsc::Sender<Event>,
    receiver: mpsc::Receiver<Event>,
    live_injectors: Arc<AtomicU64>,
}

impl<'s> Dag<'s> {
    pub(crate) fn new(runtime: &'s Runtime) -> Dag<'s> {
        let (events, receiver) = mpsc::channel();
        Dag { runtime, inbox: Arc::new(Inbox::new(runtime.options().memory_budget_bytes)), events, receiver, live_injectors: Arc::new(AtomicU64::new(0)) }
    }

    /// Adds a task that runs after all of `parents` complete. Fails with `OutOfBudget` if the
    /// task alone needs more memory than the budget, `InvalidArgument` if it writes bytes that
    /// another of its accesses covers or names an unknown parent.
    pub fn add(&self, task: impl Task<'s> + 's, parents: &[TaskId]) -> Result<TaskId> {
        self.inbox.inject(Box::new(task), parents, &self.events)
    }

    /// Like [`Dag::add`] for a boxed task.
    pub fn add_boxed(&self, task: Box<dyn Task<'s> + 's>, parents: &[TaskId]) -> Result<TaskId> {
        self.inbox.inject(task, parents, &self.events)
    }

    /// A handle to add tasks from another thread while the DAG runs. [`Dag::run`] returns
    /// only after every injector has been dropped.
    pub fn injector(&self) -> Injector<'s> {
        self.live_injectors.fetch_add(1, Ordering::AcqRel);
        Injector { inbox: self.inbox.clone(), events: self.events.clone(), live: self.live_injectors.clone() }
    }

    /// Runs every task (and every task injected meanwhile), writes all dirty buffers back, and
    /// frees the cache. Returns the first error, after in-flight work has stopped.
    pub fn run(self) -> Result<RunStats> {
        let started = Instant::now();
        let runtime = self.runtime;
        let options = runtime.options();
        let mut state = RunState {
            nodes: HashMap::new(),
            ready: Vec::new(),
            cache: ProgramCache::new(options.memory_budget_bytes),
            tasks_in_flight: 0,
            computing: 0,
            completed: 0,
            error: None,
            future_uses: HashMap::new(),
            pending_actions: Vec::new(),
            compute_busy: Duration::ZERO,
            compute_idle: Duration::ZERO,
            idle_since: Some(started),
            progress: runtime.progress(),
            published: (0, 0),
        };
        let inbox = self.inbox.clone();
        runtime.compute_pool().in_place_scope(|scope| {
            loop {
                state.publish_progress();
                state.absorb_injections(&inbox);
                let mut actions = Vec::new();
                state.schedule(runtime, &mut actions, &mut |state, id| state.dispatch(id, scope, runtime, &inbox, &self.events));
                state.perform(actions, runtime, &self.events, scope, &inbox);
                let no_more_tasks = state.nodes.is_empty() && self.live_injectors.load(Ordering::Acquire) == 0 && inbox.pending.lock().expect("task inbox poisoned").is_empty();
                if no_more_tasks || (state.error.is_some() && state.computing == 0) {
                    if state.error.is_none() {
                        let mut flush = Vec::new();
                        state.cache.flush(&mut flush);
                        state.perform(flush, runtime, &self.events, scope, &inbox);
                    }
                    if state.cache.in_flight_io() == 0 && state.computing == 0 {
                        match self.receiver.try_recv() {
                            Ok(event) => {
                                state.handle(event, runtime, &self.events, scope, &inbox);
                                continue;
                            }
                            Err(_) => break,
                        }
                    }
                } else if state.stalled() && self.live_injectors.load(Ordering::Acquire) == 0 {
                    state.error = Some(FlashError::invalid(format!("scheduler stalled with {} tasks left (a parent never completes?)", state.nodes.len())));
                    continue;
                }
                let event = self.receiver.recv().expect("the run loop holds a sender");
                state.handle(event, runtime, &self.events, scope, &inbox);
            }
            state.cache.clear_clean();
            state.publish_progress();
        });
        inbox.closed.store(true, Ordering::Release);
        match state.error {
            Some(err) => Err(err),
            None => {
                let end = Instant::now();
                let idle = state.compute_idle + state.idle_since.map_or(Duration::ZERO, |since| end - since);
                Ok(RunStats { tasks_completed: state.completed, cache: state.cache.stats(), elapsed: end - started, compute_busy: state.compute_busy, compute_idle: idle })
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Waiting,
    Ready,
    Prefetching,
    Computing,
}

struct Node<'s> {
    task: Option<Box<dyn Task<'s> + 's>>,
    name: String,
    unique: Vec<(AccessSpec, AccessMode)>,
    slot_of: Vec<usize>,
    waiting_parents: usize,
    children: Vec<TaskId>,
    phase: Phase,
    entries: Vec<EntryId>,
    missing: usize,
    /// `(index in unique, entry)` of read-only inputs prefetched before the task could commit
    /// (while its last parent computes, or while it waits for memory): reader references held
    /// on its behalf, dropped once it commits for real.
    pinned: Vec<(usize, EntryId)>,
}

struct RunState<'s> {
    nodes: HashMap<TaskId, Node<'s>>,
    ready: Vec<TaskId>,
    cache: ProgramCache,
    tasks_in_flight: usize,
    computing: usize,
    completed: u64,
    error: Option<FlashError>,
    /// For each access specifier, the tasks not yet completed that declare it. When it drops
    /// to zero the cache entry is dead: dirty ones are written back at once (overlapping the
    /// rest of the run instead of delaying a later commit), clean ones are freed.
    future_uses: HashMap<AccessSpec, u32>,
    /// Cache actions produced while dispatching (child prefetches), performed next.
    pending_actions: Vec<CacheAction>,
    compute_busy: Duration,
    compute_idle: Duration,
    /// Since when no task has been computing.
    idle_since: Option<Instant>,
    /// The runtime's live counters, and the cache's byte counts already added to them.
    progress: &'s Progress,
    published: (u64, u64),
}

impl<'s> RunState<'s> {
    /// Adds the bytes read and written since the last call to the runtime's progress counters.
    fn publish_progress(&mut self) {
        let stats = self.cache.stats();
        let now = (stats.bytes_prefetched, stats.bytes_written_back);
        self.progress.bytes_read.fetch_add(now.0 - self.published.0, Ordering::Relaxed);
        self.progress.bytes_written.fetch_add(now.1 - self.published.1, Ordering::Relaxed);
        self.published = now;
    }

    fn absorb_injections(&mut self, inbox: &Inbox<'s>) {
        let mut batch = std::mem::take(&mut *inbox.pending.lock().expect("task inbox poisoned"));
        self.progress.tasks_added.fetch_add(batch.len() as u64, Ordering::Relaxed);
        batch.sort_by_key(|t| t.id);
        for Injected { id, task, accesses, parents } in batch {
            let (unique, slot_of) = unique_accesses(&accesses);
            for (spec, _) in &unique {
                *self.future_uses.entry(spec.clone()).or_insert(0) += 1;
            }
            let mut waiting_parents = 0;
            for parent in &parents {
                if let Some(p) = self.nodes.get_mut(parent) {
                    p.children.push(id);
                    waiting_parents += 1;
                }
            }
            let phase = if waiting_parents == 0 { Phase::Ready } else { Phase::Waiting };
            if phase == Phase::Ready {
                self.ready.push(id);
            }
            let name = task.name();
            self.nodes.insert(id, Node { task: Some(task), name, unique, slot_of, waiting_parents, children: Vec::new(), phase, entries: Vec::new(), missing: 0, pinned: Vec::new() });
        }
    }

    /// Nothing in flight, yet tasks remain and none can start.
    fn stalled(&self) -> bool {
        !self.nodes.is_empty() && self.tasks_in_flight == 0 && self.cache.in_flight_io() == 0 && self.ready.is_empty()
    }

    /// Commits ready tasks, best first, while the in-flight limit allows.
    fn schedule(&mut self, runtime: &Runtime, actions: &mut Vec<CacheAction>, dispatch: &mut dyn FnMut(&mut Self, TaskId)) {
        let options = runtime.options();
        while self.error.is_none() && self.tasks_in_flight < options.max_tasks_in_flight.max(1) && !self.ready.is_empty() {
            let nodes = &self.nodes;
            let picks = candidates(&self.ready, |id| &nodes[&id].unique, &self.cache, options.priority, options.prioritizer_window, CANDIDATES_PER_DECISION);
            let mut committed = None;
            for &id in &picks {
                let node = &self.nodes[&id];
                if let Commit::Done { entries, missing } = self.cache.commit(id.0, &node.unique, actions) {
                    committed = Some((id, entries, missing));
                    break;
                }
            }
            let Some((id, entries, missing)) = committed else {
                if self.tasks_in_flight == 0 {
                    // Nothing running will release memory: drop the prefetches made for tasks
                    // that cannot commit, and try again.
                    if self.unpin_ready() {
                        continue;
                    }
                } else if let Some(&best) = picks.first() {
                    // The best task waits for memory that running tasks will release:
                    // meanwhile prefetch those of its inputs that fit.
                    self.pin_reads(best, actions);
                }
                break;
            };
            self.ready.retain(|&r| r != id);
            self.tasks_in_flight += 1;
            let node = self.nodes.get_mut(&id).expect("committed task exists");
            node.entries = entries;
            node.missing = missing;
            let pinned: Vec<EntryId> = std::mem::take(&mut node.pinned).into_iter().map(|(_, entry)| entry).collect();
            self.cache.release(&pinned, &vec![AccessMode::Read; pinned.len()]);
            node.phase = Phase::Prefetching;
            if missing == 0 {
                dispatch(self, id);
            }
        }
    }

    /// Prefetches each read-only input of `id` (not committed yet) that fits without
    /// evicting anything dirty, holding a reader reference until the task commits.
    fn pin_reads(&mut self, id: TaskId, actions: &mut Vec<CacheAction>) {
        let Some(node) = self.nodes.get(&id) else { return };
        let wanted: Vec<(usize, AccessSpec)> =
            node.unique.iter().enumerate().filter(|(index, (_, mode))| *mode == AccessMode::Read && !node.pinned.iter().any(|(pinned, _)| pinned == index)).map(|(index, (spec, _))| (index, spec.clone())).collect();
        for (index, spec) in wanted {
            if let Commit::Done { entries, .. } = self.cache.commit(PREFETCH_WAITER, &[(spec, AccessMode::Read)], actions) {
                self.nodes.get_mut(&id).expect("task exists").pinned.push((index, entries[0]));
            }
        }
    }

    /// Drops the prefetch references of ready tasks; true if there were any.
    fn unpin_ready(&mut self) -> bool {
        let mut any = false;
        for id in &self.ready {
            let node = self.nodes.get_mut(id).expect("ready task exists");
            if !node.pinned.is_empty() {
                let pinned: Vec<EntryId> = std::mem::take(&mut node.pinned).into_iter().map(|(_, entry)| entry).collect();
                self.cache.release(&pinned, &vec![AccessMode::Read; pinned.len()]);
                any = true;
            }
        }
        any
    }

    /// While task `id` computes, prefetch the read-only inputs of children that wait only for
    /// it (an accumulate chain's next blocks), when memory allows without evicting anything
    /// dirty. The references taken keep them resident until the child commits.
    fn prefetch_children(&mut self, id: TaskId) {
        let children = self.nodes[&id].children.clone();
        let mut actions = Vec::new();
        for child in children {
            if self.nodes.get(&child).is_some_and(|node| node.phase == Phase::Waiting && node.waiting_parents == 1) {
                self.pin_reads(child, &mut actions);
            }
        }
        self.pending_actions.extend(actions);
    }

    /// Starts the computation of a task whose buffers are all valid.
    fn dispatch<'scope>(&mut self, id: TaskId, scope: &rayon::Scope<'scope>, runtime: &Runtime, inbox: &Arc<Inbox<'s>>, events: &mpsc::Sender<Event>)
    where
        's: 'scope,
    {
        let node = self.nodes.get_mut(&id).expect("dispatched task exists");
        node.phase = Phase::Computing;
        self.computing += 1;
        if let Some(since) = self.idle_since.take() {
            self.compute_idle += since.elapsed();
        }
        let mut task = node.task.take().expect("task dispatched twice");
        let cells: Vec<_> = node.entries.iter().map(|&e| self.cache.buffer(e)).collect();
        let writes: Vec<bool> = node.unique.iter().map(|(_, mode)| mode.writes()).collect();
        let slot_of = node.slot_of.clone();
        let name = node.name.clone();
        let context = TaskContext { inbox: inbox.clone(), events: events.clone(), compute_threads: runtime.options().compute_threads, id };
        let events = events.clone();
        scope.spawn(move |_| {
            let began = Instant::now();
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let slots = slot_of
                    .iter()
                    .map(|&u| {
                        // SAFETY: the program cache gave this task the only reference to each
                        // written buffer and shared ones only to readers (see BufferCell).
                        unsafe {
                            if writes[u] {
                                Slot::Write(Some(cells[u].bytes_mut()))
                            } else {
                                Slot::Read(cells[u].bytes())
                            }
                        }
                    })
                    .collect();
                task.execute(&mut TaskBuffers::new(slots), &context)
            }));
            let result = match outcome {
                Ok(result) => result.map_err(|err| match err {
                    FlashError::TaskFailed { .. } => err,
                    other => FlashError::TaskFailed { task: name.clone(), reason: other.to_string() },
                }),
                Err(panic) => {
                    let reason = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "panicked".into());
                    Err(FlashError::TaskFailed { task: name, reason: format!("panicked: {reason}") })
                }
            };
            drop(task);
            drop(cells);
            let _ = events.send(Event::ComputeDone { id, result, busy: began.elapsed() });
        });
        // After the spawn: evictions and allocations for the prefetches stay off the path
        // from "inputs ready" to "computing".
        self.prefetch_children(id);
    }

    /// Hands the cache's IO to the executor and wakes tasks whose buffers became valid.
    fn perform<'scope>(&mut self, actions: Vec<CacheAction>, runtime: &Runtime, events: &mpsc::Sender<Event>, scope: &rayon::Scope<'scope>, inbox: &Arc<Inbox<'s>>)
    where
        's: 'scope,
    {
        let mut queue = std::collections::VecDeque::from(actions);
        while let Some(action) = queue.pop_front().or_else(|| (!self.pending_actions.is_empty()).then(|| self.pending_actions.remove(0))) {
            match action {
                CacheAction::Read { entry, spec, buffer } => {
                    let events = events.clone();
                    runtime.io().submit_with(IoDirection::Read, spec, buffer, move |result, buffer| {
                        let _ = events.send(Event::ReadDone { entry, result, buffer });
                    });
                }
                CacheAction::Write { entry, spec, buffer } => {
                    let events = events.clone();
                    runtime.io().submit_with(IoDirection::Write, spec, buffer, move |result, buffer| {
                        let _ = events.send(Event::WriteDone { entry, result, buffer });
                    });
                }
                CacheAction::Ready { entry } => {
                    let woken = self.cache.take_waiting(entry);
                    self.wake(woken, scope, runtime, inbox, events);
                }
            }
        }
    }

    fn wake<'scope>(&mut self, tasks: Vec<u64>, scope: &rayon::Scope<'scope>, runtime: &Runtime, inbox: &Arc<Inbox<'s>>, events: &mpsc::Sender<Event>)
    where
        's: 'scope,
    {
        for raw in tasks {
            let id = TaskId(raw);
            let Some(node) = self.nodes.get_mut(&id) else { continue };
            node.missing -= 1;
            if node.missing == 0 && node.phase == Phase::Prefetching && self.error.is_none() {
                self.dispatch(id, scope, runtime, inbox, events);
            }
        }
    }

    fn handle<'scope>(&mut self, event: Event, runtime: &Runtime, events: &mpsc::Sender<Event>, scope: &rayon::Scope<'scope>, inbox: &Arc<Inbox<'s>>)
    where
        's: 'scope,
    {
        let mut actions = Vec::new();
        match event {
            Event::Injected | Event::InjectorDropped => {}
            Event::ReadDone { entry, result, buffer } => {
                let woken = self.cache.read_done(entry, buffer);
                match result {
                    Ok(()) => self.wake(woken, scope, runtime, inbox, events),
                    Err(err) => {
                        self.error.get_or_insert(err);
                    }
                }
            }
            Event::WriteDone { entry, result, buffer } => {
                if let Err(err) = result {
                    self.error.get_or_insert(err);
                }
                self.cache.write_done(entry, buffer, &mut actions);
            }
            Event::ComputeDone { id, result, busy } => {
                let node = self.nodes.remove(&id).expect("completed task exists");
                self.computing -= 1;
                self.compute_busy += busy;
                if self.computing == 0 {
                    self.idle_since = Some(Instant::now());
                }
                self.tasks_in_flight -= 1;
                let modes: Vec<AccessMode> = node.unique.iter().map(|(_, mode)| *mode).collect();
                match result {
                    Ok(()) => {
                        self.cache.release(&node.entries, &modes);
                        self.completed += 1;
                        self.progress.tasks_completed.fetch_add(1, Ordering::Relaxed);
                        for child in node.children {
                            if let Some(c) = self.nodes.get_mut(&child) {
                                c.waiting_parents -= 1;
                                if c.waiting_parents == 0 && c.phase == Phase::Waiting {
                                    c.phase = Phase::Ready;
                                    self.ready.push(child);
                                }
                            }
                        }
                    }
                    Err(err) => {
                        self.cache.abandon(&node.entries, &modes);
                        self.error.get_or_insert(err);
                    }
                }
                for ((spec, _), &entry) in node.unique.iter().zip(&node.entries) {
                    let uses = self.future_uses.get_mut(spec).expect("every declared access is counted");
                    *uses -= 1;
                    if *uses == 0 {
                        self.future_uses.remove(spec);
                        if self.error.is_none() {
                            self.cache.retire(entry, &mut actions);
                        }
                    }
                }
                self.cache.service(&mut actions);
            }
        }
        self.perform(actions, runtime, events, scope, inbox);
    }
}
