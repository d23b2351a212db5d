//! The gate between a lane's reader threads and callers that read the lanes themselves.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Keeps the reader threads out of the way while callers read the lanes themselves: a
/// reader woken by `poll` at the same time as a spinning caller costs a thread wake-up and
/// a fight for the frame (on 2 cores, about half of a small message's round trip).
pub(crate) struct Gate {
    /// Callers spinning (or yielding) in a wait, reading arrivals themselves.
    pub(super) spinning: AtomicU32,
    /// Until when (ms since `epoch`) the readers keep standing down after a caller that
    /// reads its own arrivals ([`Net::wait_reading`](crate::backends::ucx::Net::wait_reading)) left its
    /// wait: its next call's messages would otherwise find a reader back in `poll` and wake
    /// it for nothing. A caller that parks ends the lease.
    pub(super) lease_until: AtomicU64,
    pub(super) epoch: std::time::Instant,
    /// Set when the lanes close.
    pub(super) closed: Mutex<bool>,
    pub(super) cv: Condvar,
}

/// How long a reader that stood down sleeps before it looks again when no parking caller
/// called it back (a caller whose wait ended while it spun does not: that would be the very
/// wake-up the gate saves; arrivals meanwhile wait at most this long, or until a caller reads
/// them).
pub(super) const STAND_DOWN: Duration = Duration::from_millis(1);

impl crate::wait::SpinHook for Gate {
    fn enter(&self) {
        self.spinning.fetch_add(1, Ordering::SeqCst);
    }
    fn leave(&self, parking: bool) {
        self.spinning.fetch_sub(1, Ordering::SeqCst);
        if parking {
            self.call_back();
        }
    }
}

/// How long the readers stand down after a caller that reads its own arrivals left its
/// wait (see [`Gate::lease_until`]).
pub(super) const LEASE: Duration = Duration::from_millis(2);

impl Gate {
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Readers stay out: callers read the lanes themselves now or did a moment ago.
    pub(super) fn callers_reading(&self) -> bool {
        self.spinning.load(Ordering::SeqCst) > 0 || self.now_ms() < self.lease_until.load(Ordering::SeqCst)
    }

    /// A caller that reads its own arrivals leaves its wait: the readers stand down a
    /// little longer, for its next call.
    pub(crate) fn leave_leased(&self) {
        self.lease_until.store(self.now_ms() + LEASE.as_millis() as u64, Ordering::SeqCst);
        self.spinning.fetch_sub(1, Ordering::SeqCst);
    }

    /// Calls the readers back now if a lease keeps them out: a caller starts bulk writes,
    /// and its peers may write as much to it before anyone here waits (a caller blocked in
    /// a write to a peer that blocks writing to it would otherwise wait out the lease).
    pub(super) fn end_lease(&self) {
        if self.lease_until.load(Ordering::SeqCst) != 0 {
            self.call_back();
        }
    }

    /// Ends any lease and wakes the standing-down readers (they read the lanes again once
    /// no caller spins).
    pub(super) fn call_back(&self) {
        self.lease_until.store(0, Ordering::SeqCst);
        let _g = self.closed.lock().unwrap();
        self.cv.notify_all();
    }
}

impl Gate {
    /// Sleeps while callers spin; false once the lanes are closing.
    pub(super) fn stand_down(&self) -> bool {
        let mut closed = self.closed.lock().unwrap();
        while !*closed && self.callers_reading() {
            // Until the lease ends, or a moment while a caller spins.
            let lease = self.lease_until.load(Ordering::SeqCst).saturating_sub(self.now_ms());
            closed = self.cv.wait_timeout(closed, STAND_DOWN.max(Duration::from_millis(lease))).unwrap().0;
        }
        !*closed
    }
}
