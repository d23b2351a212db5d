//! Waiting on a 32-bit word in shared memory: spin briefly, then park on a futex.
//!
//! A writer publishes with [`publish`]: a sequentially consistent store followed by a
//! check of the segment's waiter count, so the futex wake-up syscall is only paid when
//! somebody is actually parked. A waiter registers in that count before it parks and
//! re-checks the word, so no wake-up is lost (the classic futex protocol).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

mod interrupt;
mod stopped;

pub use interrupt::{check_interrupt, check_interrupt_every, set_interrupt_check, InterruptCheck};
use stopped::StoppedWatch;
pub use stopped::{set_local_peers, StoppedPeer};

/// How a wait behaves. Chosen once per device from the number of ranks per core.
#[derive(Clone, Copy, Debug)]
pub struct WaitPolicy {
    /// Busy-spin this long before yielding the core.
    pub spin: Duration,
    /// Then keep checking but call `sched_yield` between checks, this long: any other
    /// runnable task on this core (another rank, another program) runs first. Parking costs
    /// a wake-up latency (≈100 µs in a VM); once one rank parks, a partner whose spin is
    /// shorter than that latency parks too, and every later call pays it. Yielding keeps
    /// latency low without holding a core anyone else wants.
    pub yield_for: Duration,
    /// Park on the futex for at most this long before re-checking peers' liveness.
    pub check_interval: Duration,
    /// Give up after this long with [`Error::Timeout`] (peers still alive but silent).
    pub timeout: Duration,
    /// Warn on stderr after this long without progress (`SCALEFREE_PEER_TIMEOUT`, default
    /// [`DEFAULT_PEER_TIMEOUT`]; zero: never), and again each time the wait doubles. (A peer
    /// on another host silent this long counts as lost: see the UCX backend's heartbeats.)
    pub peer_timeout: Duration,
}

/// Threads of this process that need the cores while its ranks wait (the TCP lanes' readers
/// and writers while lanes carry writes, the MF block loader): while any runs, waits skip the
/// yield phase — spin, then park — unless `SCALEFREE_YIELD_US` is set: a waiter yielding for
/// up to a millisecond keeps the core those threads need (1 MiB allreduce across 4 simulated
/// hosts: 3.7 -> 1.9 ms; rima under a memory budget at 4 ranks on 2 cores: 0.85 s with the
/// yield phase, 0.69 s without; `docs/benchmarks/mf.md`).
static HELPER_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Registers a thread that needs the cores while this process waits (see
/// [`HELPER_THREADS`]); dropping the guard unregisters it.
#[must_use = "the registration ends when the guard is dropped"]
pub struct HelperThread(());

impl HelperThread {
    pub fn register() -> Self {
        HELPER_THREADS.fetch_add(1, Ordering::Relaxed);
        HelperThread(())
    }
}

impl Drop for HelperThread {
    fn drop(&mut self) {
        HELPER_THREADS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many [`HelperThread`] registrations are live.
pub fn helper_threads() -> usize {
    HELPER_THREADS.load(Ordering::Relaxed)
}

/// How long a wait yields: the policy's, or nothing while helper threads need the cores and
/// the user did not set `SCALEFREE_YIELD_US`.
fn yield_phase(policy: &WaitPolicy) -> Duration {
    static SET_BY_USER: OnceLock<bool> = OnceLock::new();
    if HELPER_THREADS.load(Ordering::Relaxed) > 0 && !*SET_BY_USER.get_or_init(|| std::env::var_os("SCALEFREE_YIELD_US").is_some()) {
        Duration::ZERO
    } else {
        policy.yield_for
    }
}

/// How long a wait lasts before it warns that a live peer makes no progress.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// `SCALEFREE_PEER_TIMEOUT` in seconds (fractions allowed; positive).
pub fn peer_timeout_from_env() -> Duration {
    std::env::var("SCALEFREE_PEER_TIMEOUT").ok().and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0).map(Duration::from_secs_f64).unwrap_or(DEFAULT_PEER_TIMEOUT)
}

/// This process's rank and the host name of every rank, for the warnings of waits.
static PEER_HOSTS: std::sync::Mutex<Option<(u32, Vec<String>)>> = std::sync::Mutex::new(None);

/// Tells the warnings of waits who this rank is and where every rank runs.
pub fn set_peer_hosts(me: u32, hosts: Vec<String>) {
    *PEER_HOSTS.lock().unwrap_or_else(|e| e.into_inner()) = Some((me, hosts));
}

/// The warning of a wait for `what` that has lasted `waited` (see [`WaitPolicy::peer_timeout`]).
fn silent_peer_warning(what: &str, waited: Duration, timeout: Duration) -> String {
    let guard = PEER_HOSTS.lock().unwrap_or_else(|e| e.into_inner());
    let me = guard.as_ref().map(|(m, _)| format!("rank {m}")).unwrap_or_else(|| "this rank".into());
    // The rank the wait names ("rank 3's piece ..."), and its host.
    let peer = what.split("rank ").skip(1).find_map(|t| {
        let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse::<u32>().ok()
    });
    let who = match peer {
        Some(p) => {
            let host = guard.as_ref().and_then(|(_, h)| h.get(p as usize)).filter(|h| !h.is_empty());
            match host {
                Some(h) => format!("rank {p} (host {h})"),
                None => format!("rank {p}"),
            }
        }
        None => "a peer".into(),
    };
    format!(
        "scalefree: warning: {me} has waited {:.0} s for {what}: {who} is alive but has made no progress for {:.0} s \
         (stopped, in a debugger, or much slower?); the wait fails after SCALEFREE_TIMEOUT={:.0} s",
        waited.as_secs_f64(), waited.as_secs_f64(), timeout.as_secs_f64()
    )
}

impl WaitPolicy {
    /// Spin long when every rank has a core, barely at all when they share cores.
    pub fn for_load(ranks_on_host: usize, timeout: Duration) -> Self {
        let cores = available_cores();
        let oversubscribed = ranks_on_host > cores;
        let spin_us = env_u64("SCALEFREE_SPIN_US").unwrap_or(if oversubscribed { 2 } else { 20 });
        let yield_us = env_u64("SCALEFREE_YIELD_US").unwrap_or(1000);
        WaitPolicy {
            spin: Duration::from_micros(spin_us),
            yield_for: Duration::from_micros(yield_us),
            check_interval: Duration::from_millis(50),
            timeout,
            peer_timeout: peer_timeout_from_env(),
        }
    }
}

pub(crate) fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Cores this process may run on.
pub fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Stores `value` into `word` and wakes parked waiters, if any.
#[inline]
pub fn publish(word: &AtomicU32, waiters: &AtomicU32, value: u32) {
    word.swap(value, Ordering::SeqCst);
    if waiters.load(Ordering::SeqCst) != 0 {
        futex_wake(word);
    }
}

/// Wakes waiters parked on `word` if there are any (after a store made elsewhere).
#[inline]
pub fn wake_if_waiting(word: &AtomicU32, waiters: &AtomicU32) {
    if waiters.load(Ordering::SeqCst) != 0 {
        futex_wake(word);
    }
}

/// Wakes every waiter parked on `word` (when no waiter count goes with it).
#[inline]
pub fn wake_all(word: &AtomicU32) {
    futex_wake(word);
}

/// Raises `word` to `value` in sequence order (never lowers it; 0 counts as unset) and
/// wakes its waiters.
pub fn raise(word: &AtomicU32, value: u32) {
    let mut cur = word.load(Ordering::Acquire);
    while cur == 0 || seq_reached(value, cur) {
        match word.compare_exchange_weak(cur, value, Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => break,
            Err(v) => cur = v,
        }
    }
    futex_wake(word);
}

/// Adds one to `word` (a doorbell) and wakes parked waiters, if any. Unlike [`publish`],
/// every call changes the word, so concurrent ringers never cancel out.
#[inline]
pub fn ring(word: &AtomicU32, waiters: &AtomicU32) {
    word.fetch_add(1, Ordering::SeqCst);
    if waiters.load(Ordering::SeqCst) != 0 {
        futex_wake(word);
    }
}

/// Waits until `ready(word)` holds. `liveness` is called every `check_interval` while
/// parked and should return an error when a peer this wait depends on is gone.
#[inline]
pub fn wait_until(
    word: &AtomicU32,
    waiters: &AtomicU32,
    ready: impl FnMut(u32) -> bool,
    policy: &WaitPolicy,
    what: &dyn Fn() -> String,
    liveness: &dyn Fn() -> Result<()>,
) -> Result<u32> {
    wait_until_hooked(word, waiters, ready, policy, what, liveness, None)
}

/// Told when a waiter starts driving arrivals itself (spinning or yielding) and when it
/// stops: `leave(true)` when it is about to park (someone else must take over now),
/// `leave(false)` when its wait ended while it spun.
pub trait SpinHook {
    fn enter(&self);
    fn leave(&self, parking: bool);
}

/// [`wait_until`], telling `hook` when the waiter spins and when it parks.
#[inline]
pub fn wait_until_hooked(
    word: &AtomicU32,
    waiters: &AtomicU32,
    mut ready: impl FnMut(u32) -> bool,
    policy: &WaitPolicy,
    what: &dyn Fn() -> String,
    liveness: &dyn Fn() -> Result<()>,
    hook: Option<&dyn SpinHook>,
) -> Result<u32> {
    let v = word.load(Ordering::Acquire);
    if ready(v) {
        return Ok(v);
    }
    wait_slow(word, waiters, &mut ready, policy, what, liveness, hook)
}

/// Calls `leave(false)` on drop unless the waiter parked (then `leave(true)` was called).
struct Spinning<'a>(Option<&'a dyn SpinHook>);

impl Spinning<'_> {
    fn park(&mut self) {
        if let Some(h) = self.0.take() {
            h.leave(true);
        }
    }
}

impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            h.leave(false);
        }
    }
}

#[cold]
fn wait_slow(
    word: &AtomicU32,
    waiters: &AtomicU32,
    ready: &mut dyn FnMut(u32) -> bool,
    policy: &WaitPolicy,
    what: &dyn Fn() -> String,
    liveness: &dyn Fn() -> Result<()>,
    hook: Option<&dyn SpinHook>,
) -> Result<u32> {
    let start = Instant::now();
    if let Some(h) = hook {
        h.enter();
    }
    let mut spinning = Spinning(hook);
    // Phase 1: spin.
    let mut i = 0u32;
    loop {
        let v = word.load(Ordering::Acquire);
        if ready(v) {
            return Ok(v);
        }
        std::hint::spin_loop();
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) && start.elapsed() >= policy.spin {
            break;
        }
    }
    // Phase 2: keep checking, but let anything else runnable on this core go first.
    let yield_start = Instant::now();
    let yield_for = yield_phase(policy);
    while yield_start.elapsed() < yield_for {
        unsafe { libc::sched_yield() };
        let v = word.load(Ordering::Acquire);
        if ready(v) {
            return Ok(v);
        }
    }
    // Phase 3: park on the futex.
    spinning.park();
    park_until(start, policy, what, liveness, || {
        waiters.fetch_add(1, Ordering::SeqCst);
        let v = word.load(Ordering::SeqCst);
        if ready(v) {
            waiters.fetch_sub(1, Ordering::SeqCst);
            return Some(v);
        }
        futex_wait(word, v, policy.check_interval);
        waiters.fetch_sub(1, Ordering::SeqCst);
        let v = word.load(Ordering::Acquire);
        ready(v).then_some(v)
    })
}

/// The parking phase of a wait that started at `start`: `park_once` sleeps at most
/// `policy.check_interval` (registered as a sleeper, re-checking before it sleeps so no
/// wake-up is lost) and returns the word's value once ready; meanwhile `liveness` runs every
/// `check_interval` and the wait fails with [`Error::Timeout`] after `policy.timeout`.
pub(crate) fn park_until(
    start: Instant,
    policy: &WaitPolicy,
    what: &dyn Fn() -> String,
    liveness: &dyn Fn() -> Result<()>,
    mut park_once: impl FnMut() -> Option<u32>,
) -> Result<u32> {
    let mut last_check = Instant::now();
    let mut warn_at = policy.peer_timeout;
    let mut stopped = StoppedWatch::new();
    loop {
        if let Some(v) = park_once() {
            return Ok(v);
        }
        // Whatever `liveness` checks, a parked wait ends on Ctrl-C (see `InterruptCheck`).
        check_interrupt_every(policy.check_interval, what)?;
        if last_check.elapsed() >= policy.check_interval {
            liveness()?;
            stopped.check(start, policy.peer_timeout)?;
            last_check = Instant::now();
            // Every peer is alive (or liveness would have failed): say who we wait for.
            let waited = start.elapsed();
            if !warn_at.is_zero() && waited >= warn_at && waited < policy.timeout {
                eprintln!("{}", silent_peer_warning(&what(), waited, policy.timeout));
                warn_at = waited * 2;
            }
        }
        if start.elapsed() >= policy.timeout {
            return Err(Error::Timeout {
                timeout: policy.timeout,
                waiting_for: what(),
            });
        }
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // Shared (not PRIVATE) futex: the word lives in memory mapped by several processes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// `a >= b` for sequence numbers that wrap around.
#[inline]
pub fn seq_reached(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < (1 << 31)
}

#[cfg(test)]
mod tests {
    use super::stopped::process_stopped;
    use super::*;
    use std::sync::Arc;

    #[test]
    fn wrapping_sequence_compare() {
        assert!(seq_reached(5, 5));
        assert!(seq_reached(6, 5));
        assert!(!seq_reached(4, 5));
        assert!(seq_reached(1, u32::MAX));
        assert!(!seq_reached(u32::MAX, 1));
    }

    #[test]
    fn parked_waiter_is_woken() {
        let word = Arc::new(AtomicU32::new(0));
        let waiters = Arc::new(AtomicU32::new(0));
        let policy = WaitPolicy {
            spin: Duration::from_micros(1),
            yield_for: Duration::ZERO,
            check_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(20),
            peer_timeout: Duration::ZERO,
        };
        let (w, c) = (word.clone(), waiters.clone());
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            wait_until(&w, &c, |v| v == 7, &policy, &|| "test".into(), &|| Ok(())).unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        publish(&word, &waiters, 7);
        let waited = t.join().unwrap();
        // Woken by the futex, not by the 5 s check interval.
        assert!(waited < Duration::from_secs(4), "{waited:?}");
    }

    #[test]
    fn registered_helper_threads_turn_the_yield_phase_off() {
        let policy = WaitPolicy {
            spin: Duration::from_micros(1),
            yield_for: Duration::from_millis(1),
            check_interval: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
            peer_timeout: Duration::ZERO,
        };
        // A user's SCALEFREE_YIELD_US wins over the helpers (the test's environment may set it).
        let user = std::env::var_os("SCALEFREE_YIELD_US").is_some();
        let a = HelperThread::register();
        let b = HelperThread::register();
        assert_eq!(yield_phase(&policy), if user { policy.yield_for } else { Duration::ZERO });
        drop(a);
        assert_eq!(yield_phase(&policy), if user { policy.yield_for } else { Duration::ZERO });
        drop(b);
        // (Other tests of this binary register none, so the count is back to 0.)
        assert_eq!(yield_phase(&policy), policy.yield_for);
    }

    #[test]
    fn timeout_is_an_error() {
        let word = AtomicU32::new(0);
        let waiters = AtomicU32::new(0);
        let policy = WaitPolicy {
            spin: Duration::from_micros(1),
            yield_for: Duration::from_micros(100),
            check_interval: Duration::from_millis(10),
            timeout: Duration::from_millis(50),
            peer_timeout: Duration::ZERO,
        };
        let r = wait_until(&word, &waiters, |v| v == 1, &policy, &|| "nothing".into(), &|| Ok(()));
        assert!(matches!(r, Err(Error::Timeout { .. })));
    }

    #[test]
    fn the_interrupt_check_ends_a_parked_wait_in_the_threads_it_concerns() {
        use std::sync::atomic::AtomicBool;
        let word = AtomicU32::new(0);
        let waiters = AtomicU32::new(0);
        let policy = WaitPolicy {
            spin: Duration::from_micros(1),
            yield_for: Duration::ZERO,
            check_interval: Duration::from_millis(20),
            timeout: Duration::from_secs(20),
            peer_timeout: Duration::ZERO,
        };
        let raised = Arc::new(AtomicBool::new(false));
        let me = std::thread::current().id();
        let flag = raised.clone();
        // Only this test's thread is interrupted (other tests of the binary wait meanwhile).
        set_interrupt_check(Some(Arc::new(move || std::thread::current().id() == me && flag.load(Ordering::SeqCst))));
        let setter = {
            let raised = raised.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                raised.store(true, Ordering::SeqCst);
            })
        };
        let start = Instant::now();
        // A liveness check that never looks at interrupts (a UCX request's wait).
        let r = wait_until(&word, &waiters, |v| v == 1, &policy, &|| "a word nobody raises".into(), &|| Ok(()));
        set_interrupt_check(None);
        setter.join().unwrap();
        match r {
            Err(Error::Interrupted(what)) => assert_eq!(what, "waiting for a word nobody raises"),
            other => panic!("{other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    }

    #[test]
    fn a_process_stopped_by_a_signal_is_seen_stopped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!process_stopped(pid));
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !process_stopped(pid) {
            assert!(Instant::now() < deadline, "never seen stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        while process_stopped(pid) {
            assert!(Instant::now() < deadline, "never seen running again");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!process_stopped(u32::MAX), "no such process");
    }

    #[test]
    fn the_warning_names_the_silent_rank_and_its_host() {
        set_peer_hosts(0, vec!["h0".into(), "h1".into(), "node7".into()]);
        let w = silent_peer_warning("rank 2's piece 0 of allreduce call #4", Duration::from_secs(31), Duration::from_secs(1800));
        assert!(w.contains("rank 0 has waited 31 s for rank 2's piece") && w.contains("rank 2 (host node7)"), "{w}");
        assert!(w.contains("no progress for 31 s") && w.contains("SCALEFREE_TIMEOUT=1800"), "{w}");
        let w = silent_peer_warning("a notification in slot 3", Duration::from_secs(5), Duration::from_secs(9));
        assert!(w.contains("a peer is alive"), "{w}");
    }
}
