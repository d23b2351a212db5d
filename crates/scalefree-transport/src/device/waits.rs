//! A device's waits: for a notification in one of its slots, for a word of memory raised by
//! a peer, with the device's spin/park policy and peer checks; waiters drive the backend's
//! progress when it asks for that, and a wait on arrivals a backend reads in the waiting
//! thread itself goes to the backend.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::control::NOTIFY_SLOTS;
use super::Device;
use crate::error::{Error, Result};
use crate::wait::{self, WaitPolicy};

impl Device {
    pub(crate) fn check_slot(slot: usize) -> Result<()> {
        if slot >= NOTIFY_SLOTS {
            return Err(Error::InvalidArgument(format!("notification slot {slot} is not below {NOTIFY_SLOTS}")));
        }
        Ok(())
    }

    /// Waits for a notification in `slot` of this rank, consumes it and returns its value.
    pub fn wait(&self, slot: usize, timeout: Option<Duration>) -> Result<u32> {
        Self::check_slot(slot)?;
        let me = self.rank();
        let word = self.slot_of(me, slot);
        let mut policy = self.inner.policy;
        if let Some(t) = timeout {
            policy.timeout = t;
        }
        let what = || format!("a notification in slot {slot}");
        if self.reads_own_notifications() {
            let b = &*self.inner.backend;
            b.wait_reading(word, &mut |v| v != 0, &policy, &what, &|| self.check_peers())?;
        } else {
            self.wait_with(word, self.waiters_of(me), |v| v != 0, &policy, &what)?;
        }
        Ok(word.swap(0, Ordering::AcqRel))
    }

    /// Whether a wait for a notification reads the arrivals in its own thread (see
    /// [`crate::Backend::wait_reading`]): when no other rank shares this host (every
    /// notification then comes over the network, and arrivals there wake a waiter parked in
    /// `poll`) and the backend reads every peer's arrivals so (TCP lanes). The data of a notified write is read by the waiter as
    /// a plain socket's receiver would, not handed over from the lane's reader thread: for
    /// 8 posted 1 MiB writes and a notification between 2 simulated hosts, one thread
    /// wake-up per arrival instead of two (`docs/benchmarks/collectives.md`, "Posted
    /// one-sided writes").
    fn reads_own_notifications(&self) -> bool {
        let me = self.rank();
        let b = &*self.inner.backend;
        self.inner.job.local_size == 1 && self.inner.job.size > 1 && (0..self.inner.job.size).all(|r| r == me || b.reads_own_from(r))
    }

    /// Consumes and returns the notification in `slot`, if there is one.
    pub fn test(&self, slot: usize) -> Result<Option<u32>> {
        Self::check_slot(slot)?;
        self.inner.backend.progress();
        let v = self.slot_of(self.rank(), slot).swap(0, Ordering::AcqRel);
        Ok((v != 0).then_some(v))
    }

    /// Waits until `ready(word)` with this device's spin/park policy and peer checks.
    pub fn wait_word(
        &self,
        word: &AtomicU32,
        waiters: &AtomicU32,
        ready: impl FnMut(u32) -> bool,
        what: &dyn Fn() -> String,
    ) -> Result<u32> {
        self.wait_with(word, waiters, ready, &self.inner.policy, what)
    }

    /// Waits on a word that only `peer`'s writes raise, for a latency-bound message (a
    /// small call's): when the backend reads `peer`'s arrivals in the waiting thread (a TCP
    /// lane), this thread reads them itself and parks in `poll` on them (see
    /// [`crate::Backend::wait_reading`]: one thread wake-up per message instead of two);
    /// otherwise as [`Device::wait_word`].
    pub fn wait_from(
        &self,
        peer: u32,
        word: &AtomicU32,
        waiters: &AtomicU32,
        ready: impl FnMut(u32) -> bool,
        what: &dyn Fn() -> String,
    ) -> Result<u32> {
        let b = &*self.inner.backend;
        if b.reads_own_from(peer) {
            let mut ready = ready;
            return b.wait_reading(word, &mut ready, &self.inner.policy, what, &|| self.check_peers());
        }
        self.wait_word(word, waiters, ready, what)
    }

    /// Waits on a word of this host with `policy`: with a backend that drives progress,
    /// spinning drives it (arrivals run their handlers) before parking.
    pub fn wait_with(
        &self,
        word: &AtomicU32,
        waiters: &AtomicU32,
        mut ready: impl FnMut(u32) -> bool,
        policy: &WaitPolicy,
        what: &dyn Fn() -> String,
    ) -> Result<u32> {
        let b = &*self.inner.backend;
        if !b.drives_progress() {
            return wait::wait_until(word, waiters, ready, policy, what, &|| self.check_peers());
        }
        wait::wait_until_hooked(word, waiters, |v| {
            if ready(v) {
                return true;
            }
            b.progress();
            ready(word.load(Ordering::Acquire))
        }, policy, what, &|| self.check_peers(), b.spin_hook())
    }

    /// This rank's notification slot `slot` (a word that peers' notifications raise).
    pub fn my_slot(&self, slot: usize) -> Result<&AtomicU32> {
        Self::check_slot(slot)?;
        Ok(self.slot_of(self.rank(), slot))
    }

    /// The waiter count that goes with [`Device::my_slot`].
    pub fn my_waiters(&self) -> &AtomicU32 {
        self.waiters_of(self.rank())
    }
}
