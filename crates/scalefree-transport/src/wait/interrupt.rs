//! The process's interrupt check (Ctrl-C in Python): every parked wait of every thread runs
//! it at least once per check interval.

use std::cell::Cell;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A check the embedding runtime installs for the whole process (Python: run the pending
/// signal handlers); true ends the wait that ran it with [`Error::Interrupted`]. Every parked
/// wait of every thread runs it at least once per check interval, so the check itself decides
/// which threads it concerns (Python runs handlers in its main thread only) and must be cheap
/// for the others.
pub type InterruptCheck = Arc<dyn Fn() -> bool + Send + Sync>;

static INTERRUPT_CHECK: RwLock<Option<InterruptCheck>> = RwLock::new(None);

thread_local! {
    /// When this thread last ran the interrupt check: a thread whose waits each end before
    /// their check interval (a collective's pieces arriving one by one) still runs it.
    static LAST_INTERRUPT_CHECK: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Installs (or with None removes) the process's interrupt check (see [`InterruptCheck`]).
pub fn set_interrupt_check(f: Option<InterruptCheck>) {
    *INTERRUPT_CHECK.write().unwrap_or_else(|e| e.into_inner()) = f;
}

/// Runs the interrupt check now: [`Error::Interrupted`] (naming `what` the caller waited
/// for) when it says so.
pub fn check_interrupt(what: &dyn Fn() -> String) -> Result<()> {
    LAST_INTERRUPT_CHECK.with(|c| c.set(Some(Instant::now())));
    let check = INTERRUPT_CHECK.read().unwrap_or_else(|e| e.into_inner()).clone();
    match check {
        Some(f) if f() => Err(Error::Interrupted(format!("waiting for {}", what()))),
        _ => Ok(()),
    }
}

/// [`check_interrupt`] if this thread has not run it for `interval`.
pub fn check_interrupt_every(interval: Duration, what: &dyn Fn() -> String) -> Result<()> {
    let due = LAST_INTERRUPT_CHECK.with(|c| c.get().is_none_or(|t| t.elapsed() >= interval));
    if due { check_interrupt(what) } else { Ok(()) }
}
