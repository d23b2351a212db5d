//! Backends implement how bytes move between ranks. Each has the same set of pieces:
//! memory (how a region is made addressable by peers) and copies (how a write or read
//! reaches a peer's region).
//!
//! [`Backend`] is what a [`crate::Device`] and its [`crate::Channel`]s ask of one: two
//! implement it, [`shm::Shm`] (every rank on this host: mapped memory and cross-memory
//! attach) and [`ucx::Ucx`] (peers on other hosts over UCX and TCP lanes; peers on this host
//! still through mapped memory). What only some backends can do is an optional capability,
//! reached through an accessor that returns `None` elsewhere: [`DirectLanding`] (arriving
//! writes received straight into the caller's buffer). Code above the transport (the
//! collectives) names the trait and the capabilities, never a backend.

use std::any::Any;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crate::device::Device;
use crate::error::Result;
use crate::region::RemoteRegion;
use crate::wait::{SpinHook, WaitPolicy};

pub mod shm;
pub mod ucx;

/// The handles of a backend that reaches peers through keys rather than mappings: a local
/// region's registration, a peer region's unpacked key, an operation in flight. Only the
/// network backend makes them; on shared memory they never exist.
pub use ucx::{Registration, RemoteKey, Request};

/// What a write raises at the target once its data has landed.
#[derive(Clone, Copy, Debug)]
pub enum Note {
    None,
    /// The device's notification slot `.0` becomes at least `.1` (sequence order).
    Slot(u32, u32),
    /// The 32-bit word at byte offset `.0` of the same region becomes at least `.1`.
    Word(u64, u32),
    /// The 64-bit word at byte offset `.0` of the same region (a mesh region) becomes `.1`,
    /// then the region's doorbell rings.
    Post(u64, u64),
}

/// Reduces `bytes` bytes at `src` into `dst` (`dst = dst op src`, element-wise): what a
/// reducing window does with each part of a write as it arrives.
pub type Reducer = Arc<dyn Fn(*mut u8, *const u8, usize) + Send + Sync>;

/// A window of direct landing (see [`DirectLanding::set`]): arriving writes into `[offset,
/// offset + len)` of the region go to `dst` instead, copied, or reduced into it by `reduce`.
#[derive(Clone)]
pub struct Window {
    pub offset: usize,
    pub len: usize,
    pub dst: *mut u8,
    pub reduce: Option<Reducer>,
}

/// Capability: writes that arrive through this rank's own reader (TCP lanes) can be
/// received straight into a caller's buffer instead of the region they target.
pub trait DirectLanding {
    /// Until [`DirectLanding::clear`], arriving writes into the region with key `key` that
    /// fall whole inside a window go to its `dst` (copied, or reduced into it), and store
    /// their note's value `flag_delta` bytes after their note word.
    ///
    /// # Safety
    /// Every window's `dst..dst+len` must stay writable (and readable, for a reducing one),
    /// and untouched by anyone else, until `clear` returns.
    unsafe fn set(&self, key: u64, windows: &[Window], flag_delta: usize);
    /// Ends direct landing; returns once no arriving write touches a window any more (a
    /// writer stuck mid-write for `timeout` has its connection shut down).
    fn clear(&self, timeout: Duration);
    /// Bytes received by direct landing since the device opened: (copied, reduced).
    fn landed_bytes(&self) -> (u64, u64);
}

/// How a device moves bytes and notifications to its peers. Operations name the target by
/// its [`RemoteRegion`]; `dev` is the device the call comes from (its peers, control
/// segments and wait policy). Counting traffic and checking arguments is the channel's job.
pub trait Backend: Send + Sync + 'static {
    /// `"shm"` or `"ucx"`.
    fn name(&self) -> &'static str;
    /// For backend-specific introspection (tests, diagnostics): downcast to the backend.
    fn as_any(&self) -> &dyn Any;
    /// Whether memory is registered and peers' regions are reached through keys (regions
    /// then travel with their key, see [`Backend::register`], [`Backend::remote_key`]).
    fn keyed(&self) -> bool {
        false
    }

    /// Whether waiters should drive [`Backend::progress`] while they spin.
    fn drives_progress(&self) -> bool {
        false
    }
    /// Runs whatever arrived and advances operations in flight.
    fn progress(&self) {}
    /// Told when a waiter that drives progress spins and parks.
    fn spin_hook(&self) -> Option<&dyn SpinHook> {
        None
    }
    /// Whether [`Backend::wait_reading`] can serve a wait on a word only `peer` raises.
    fn reads_own_from(&self, _peer: u32) -> bool {
        false
    }
    /// Waits for `word` reading `peer`'s arrivals in this thread (only when
    /// [`Backend::reads_own_from`]).
    fn wait_reading(
        &self,
        _word: &AtomicU32,
        _ready: &mut dyn FnMut(u32) -> bool,
        _policy: &WaitPolicy,
        _what: &dyn Fn() -> String,
        _liveness: &dyn Fn() -> Result<()>,
    ) -> Result<u32> {
        Err(crate::Error::Unsupported(format!("{} waits read no arrivals themselves", self.name())))
    }

    /// Errors when the backend learnt that a peer is lost.
    fn check_alive(&self) -> Result<()> {
        Ok(())
    }
    /// Tells the backend (and through it, peers on other hosts) that `rank` is lost.
    fn note_lost(&self, _rank: u32, _why: String) {}
    /// Whether the backend learnt that `rank` is lost (for callers that survive a loss).
    fn is_lost(&self, _rank: u32) -> bool {
        false
    }

    /// Makes `ptr..ptr+len` reachable by key; `None` when mapping it is enough.
    fn register(&self, _ptr: *mut u8, _len: usize, _key: u64) -> Result<Option<Registration>> {
        Ok(None)
    }
    /// A peer's region key, from its packed bytes.
    fn remote_key(&self, peer: u32, _addr: u64, _packed: &[u8]) -> Result<Arc<RemoteKey>> {
        Err(crate::Error::Unsupported(format!("rank {peer}'s region carries a key, but {} uses none", self.name())))
    }

    /// Copies `n` (> 0) bytes from `src` into `remote[off..]`; returns once `src` may be reused.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    unsafe fn write(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize) -> Result<()>;
    /// Copies `n` (> 0) bytes of `remote[off..]` into `dst`.
    ///
    /// # Safety
    /// `dst..dst+n` must be writable and not overlap the source.
    unsafe fn read(&self, dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<()>;
    /// [`Backend::write`] that may return before it completes (then with its request).
    ///
    /// # Safety
    /// `src..src+n` must stay readable until the request is done.
    unsafe fn start_write(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize) -> Result<Option<Request>> {
        unsafe { self.write(dev, peer, src, remote, off, n)? };
        Ok(None)
    }
    /// [`Backend::read`] that may return before it completes (then with its request).
    ///
    /// # Safety
    /// `dst..dst+n` must stay writable, and unread, until the request is done.
    unsafe fn start_read(&self, dev: &Device, peer: u32, remote: &RemoteRegion, off: usize, dst: *mut u8, n: usize) -> Result<Option<Request>> {
        unsafe { self.read(dev, peer, remote, off, dst, n)? };
        Ok(None)
    }
    /// Raises `peer`'s notification slot `slot` to `value`.
    fn notify(&self, dev: &Device, peer: u32, slot: u32, value: u32) -> Result<()>;
    /// Writes `n` bytes, then raises `note` at the target once they have landed; returns
    /// once `src` may be reused.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    #[allow(clippy::too_many_arguments)]
    unsafe fn write_notify(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note) -> Result<()>;
    /// [`Backend::write_notify`] that may return before it completes (then with its request).
    ///
    /// # Safety
    /// `src..src+n` must stay readable until the request is done.
    #[allow(clippy::too_many_arguments)]
    unsafe fn start_write_notify(&self, dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note) -> Result<Option<Request>> {
        unsafe { self.write_notify(dev, peer, src, remote, off, n, note)? };
        Ok(None)
    }
    /// Blocks until `req` (one of this backend's) has completed.
    fn wait_request(&self, req: &Request, policy: &WaitPolicy) -> Result<()>;

    /// Capability: direct landing of arriving writes.
    fn direct_landing(&self) -> Option<&dyn DirectLanding> {
        None
    }
}
