//! Waiting on a 32-bit word in shared memory: spin briefly, then park on a futex.
//!
//! A writer publishes with [`publish`]: a sequentially consistent store followed by a
//! check of the segment's waiter count, so the futex wake-up syscall is only paid when
//! somebody is actually parked. A waiter registers in that count before it parks and
//! re-checks the word, so no wake-up is lost (the classic futex protocol).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

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
    while yield_start.elapsed() < policy.yield_for {
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
    loop {
        if let Some(v) = park_once() {
            return Ok(v);
        }
        if last_check.elapsed() >= policy.check_interval {
            liveness()?;
            last_check = Instant::now();
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
    fn timeout_is_an_error() {
        let word = AtomicU32::new(0);
        let waiters = AtomicU32::new(0);
        let policy = WaitPolicy {
            spin: Duration::from_micros(1),
            yield_for: Duration::from_micros(100),
            check_interval: Duration::from_millis(10),
            timeout: Duration::from_millis(50),
        };
        let r = wait_until(&word, &waiters, |v| v == 1, &policy, &|| "nothing".into(), &|| Ok(()));
        assert!(matches!(r, Err(Error::Timeout { .. })));
    }
}
