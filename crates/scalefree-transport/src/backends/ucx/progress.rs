//! Progress of the UCX backend: a thread sleeps on the worker's event descriptor
//! (`ucp_worker_arm` + `poll`) and runs the handlers when traffic arrives; a caller that waits
//! spins briefly driving `ucp_worker_progress` (and reading the lanes), then parks on the same
//! futex words as the shared-memory backend, or in `poll` on the lanes. Nobody busy-polls the
//! network without bound.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::ffi::*;
use super::net::{Net, Shared};
use super::net::ucp_static;
use crate::backends::lanes;
use crate::backends::{InFlight, OpState, Request};
use crate::error::Result;
use crate::wait::{self, WaitPolicy};

// A lane's broken write reports the status a broken UCX connection does.
const _: () = assert!(UCS_ERR_CONNECTION_RESET as u32 == OpState::BROKEN);

/// The most credit spins that ended their wait can build up.
pub(super) const SPIN_CREDIT_MAX: u32 = 4;

/// Completion state of one UCX request, shared with its callback.
pub(super) struct Pending {
    pub(super) state: OpState,
    /// Counts the request in `Shared::inflight` until it completes.
    inflight: Option<Arc<Shared>>,
    /// For a notification raised when a rendezvous receive completes: the shared state,
    /// the region's address and length, and the note.
    notify: Option<(Arc<Shared>, usize, usize, u64, u64, u32)>,
}

impl Pending {
    pub(super) fn new(inflight: Option<Arc<Shared>>, notify: Option<(Arc<Shared>, usize, usize, u64, u64, u32)>) -> Self {
        Pending { state: OpState::default(), inflight, notify }
    }
}

impl InFlight for Pending {
    fn state(&self) -> &OpState {
        &self.state
    }
}

pub(super) unsafe extern "C" fn send_cb(request: *mut c_void, status: ucs_status_t, user: *mut c_void) {
    let p = unsafe { Arc::from_raw(user as *const Pending) };
    finish_pending(&p, status);
    unsafe { (ucp_static().request_free)(request) };
}

pub(super) unsafe extern "C" fn recv_data_cb(request: *mut c_void, status: ucs_status_t, _len: usize, user: *mut c_void) {
    unsafe { send_cb(request, status, user) }
}

pub(super) fn finish_pending(p: &Pending, status: ucs_status_t) {
    if let Some(sh) = &p.inflight {
        sh.inflight.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some((sh, addr, len, note, index, value)) = &p.notify {
        if status == UCS_OK {
            sh.raise(*addr, *len, *note, *index, *value);
        }
    }
    p.state.finish(status as u32);
}

impl Shared {
    pub(super) fn progress(&self) -> u32 {
        let k = unsafe { (self.ucp.worker_progress)(self.worker) };
        if self.announcing.load(Ordering::Relaxed) {
            self.announce_losses();
        }
        k
    }
}

impl Net {
    /// Runs the handlers of whatever has arrived (callers do this while they spin).
    pub fn progress(&self) -> u32 {
        let k = self.shared.progress();
        match &self.lanes {
            Some(l) => k + l.poll(),
            None => k,
        }
    }
    /// Waits for a request started by one of the `start_*` calls.
    pub fn wait_request(&self, req: &Request, policy: &WaitPolicy) -> Result<()> {
        let (peer, what) = (req.peer, &req.what);
        let op = req.op.state();
        if let Some(h) = &req.helper {
            h.help(op, policy.check_interval);
        }
        let (done, waiters) = op.words();
        self.wait_word(done, waiters, |v| v != 0, policy, &|| format!("{what} to rank {peer} to complete"))?;
        let st = op.status() as ucs_status_t;
        if st != UCS_OK {
            return Err(self.lost_error(peer, what, st));
        }
        Ok(())
    }

    /// Waits on a local word while driving progress: spin with progress, then park (the
    /// progress thread wakes us).
    pub fn wait_word(&self, word: &AtomicU32, waiters: &AtomicU32, mut ready: impl FnMut(u32) -> bool, policy: &WaitPolicy, what: &dyn Fn() -> String) -> Result<u32> {
        wait::wait_until_hooked(word, waiters, |v| {
            if ready(v) {
                return true;
            }
            self.progress();
            ready(word.load(Ordering::Acquire))
        }, policy, what, &|| self.check_alive(), self.spin_hook())
    }

    /// How long [`Net::wait_reading`] spins before it parks: `spin` while spinning pays
    /// (recent waits ended during their spin), else not at all but for every 32nd wait,
    /// which tries again. Where ranks outnumber cores (simulated hosts) a spinning waiter
    /// only delays the rank that would send it its message.
    pub(super) fn spin_budget(&self, spin: std::time::Duration) -> std::time::Duration {
        let sh = &self.shared;
        let probe = sh.waits.fetch_add(1, Ordering::Relaxed).is_multiple_of(32);
        if sh.spin_credit.load(Ordering::Relaxed) > 0 || probe { spin } else { std::time::Duration::ZERO }
    }

    /// Records whether a spin of `spin` ended the wait.
    pub(super) fn spun(&self, spin: std::time::Duration, hit: bool) {
        if spin.is_zero() {
            return;
        }
        let c = &self.shared.spin_credit;
        let v = c.load(Ordering::Relaxed);
        c.store(if hit { (v + 1).min(SPIN_CREDIT_MAX) } else { v.saturating_sub(1) }, Ordering::Relaxed);
    }

    /// Whether [`Net::wait_reading`] can serve a wait for a word only `peer` raises: it
    /// writes to this rank over a TCP lane (`SCALEFREE_OWN_READS=0` turns it off).
    pub fn reads_own_from(&self, peer: u32) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| crate::config::env_switch("SCALEFREE_OWN_READS"))
            && self.lanes.as_ref().is_some_and(|l| l.has(peer))
    }

    /// Waits until `ready(word)` holds, reading the lanes in this thread: spin (driving
    /// progress) for `policy.spin`, then park in `poll` on the lanes' sockets and an
    /// eventfd that other threads raising a word write to, and read whatever arrives here.
    /// The lanes' reader threads stand down meanwhile and for a moment after (the next
    /// call's messages must not wake them), so a small message costs the receiver one
    /// wake-up, not two (reader, then waiter). Only for a word that arrivals over the lanes
    /// raise ([`Net::reads_own_from`]): a peer on this host raises its words by futex.
    pub fn wait_reading(&self, word: &AtomicU32, mut ready: impl FnMut(u32) -> bool, policy: &WaitPolicy, what: &dyn Fn() -> String,
                        liveness: &dyn Fn() -> Result<()>) -> Result<u32> {
        let v = word.load(Ordering::Acquire);
        if ready(v) {
            return Ok(v);
        }
        let lanes = self.lanes.as_ref().expect("checked by reads_own_from");
        let gate = lanes.gate();
        wait::SpinHook::enter(gate);
        struct Leave<'a>(&'a lanes::Gate);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.leave_leased();
            }
        }
        let _leave = Leave(gate);
        let start = std::time::Instant::now();
        let spin = self.spin_budget(policy.spin);
        loop {
            // Each check is a few system calls: the clock is cheap beside them.
            self.progress();
            let v = word.load(Ordering::Acquire);
            if ready(v) {
                self.spun(spin, true);
                return Ok(v);
            }
            if start.elapsed() >= spin {
                break;
            }
        }
        self.spun(spin, false);
        let sh = &self.shared;
        let mut fds: Vec<libc::pollfd> = lanes.fds().into_iter().chain([sh.kick_fd])
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 }).collect();
        let kick = fds.len() - 1;
        wait::park_until(start, policy, what, liveness, || {
            sh.pollers.fetch_add(1, Ordering::SeqCst);
            let v = word.load(Ordering::SeqCst);
            if ready(v) {
                sh.pollers.fetch_sub(1, Ordering::SeqCst);
                return Some(v);
            }
            let ms = policy.check_interval.as_millis().clamp(1, i32::MAX as u128) as i32;
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            sh.pollers.fetch_sub(1, Ordering::SeqCst);
            let kicked = fds[kick].revents & libc::POLLIN != 0;
            for (k, p) in fds.iter_mut().enumerate() {
                if p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0 && k != kick {
                    // A lane its peer closed (done with this job, or gone) or that broke: what
                    // is left on it is read below, and then it is not polled again (it would
                    // be readable for ever). A peer that is gone is the liveness check's to
                    // report, at its usual pace: a peer that finished the job and left is no
                    // error for a wait that does not need it.
                    p.fd = -1;
                }
                p.revents = 0;
            }
            if kicked {
                let mut count = 0u64;
                unsafe { libc::read(sh.kick_fd, &mut count as *mut u64 as *mut c_void, 8) };
            }
            self.progress();
            let v = word.load(Ordering::Acquire);
            ready(v).then_some(v)
        })
    }

    /// For a waiter that drives progress while it spins: the lanes' reader threads stand
    /// down meanwhile (see [`lanes::Gate`]).
    pub fn spin_hook(&self) -> Option<&dyn wait::SpinHook> {
        self.lanes.as_ref().map(|l| l.gate() as &dyn wait::SpinHook)
    }
}

/// Sleeps on the worker's event descriptor; runs handlers when anything arrives.
pub(super) fn progress_loop(sh: &Shared, efd: c_int) {
    let u = sh.ucp;
    let every = (sh.peer_timeout / 10).clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1));
    let mut last_beat = std::time::Instant::now();
    while !sh.stop.load(Ordering::SeqCst) {
        if last_beat.elapsed() >= every {
            sh.heartbeat();
            last_beat = std::time::Instant::now();
        }
        while sh.progress() != 0 {}
        let s = unsafe { (u.worker_arm)(sh.worker) };
        if s == UCS_ERR_BUSY {
            continue;
        }
        // With data in flight, look again soon even without an event (a socket that can
        // take more data is not always reported); otherwise sleep until something arrives.
        let ms = if sh.inflight.load(Ordering::SeqCst) > 0 { 1 } else { every.as_millis().min(100) as i32 };
        let mut p = libc::pollfd { fd: efd, events: libc::POLLIN, revents: 0 };
        unsafe { libc::poll(&mut p, 1, ms) };
    }
}
