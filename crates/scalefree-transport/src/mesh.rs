//! A region per rank, attached by every peer, with a *doorbell*: every one-sided update aimed
//! at a rank bumps that rank's bell (and wakes it if parked), and a rank waiting for any
//! update parks on its own bell. Protocols built on it (the SSP reductions, tensor slots)
//! lay out their own words and buffers after [`MESH_HEADER`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::{wait, Channel, Device, Error, Region, RemoteRegion, Result};

/// What a wait checks besides its own `extra` liveness test.
#[derive(Clone, Copy)]
enum Check {
    /// That every peer of the job is alive.
    AllPeers,
    /// Nothing more (Ctrl-C still ends an interruptible wait).
    ExtraOnly,
}

/// Every rank's region of one protocol, attached, with channels to every peer.
pub struct Mesh {
    pub dev: Device,
    pub me: usize,
    region: Region,
    pub remotes: Vec<RemoteRegion>,
    pub chans: Vec<Channel>,
}

/// Offsets of the doorbell and the waiter count at the start of every mesh region.
const OFF_BELL: usize = 0;
const OFF_WAITERS: usize = 64;
/// Bytes before a design's own layout starts.
pub const MESH_HEADER: usize = 128;

/// A post into the mapped mesh region at `base` (see [`Mesh::post`]): the bytes, then the
/// 64-bit word, then the doorbell.
///
/// # Safety
/// `base` must be a live mesh region holding `off..off+n` and `word..word+8`; `src..src+n`
/// must be readable.
pub(crate) unsafe fn post_mapped(base: *mut u8, off: usize, src: *const u8, n: usize, word: usize, value: u64) {
    unsafe {
        if n > 0 {
            std::ptr::copy_nonoverlapping(src, base.add(off), n);
        }
        (*(base.add(word) as *const AtomicU64)).store(value, Ordering::Release);
        let (bell, waiters) = bell_words(base);
        wait::ring(bell, waiters);
    }
}

/// The doorbell and waiter count of the mesh region at `base`.
///
/// # Safety
/// `base` must be a live mesh region (at least [`MESH_HEADER`] bytes).
pub(crate) unsafe fn bell_words<'a>(base: *mut u8) -> (&'a AtomicU32, &'a AtomicU32) {
    unsafe { (&*(base.add(OFF_BELL) as *const AtomicU32), &*(base.add(OFF_WAITERS) as *const AtomicU32)) }
}

impl Mesh {
    /// Collective: allocates this rank's region of `len` bytes and attaches every peer's.
    pub fn new(dev: &Device, len: usize) -> Result<Self> {
        // Decided before the exchange, the same way on every rank (a rank that gave up after
        // it would free its region while peers still attach to it).
        if (0..dev.size()).any(|r| r != dev.rank() && !dev.is_local(r)) {
            return Err(Error::Unsupported("this protocol needs peers' regions mapped (all ranks on one host)".into()));
        }
        let m = Self::new_posting(dev, len)?;
        for r in &m.remotes {
            if r.mapped_ptr().is_none() {
                return Err(Error::Unsupported("this protocol needs peers' regions mapped (all ranks on one host)".into()));
            }
        }
        Ok(m)
    }

    /// Like [`Mesh::new`] for protocols that reach peers only through [`Mesh::post`] (and
    /// read only their own region): peers on other hosts need not be mapped.
    pub fn new_posting(dev: &Device, len: usize) -> Result<Self> {
        let region = dev.alloc_region(len.max(MESH_HEADER))?;
        let remotes = dev.exchange_regions(&region)?;
        let chans = (0..dev.size()).map(|r| dev.channel(r)).collect::<Result<Vec<_>>>()?;
        Ok(Mesh { dev: dev.clone(), me: dev.rank() as usize, region, remotes, chans })
    }

    /// Writes `n` bytes from `src` to offset `off` of rank `r`'s region, then stores `value`
    /// in its 64-bit word at `word` and rings its bell: the value is seen after the data. On
    /// a mapped peer these are stores; on another host one message.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    pub unsafe fn post(&self, r: usize, off: usize, src: *const u8, n: usize, word: usize, value: u64) -> Result<()> {
        if r == self.me {
            unsafe { post_mapped(self.region.as_ptr(), off, src, n, word, value) };
            return Ok(());
        }
        unsafe { self.chans[r].write_post(src, &self.remotes[r], off, n, word, value) }
    }
    /// Whether rank `r`'s region is mapped here (this rank, or a peer on this host).
    pub fn is_mapped(&self, r: usize) -> bool {
        r == self.me || self.remotes[r].mapped_ptr().is_some()
    }
    /// This rank's own region.
    pub fn region(&self) -> &Region {
        &self.region
    }
    pub fn base(&self, r: usize) -> *mut u8 {
        if r == self.me {
            return self.region.as_ptr();
        }
        self.remotes[r].mapped_ptr().expect("a peer's mesh region is mapped (Mesh::new)")
    }
    pub fn u32_at(&self, r: usize, off: usize) -> &AtomicU32 {
        unsafe { &*(self.base(r).add(off) as *const AtomicU32) }
    }
    pub fn u64_at(&self, r: usize, off: usize) -> &AtomicU64 {
        unsafe { &*(self.base(r).add(off) as *const AtomicU64) }
    }
    pub fn bell(&self, r: usize) -> &AtomicU32 {
        self.u32_at(r, OFF_BELL)
    }
    /// Wakes rank `r` after an update aimed at it.
    pub fn ring(&self, r: usize) {
        wait::ring(self.bell(r), self.u32_at(r, OFF_WAITERS));
    }
    /// One-sided write of `n` bytes from `src` to offset `off` of rank `r`'s region.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    pub unsafe fn put(&self, r: usize, off: usize, src: *const u8, n: usize) -> Result<()> {
        if r == self.me {
            // Into this rank's own region: a copy (a UCX put to itself would complete later).
            crate::region::check_range(self.region.len(), off, n, "mesh put")?;
            unsafe { std::ptr::copy_nonoverlapping(src, self.region.as_ptr().add(off), n) };
            return Ok(());
        }
        unsafe { self.chans[r].write_from(src, &self.remotes[r], off, n) }
    }
    /// Reads this rank's bell; pass the value to [`Mesh::wait_bell`] after checking state,
    /// so no update between the check and the wait is missed.
    pub fn my_bell(&self) -> u32 {
        self.bell(self.me).load(Ordering::SeqCst)
    }
    /// Parks until this rank's bell differs from `seen` (an update arrived), checking that
    /// peers are alive and `extra` (errors of a background thread) meanwhile; only the caller's
    /// thread is `interruptible` (Ctrl-C in Python).
    pub fn wait_bell(
        &self,
        seen: u32,
        timeout: Option<Duration>,
        what: &dyn Fn() -> String,
        extra: &dyn Fn() -> Result<()>,
        interruptible: bool,
    ) -> Result<()> {
        self.wait_bell_with(seen, timeout, what, extra, interruptible, true)
    }

    /// Waits (in the caller's thread) until `ready()` holds, re-checking after every update
    /// aimed at this rank.
    pub fn wait_for(&self, timeout: Option<Duration>, what: &dyn Fn() -> String, mut ready: impl FnMut() -> bool) -> Result<()> {
        loop {
            let seen = self.my_bell();
            if ready() {
                return Ok(());
            }
            self.wait_bell(seen, timeout, what, &|| Ok(()), true)?;
        }
    }

    /// [`Mesh::wait_bell`]; a wait that is not `eager` parks at once instead of spinning and
    /// yielding first (for background threads, which must not take cores from callers).
    pub fn wait_bell_with(
        &self,
        seen: u32,
        timeout: Option<Duration>,
        what: &dyn Fn() -> String,
        extra: &dyn Fn() -> Result<()>,
        interruptible: bool,
        eager: bool,
    ) -> Result<()> {
        self.wait_bell_checked(seen, timeout, what, extra, interruptible, eager, Check::AllPeers)
    }

    #[allow(clippy::too_many_arguments)]
    fn wait_bell_checked(
        &self,
        seen: u32,
        timeout: Option<Duration>,
        what: &dyn Fn() -> String,
        extra: &dyn Fn() -> Result<()>,
        interruptible: bool,
        eager: bool,
        check: Check,
    ) -> Result<()> {
        let mut policy = *self.dev.policy();
        if !eager {
            policy.spin = Duration::ZERO;
            policy.yield_for = Duration::ZERO;
        }
        if let Some(t) = timeout {
            policy.timeout = t;
        }
        let bell = self.bell(self.me);
        let ready = |v: u32| {
            if v != seen {
                return true;
            }
            // Over the network, a waiter that spins runs arrived messages itself.
            let backend = self.dev.backend();
            if eager && backend.drives_progress() {
                backend.progress();
                return bell.load(Ordering::Acquire) != seen;
            }
            false
        };
        let hook = if eager { self.dev.backend().spin_hook() } else { None };
        wait::wait_until_hooked(bell, self.u32_at(self.me, OFF_WAITERS), ready, &policy, what, &|| {
            extra()?;
            match (interruptible, check) {
                (true, Check::AllPeers) => self.dev.check_peers(),
                (false, Check::AllPeers) => self.dev.check_alive(),
                (true, Check::ExtraOnly) => wait::check_interrupt(what),
                (false, Check::ExtraOnly) => Ok(()),
            }
        }, hook)?;
        Ok(())
    }

    /// [`Mesh::wait_bell`] (eager, interruptible) for protocols that survive losses: only
    /// `liveness` decides whether a lost peer ends the wait (a replicated protocol waiting
    /// for any replica of a member), not the loss of any peer of the job.
    pub fn wait_bell_surviving(&self, seen: u32, what: &dyn Fn() -> String, liveness: &dyn Fn() -> Result<()>) -> Result<()> {
        self.wait_bell_checked(seen, None, what, liveness, true, true, Check::ExtraOnly)
    }
}
