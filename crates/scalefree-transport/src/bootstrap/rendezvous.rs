//! Rendezvous of the ranks of a job: every rank connects to a hub at rank 0, presents the
//! job token, its rank and the scalefree version, and keeps the connection open. Later set-up
//! exchanges (`exchange`) go through the hub.
//!
//! * **One host** (no master address): the hub listens on the abstract Unix socket
//!   `\0scalefree/<job id>` (no file to clean up after a crash), and an exchange may carry one
//!   file descriptor per rank (`SCM_RIGHTS`), which is how peers map each other's memfd regions
//!   without `/proc` permissions.
//! * **Across hosts** (`SCALEFREE_MASTER_ADDR`/`SCALEFREE_MASTER_PORT`, see [`JobInfo::master`]):
//!   the hub listens on TCP. Descriptors do not cross hosts: over TCP every `Item.fd` is
//!   `None`, and peers on one host map each other's regions through `/proc/<pid>/fd`.
//!
//! Every rank also sends an identity of its host (boot id, IPC, UTS and network namespaces,
//! host name), from which [`Rendezvous::host_of`] numbers the hosts.
//!
//! With [`JobInfo::sealed`] (`SCALEFREE_ENCRYPT=1`) every message after the handshake over TCP
//! is one sealed record ([`crate::seal`]), with keys of each connection's own (its hello and
//! both nonces): what crosses the network is confidential, and a message changed, replayed
//! or reordered on the way is refused. Every rank must say the same (its hello tells).

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::frames::{broken, describe_io, read_frame_by, recv_frame, recv_frame_max, same_user, send_frame, set_blocking, Conn};
use super::JobInfo;
use crate::auth::{self, nonce, Key};
use crate::seal::Cipher;
use crate::error::{Error, Result};

/// One rank's contribution to an exchange: bytes and an optional descriptor.
pub struct Item {
    pub bytes: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

/// Connections between the ranks of a job, used only during set-up.
pub struct Rendezvous {
    rank: u32,
    size: u32,
    /// Rank 0: a stream per peer, indexed by rank (None at index 0). Others: one stream.
    conns: Vec<Option<Box<dyn Conn>>>,
    timeout: Duration,
    /// Host index of every rank.
    hosts: Vec<u32>,
    /// Host name of every rank.
    host_names: Vec<String>,
    /// Each connection's sealing (send, receive), indexed as `conns`, when sealed.
    seals: Vec<Option<(Cipher, Cipher)>>,
}

/// The connections of a [`Rendezvous`], watched (duplicates of their descriptors) by set-up
/// waits outside it (the UCX backend's lanes): rank 0 holds one to every rank, the others
/// one to rank 0. A host cut off fails its connection within `SCALEFREE_PEER_TIMEOUT` (TCP
/// keepalive, see [`super::frames::watch_liveness`]); rank 0 then fails and closes every
/// connection, which the other ranks see at once.
pub struct SetupWatch {
    conns: Vec<(u32, String, OwnedFd)>,
}

impl SetupWatch {
    /// `PeerLost` for the first watched rank whose connection is broken.
    pub fn check(&self) -> Result<()> {
        for (rank, host, fd) in &self.conns {
            if let Some(why) = broken(fd.as_raw_fd()) {
                return Err(lost_in_setup(*rank, host, &why));
            }
        }
        Ok(())
    }
}

/// A peer lost during set-up, in the words of every lost peer (`PeerLostError` in Python).
fn lost_in_setup(rank: u32, host: &str, why: &str) -> Error {
    Error::PeerLost { rank, pid: 0, detail: format!("lost during set-up, on host {host} ({why})") }
}

/// The sealing of a connection: (what this end sends with, what it opens with).
type Seal = (Cipher, Cipher);

/// The label of the rendezvous' session keys.
const SEAL_LABEL: &str = "scalefree rendezvous seal";

const MAGIC: &[u8; 8] = b"SCLFREE5";
/// The longest hello (and answer) the hub reads; anything longer is refused unread.
pub const MAX_HELLO: usize = 512;
/// How long a connection may take to say hello and answer the challenge.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(1);
/// Connections being admitted at once; more are dropped at once.
const MAX_PENDING: usize = 1024;
const WELCOME: &[u8] = b"WELCOME";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What a receive says when the other end closed the connection.
pub(super) const CLOSED: &str = "peer closed the connection";

pub(super) fn bs(msg: impl Into<String>) -> Error {
    Error::Bootstrap(msg.into())
}

/// What makes this host this host for the transports: shared memory needs the same boot,
/// IPC namespace and host name; the network namespace separates simulated hosts too.
pub fn host_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let link = |p: &str| std::fs::read_link(p).map(|l| l.to_string_lossy().into_owned()).unwrap_or_default();
    format!(
        "{}|{}|{}|{}|{}",
        read("/proc/sys/kernel/random/boot_id"),
        link("/proc/self/ns/ipc"),
        link("/proc/self/ns/uts"),
        link("/proc/self/ns/net"),
        read("/proc/sys/kernel/hostname"),
    )
}

impl Rendezvous {
    /// Joins the job. Blocks until every rank has arrived or `timeout` passes.
    pub fn join(job: &JobInfo, timeout: Duration) -> Result<Self> {
        if job.size == 1 {
            return Ok(Rendezvous { rank: 0, size: 1, conns: vec![None], timeout, hosts: vec![0], host_names: Vec::new(), seals: vec![None] });
        }
        let mut rv = match &job.master {
            Some((host, port)) => {
                let what = format!("{host}:{port}");
                if job.rank == 0 {
                    let listener = bind_tcp(host, *port)?;
                    Self::host(job, &what, timeout, &mut || match listener.accept() {
                        Ok((s, _)) => {
                            s.set_nodelay(true).ok();
                            Ok(Some(Box::new(s) as Box<dyn Conn>))
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                        Err(e) => Err(Error::io("accept", e)),
                    }, &|l| { listener.set_nonblocking(l).ok(); })?
                } else {
                    Self::guest(job, &what, timeout, &mut || {
                        let addrs: Vec<_> = (host.as_str(), *port).to_socket_addrs().map_err(|e| (e.to_string(), false))?.collect();
                        let mut last = (String::from("no address"), false);
                        for a in addrs {
                            match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
                                Ok(s) => {
                                    s.set_nodelay(true).ok();
                                    s.watch(crate::wait::peer_timeout_from_env());
                                    return Ok(Box::new(s) as Box<dyn Conn>);
                                }
                                // No route, or no answer at all (not even a refusal): rank 0's
                                // host is not reachable from here (a rank not listening yet is
                                // refused, and tried again until the set-up timeout).
                                Err(e) => last = (e.to_string(), matches!(e.raw_os_error(),
                                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ETIMEDOUT | libc::ENETDOWN | libc::EHOSTDOWN))),
                            }
                        }
                        Err(last)
                    })?
                }
            }
            None => {
                let name = format!("scalefree/{}", job.job_id);
                let addr = SocketAddr::from_abstract_name(name.as_bytes())
                    .map_err(|e| Error::io("abstract socket name", e))?;
                let what = format!("{name:?}");
                if job.rank == 0 {
                    let listener = UnixListener::bind_addr(&addr).map_err(|e| {
                        if e.kind() == std::io::ErrorKind::AddrInUse {
                            bs(format!(
                                "another process already hosts rendezvous {name:?}: is a job with id {} still running?",
                                job.job_id
                            ))
                        } else {
                            Error::io(format!("bind {name:?}"), e)
                        }
                    })?;
                    Self::host(job, &what, timeout, &mut || match listener.accept() {
                        Ok((s, _)) => {
                            if !same_user(&s) {
                                return Ok(None);
                            }
                            Ok(Some(Box::new(s) as Box<dyn Conn>))
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                        Err(e) => Err(Error::io("accept", e)),
                    }, &|l| { listener.set_nonblocking(l).ok(); })?
                } else {
                    Self::guest(job, &what, timeout, &mut || {
                        UnixStream::connect_addr(&addr).map(|s| Box::new(s) as Box<dyn Conn>).map_err(|e| (e.to_string(), false))
                    })?
                }
            }
        };
        // Which ranks share a host.
        let ids = rv.exchange(host_identity().as_bytes(), None)?;
        let mut seen: Vec<Vec<u8>> = Vec::new();
        rv.host_names = ids.iter().map(|it| String::from_utf8_lossy(it.bytes.rsplit(|&b| b == b'|').next().unwrap_or_default()).into_owned()).collect();
        rv.hosts = ids
            .into_iter()
            .map(|it| match seen.iter().position(|s| *s == it.bytes) {
                Some(i) => i as u32,
                None => {
                    seen.push(it.bytes);
                    (seen.len() - 1) as u32
                }
            })
            .collect();
        Ok(rv)
    }

    fn host(
        job: &JobInfo,
        what: &str,
        timeout: Duration,
        accept: &mut dyn FnMut() -> Result<Option<Box<dyn Conn>>>,
        nonblocking: &dyn Fn(bool),
    ) -> Result<Self> {
        nonblocking(true);
        let deadline = Instant::now() + timeout;
        let peer_timeout = crate::wait::peer_timeout_from_env();
        let key = Arc::new(Key::derive(&job.token, "scalefree rendezvous", &job.job_id));
        let mut conns: Vec<Option<Box<dyn Conn>>> = (0..job.size).map(|_| None).collect();
        let mut joined = 1u32;
        // Every connection is admitted (hello, challenge, answer) on a thread of its own,
        // within HELLO_DEADLINE: a silent or slow stranger holds up nobody.
        let (tx, rx) = mpsc::channel::<(u32, Box<dyn Conn>, Option<Seal>)>();
        let mut seals: Vec<Option<Seal>> = (0..job.size).map(|_| None).collect();
        let pending = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        while joined < job.size {
            // Take every connection waiting in the backlog.
            while let Some(s) = accept()? {
                if pending.load(Ordering::SeqCst) >= MAX_PENDING {
                    continue; // dropped: more half-open connections than any job has ranks
                }
                pending.fetch_add(1, Ordering::SeqCst);
                let (key, tx, p, refused, size, sealed) = (key.clone(), tx.clone(), pending.clone(), refused.clone(), job.size, job.sealed);
                let spawned = std::thread::Builder::new().name("sf-admit".into()).stack_size(64 << 10).spawn(move || {
                    if let Some(ok) = admit(s, &key, size, sealed, &refused) {
                        let _ = tx.send(ok);
                    }
                    p.fetch_sub(1, Ordering::SeqCst);
                });
                if spawned.is_err() {
                    pending.fetch_sub(1, Ordering::SeqCst);
                }
            }
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok((rank, mut s, seal)) => {
                    if conns[rank as usize].is_some() {
                        let _ = send_frame(&mut *s, format!("REFUSED: rank {rank} is already taken").as_bytes(), None);
                        continue;
                    }
                    s.set_timeout(Some(timeout));
                    s.watch(peer_timeout);
                    conns[rank as usize] = Some(s);
                    seals[rank as usize] = seal;
                    joined += 1;
                }
                Err(_) => {
                    crate::wait::check_interrupt_every(Duration::from_millis(50), &|| format!("ranks to join rendezvous {what}"))?;
                    // A rank that joined and was lost while others are still coming.
                    for (r, s) in conns.iter().enumerate() {
                        if let Some(why) = s.as_ref().and_then(|s| broken(s.as_raw_fd())) {
                            return Err(lost_in_setup(r as u32, &address_of(s.as_deref()), &why));
                        }
                    }
                    if Instant::now() >= deadline {
                        let missing: Vec<u32> =
                            (1..job.size).filter(|r| conns[*r as usize].is_none()).collect();
                        return Err(Error::Timeout {
                            timeout,
                            waiting_for: format!("ranks {missing:?} to join rendezvous {what}"),
                        });
                    }
                }
            }
        }
        nonblocking(false);
        // Everybody is here: welcome them.
        for s in conns.iter_mut().flatten() {
            send_frame(&mut **s, WELCOME, None)?;
        }
        Ok(Rendezvous { rank: 0, size: job.size, conns, timeout, hosts: Vec::new(), host_names: Vec::new(), seals })
    }

    /// `connect` fails with why, and whether rank 0's host is unreachable (no route, no answer):
    /// unreachable for `SCALEFREE_PEER_TIMEOUT` on end, rank 0 is lost.
    fn guest(job: &JobInfo, what: &str, timeout: Duration, connect: &mut dyn FnMut() -> std::result::Result<Box<dyn Conn>, (String, bool)>) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let key = Key::derive(&job.token, "scalefree rendezvous", &job.job_id);
        let mut delay = Duration::from_millis(1);
        let mut last = String::new();
        // Set when rank 0 dropped a connection that had reached it: tried again (rank 0 drops
        // a rank that was too slow to answer, e.g. descheduled for a second), unless rank 0
        // is gone (then this is the error, at once).
        let mut dropped: Option<String> = None;
        let peer_timeout = crate::wait::peer_timeout_from_env();
        let mut unreachable_since: Option<Instant> = None;
        loop {
            if !last.is_empty() {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout { timeout, waiting_for: format!("rank 0 to open rendezvous {what} ({last})") });
                }
                crate::wait::check_interrupt_every(Duration::from_millis(50), &|| format!("rank 0 to open rendezvous {what}"))?;
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(50));
            }
            let mut s = match connect() {
                Ok(s) => s,
                Err((e, unreachable)) => {
                    if let Some(why) = dropped {
                        return Err(bs(why));
                    }
                    if !unreachable {
                        unreachable_since = None;
                    } else if unreachable_since.get_or_insert_with(Instant::now).elapsed() >= peer_timeout {
                        return Err(lost_in_setup(0, what, &format!(
                            "unreachable from this host for {:.0} s (SCALEFREE_PEER_TIMEOUT): {e}", peer_timeout.as_secs_f64())));
                    }
                    last = e;
                    continue;
                }
            };
            let seal = match Self::handshake(&mut *s, job, &key, what, deadline)? {
                Ok(seal) => seal,
                Err(e) => {
                    if let Error::Io { source, .. } = &e {
                        if source.raw_os_error() == Some(libc::ETIMEDOUT) {
                            return Err(lost_in_setup(0, what, &describe_io(source)));
                        }
                    }
                    let closed = format!("rank 0 closed the rendezvous {what} before welcoming rank {}: {e}", job.rank);
                    (last, dropped) = ("rank 0 closed the connection".into(), Some(closed));
                    continue;
                }
            };
            s.set_timeout(Some(timeout));
            let mut conns: Vec<Option<Box<dyn Conn>>> = (0..job.size).map(|_| None).collect();
            conns[0] = Some(s);
            let mut seals: Vec<Option<Seal>> = (0..job.size).map(|_| None).collect();
            seals[0] = seal;
            return Ok(Rendezvous { rank: job.rank, size: job.size, conns, timeout, hosts: Vec::new(), host_names: Vec::new(), seals });
        }
    }

    /// A guest's handshake on a fresh connection to rank 0: hello, rank 0's challenge, our
    /// answer, its welcome; then the connection's sealing, if sealed over TCP. `Ok(Err(e))`:
    /// rank 0 closed the connection on the way (`e`, the failed send or receive); errors are
    /// final (refused, or not this job's rank 0).
    fn handshake(s: &mut dyn Conn, job: &JobInfo, key: &Key, what: &str, deadline: Instant) -> Result<Result<Option<Seal>>> {
        let mine = nonce()?;
        let sealed = job.sealed && s.is_tcp();
        let hello = hello_bytes(job.rank, job.size, sealed, &mine);
        let challenge = match Self::ask(s, &hello, job.rank, deadline)? {
            Ok(reply) => reply,
            Err(e) => return Ok(Err(e)),
        };
        let Some(tag) = auth::answer(key, &hello, &mine, &challenge) else {
            return Err(bs(format!(
                "rank 0 at {what} could not prove it knows this job's secret: wrong job token here or there \
                 (set the same SCALEFREE_JOB_TOKEN on every host), or not this job's rank 0"
            )));
        };
        let welcome = match Self::ask(s, &tag, job.rank, deadline)? {
            Ok(reply) => reply,
            Err(e) => return Ok(Err(e)),
        };
        if welcome != WELCOME {
            return Err(bs(format!("rank 0 at {what} sent no welcome")));
        }
        let theirs: auth::Nonce = challenge[..auth::NONCE_LEN].try_into().expect("a checked challenge");
        Ok(Ok(sealed.then(|| crate::seal::session(key, SEAL_LABEL, &hello, (&mine, &theirs), true))))
    }

    /// Sends `msg` to rank 0 and reads its reply by `deadline`. `Ok(Err(e))`: the send or the
    /// receive failed (rank 0 closed the connection); an error when rank 0 refused rank `me`.
    fn ask(s: &mut dyn Conn, msg: &[u8], me: u32, deadline: Instant) -> Result<Result<Vec<u8>>> {
        s.set_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))));
        let reply = match send_frame(s, msg, None).and_then(|()| recv_frame_max(s, MAX_HELLO)) {
            Ok((b, _)) => b,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(why) = reply.strip_prefix(b"REFUSED: ") {
            return Err(bs(format!("rank 0 refused rank {me}: {}", String::from_utf8_lossy(why))));
        }
        Ok(Ok(reply))
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Host index of `rank`: ranks of one host share it; hosts are numbered in the order
    /// of their lowest rank.
    pub fn host_of(&self, rank: u32) -> u32 {
        self.hosts[rank as usize]
    }
    /// Host name of every rank (empty for a job of one).
    pub fn host_names(&self) -> &[String] {
        &self.host_names
    }
    /// Host index of every rank.
    pub fn hosts(&self) -> &[u32] {
        &self.hosts
    }
    /// Whether the hub is reached over TCP (descriptors do not travel).
    pub fn is_tcp(&self) -> bool {
        self.conns.iter().flatten().any(|c| c.is_tcp())
    }

    /// The address this rank reaches the others from: the local end of its TCP connection to
    /// the hub (the interface that routes to the master); `None` over a Unix socket.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.conns.iter().flatten().find_map(|c| c.local_ip())
    }

    /// Every rank contributes an item; every rank gets all items, indexed by rank.
    /// Descriptors are duplicated into each receiver by the kernel (Unix hub only).
    pub fn exchange(&mut self, bytes: &[u8], fd: Option<RawFd>) -> Result<Vec<Item>> {
        let dup = |fd: RawFd| -> Result<OwnedFd> {
            let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if d < 0 {
                return Err(Error::last_os("dup"));
            }
            Ok(unsafe { OwnedFd::from_raw_fd(d) })
        };
        if self.size == 1 {
            return Ok(vec![Item { bytes: bytes.to_vec(), fd: fd.map(dup).transpose()? }]);
        }
        let fd = if self.is_tcp() { None } else { fd };
        let timeout = self.timeout;
        if self.rank == 0 {
            let mut items: Vec<Item> = Vec::with_capacity(self.size as usize);
            items.push(Item { bytes: bytes.to_vec(), fd: fd.map(dup).transpose()? });
            for r in 1..self.size as usize {
                let host = self.host_label(r);
                let s = self.conns[r].as_mut().expect("connected");
                let (b, f) = recv_sealed(&mut **s, &mut self.seals[r]).map_err(|e| lost(r as u32, &host, timeout, e))?;
                items.push(Item { bytes: b, fd: f });
            }
            for r in 1..self.size as usize {
                let host = self.host_label(r);
                let s = self.conns[r].as_mut().expect("connected");
                for it in &items {
                    send_sealed(&mut **s, &mut self.seals[r], &it.bytes, it.fd.as_ref().map(|f| f.as_raw_fd()))
                        .map_err(|e| lost(r as u32, &host, timeout, e))?;
                }
            }
            Ok(items)
        } else {
            let host = self.host_label(0);
            let s = self.conns[0].as_mut().expect("connected");
            let seal = &mut self.seals[0];
            send_sealed(&mut **s, seal, bytes, fd).map_err(|e| lost(0, &host, timeout, e))?;
            let mut items = Vec::with_capacity(self.size as usize);
            for _ in 0..self.size {
                let (b, f) = recv_sealed(&mut **s, seal).map_err(|e| lost(0, &host, timeout, e))?;
                items.push(Item { bytes: b, fd: f });
            }
            Ok(items)
        }
    }

    /// How messages name `rank`'s host: its name once the hosts are known, else the address
    /// its connection comes from.
    fn host_label(&self, rank: usize) -> String {
        match self.host_names.get(rank).filter(|n| !n.is_empty()) {
            Some(name) => name.clone(),
            None => address_of(self.conns.get(rank).and_then(|c| c.as_deref()).or_else(|| self.conns.iter().flatten().next().map(|c| &**c))),
        }
    }

    /// The connections to watch from set-up waits outside the rendezvous ([`SetupWatch`]).
    pub fn watcher(&self) -> Result<SetupWatch> {
        let mut conns = Vec::new();
        for (r, c) in self.conns.iter().enumerate() {
            if let Some(c) = c {
                let d = unsafe { libc::fcntl(c.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
                if d < 0 {
                    return Err(Error::last_os("dup a rendezvous connection"));
                }
                conns.push((r as u32, self.host_label(r), unsafe { OwnedFd::from_raw_fd(d) }));
            }
        }
        Ok(SetupWatch { conns })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long a set-up exchange waits for a live but silent peer from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        for c in self.conns.iter().flatten() {
            c.set_timeout(Some(timeout));
        }
    }
}

/// Listens on `host:port` (the master address: the interface the other hosts reach), or,
/// when `host` is not an address of this machine (behind NAT, say), on every interface,
/// with a warning (only ranks that prove the job's secret get in either way).
fn bind_tcp(host: &str, port: u16) -> Result<TcpListener> {
    let mut last = None;
    let addrs: Vec<_> = (host, port).to_socket_addrs().map_err(|e| Error::io(format!("resolve {host}:{port}"), e))?.collect();
    for a in addrs {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    let not_local = matches!(&last, Some(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable);
    if not_local {
        if let Ok(l) = TcpListener::bind(("0.0.0.0", port)) {
            eprintln!(
                "scalefree: warning: the master address {host} is not an address of this host: \
                 the rendezvous listens on every interface (port {port})"
            );
            return Ok(l);
        }
    }
    Err(match last {
        Some(e) if e.kind() == std::io::ErrorKind::AddrInUse => bs(format!(
            "port {port} on {host} is in use: another job? choose another --master-port"
        )),
        Some(e) => Error::io(format!("listen on {host}:{port}"), e),
        None => bs(format!("{host} resolves to no address")),
    })
}

/// The address a connection comes from, for messages (`this host` over a Unix socket).
fn address_of(c: Option<&dyn Conn>) -> String {
    c.and_then(|c| c.peer_ip()).map_or_else(|| "this host".to_string(), |ip| ip.to_string())
}

/// What a failed set-up message to or from `rank` (on `host`) means: a peer lost (its
/// connection closed, reset, or dropped by the kernel when the host went silent), a peer
/// alive but silent past the set-up `timeout` (a socket read timeout, never shown as `EAGAIN`),
/// or the message itself was bad.
fn lost(rank: u32, host: &str, timeout: Duration, e: Error) -> Error {
    match &e {
        Error::Io { source, .. } if matches!(source.kind(), std::io::ErrorKind::WouldBlock) => Error::Timeout {
            timeout,
            waiting_for: format!("rank {rank} on host {host} in a set-up exchange (SCALEFREE_BOOTSTRAP_TIMEOUT)"),
        },
        Error::Io { source, .. } => lost_in_setup(rank, host, &describe_io(source)),
        Error::Bootstrap(m) if m == CLOSED => lost_in_setup(rank, host, "connection closed: the process ended"),
        _ => Error::Bootstrap(format!("lost rank {rank} during set-up: {e}")),
    }
}

/// Sends one set-up message, sealed when the connection is.
fn send_sealed(s: &mut dyn Conn, seal: &mut Option<Seal>, payload: &[u8], fd: Option<RawFd>) -> Result<()> {
    match seal {
        None => send_frame(s, payload, fd),
        Some((tx, _)) => {
            let mut rec = Vec::with_capacity(payload.len() + crate::seal::OVERHEAD);
            tx.seal_onto(&mut rec, payload);
            send_frame(s, &rec, None)
        }
    }
}

/// Receives one set-up message, opening it when the connection is sealed: a message changed,
/// replayed or reordered on the way is an error.
fn recv_sealed(s: &mut dyn Conn, seal: &mut Option<Seal>) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    let (mut b, f) = recv_frame(s)?;
    if let Some((_, rx)) = seal {
        let n = rx.open_record(&mut b).map_err(|e| bs(format!("a sealed rendezvous message was refused: {e}")))?.len();
        b.drain(..8);
        b.truncate(n);
    }
    Ok((b, f))
}

fn hello_bytes(rank: u32, size: u32, sealed: bool, nonce: &auth::Nonce) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(&(VERSION.len() as u16).to_le_bytes());
    v.extend_from_slice(VERSION.as_bytes());
    v.push(sealed as u8);
    v.extend_from_slice(nonce);
    v
}

/// (rank, world size, sealed, initiator nonce) from a hello, or why it is refused.
fn parse_hello(b: &[u8]) -> std::result::Result<(u32, u32, bool, auth::Nonce), String> {
    if b.len() < 18 || &b[..8] != MAGIC {
        return Err("not a scalefree rendezvous message (another program, or a scalefree too old)".into());
    }
    let rank = u32::from_le_bytes(b[8..12].try_into().unwrap());
    let size = u32::from_le_bytes(b[12..16].try_into().unwrap());
    let vlen = u16::from_le_bytes(b[16..18].try_into().unwrap()) as usize;
    if b.len() < 18 + vlen {
        return Err("a truncated hello".into());
    }
    let version = String::from_utf8_lossy(&b[18..18 + vlen]).into_owned();
    if version != VERSION {
        return Err(format!("rank {rank} runs scalefree {version} but rank 0 runs {VERSION}"));
    }
    let rest = &b[18 + vlen..];
    if rest.len() != 1 + auth::NONCE_LEN || rest[0] > 1 {
        return Err("a hello without a nonce".to_string());
    }
    Ok((rank, size, rest[0] == 1, rest[1..].try_into().unwrap()))
}

/// Admits one connection to the hub within [`HELLO_DEADLINE`]: reads its hello (at most
/// [`MAX_HELLO`] bytes, checked before anything is allocated), proves this job's secret to it
/// and checks its proof. Returns its rank, or `None` (after telling it why, when it is
/// worth telling) for anybody else.
fn admit(mut s: Box<dyn Conn>, key: &Key, size: u32, sealed: bool, refused: &AtomicUsize) -> Option<(u32, Box<dyn Conn>, Option<Seal>)> {
    let deadline = Instant::now() + HELLO_DEADLINE;
    set_blocking(s.as_raw_fd());
    s.set_write_timeout(Some(HELLO_DEADLINE));
    let refuse = |s: &mut Box<dyn Conn>, why: String| {
        if refused.fetch_add(1, Ordering::SeqCst) < 3 {
            eprintln!("scalefree: rank 0 refused a connection to the rendezvous: {why}");
        }
        let _ = send_frame(&mut **s, format!("REFUSED: {why}").as_bytes(), None);
        None
    };
    let hello = match read_frame_by(&mut *s, MAX_HELLO, deadline) {
        Ok(b) => b,
        Err(why) => {
            return if why.starts_with("a hello of") { refuse(&mut s, why) } else { None };
        }
    };
    let (rank, their_size, their_sealed, theirs) = match parse_hello(&hello) {
        Ok(h) => h,
        Err(why) => return refuse(&mut s, why),
    };
    let challenge = auth::challenge(key, &hello, &theirs).ok()?;
    send_frame(&mut *s, &challenge, None).ok()?;
    let answer = read_frame_by(&mut *s, MAX_HELLO, deadline).ok()?;
    if !auth::accept(key, &hello, &theirs, &challenge, &answer) {
        return refuse(&mut s, format!("rank {rank} presented the wrong job token (a rank of another job?)"));
    }
    if their_size != size {
        return refuse(&mut s, format!("rank 0 runs a job of {size} ranks, this rank was told {their_size}"));
    }
    if rank == 0 || rank >= size {
        return refuse(&mut s, format!("rank {rank} is out of range"));
    }
    let sealed = sealed && s.is_tcp();
    if their_sealed != sealed {
        let on = |b: bool| if b { "with SCALEFREE_ENCRYPT=1" } else { "without SCALEFREE_ENCRYPT" };
        return refuse(&mut s, format!("rank {rank} runs {} and rank 0 {}: set it alike on every host (scalefree run --encrypt)", on(their_sealed), on(sealed)));
    }
    s.set_write_timeout(None);
    let mine: auth::Nonce = challenge[..auth::NONCE_LEN].try_into().unwrap();
    Some((rank, s, sealed.then(|| crate::seal::session(key, SEAL_LABEL, &hello, (&theirs, &mine), false))))
}

#[cfg(test)]
mod tests;
