//! Test support shared by the crates' integration tests (a dev-dependency only): a job's
//! ranks as threads of this process, each with a device of its own, joined through a fresh
//! rendezvous. Fast, and real enough for the transport and everything above it; the Python
//! suite runs the same checks with real processes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use scalefree_transport::{Device, DeviceOptions, JobInfo, Launcher};

/// Jobs started by this test process so far (each gets an id of its own).
static JOBS: AtomicU32 = AtomicU32::new(0);

/// Rank `rank` of a job of `size` ranks, all on this host, named `job_id`.
pub fn job(rank: u32, size: u32, job_id: &str) -> JobInfo {
    JobInfo {
        rank,
        size,
        local_rank: rank,
        local_size: size,
        job_id: job_id.into(),
        token: "t".into(),
        launcher: Launcher::Scalefree,
        master: None,
        sealed: false,
    }
}

/// Device options for a test: waits give up after `timeout`, ranks meet within 30 s, the
/// transport as the environment says (`SCALEFREE_TRANSPORT`).
pub fn options(timeout: Duration) -> DeviceOptions {
    DeviceOptions { timeout, bootstrap_timeout: Duration::from_secs(30), ..DeviceOptions::default() }
}

/// Runs `f(device)` on each of `n` ranks, threads of this process, of a new job whose id
/// starts with `tag`; returns once every rank has returned. A rank that panics (or whose
/// device cannot open) fails the call.
pub fn ranks<F>(n: u32, tag: &str, opts: DeviceOptions, f: F)
where
    F: Fn(Device) + Send + Sync + Clone + 'static,
{
    let id = format!("{tag}{}-{}", std::process::id(), JOBS.fetch_add(1, Ordering::SeqCst));
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (id, f, opts) = (id.clone(), f.clone(), opts.clone());
            std::thread::spawn(move || f(Device::new(job(r, n, &id), opts).unwrap()))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// A seeded xorshift64 generator for test data and delay schedules (never for secrets).
/// The seed must not be zero.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in `[0, n)` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
