//! Backends implement how bytes move between ranks. Each has the same set of pieces, one
//! file each where they do the same thing: `memory` (how a region is made addressable by
//! peers), `copies` (how a write or read reaches a peer's region), `notify` (how a
//! notification or a note reaches a peer's words), `progress` (what drives operations in
//! flight and wakes waiters) and `peers` (how a lost peer is noticed).
//!
//! [`Backend`] is what a [`crate::Device`] and its [`crate::Channel`]s ask of one: two
//! implement it, [`shm::Shm`] (every rank on this host: mapped memory and cross-memory
//! attach) and [`ucx::Ucx`] (peers on other hosts over UCX, bulk writes over [`lanes`];
//! peers on this host still through mapped memory). A device does not know which one it
//! has: [`choose`] picks the backend for the job ([`Transport`], the hosts of its ranks) and
//! that backend's module builds it from the job's rendezvous. What only some backends can
//! do is an optional capability, reached through an accessor that returns `None` elsewhere:
//! [`DirectLanding`] (arriving writes received straight into the caller's buffer). Code
//! above the transport (the collectives) names the trait and the capabilities, never a
//! backend. The handles a backend hands out ([`Request`], [`Registration`], [`RemoteKey`])
//! are neutral types defined here; what is backend-specific in them stays behind them.

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::rendezvous::Rendezvous;
use crate::bootstrap::JobInfo;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::region::RemoteRegion;
use crate::wait::{SpinHook, WaitPolicy};

pub mod lanes;
pub mod shm;
pub mod ucx;
pub(crate) mod wire;

/// Which backend carries the bytes (`SCALEFREE_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory when every rank is on this host, UCX otherwise.
    Auto,
    /// Shared memory only (all ranks on one host).
    Shm,
    /// UCX between every pair of ranks, even on one host (for tests and comparison).
    Ucx,
}

impl Transport {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Transport::Auto),
            "shm" => Ok(Transport::Shm),
            "ucx" => Ok(Transport::Ucx),
            other => Err(Error::InvalidArgument(format!("SCALEFREE_TRANSPORT={other:?}: expected auto, shm or ucx"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Shm => "shm",
            Transport::Ucx => "ucx",
        }
    }
}

/// The backend a job uses, and the host index of every rank (ranks of one host share it;
/// hosts are numbered in the order of their lowest rank).
pub struct Choice {
    kind: Transport,
    pub hosts: Vec<u32>,
}

/// Picks the backend for `job` (see [`Transport`]) once its ranks have met at the
/// rendezvous `rv`, and checks that it can be had here (a missing UCX library is an error
/// before any further exchange).
pub fn choose(job: &JobInfo, rv: &Rendezvous, transport: Transport) -> Result<Choice> {
    let hosts = host_map(job, rv, transport);
    let several_hosts = hosts.iter().any(|&h| h != hosts[0]);
    let networked = match transport {
        Transport::Ucx => job.size > 1,
        Transport::Auto => several_hosts,
        Transport::Shm => false,
    };
    if networked {
        ucx::describe()?;
        return Ok(Choice { kind: Transport::Ucx, hosts });
    }
    if several_hosts {
        return Err(Error::Unsupported("ranks span hosts; SCALEFREE_TRANSPORT=shm needs all ranks on one host".into()));
    }
    Ok(Choice { kind: Transport::Shm, hosts: vec![0; job.size as usize] })
}

/// What a backend is built from: the job, its rendezvous (for the collective exchanges of
/// its set-up), the host of every rank, and this rank's notification words (in the device's
/// control segment, which outlives the backend).
pub struct Setup<'a> {
    pub job: &'a JobInfo,
    pub rendezvous: &'a mut Rendezvous,
    pub hosts: &'a [u32],
    /// This rank's notification slots (`nslots` words) and their waiter count.
    pub slots: *const AtomicU32,
    pub nslots: usize,
    pub waiters: *const AtomicU32,
    /// How long ranks may take to connect to each other.
    pub connect_timeout: Duration,
}

impl Choice {
    /// Collective: builds the chosen backend (its module does, from `setup`).
    ///
    /// # Safety
    /// `setup`'s slot and waiter words must stay valid while the backend lives.
    pub unsafe fn open(&self, setup: Setup<'_>) -> Result<Box<dyn Backend>> {
        match self.kind {
            Transport::Ucx => unsafe { ucx::open(setup) },
            _ => shm::open(setup),
        }
    }
}

/// Host index of every rank. `Transport::Ucx` treats every rank as its own host (all
/// traffic over UCX, for tests and comparison); `SCALEFREE_SIMULATE_HOSTS=k` (tests only)
/// pretends ranks `k*h .. k*h+k-1` share host `h`, `SCALEFREE_SIMULATE_HOSTS=a,b,c` that the
/// first `a` ranks share host 0, the next `b` host 1, and so on; otherwise the rendezvous knows.
fn host_map(job: &JobInfo, rv: &Rendezvous, transport: Transport) -> Vec<u32> {
    let n = job.size;
    if transport == Transport::Ucx {
        return (0..n).collect();
    }
    if let Some(map) = simulated_hosts(n) {
        return map;
    }
    rv.hosts().to_vec()
}

/// `SCALEFREE_SIMULATE_HOSTS`: the host of every rank when it makes more than one host (a
/// list must account for every rank, else it is ignored).
fn simulated_hosts(size: u32) -> Option<Vec<u32>> {
    let v = std::env::var("SCALEFREE_SIMULATE_HOSTS").ok()?;
    let counts: Vec<u32> = v.split(',').map(|x| x.trim().parse::<u32>().ok().filter(|k| *k > 0)).collect::<Option<_>>()?;
    let map: Vec<u32> = match counts[..] {
        [k] if k < size => (0..size).map(|r| r / k).collect(),
        [_] => return None,
        _ if counts.iter().sum::<u32>() == size => counts.iter().enumerate().flat_map(|(h, &k)| std::iter::repeat_n(h as u32, k as usize)).collect(),
        _ => return None,
    };
    Some(map)
}

/// Completion state of one operation in flight, shared by its [`Request`] and whoever
/// completes it (a callback of the network library, a lane's writer thread).
#[derive(Default)]
pub struct OpState {
    done: AtomicU32,
    status: AtomicU32,
    waiters: AtomicU32,
}

impl OpState {
    /// The status of an operation that went well.
    pub const OK: u32 = 0;
    /// The status of an operation whose connection broke (UCX's `UCS_ERR_CONNECTION_RESET`,
    /// which the lanes report too).
    pub const BROKEN: u32 = -25i32 as u32;

    /// Records `status` and wakes whoever waits for the operation.
    pub fn finish(&self, status: u32) {
        self.status.store(status, Ordering::Release);
        crate::wait::publish(&self.done, &self.waiters, 1);
    }
    /// True once the operation completed (its buffers may be reused).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) != 0
    }
    /// The status [`OpState::finish`] recorded.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }
    /// The word that becomes non-zero when the operation completes, and its waiter count.
    pub fn words(&self) -> (&AtomicU32, &AtomicU32) {
        (&self.done, &self.waiters)
    }
}

/// What an operation in flight is to the backend that made it: its completion state and
/// whatever the backend keeps with it until it completes.
pub trait InFlight: Send + Sync {
    fn state(&self) -> &OpState;
}

impl InFlight for OpState {
    fn state(&self) -> &OpState {
        self
    }
}

/// Something a waiter can do to complete an operation sooner than its owner thread would:
/// a lane's queue, which a waiter sends itself up to its write.
pub trait Helper: Send + Sync {
    /// Pushes `op` along from the waiting thread for at most `patience` without progress.
    fn help(&self, op: &OpState, patience: Duration);
}

/// An operation in flight (see [`Backend::start_write`]): waited for through the backend
/// that made it ([`Backend::wait_request`]).
pub struct Request {
    pub(crate) op: Arc<dyn InFlight>,
    /// The peer it goes to and what it is, for errors.
    pub(crate) peer: u32,
    pub(crate) what: String,
    pub(crate) helper: Option<Arc<dyn Helper>>,
}

impl Request {
    /// True once the operation's buffers may be reused.
    pub fn test(&self) -> bool {
        self.op.state().is_done()
    }
}

/// A local region made reachable by key (see [`Backend::register`]): the packed key peers
/// need, and the backend's hold on the memory, released when this drops.
pub struct Registration {
    /// The packed key, sent to peers beside the region's handle.
    pub packed_key: Vec<u8>,
    pub(crate) _hold: Box<dyn Send + Sync>,
}

/// A peer's region reached by key, as seen from here: the peer, the region's address there,
/// and the backend's unpacked key (see [`Backend::remote_key`]).
pub struct RemoteKey {
    pub peer: u32,
    pub addr: u64,
    pub(crate) unpacked: Box<dyn Any + Send + Sync>,
}

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
        Err(Error::Unsupported(format!("{} waits read no arrivals themselves", self.name())))
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
        Err(Error::Unsupported(format!("rank {peer}'s region carries a key, but {} uses none", self.name())))
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

    /// What carries this rank's traffic to `peer` (`name/device`, e.g. `tcp/eth0`), for
    /// diagnostics; empty where the backend has no such choice (shared memory).
    fn routes(&self, _peer: u32) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}
