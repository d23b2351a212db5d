//! The task interface: a task declares its reads and writes as access specifiers and
//! computes on the in-memory buffers the runtime hands it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use crate::element::{cast_slice, cast_slice_mut, Element};
use crate::error::{FlashError, Result};
use crate::io::{Access, AccessMode};

use super::scheduler::Event;

/// Identity of a task within one DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub(crate) u64);

/// A unit of work on in-memory blocks of flash-resident data.
///
/// The runtime prefetches every access of [`Task::accesses`] into a buffer (packed strides,
/// see [`crate::AccessSpec`]), calls [`Task::execute`], then writes the buffers of `Write` /
/// `ReadWrite` accesses back (lazily: a buffer shared along an accumulate chain is written
/// once). A task may not write bytes that another of its own accesses covers.
pub trait Task<'s>: Send {
    /// The task's inputs and outputs, in the order [`TaskBuffers`] indexes them.
    fn accesses(&self) -> Vec<Access>;

    /// The computation. Read buffers come from `buffers.read(i)`, written ones from
    /// `buffers.take_write(i)`.
    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, context: &TaskContext<'s>) -> Result<()>;

    /// A name for errors and statistics.
    fn name(&self) -> String {
        "task".to_string()
    }
}

/// A task made of a list of accesses and a closure.
pub struct FnTask<F> {
    name: String,
    accesses: Vec<Access>,
    body: F,
}

impl<F> FnTask<F> {
    /// A task named `name` with these accesses running `body`.
    pub fn new<'s>(name: impl Into<String>, accesses: Vec<Access>, body: F) -> FnTask<F>
    where
        F: FnMut(&mut TaskBuffers<'_>, &TaskContext<'s>) -> Result<()> + Send,
    {
        FnTask { name: name.into(), accesses, body }
    }
}

impl<'s, F> Task<'s> for FnTask<F>
where
    F: FnMut(&mut TaskBuffers<'_>, &TaskContext<'s>) -> Result<()> + Send,
{
    fn accesses(&self) -> Vec<Access> {
        self.accesses.clone()
    }

    fn execute(&mut self, buffers: &mut TaskBuffers<'_>, context: &TaskContext<'s>) -> Result<()> {
        (self.body)(buffers, context)
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

pub(crate) enum Slot<'a> {
    Read(&'a [u8]),
    Write(Option<&'a mut [u8]>),
}

/// The in-memory buffers of a running task, indexed like its accesses.
pub struct TaskBuffers<'a> {
    slots: Vec<Slot<'a>>,
}

impl<'a> TaskBuffers<'a> {
    pub(crate) fn new(slots: Vec<Slot<'a>>) -> TaskBuffers<'a> {
        TaskBuffers { slots }
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when the task declared no accesses.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Read-only view of access `index` (declared `Read`). Panics otherwise (misuse).
    pub fn read<T: Element>(&self, index: usize) -> &'a [T] {
        match &self.slots[index] {
            Slot::Read(bytes) => cast_slice(bytes),
            Slot::Write(_) => panic!("access {index} is an output: use take_write"),
        }
    }

    /// Mutable view of access `index` (declared `Write` or `ReadWrite`); can be taken once.
    /// Panics otherwise (misuse).
    pub fn take_write<T: Element>(&mut self, index: usize) -> &'a mut [T] {
        match &mut self.slots[index] {
            Slot::Write(slot) => cast_slice_mut(slot.take().unwrap_or_else(|| panic!("access {index} was already taken"))),
            Slot::Read(_) => panic!("access {index} is read-only"),
        }
    }
}

/// A task waiting to join the DAG.
pub(crate) struct Injected<'s> {
    pub(crate) id: TaskId,
    pub(crate) task: Box<dyn Task<'s> + 's>,
    pub(crate) accesses: Vec<Access>,
    pub(crate) parents: Vec<TaskId>,
}

/// Tasks injected while the DAG runs, and the id counter.
pub(crate) struct Inbox<'s> {
    pub(crate) pending: Mutex<Vec<Injected<'s>>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) budget_bytes: u64,
    /// Set when the run has returned: later injections are refused.
    pub(crate) closed: std::sync::atomic::AtomicBool,
}

impl<'s> Inbox<'s> {
    pub(crate) fn new(budget_bytes: u64) -> Inbox<'s> {
        Inbox { pending: Mutex::new(Vec::new()), next_id: AtomicU64::new(0), budget_bytes, closed: std::sync::atomic::AtomicBool::new(false) }
    }

    /// Validates a task and queues it; the scheduler is told through `events`.
    pub(crate) fn inject(&self, task: Box<dyn Task<'s> + 's>, parents: &[TaskId], events: &mpsc::Sender<Event>) -> Result<TaskId> {
        if self.closed.load(Ordering::Acquire) {
            return Err(FlashError::invalid("the DAG has finished running; no task can be added"));
        }
        let accesses = task.accesses();
        validate_accesses(&task.name(), &accesses, self.budget_bytes)?;
        let next = self.next_id.load(Ordering::Acquire);
        if let Some(bad) = parents.iter().find(|p| p.0 >= next) {
            return Err(FlashError::invalid(format!("parent {bad:?} is not a task of this DAG")));
        }
        let id = TaskId(self.next_id.fetch_add(1, Ordering::AcqRel));
        self.pending.lock().expect("task inbox poisoned").push(Injected { id, task, accesses, parents: parents.to_vec() });
        let _ = events.send(Event::Injected);
        Ok(id)
    }
}

/// Checks a task's accesses: no write overlapping another access of the same task, and the
/// task's distinct buffers fit the budget.
pub(crate) fn validate_accesses(name: &str, accesses: &[Access], budget_bytes: u64) -> Result<()> {
    for (i, a) in accesses.iter().enumerate() {
        for b in &accesses[i + 1..] {
            let clash = (a.mode.writes() || b.mode.writes()) && (a.spec == b.spec || a.spec.overlaps(&b.spec));
            if clash {
                return Err(FlashError::invalid(format!("task {name} writes {:?} and also accesses {:?}", a.spec, b.spec)));
            }
        }
    }
    let mut distinct: Vec<&Access> = Vec::new();
    for a in accesses {
        if !distinct.iter().any(|d| d.spec == a.spec) {
            distinct.push(a);
        }
    }
    let needed_bytes: u64 = distinct.iter().map(|a| a.spec.size_bytes()).sum();
    if needed_bytes > budget_bytes {
        return Err(FlashError::OutOfBudget { what: format!("task {name}"), needed_bytes, budget_bytes });
    }
    Ok(())
}

/// What a running task can do besides computing: inject more tasks.
pub struct TaskContext<'s> {
    pub(crate) inbox: Arc<Inbox<'s>>,
    pub(crate) events: mpsc::Sender<Event>,
    pub(crate) compute_threads: usize,
    pub(crate) id: TaskId,
}

impl<'s> TaskContext<'s> {
    /// Adds a task to the running DAG (its parents may be complete already).
    pub fn inject(&self, task: impl Task<'s> + 's, parents: &[TaskId]) -> Result<TaskId> {
        self.inbox.inject(Box::new(task), parents, &self.events)
    }

    /// Threads of the compute pool (for a task's own parallelism).
    pub fn compute_threads(&self) -> usize {
        self.compute_threads
    }

    /// The running task's id.
    pub fn task_id(&self) -> TaskId {
        self.id
    }
}

/// A handle that adds tasks to a DAG from other threads while it runs. The run returns only
/// after every `Injector` has been dropped.
pub struct Injector<'s> {
    pub(crate) inbox: Arc<Inbox<'s>>,
    pub(crate) events: mpsc::Sender<Event>,
    pub(crate) live: Arc<AtomicU64>,
}

impl<'s> Injector<'s> {
    /// Adds a task (its parents may be complete already).
    pub fn inject(&self, task: impl Task<'s> + 's, parents: &[TaskId]) -> Result<TaskId> {
        self.inbox.inject(Box::new(task), parents, &self.events)
    }
}

impl Clone for Injector<'_> {
    fn clone(&self) -> Self {
        self.live.fetch_add(1, Ordering::AcqRel);
        Injector { inbox: self.inbox.clone(), events: self.events.clone(), live: self.live.clone() }
    }
}

impl Drop for Injector<'_> {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        let _ = self.events.send(Event::InjectorDropped);
    }
}

/// Distinct (spec, mode) pairs of a task and, for each declared access, which one serves it.
pub(crate) fn unique_accesses(accesses: &[Access]) -> (Vec<(crate::io::AccessSpec, AccessMode)>, Vec<usize>) {
    let mut unique: Vec<(crate::io::AccessSpec, AccessMode)> = Vec::new();
    let mut slot_of = Vec::with_capacity(accesses.len());
    for a in accesses {
        match unique.iter().position(|(s, _)| *s == a.spec) {
            Some(at) => slot_of.push(at),
            None => {
                unique.push((a.spec.clone(), a.mode));
                slot_of.push(unique.len() - 1);
            }
        }
    }
    (unique, slot_of)
}
