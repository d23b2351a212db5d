//! A rank's endpoint: allocates and registers regions, attaches peers' regions, hands out
//! channels, and owns the notification slots peers write into.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::backends::shm::{self, Mapping, PidWatch};
use crate::backends::{ucx, Backend, DirectLanding, Window};
use crate::bootstrap::rendezvous::Rendezvous;
use crate::bootstrap::JobInfo;
use crate::channel::Channel;
use crate::error::{Error, Result};
use crate::region::{Backing, Region, RegionHandle, RegionInner, RegionKind, RemoteRegion};
use crate::wait::{self, WaitPolicy};

/// Number of notification slots per device (`write_notify` targets one of them).
pub const NOTIFY_SLOTS: usize = 1024;

/// Layout of a device's control segment (one memfd per rank, mapped by every peer).
const CTRL_MAGIC: u64 = 0x5343_4c46_4354_524c;
const OFF_WAITERS: usize = 64;
const OFF_SLOTS: usize = 4096;
const CTRL_LEN: usize = OFF_SLOTS + NOTIFY_SLOTS * 4;

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

/// Options for [`Device::new`].
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// How long a wait for a live but silent peer may last.
    pub timeout: Duration,
    /// How long ranks may take to find each other at start-up.
    pub bootstrap_timeout: Duration,
    /// Which backend to use.
    pub transport: Transport,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        let secs = |name: &str, default: u64| {
            std::env::var(name).ok().and_then(|v| v.trim().parse::<f64>().ok())
                .map(Duration::from_secs_f64).unwrap_or(Duration::from_secs(default))
        };
        DeviceOptions {
            timeout: secs("SCALEFREE_TIMEOUT", 1800),
            bootstrap_timeout: secs("SCALEFREE_BOOTSTRAP_TIMEOUT", 120),
            // A bad value is reported by `Device::new` (through `transport_from_env`).
            transport: Transport::parse(&std::env::var("SCALEFREE_TRANSPORT").unwrap_or_default()).unwrap_or(Transport::Auto),
        }
    }
}

pub(crate) struct PeerInfo {
    pub(crate) pid: u32,
    /// The peer's control segment, mapped here (shared memory only).
    pub(crate) ctrl: Option<Mapping>,
    pub(crate) watch: Option<PidWatch>,
    pub(crate) cma: bool,
}

pub(crate) struct DeviceInner {
    /// How bytes reach peers: [`shm::Shm`] or [`ucx::Ucx`] (dropped first: UCX's progress
    /// thread writes into our control segment).
    pub(crate) backend: Box<dyn Backend>,
    /// Host index of every rank.
    hosts: Vec<u32>,
    /// Remote keys of peers' UCX regions seen in `exchange_regions`, for `attach`.
    rkeys: Mutex<HashMap<(u32, u64), Weak<ucx::RemoteKey>>>,
    pub(crate) job: JobInfo,
    pub(crate) peers: Vec<PeerInfo>,
    _ctrl_fd: OwnedFd,
    policy: WaitPolicy,
    rendezvous: Mutex<Rendezvous>,
    attached: Mutex<HashMap<(u32, u64), Arc<Mapping>>>,
    /// Peers' `RegionKind::File` regions mapped here, kept while unused too (up to
    /// `FILE_CACHE_BYTES` of unused ones), so a buffer used every step is mapped once.
    attached_files: Mutex<HashMap<(u32, u64), Arc<Mapping>>>,
    /// Regions allocated here, so a buffer inside one is recognised as registered.
    local_regions: Mutex<Vec<(usize, usize, Weak<RegionInner>)>>,
    next_key: AtomicU64,
    /// Called from parked waits (every check interval): lets the embedding runtime stop a
    /// wait, e.g. Python on Ctrl-C.
    interrupt_check: Mutex<Option<InterruptCheck>>,
    /// What this rank's channels moved to and from each peer.
    pub(crate) traffic: crate::traffic::Traffic,
}

/// See [`Device::set_interrupt_check`].
pub type InterruptCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// A rank's endpoint. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

fn random_u64() -> u64 {
    let mut v = 0u64;
    let r = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if r != 8 {
        v = std::process::id() as u64 ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7));
    }
    v
}

impl Device {
    /// Joins the job described by `job`: rendezvous, then maps every peer's control segment.
    pub fn new(job: JobInfo, opts: DeviceOptions) -> Result<Self> {
        if let Ok(v) = std::env::var("SCALEFREE_TRANSPORT") {
            Transport::parse(&v)?;
        }
        if opts.transport == Transport::Shm && !job.single_host() {
            return Err(Error::Unsupported(format!(
                "ranks span hosts ({} of {} on this host); SCALEFREE_TRANSPORT=shm needs all ranks on one host",
                job.local_size, job.size
            )));
        }
        let rv = Rendezvous::join(&job, opts.bootstrap_timeout)?;
        crate::wait::set_peer_hosts(job.rank, rv.host_names().to_vec());
        let hosts = host_map(&job, &rv, opts.transport);
        let several_hosts = hosts.iter().any(|&h| h != hosts[0]);
        let use_ucx = match opts.transport {
            Transport::Ucx => job.size > 1,
            Transport::Auto => several_hosts,
            Transport::Shm => false,
        };
        if use_ucx {
            return Self::new_ucx(job, opts, rv, hosts);
        }
        if several_hosts {
            return Err(Error::Unsupported("ranks span hosts; SCALEFREE_TRANSPORT=shm needs all ranks on one host".into()));
        }
        Self::new_shm(job, opts, rv)
    }

    fn new_shm(job: JobInfo, opts: DeviceOptions, mut rv: Rendezvous) -> Result<Self> {
        let me = job.rank;
        let ctrl_fd = shm::create_memfd(&format!("ctrl-r{me}"), CTRL_LEN)?;
        let ctrl = shm::map_shared(ctrl_fd.as_raw_fd(), CTRL_LEN, true)?;
        let key = random_u64();
        unsafe {
            (ctrl.as_ptr() as *mut u64).write(CTRL_MAGIC);
            (ctrl.as_ptr().add(8) as *mut u64).write(key);
        }
        // Announce pid and the address of our control segment (a CMA probe target).
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(&std::process::id().to_le_bytes());
        hello.extend_from_slice(&(ctrl.as_ptr() as u64).to_le_bytes());
        hello.extend_from_slice(&ctrl_fd.as_raw_fd().to_le_bytes());
        let items = rv.exchange(&hello, Some(ctrl_fd.as_raw_fd()))?;
        let mut peers = Vec::with_capacity(items.len());
        let mut my_ctrl = Some(ctrl);
        for (r, it) in items.into_iter().enumerate() {
            if it.bytes.len() < 16 {
                return Err(Error::Bootstrap(format!("rank {r} sent a short hello")));
            }
            let pid = u32::from_le_bytes(it.bytes[0..4].try_into().unwrap());
            let probe = u64::from_le_bytes(it.bytes[4..12].try_into().unwrap());
            let peer_fd = i32::from_le_bytes(it.bytes[12..16].try_into().unwrap());
            // The descriptor travels over a Unix rendezvous; over TCP it is opened via /proc.
            let fd = match it.fd {
                Some(fd) => fd,
                None if r as u32 == me => shm::open_peer_fd(pid, peer_fd)?,
                None => shm::open_peer_fd(pid, peer_fd).map_err(|e| Error::Bootstrap(format!("rank {r}'s control segment: {e}")))?,
            };
            let map = if r as u32 == me {
                my_ctrl.take().unwrap()
            } else {
                shm::map_shared(fd.as_raw_fd(), CTRL_LEN, false)?
            };
            let map = Some(map);
            let magic = unsafe { (map.as_ref().unwrap().as_ptr() as *const u64).read_volatile() };
            if magic != CTRL_MAGIC {
                return Err(Error::Bootstrap(format!("rank {r}'s control segment is not a scalefree device")));
            }
            let (watch, cma) = if r as u32 == me {
                (None, true)
            } else {
                (Some(PidWatch::new(pid)), shm::cma_permitted(pid, probe as usize))
            };
            peers.push(PeerInfo { pid, ctrl: map, watch, cma });
        }
        crate::wait::set_local_peers(&peers.iter().map(|p| p.watch.as_ref().map(|_| p.pid)).collect::<Vec<_>>())?;
        let policy = WaitPolicy::for_load(job.local_size as usize, opts.timeout);
        let job_size = job.size as usize;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                backend: Box::new(shm::Shm),
                hosts: vec![0; job.size as usize],
                rkeys: Mutex::new(HashMap::new()),
                job,
                peers,
                _ctrl_fd: ctrl_fd,
                policy,
                rendezvous: Mutex::new(rv),
                attached: Mutex::new(HashMap::new()),
                attached_files: Mutex::new(HashMap::new()),
                local_regions: Mutex::new(Vec::new()),
                interrupt_check: Mutex::new(None),
                traffic: crate::traffic::Traffic::new(job_size),
                next_key: AtomicU64::new(random_u64() | 1),
            }),
        })
    }

    /// Peers on other hosts over UCX, peers on this host over shared memory (every peer
    /// over UCX with `Transport::Ucx`). The control segment is mapped by this host's peers;
    /// remote peers' notifications arrive as active messages. Regions are memfds registered
    /// with UCX, so either kind of peer can reach them.
    fn new_ucx(job: JobInfo, opts: DeviceOptions, mut rv: Rendezvous, hosts: Vec<u32>) -> Result<Self> {
        ucx::describe()?;
        let me = job.rank;
        // The interface between hosts: the user's choice (checked before UCX sees it), else
        // the one this rank reached the rendezvous through.
        let ip = match crate::config::ifname() {
            Some(name) => crate::config::interface_ip(&name)?,
            None => rv.local_ip().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
        };
        let ctrl_fd = shm::create_memfd(&format!("ctrl-r{me}"), CTRL_LEN)?;
        let ctrl = shm::map_shared(ctrl_fd.as_raw_fd(), CTRL_LEN, true)?;
        unsafe { (ctrl.as_ptr() as *mut u64).write(CTRL_MAGIC) };
        let mut hello = Vec::with_capacity(12);
        hello.extend_from_slice(&std::process::id().to_le_bytes());
        hello.extend_from_slice(&(ctrl.as_ptr() as u64).to_le_bytes());
        hello.extend_from_slice(&ctrl_fd.as_raw_fd().to_le_bytes());
        let items = rv.exchange(&hello, Some(ctrl_fd.as_raw_fd()))?;
        let slots = unsafe { ctrl.as_ptr().add(OFF_SLOTS) } as *const AtomicU32;
        let waiters = unsafe { ctrl.as_ptr().add(OFF_WAITERS) } as *const AtomicU32;
        let mut net = unsafe {
            ucx::Net::new(me, job.size, slots, NOTIFY_SLOTS, waiters, &mut |b| {
                Ok(rv.exchange(b, None)?.into_iter().map(|i| i.bytes).collect())
            })?
        };
        let remote: Vec<bool> = (0..job.size as usize).map(|r| hosts[r] != hosts[me as usize]).collect();
        net.open_lanes(ip, &remote, &job.token, &job.job_id, opts.bootstrap_timeout, &mut |b| {
            Ok(rv.exchange(b, None)?.into_iter().map(|i| i.bytes).collect())
        })?;
        let mut peers = Vec::with_capacity(items.len());
        let mut my_ctrl = Some(ctrl);
        for (r, it) in items.into_iter().enumerate() {
            let b = &it.bytes;
            if b.len() < 16 {
                return Err(Error::Bootstrap(format!("rank {r} sent a short hello")));
            }
            let pid = u32::from_le_bytes(b[0..4].try_into().unwrap());
            let probe = u64::from_le_bytes(b[4..12].try_into().unwrap());
            let peer_fd = i32::from_le_bytes(b[12..16].try_into().unwrap());
            if r as u32 == me {
                peers.push(PeerInfo { pid, ctrl: my_ctrl.take(), watch: None, cma: true });
            } else if hosts[r] == hosts[me as usize] {
                // Same host: map its control segment (descriptor passed, else through /proc).
                let fd = match it.fd {
                    Some(fd) => fd,
                    None => shm::open_peer_fd(pid, peer_fd)?,
                };
                let map = shm::map_shared(fd.as_raw_fd(), CTRL_LEN, false)?;
                peers.push(PeerInfo { pid, ctrl: Some(map), watch: Some(PidWatch::new(pid)), cma: shm::cma_permitted(pid, probe as usize) });
            } else {
                peers.push(PeerInfo { pid, ctrl: None, watch: None, cma: false });
            }
        }
        net.watch(peers.iter().enumerate().map(|(r, p)| r as u32 != me && p.ctrl.is_none()).collect());
        crate::wait::set_local_peers(&peers.iter().map(|p| p.watch.as_ref().map(|_| p.pid)).collect::<Vec<_>>())?;
        // (With lanes carrying writes, waits skip their yield phase: `Lanes` registers a
        // helper thread, see `wait::HelperThread`.)
        let policy = WaitPolicy::for_load(job.local_size as usize, opts.timeout);
        let job_size = job.size as usize;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                backend: Box::new(ucx::Ucx { net }),
                hosts,
                rkeys: Mutex::new(HashMap::new()),
                job,
                peers,
                _ctrl_fd: ctrl_fd,
                policy,
                rendezvous: Mutex::new(rv),
                attached: Mutex::new(HashMap::new()),
                attached_files: Mutex::new(HashMap::new()),
                local_regions: Mutex::new(Vec::new()),
                interrupt_check: Mutex::new(None),
                traffic: crate::traffic::Traffic::new(job_size),
                next_key: AtomicU64::new(random_u64() | 1),
            }),
        })
    }

    /// The host index of `rank` (ranks of one host share it; hosts are numbered in the
    /// order of their lowest rank).
    pub fn host_of(&self, rank: u32) -> u32 {
        self.inner.hosts[rank as usize]
    }

    /// Whether `rank` is on this host (its memory is mapped here).
    pub fn is_local(&self, rank: u32) -> bool {
        self.inner.peers[rank as usize].ctrl.is_some()
    }

    /// The backend that carries this device's traffic.
    pub fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// The UCX endpoints, when this device's backend is UCX: for UCX-specific diagnostics
    /// (its transports, lanes). Everything else goes through [`Device::backend`].
    pub fn net(&self) -> Option<&ucx::Net> {
        self.inner.backend.as_any().downcast_ref::<ucx::Ucx>().map(|u| &u.net)
    }

    /// The backend's direct-landing capability, if it has one.
    pub fn direct_landing(&self) -> Option<&dyn DirectLanding> {
        self.inner.backend.direct_landing()
    }

    /// Direct landing (see [`DirectLanding::set`]): until [`Device::clear_direct`], writes
    /// into `region` that arrive through this rank's own reader and fall whole inside a
    /// window are received straight into its `dst` (copied, or reduced into it), and store
    /// their note's value `flag_delta` bytes after their note word. False (nothing set)
    /// when the backend cannot.
    ///
    /// # Safety
    /// Every window's `dst..dst+len` must stay valid, and untouched by anyone else, until
    /// `clear_direct` returns.
    pub unsafe fn set_direct(&self, region: &Region, windows: &[Window], flag_delta: usize) -> bool {
        match self.direct_landing() {
            Some(d) => {
                unsafe { d.set(region.handle().key, windows, flag_delta) };
                true
            }
            None => false,
        }
    }

    /// Ends direct landing: once it returns, no arriving write touches a window any more.
    pub fn clear_direct(&self) {
        if let Some(d) = self.direct_landing() {
            d.clear(self.inner.policy.timeout);
        }
    }

    /// `"shm"` or `"ucx"`: the backend that carries this device's traffic.
    pub fn transport_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// A device from the launcher's environment (`scalefree run`, mpirun, srun, torchrun).
    pub fn from_env(opts: DeviceOptions) -> Result<Self> {
        Device::new(JobInfo::from_env()?, opts)
    }

    pub fn rank(&self) -> u32 {
        self.inner.job.rank
    }
    pub fn size(&self) -> u32 {
        self.inner.job.size
    }
    pub fn job(&self) -> &JobInfo {
        &self.inner.job
    }
    pub fn policy(&self) -> &WaitPolicy {
        &self.inner.policy
    }
    pub fn pid_of(&self, rank: u32) -> u32 {
        self.inner.peers[rank as usize].pid
    }
    /// Whether cross-memory attach works towards every peer (ordinary memory is then
    /// addressable without staging).
    pub fn cma_everywhere(&self) -> bool {
        self.inner.peers.iter().all(|p| p.cma)
    }

    /// Installs a function that parked waits call every check interval; when it returns
    /// true the wait ends with [`Error::Interrupted`].
    pub fn set_interrupt_check(&self, f: Option<InterruptCheck>) {
        *self.inner.interrupt_check.lock().unwrap() = f;
    }

    /// Errors with [`Error::PeerLost`] if any peer process has exited, or
    /// [`Error::Interrupted`] if the interrupt check says so.
    pub fn check_peers(&self) -> Result<()> {
        let check = self.inner.interrupt_check.lock().unwrap().clone();
        if let Some(f) = check {
            if f() {
                return Err(Error::Interrupted("waiting for peers".into()));
            }
        }
        self.check_alive()
    }

    /// Errors with [`Error::PeerLost`] if any peer process has exited (no interrupt check:
    /// for background threads).
    pub fn check_alive(&self) -> Result<()> {
        self.inner.backend.check_alive()?;
        for (r, p) in self.inner.peers.iter().enumerate() {
            if let Some(w) = &p.watch {
                if !w.alive() {
                    // Ranks on other hosts hear it from here (and report it first).
                    self.inner.backend.note_lost(r as u32, format!("the process (pid {}) exited", p.pid));
                    return Err(Error::PeerLost {
                        rank: r as u32,
                        pid: p.pid,
                        detail: "the process exited".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether the process of `rank` is still running: on this host, its process is; on
    /// another, UCX has not found it lost (see [`ucx::Net::is_lost`]). True for this rank.
    /// For callers that survive a peer's death (replicated collectives), unlike
    /// [`Device::check_alive`].
    pub fn rank_alive(&self, rank: u32) -> bool {
        self.inner.peers.get(rank as usize).and_then(|p| p.watch.as_ref()).is_none_or(|w| w.alive())
            && (rank == self.rank() || !self.backend().is_lost(rank))
    }

    /// Turns an OS error from touching `rank`'s memory into `PeerLost` when it is gone.
    pub fn peer_error(&self, rank: u32, what: &str, e: std::io::Error) -> Error {
        let p = &self.inner.peers[rank as usize];
        if e.raw_os_error() == Some(libc::ESRCH) || p.watch.as_ref().is_some_and(|w| !w.alive()) {
            Error::PeerLost { rank, pid: p.pid, detail: format!("{what}: {e}") }
        } else {
            Error::io(format!("{what} (rank {rank})"), e)
        }
    }

    /// Allocates `nbytes` of shared memory (pre-faulted) that peers can map.
    pub fn alloc_region(&self, nbytes: usize) -> Result<Region> {
        self.make_region(nbytes, false)
    }

    /// Allocates a large sparse region for an [`crate::Arena`]: address space only, pages
    /// are backed when first touched.
    pub fn alloc_arena_region(&self, nbytes: usize) -> Result<Region> {
        self.make_region(nbytes, true)
    }

    fn make_region(&self, nbytes: usize, sparse: bool) -> Result<Region> {
        let key = self.inner.next_key.fetch_add(2, Ordering::Relaxed) ^ random_u64().rotate_left(17);
        let fd = shm::create_memfd(&format!("r{}-{key:016x}", self.rank()), nbytes)?;
        let map = if sparse { shm::map_sparse(fd.as_raw_fd(), nbytes)? } else { shm::map_shared(fd.as_raw_fd(), nbytes, true)? };
        let reg = self.inner.backend.register(map.as_ptr(), nbytes, key)?;
        let handle = RegionHandle {
            owner: self.rank(),
            pid: std::process::id(),
            kind: if reg.is_some() { RegionKind::Ucx } else { RegionKind::Shm },
            fd: fd.as_raw_fd(),
            addr: map.as_ptr() as u64,
            len: nbytes as u64,
            key,
        };
        let inner = Arc::new(RegionInner { reg, backing: Backing::Shm { map, _fd: fd }, handle });
        let mut regs = self.inner.local_regions.lock().unwrap();
        regs.retain(|(_, _, w)| w.strong_count() > 0);
        regs.push((handle.addr as usize, nbytes, Arc::downgrade(&inner)));
        Ok(Region { inner })
    }

    /// The shared-memory region allocated here that contains `ptr..ptr+len`, and the
    /// offset of `ptr` in it. Lets collectives use a registered buffer without copies.
    pub fn find_region(&self, ptr: *const u8, len: usize) -> Option<(Region, usize)> {
        let p = ptr as usize;
        let regs = self.inner.local_regions.lock().unwrap();
        for (addr, n, w) in regs.iter() {
            if p >= *addr && p + len <= addr + n {
                if let Some(inner) = w.upgrade() {
                    return Some((Region { inner }, p - addr));
                }
            }
        }
        None
    }

    /// Registers ordinary memory so peers can read and write it by cross-memory attach.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid while the region (or a peer's use of its handle) lives.
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<Region> {
        let mut handle = self.process_handle(ptr, len);
        let reg = if self.inner.backend.keyed() {
            handle.key = self.inner.next_key.fetch_add(2, Ordering::Relaxed) ^ random_u64().rotate_left(17);
            handle.kind = RegionKind::Ucx;
            self.inner.backend.register(ptr, len, handle.key)?
        } else {
            None
        };
        Ok(Region { inner: Arc::new(RegionInner { reg, backing: Backing::Process { ptr }, handle }) })
    }

    /// Registers memory that is already a shared mapping, at `ptr`, of the first `len`
    /// bytes of the file open as `fd` (a shared-memory file, e.g. a torch storage after
    /// `share_memory_()`). Peers on this host map the same file, so collectives on buffers
    /// inside it read and write them with plain loads and stores. The descriptor is
    /// duplicated; the mapping itself stays the caller's.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped to that file while the region lives.
    pub unsafe fn register_shared(&self, ptr: *mut u8, len: usize, fd: std::os::fd::RawFd) -> Result<Region> {
        if self.inner.backend.keyed() {
            return Err(Error::Unsupported("register_shared is for shared memory on one host".into()));
        }
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Error::last_os(format!("dup(fd {fd})")));
        }
        let dup = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) };
        let (ino, size) = shm::fd_identity(dup.as_raw_fd())?;
        if size < len as u64 {
            return Err(Error::InvalidArgument(format!("register_shared: the file holds {size} bytes, fewer than {len}")));
        }
        let handle = RegionHandle {
            owner: self.rank(),
            pid: std::process::id(),
            kind: RegionKind::File,
            fd: dup.as_raw_fd(),
            addr: ptr as u64,
            len: len as u64,
            key: ino,
        };
        let inner = Arc::new(RegionInner { reg: None, backing: Backing::File { ptr, _fd: dup }, handle });
        let mut regs = self.inner.local_regions.lock().unwrap();
        regs.retain(|(_, _, w)| w.strong_count() > 0);
        regs.push((ptr as usize, len, Arc::downgrade(&inner)));
        Ok(Region { inner })
    }

    /// A peer's `RegionKind::File` region, mapped once: the mapping stays cached while unused
    /// (up to `FILE_CACHE_BYTES` of unused ones), so a buffer used every step maps once.
    fn attach_file(&self, handle: &RegionHandle) -> Result<RemoteRegion> {
        /// Unused mappings of peers' files kept at most (they keep the peer's memory alive).
        const FILE_CACHE_BYTES: usize = 1 << 30;
        let k = (handle.owner, handle.key);
        let mut cache = self.inner.attached_files.lock().unwrap();
        if let Some(m) = cache.get(&k) {
            if m.len() as u64 >= handle.len {
                return Ok(RemoteRegion { handle: *handle, map: Some(m.clone()), rkey: None });
            }
        }
        let gone = || Error::InvalidArgument(format!("rank {} no longer has that region (freed?)", handle.owner));
        let fd = shm::open_peer_fd(handle.pid, handle.fd).map_err(|e| match e {
            Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => gone(),
            e => e,
        })?;
        let (ino, size) = shm::fd_identity(fd.as_raw_fd())?;
        if ino != handle.key || size < handle.len {
            return Err(gone());
        }
        let m = Arc::new(shm::map_shared(fd.as_raw_fd(), handle.len as usize, false)?);
        let unused: usize = cache.values().filter(|v| Arc::strong_count(v) == 1).map(|v| v.len()).sum();
        if unused + m.len() > FILE_CACHE_BYTES {
            cache.retain(|_, v| Arc::strong_count(v) > 1);
        }
        cache.insert(k, m.clone());
        Ok(RemoteRegion { handle: *handle, map: Some(m), rkey: None })
    }

    /// The handle of ordinary memory of this process, reachable by cross-memory attach.
    pub fn process_handle(&self, ptr: *const u8, len: usize) -> RegionHandle {
        RegionHandle {
            owner: self.rank(),
            pid: std::process::id(),
            kind: RegionKind::Process,
            fd: -1,
            addr: ptr as u64,
            len: len as u64,
            key: 0,
        }
    }

    /// Makes a peer's region addressable here. Shared-memory regions are mapped (and the
    /// mapping cached); process memory needs cross-memory attach to that peer.
    pub fn attach(&self, handle: &RegionHandle) -> Result<RemoteRegion> {
        let owner = handle.owner;
        if owner >= self.size() {
            return Err(Error::InvalidArgument(format!("handle names rank {owner} of a job of {}", self.size())));
        }
        let peer = &self.inner.peers[owner as usize];
        if handle.pid != peer.pid {
            return Err(Error::InvalidArgument(format!(
                "handle names pid {} but rank {owner} is pid {}", handle.pid, peer.pid
            )));
        }
        match handle.kind {
            RegionKind::Ucx if self.is_local(owner) && owner != self.rank() && handle.fd >= 0 => {
                if let Some(m) = self.inner.attached.lock().unwrap().get(&(owner, handle.key)) {
                    return Ok(RemoteRegion { handle: *handle, map: Some(m.clone()), rkey: None });
                }
                let fd = shm::open_peer_fd(handle.pid, handle.fd)?;
                self.map_checked(handle, fd)
            }
            RegionKind::Ucx => {
                let known = self.inner.rkeys.lock().unwrap().get(&(owner, handle.key)).and_then(|w| w.upgrade());
                match known {
                    Some(rk) => Ok(RemoteRegion { handle: *handle, map: None, rkey: Some(rk) }),
                    None => Err(Error::Unsupported(format!(
                        "rank {owner}'s UCX region {:016x} is not known here: pass UCX regions through exchange_regions", handle.key
                    ))),
                }
            }
            RegionKind::File => self.attach_file(handle),
            RegionKind::Process => {
                if !peer.cma {
                    return Err(Error::Unsupported(format!(
                        "cross-memory attach to rank {owner} is not permitted; use a region from alloc_region"
                    )));
                }
                Ok(RemoteRegion { handle: *handle, map: None, rkey: None })
            }
            RegionKind::Shm => {
                let k = (owner, handle.key);
                if let Some(m) = self.inner.attached.lock().unwrap().get(&k) {
                    if m.len() as u64 == handle.len {
                        return Ok(RemoteRegion { handle: *handle, map: Some(m.clone()), rkey: None });
                    }
                }
                let fd = shm::open_peer_fd(handle.pid, handle.fd).map_err(|e| match e {
                    Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => Error::InvalidArgument(
                        format!("rank {owner} no longer has that region (freed?)"),
                    ),
                    e => e,
                })?;
                self.map_checked(handle, fd)
            }
        }
    }

    /// [`Device::attach`] from [`Region::serialized`] bytes (which carry the UCX remote key of
    /// a region on another host).
    pub fn attach_serialized(&self, bytes: &[u8]) -> Result<RemoteRegion> {
        if bytes.len() < RegionHandle::BYTES {
            return Err(Error::InvalidArgument(format!(
                "a region handle is at least {} bytes, got {}", RegionHandle::BYTES, bytes.len()
            )));
        }
        let h = RegionHandle::from_bytes(&bytes[..RegionHandle::BYTES])?;
        let rkey = &bytes[RegionHandle::BYTES..];
        if let (true, RegionKind::Ucx) = (self.inner.backend.keyed(), h.kind) {
            if h.owner < self.size() && !self.is_local(h.owner) {
                if h.pid != self.pid_of(h.owner) && self.pid_of(h.owner) != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "handle names pid {} but rank {} is pid {}", h.pid, h.owner, self.pid_of(h.owner)
                    )));
                }
                if rkey.is_empty() {
                    return self.attach(&h);
                }
                let rk = self.inner.backend.remote_key(h.owner, h.addr, rkey)?;
                let mut cache = self.inner.rkeys.lock().unwrap();
                cache.retain(|_, w| w.strong_count() > 0);
                cache.insert((h.owner, h.key), Arc::downgrade(&rk));
                return Ok(RemoteRegion { handle: h, map: None, rkey: Some(rk) });
            }
        }
        self.attach(&h)
    }

    fn map_checked(&self, handle: &RegionHandle, fd: OwnedFd) -> Result<RemoteRegion> {
        let label = shm::fd_label(fd.as_raw_fd());
        if !label.contains(&format!("{:016x}", handle.key)) {
            return Err(Error::InvalidArgument(format!(
                "rank {} no longer has that region (descriptor now points at {label:?})", handle.owner
            )));
        }
        let m = Arc::new(shm::map_shared(fd.as_raw_fd(), handle.len as usize, false)?);
        let mut cache = self.inner.attached.lock().unwrap();
        cache.retain(|_, v| Arc::strong_count(v) > 1);
        cache.insert((handle.owner, handle.key), m.clone());
        Ok(RemoteRegion { handle: *handle, map: Some(m), rkey: None })
    }

    /// Collective: every rank passes one of its regions and gets every rank's, attached.
    /// Descriptors travel over the bootstrap socket, so this works without `/proc` access.
    pub fn exchange_regions(&self, region: &Region) -> Result<Vec<RemoteRegion>> {
        let h = region.handle();
        if self.inner.backend.keyed() {
            // Handle and packed remote key travel together.
            let Some(reg) = &region.inner.reg else {
                return Err(Error::InvalidArgument("exchange_regions needs a region of this device".into()));
            };
            let mut bytes = h.to_bytes().to_vec();
            bytes.extend_from_slice(&reg.rkey);
            let fd = match &region.inner.backing {
                Backing::Shm { _fd, .. } | Backing::File { _fd, .. } => Some(_fd.as_raw_fd()),
                Backing::Process { .. } => None,
            };
            let items = self.inner.rendezvous.lock().unwrap().exchange(&bytes, fd)?;
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let b = &it.bytes;
                if b.len() < RegionHandle::BYTES {
                    return Err(Error::Bootstrap("a rank sent a short region handle".into()));
                }
                let ph = RegionHandle::from_bytes(&b[..RegionHandle::BYTES])?;
                if ph.owner != self.rank() && self.is_local(ph.owner) && ph.fd >= 0 {
                    // A peer of this host: map its memfd (passed, else through /proc).
                    let fd = match it.fd {
                        Some(fd) => fd,
                        None => shm::open_peer_fd(ph.pid, ph.fd)?,
                    };
                    let m = Arc::new(shm::map_sparse(fd.as_raw_fd(), ph.len as usize)?);
                    self.inner.attached.lock().unwrap().insert((ph.owner, ph.key), m.clone());
                    out.push(RemoteRegion { handle: ph, map: Some(m), rkey: None });
                    continue;
                }
                let rk = self.inner.backend.remote_key(ph.owner, ph.addr, &b[RegionHandle::BYTES..])?;
                let mut cache = self.inner.rkeys.lock().unwrap();
                cache.retain(|_, w| w.strong_count() > 0);
                cache.insert((ph.owner, ph.key), Arc::downgrade(&rk));
                out.push(RemoteRegion { handle: ph, map: None, rkey: Some(rk) });
            }
            return Ok(out);
        }
        let fd = match &region.inner.backing {
            Backing::Shm { _fd, .. } | Backing::File { _fd, .. } => Some(_fd.as_raw_fd()),
            Backing::Process { .. } => None,
        };
        let items = self.inner.rendezvous.lock().unwrap().exchange(&h.to_bytes(), fd)?;
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let h = RegionHandle::from_bytes(&it.bytes)?;
            match (h.kind, it.fd) {
                (RegionKind::Shm, Some(fd)) => {
                    let m = Arc::new(shm::map_sparse(fd.as_raw_fd(), h.len as usize)?);
                    // Later `attach` calls for this region find the mapping here.
                    self.inner.attached.lock().unwrap().insert((h.owner, h.key), m.clone());
                    out.push(RemoteRegion { handle: h, map: Some(m), rkey: None });
                }
                _ => out.push(self.attach(&h)?),
            }
        }
        Ok(out)
    }

    /// Collective: creates this rank's registered arena and maps every peer's, so buffers
    /// allocated from it are addressable by all ranks without copies. Keep the returned
    /// remote regions alive as long as peers' arena buffers may be used.
    pub fn create_arena(&self, opts: &crate::arena::ArenaOptions) -> Result<(Arc<crate::arena::Arena>, Vec<RemoteRegion>)> {
        if self.inner.backend.keyed() {
            return Err(Error::Unsupported("the registered arena is for shared memory; over UCX buffers are staged".into()));
        }
        // Every rank learns whether every rank could reserve its arena, so that a failure on
        // one (e.g. an address-space limit) is the same error everywhere instead of a hang.
        let mine = self.alloc_arena_region(opts.capacity_bytes);
        let status = self.exchange_bytes(&[mine.is_ok() as u8])?;
        let region = match mine {
            Ok(r) => r,
            Err(e) => return Err(Error::Unsupported(format!("no arena of {} bytes on rank {}: {e}", opts.capacity_bytes, self.rank()))),
        };
        if let Some(r) = status.iter().position(|s| s.first() != Some(&1)) {
            return Err(Error::Unsupported(format!("rank {r} could not reserve its arena")));
        }
        let peers = self.exchange_regions(&region)?;
        Ok((Arc::new(crate::arena::Arena::new(region, opts)), peers))
    }

    /// Collective over the bootstrap socket: all ranks' bytes, indexed by rank. For set-up.
    pub fn exchange_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let items = self.inner.rendezvous.lock().unwrap().exchange(bytes, None)?;
        Ok(items.into_iter().map(|i| i.bytes).collect())
    }

    /// A channel to `peer` (may be this rank itself).
    /// What this rank's channels moved to and from each peer so far (index = peer rank;
    /// see [`crate::traffic`]).
    pub fn traffic(&self) -> Vec<crate::traffic::PeerTraffic> {
        self.inner.traffic.snapshot()
    }

    pub fn channel(&self, peer: u32) -> Result<Channel> {
        if peer >= self.size() {
            return Err(Error::InvalidArgument(format!("no rank {peer} in a job of {}", self.size())));
        }
        Ok(Channel::new(self.clone(), peer))
    }

    pub(crate) fn slot_of(&self, rank: u32, slot: usize) -> &AtomicU32 {
        let m = self.inner.peers[rank as usize].ctrl.as_ref().expect("peer's control segment is mapped (shared memory)");
        unsafe { &*(m.as_ptr().add(OFF_SLOTS + slot * 4) as *const AtomicU32) }
    }
    pub(crate) fn waiters_of(&self, rank: u32) -> &AtomicU32 {
        let m = self.inner.peers[rank as usize].ctrl.as_ref().expect("peer's control segment is mapped (shared memory)");
        unsafe { &*(m.as_ptr().add(OFF_WAITERS) as *const AtomicU32) }
    }

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

    /// Whether a wait for a notification reads the TCP lanes in its own thread (see
    /// `Net::wait_reading`): when no other rank shares this host (every notification then
    /// comes over the network, and arrivals there wake a waiter parked in `poll`) and every
    /// peer writes here over a lane. The data of a notified write is read by the waiter as
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
    /// small call's): when `peer` is on another host behind a TCP lane, this thread reads
    /// the arrivals itself and parks in `poll` on the lanes (see `Net::wait_reading`: one
    /// thread wake-up per message instead of two); otherwise as [`Device::wait_word`].
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

    /// Waits on a word of this host with `policy`: over UCX, spinning drives the worker's
    /// progress (arrivals run their handlers) before parking.
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

/// Host index of every rank. `Transport::Ucx` treats every rank as its own host (all
/// traffic over UCX, for tests and comparison); `SCALEFREE_SIMULATE_HOSTS=k` (tests only)
/// pretends ranks `k*h .. k*h+k-1` share host `h`; otherwise the rendezvous knows.
fn host_map(job: &JobInfo, rv: &Rendezvous, transport: Transport) -> Vec<u32> {
    let n = job.size;
    if transport == Transport::Ucx {
        return (0..n).collect();
    }
    if let Some(k) = simulated_hosts(n) {
        return (0..n).map(|r| r / k).collect();
    }
    rv.hosts().to_vec()
}

/// `SCALEFREE_SIMULATE_HOSTS=k` with fewer than `size` ranks per simulated host.
fn simulated_hosts(size: u32) -> Option<u32> {
    std::env::var("SCALEFREE_SIMULATE_HOSTS").ok().and_then(|v| v.trim().parse::<u32>().ok()).filter(|k| *k > 0 && *k < size)
}
