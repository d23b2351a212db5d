//! A rank's endpoint: allocates and registers regions (`device/regions.rs`), attaches peers'
//! regions, hands out channels, and owns the notification slots peers write into
//! (`device/control.rs`, `device/waits.rs`). A device does not know which backend carries its bytes: the
//! backends module picks one for the job and builds it ([`crate::backends::choose`]), and
//! every operation goes through the [`Backend`] trait.

mod control;
mod regions;
mod waits;

pub use control::NOTIFY_SLOTS;
pub(crate) use control::PeerInfo;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::backends::shm::Mapping;
use crate::backends::{self, Backend, DirectLanding, RemoteKey, Setup, Transport, Window};
use crate::bootstrap::rendezvous::Rendezvous;
use crate::bootstrap::JobInfo;
use crate::channel::Channel;
use crate::error::{Error, Result};
use crate::region::{Region, RegionInner};
use crate::wait::WaitPolicy;

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

pub(crate) struct DeviceInner {
    /// How bytes reach peers (dropped first: a backend's threads may write into our
    /// control segment).
    pub(crate) backend: Box<dyn Backend>,
    /// Host index of every rank.
    hosts: Vec<u32>,
    /// Keys of peers' keyed regions seen in `exchange_regions`, for `attach`.
    rkeys: Mutex<HashMap<(u32, u64), Weak<RemoteKey>>>,
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
    /// What this rank's channels moved to and from each peer.
    pub(crate) traffic: crate::traffic::Traffic,
}

/// A rank's endpoint. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) fn random_u64() -> u64 {
    let mut v = 0u64;
    let r = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if r != 8 {
        v = std::process::id() as u64 ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7));
    }
    v
}
impl Device {
    /// Joins the job described by `job`: rendezvous, then every rank's control segment
    /// (mapped where its rank is on this host), then the backend the job uses.
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
        let mut rv = Rendezvous::join(&job, opts.bootstrap_timeout)?;
        crate::wait::set_peer_hosts(job.rank, rv.host_names().to_vec());
        let choice = backends::choose(&job, &rv, opts.transport)?;
        let (ctrl_fd, peers) = control::open(&job, &mut rv, &choice.hosts)?;
        let (slots, waiters) = control::words(peers[job.rank as usize].ctrl.as_ref().expect("this rank's control segment"));
        let setup = Setup {
            job: &job,
            rendezvous: &mut rv,
            hosts: &choice.hosts,
            slots,
            nslots: NOTIFY_SLOTS,
            waiters,
            connect_timeout: opts.bootstrap_timeout,
        };
        // The slots live in `peers`, which the device drops after the backend.
        let backend = unsafe { choice.open(setup)? };
        // Peers on this host, by pid: a wait watches them for being stopped (SCALEFREE_STOPPED_PEER).
        crate::wait::set_local_peers(&peers.iter().map(|p| p.watch.as_ref().map(|_| p.pid)).collect::<Vec<_>>())?;
        let policy = WaitPolicy::for_load(job.local_size as usize, opts.timeout);
        let job_size = job.size as usize;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                backend,
                hosts: choice.hosts,
                rkeys: Mutex::new(HashMap::new()),
                job,
                peers,
                _ctrl_fd: ctrl_fd,
                policy,
                rendezvous: Mutex::new(rv),
                attached: Mutex::new(HashMap::new()),
                attached_files: Mutex::new(HashMap::new()),
                local_regions: Mutex::new(Vec::new()),
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

    /// The name of the backend that carries this device's traffic ([`Backend::name`]).
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

    /// Errors with [`Error::PeerLost`] if any peer process has exited, or
    /// [`Error::Interrupted`] if the process's interrupt check says so
    /// ([`crate::wait::set_interrupt_check`]).
    pub fn check_peers(&self) -> Result<()> {
        crate::wait::check_interrupt(&|| "peers".to_string())?;
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
    /// another, the backend has not found it lost (see [`Backend::is_lost`]). True for this rank.
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

    /// Collective over the bootstrap socket: all ranks' bytes, indexed by rank. For set-up.
    pub fn exchange_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let items = self.inner.rendezvous.lock().unwrap().exchange(bytes, None)?;
        Ok(items.into_iter().map(|i| i.bytes).collect())
    }

    /// What this rank's channels moved to and from each peer so far (index = peer rank;
    /// see [`crate::traffic`]).
    pub fn traffic(&self) -> Vec<crate::traffic::PeerTraffic> {
        self.inner.traffic.snapshot()
    }

    /// A channel to `peer` (may be this rank itself).
    pub fn channel(&self, peer: u32) -> Result<Channel> {
        if peer >= self.size() {
            return Err(Error::InvalidArgument(format!("no rank {peer} in a job of {}", self.size())));
        }
        Ok(Channel::new(self.clone(), peer))
    }
}
