//! TCP lanes: bulk writes between hosts over plain sockets where UCX would carry them over
//! TCP anyway.
//!
//! Measured between simulated hosts on this machine (`docs/benchmarks/collectives.md`, "Across simulated
//! hosts"): UCX's `tcp` transport moves 0.8–1.3 GB/s per direction when both sides send at
//! once (its receive path copies every fragment out of its own buffers, and eager messages
//! once more when they are reassembled), while kernel TCP between the same namespaces moves
//! about 2.2 GB/s per direction. A lane reads a write's bytes straight from the socket into
//! the target region — one kernel copy at each end, as gloo does — and raises the write's
//! note after the last byte has landed.
//!
//! Every frame to a peer travels on its first socket, in order, and `notify` takes the lane
//! after flushing UCX, so a notification is raised after every earlier write's data is in
//! place. The exception: with more than one socket per pair (`SCALEFREE_TCP_LANE_STREAMS`,
//! default 1; a pair uses the smaller of its two settings), large posted writes without a
//! note are striped over all of them, and a fence keeps that rule: see [`Stripe`] and
//! [`Offer`]. One-sided `put`/`get`, heartbeats and failure detection stay on UCX. Where
//! UCX has RDMA (verbs) to a peer, lanes are not used for it (`SCALEFREE_TCP_LANES=auto`,
//! the default; `1` forces them, `0` turns them off).
//!
//! Threads: per peer and socket, a reader that sleeps in `poll` and a writer that sends
//! queued large writes; small frames are written by the caller at once when nothing is queued. A
//! large posted write on an idle lane goes to the socket from the caller as far as the socket
//! takes it without blocking; the rest is queued, and a caller that waits for a queued write
//! sends the queue itself up to that write (the writer thread takes no job meanwhile, see
//! [`help`]): the writer thread only moves what nobody waits for. A caller
//! waiting for a notification reads arrived frames itself while it spins (as it drives UCX's
//! progress), so a small message costs no thread wake-up; parked, it leaves them to the
//! reader thread, unless it reads them itself while parked in `poll` (`Net::wait_reading`).
//! Nobody polls without bound.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::auth::Key;
use super::{finish_pending, Pending, Request, Shared, NOTE_WORD, UCS_ERR_CONNECTION_RESET, UCS_OK};
use crate::error::{Error, Result};

const KIND_WRITE: u32 = 1;
const KIND_NOTIFY: u32 = 2;
/// A fence (see [`Stripe`]): `index` is its number. On an extra stream it marks that every
/// write sent on that stream before it has been read; on the first stream, that the frames
/// after it wait until every extra stream has delivered that fence.
const KIND_FENCE: u32 = 3;
/// Posted writes without a note from this size on are striped over a peer's streams (when
/// `SCALEFREE_TCP_LANE_STREAMS` > 1).
const STRIPE_MIN: usize = 256 << 10;
const HELLO_MAGIC: u32 = 0x5346_4c4e; // "SFLN"
/// Frames up to this size are written by the caller when the lane is idle (no hand-off to
/// the writer thread: at 1 MiB allreduce that hand-off cost more than the overlap it buys).
const INLINE_MAX: usize = 1 << 20;
/// Frames from this size on are bulk: sending one ends a reader lease (see [`Gate::end_lease`])
/// unless the caller writes it and the socket takes it at once (see [`keep_lease`]).
const BULK_FRAME: usize = 64 << 10;

/// Frame header, little-endian on the wire.
#[derive(Clone, Copy, Default)]
struct Frame {
    kind: u32,
    value: u32,
    key: u64,
    offset: u64,
    len: u64,
    note: u64,
    index: u64,
}
const FRAME_LEN: usize = 48;

impl Frame {
    fn bytes(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.value.to_le_bytes());
        for (i, v) in [self.key, self.offset, self.len, self.note, self.index].into_iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    fn parse(b: &[u8; FRAME_LEN]) -> Frame {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Frame {
            kind: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            value: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            key: u64_at(8),
            offset: u64_at(16),
            len: u64_at(24),
            note: u64_at(32),
            index: u64_at(40),
        }
    }
}

/// A queued write: the header, the source bytes (valid until `pending` completes) and its
/// completion.
struct Job {
    frame: Frame,
    src: usize,
    /// Bytes of header and data already on the socket (the caller sent them).
    sent: usize,
    pending: Arc<Pending>,
}

struct State {
    queue: VecDeque<Job>,
    /// A job is being sent (by the writer thread or a waiter; nobody else may write
    /// meanwhile).
    busy: bool,
    /// Callers waiting for a queued write of this lane, sending the queue themselves (see
    /// [`help`]): the writer thread takes no new job meanwhile.
    helpers: u32,
    closed: bool,
    failed: Option<String>,
}

pub(crate) struct Lane {
    peer: u32,
    stream: TcpStream,
    state: Mutex<State>,
    cv: Condvar,
    reader: Mutex<Reader>,
    /// Which of the peer's streams this is (0: the first, which carries every frame but
    /// striped writes).
    index: usize,
    /// The extra streams to this peer (on the first stream only; empty with one stream).
    extra: Vec<Arc<Lane>>,
    /// Where striped writes go next, and whether a fence is owed (first stream only).
    stripe: Mutex<Stripe>,
    /// The fences the extra streams delivered (shared by all of a peer's streams).
    fences: Arc<Fences>,
}

/// Striping (N > 1 streams: the smaller of the pair's two `SCALEFREE_TCP_LANE_STREAMS`, see
/// [`Offer`]): a peer pair has N sockets, each with its own writer and reader thread. Posted writes without a note of at least [`STRIPE_MIN`]
/// bytes go round-robin to the N streams (queued, so they progress in parallel); every other
/// frame goes on the first stream. Before the first such frame after a striped write, a
/// fence numbered F is queued on every extra stream and on the first one: the first
/// stream's reader reads on past it only once every extra stream's reader has read its
/// fence F, so a note or notification is still raised after every earlier write landed.
/// Posted writes to one peer may land in any order among themselves.
#[derive(Default)]
struct Stripe {
    next: usize,
    dirty: bool,
    fence: u64,
}

/// The highest fence read on each extra stream of a peer (index 0 unused); `u64::MAX` once
/// the stream closed or broke.
struct Fences {
    seen: Mutex<Vec<u64>>,
    cv: Condvar,
}

/// The most sockets a peer pair may use.
const MAX_STREAMS: usize = 8;

/// Sockets a rank offers each peer unless `SCALEFREE_TCP_LANE_STREAMS` says otherwise: one
/// (striping off). Between 2 simulated hosts on 2 cores, 4 streams did not make 8 posted
/// 1 MiB writes reliably faster than one (`docs/benchmarks/collectives.md`, "Striped lanes").
const DEFAULT_STREAMS: usize = 1;

/// The number of sockets this rank offers each peer (`SCALEFREE_TCP_LANE_STREAMS`, 1..=8,
/// default [`DEFAULT_STREAMS`]). A pair uses the smaller of its two offers (see [`Offer`]).
fn streams() -> usize {
    std::env::var("SCALEFREE_TCP_LANE_STREAMS").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(DEFAULT_STREAMS).clamp(1, MAX_STREAMS)
}

/// What a rank tells every other rank before the lanes open: where it listens and how many
/// streams it offers, as `"ADDR STREAMS"`. Both ends of a pair read both offers and use the
/// smaller count ([`Offer::agree`]), so ranks with different settings still agree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Offer {
    pub addr: SocketAddr,
    pub streams: usize,
}

impl Offer {
    pub fn encode(&self) -> String {
        format!("{} {}", self.addr, self.streams)
    }

    /// `None` for a rank that offers no lane (empty) or sent something else.
    pub fn parse(b: &[u8]) -> Option<Offer> {
        let mut it = std::str::from_utf8(b).ok()?.split_ascii_whitespace();
        let addr = it.next()?.parse().ok()?;
        let streams = it.next()?.parse::<usize>().ok().filter(|&k| (1..=MAX_STREAMS).contains(&k))?;
        it.next().is_none().then_some(Offer { addr, streams })
    }

    /// The streams a pair uses: the smaller offer.
    pub fn agree(mine: usize, theirs: usize) -> usize {
        mine.min(theirs).clamp(1, MAX_STREAMS)
    }
}

/// The receiving side of a lane.
struct Reader {
    s: TcpStream,
    fd: std::os::fd::RawFd,
    scratch: Vec<u8>,
    /// Where a reducing window's parts are read (see [`read_reducing`]).
    part: Vec<u64>,
    /// The peer closed the lane, or it broke.
    done: bool,
}

/// Keeps the reader threads out of the way while callers read the lanes themselves: a
/// reader woken by `poll` at the same time as a spinning caller costs a thread wake-up and
/// a fight for the frame (on 2 cores, about half of a small message's round trip).
pub(crate) struct Gate {
    /// Callers spinning (or yielding) in a wait, reading arrivals themselves.
    spinning: AtomicU32,
    /// Until when (ms since `epoch`) the readers keep standing down after a caller that
    /// reads its own arrivals ([`Net::wait_reading`](super::Net::wait_reading)) left its
    /// wait: its next call's messages would otherwise find a reader back in `poll` and wake
    /// it for nothing. A caller that parks ends the lease.
    lease_until: AtomicU64,
    epoch: std::time::Instant,
    /// Set when the lanes close.
    closed: Mutex<bool>,
    cv: Condvar,
}

/// How long a reader that stood down sleeps before it looks again when no parking caller
/// called it back (a caller whose wait ended while it spun does not: that would be the very
/// wake-up the gate saves; arrivals meanwhile wait at most this long, or until a caller reads
/// them).
const STAND_DOWN: Duration = Duration::from_millis(1);

impl crate::wait::SpinHook for Gate {
    fn enter(&self) {
        self.spinning.fetch_add(1, Ordering::SeqCst);
    }
    fn leave(&self, parking: bool) {
        self.spinning.fetch_sub(1, Ordering::SeqCst);
        if parking {
            self.call_back();
        }
    }
}

/// How long the readers stand down after a caller that reads its own arrivals left its
/// wait (see [`Gate::lease_until`]).
const LEASE: Duration = Duration::from_millis(2);

impl Gate {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Readers stay out: callers read the lanes themselves now or did a moment ago.
    fn callers_reading(&self) -> bool {
        self.spinning.load(Ordering::SeqCst) > 0 || self.now_ms() < self.lease_until.load(Ordering::SeqCst)
    }

    /// A caller that reads its own arrivals leaves its wait: the readers stand down a
    /// little longer, for its next call.
    pub(crate) fn leave_leased(&self) {
        self.lease_until.store(self.now_ms() + LEASE.as_millis() as u64, Ordering::SeqCst);
        self.spinning.fetch_sub(1, Ordering::SeqCst);
    }

    /// Calls the readers back now if a lease keeps them out: a caller starts bulk writes,
    /// and its peers may write as much to it before anyone here waits (a caller blocked in
    /// a write to a peer that blocks writing to it would otherwise wait out the lease).
    fn end_lease(&self) {
        if self.lease_until.load(Ordering::SeqCst) != 0 {
            self.call_back();
        }
    }

    /// Ends any lease and wakes the standing-down readers (they read the lanes again once
    /// no caller spins).
    fn call_back(&self) {
        self.lease_until.store(0, Ordering::SeqCst);
        let _g = self.closed.lock().unwrap();
        self.cv.notify_all();
    }
}

impl Gate {
    /// Sleeps while callers spin; false once the lanes are closing.
    fn stand_down(&self) -> bool {
        let mut closed = self.closed.lock().unwrap();
        while !*closed && self.callers_reading() {
            // Until the lease ends, or a moment while a caller spins.
            let lease = self.lease_until.load(Ordering::SeqCst).saturating_sub(self.now_ms());
            closed = self.cv.wait_timeout(closed, STAND_DOWN.max(Duration::from_millis(lease))).unwrap().0;
        }
        !*closed
    }
}

/// The lanes of one rank: one per peer on another host that offered one.
pub(crate) struct Lanes {
    sh: Arc<Shared>,
    gate: Arc<Gate>,
    lanes: Vec<Option<Arc<Lane>>>,
    /// Which peers writes go to over a lane (the others use UCX even if a lane exists).
    send_on: Vec<bool>,
    threads: Vec<JoinHandle<()>>,
    /// While writes go over lanes, their threads and the kernel's TCP work need the cores a
    /// yielding waiter would keep: the process's waits skip their yield phase (measured on 4
    /// simulated hosts: 1 MiB allreduce 3.7 -> 1.9 ms).
    helper: Option<crate::wait::HelperThread>,
}

/// The lane setting: `None` off, `Some(true)` forced, `Some(false)` auto.
pub(crate) fn setting() -> Option<bool> {
    match std::env::var("SCALEFREE_TCP_LANES").ok().as_deref().map(str::trim) {
        Some("0") | Some("off") | Some("no") => None,
        Some("1") | Some("on") | Some("yes") => Some(true),
        _ => Some(false),
    }
}

/// A listening socket on `ip`, before the addresses are swapped.
pub(crate) struct Listener {
    listener: TcpListener,
    /// What this rank offers its peers (its address, its `SCALEFREE_TCP_LANE_STREAMS`).
    pub offer: Offer,
}

impl Listener {
    pub fn bind(ip: IpAddr) -> Result<Listener> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| Error::io(format!("TCP lane: bind {ip}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("TCP lane: local address", e))?;
        Ok(Listener { listener, offer: Offer { addr, streams: streams() } })
    }
}

/// How long a connection to a lane listener may take to prove it belongs to the job.
const LANE_HELLO_DEADLINE: Duration = Duration::from_secs(5);
const LANE_HELLO_LEN: usize = 8 + crate::auth::NONCE_LEN;
const LANE_CHALLENGE_LEN: usize = crate::auth::NONCE_LEN + crate::auth::TAG_LEN;

/// What both ends of a lane from `dialer` to `acceptor` bind their tags to.
fn lane_context(dialer: u32, acceptor: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    c[4..8].copy_from_slice(&dialer.to_le_bytes());
    c[8..12].copy_from_slice(&acceptor.to_le_bytes());
    c
}

/// The dialling side of a lane's handshake (see [`crate::auth`]): hello with a fresh nonce,
/// check the acceptor's tag, answer with ours. The job's secret never crosses the wire.
pub(crate) fn dial_handshake(s: &mut TcpStream, key: &Key, me: u32, peer: u32) -> std::result::Result<(), String> {
    let mine = crate::auth::nonce().map_err(|e| e.to_string())?;
    let mut hello = [0u8; LANE_HELLO_LEN];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[4..8].copy_from_slice(&me.to_le_bytes());
    hello[8..].copy_from_slice(&mine);
    s.write_all(&hello).map_err(|e| format!("hello: {e}"))?;
    let mut challenge = [0u8; LANE_CHALLENGE_LEN];
    s.read_exact(&mut challenge).map_err(|e| format!("rank {peer} closed the lane before proving it is of this job: {e}"))?;
    let tag = crate::auth::answer(key, &lane_context(me, peer), &mine, &challenge)
        .ok_or_else(|| format!("the process at rank {peer}'s lane address does not know this job's secret"))?;
    s.write_all(&tag).map_err(|e| format!("answer: {e}"))
}

/// The accepting side of a lane's handshake, all within `deadline`: the dialler's rank when
/// it proves it is a rank of this job that `wanted` (`None` for anybody else).
pub(crate) fn accept_handshake(s: &mut TcpStream, key: &Key, me: u32, wanted: &dyn Fn(u32) -> bool, deadline: std::time::Instant) -> Option<u32> {
    let read_by = |s: &mut TcpStream, buf: &mut [u8]| -> Option<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            s.set_read_timeout(Some(left)).ok()?;
            match s.read(&mut buf[got..]) {
                Ok(0) => return None,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(())
    };
    s.set_write_timeout(Some(LANE_HELLO_DEADLINE)).ok()?;
    let mut hello = [0u8; LANE_HELLO_LEN];
    read_by(s, &mut hello)?;
    let magic = u32::from_le_bytes(hello[0..4].try_into().unwrap());
    let r = u32::from_le_bytes(hello[4..8].try_into().unwrap());
    let theirs: crate::auth::Nonce = hello[8..].try_into().unwrap();
    if magic != HELLO_MAGIC || !wanted(r) {
        return None;
    }
    let ctx = lane_context(r, me);
    let challenge = crate::auth::challenge(key, &ctx, &theirs).ok()?;
    s.write_all(&challenge).ok()?;
    let mut answer = [0u8; crate::auth::TAG_LEN];
    read_by(s, &mut answer)?;
    if !crate::auth::accept(key, &ctx, &theirs, &challenge, &answer) {
        return None;
    }
    s.set_read_timeout(None).ok()?;
    s.set_write_timeout(None).ok()?;
    Some(r)
}

/// The key of a job's lanes.
pub(crate) fn lane_key(token: &str, job_id: &str) -> Key {
    Key::derive(token, "scalefree tcp lane", job_id)
}

impl Lanes {
    /// Collective between the ranks in `connect` (true: open a lane to that rank; both sides
    /// must agree): lower ranks are dialled by higher ones. `offers[r]` is rank `r`'s
    /// listening address and stream count; a pair opens as many streams as the smaller of
    /// its two offers. Every lane proves both ends know the job's key (`lane_key`).
    pub fn open(sh: &Arc<Shared>, listener: Listener, offers: &[Option<Offer>], connect: &[bool], key: &Key, timeout: Duration) -> Result<Lanes> {
        let me = sh.me as usize;
        // Streams per peer, the same number at both ends.
        let counts: Vec<usize> = offers.iter().map(|o| o.map_or(1, |o| Offer::agree(listener.offer.streams, o.streams))).collect();
        let mut streams: Vec<Vec<Option<TcpStream>>> = counts.iter().map(|&k| (0..k).map(|_| None).collect()).collect();
        // Accept (and admit, each on a thread of its own) while this rank dials its own.
        let want: usize = connect.iter().enumerate().filter(|&(r, &c)| c && r > me).map(|(r, _)| counts[r]).sum();
        let deadline = std::time::Instant::now() + timeout;
        let acceptor = {
            let key = key.clone();
            let connect = connect.to_vec();
            let counts = counts.clone();
            let l = listener.listener;
            std::thread::Builder::new().name(format!("sf-lane-accept-{me}")).spawn(move || -> Result<Vec<(u32, usize, TcpStream)>> {
                l.set_nonblocking(true).ok();
                let (tx, rx) = std::sync::mpsc::channel::<(u32, usize, TcpStream)>();
                let mut got: Vec<(u32, usize, TcpStream)> = Vec::new();
                let mut refused = 0;
                while got.len() < want {
                    loop {
                        match l.accept() {
                            Ok((mut s, _)) => {
                                s.set_nonblocking(false).ok();
                                let (key, tx, connect, counts) = (key.clone(), tx.clone(), connect.clone(), counts.clone());
                                let _ = std::thread::Builder::new().name("sf-lane-admit".into()).stack_size(64 << 10).spawn(move || {
                                    let ok = accept_handshake(&mut s, &key, me as u32, &|r| (r as usize) > me && (r as usize) < connect.len() && connect[r as usize],
                                                              std::time::Instant::now() + LANE_HELLO_DEADLINE);
                                    // Then which of the dialler's streams this is.
                                    let mut idx = [0u8; 4];
                                    let stream = ok.and_then(|r| {
                                        s.set_read_timeout(Some(LANE_HELLO_DEADLINE)).ok()?;
                                        s.read_exact(&mut idx).ok()?;
                                        s.set_read_timeout(None).ok()?;
                                        Some(u32::from_le_bytes(idx) as usize).filter(|&i| i < counts[r as usize])
                                    });
                                    // u32::MAX: refused.
                                    let _ = tx.send((if stream.is_some() { ok.unwrap_or(u32::MAX) } else { u32::MAX }, stream.unwrap_or(0), s));
                                });
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(Error::io("TCP lane: accept", e)),
                        }
                    }
                    match rx.recv_timeout(Duration::from_millis(1)) {
                        Ok((r, i, s)) => {
                            let from = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                            if r == u32::MAX || got.iter().any(|(q, j, _)| *q == r && *j == i) {
                                refused += 1;
                                if refused <= 3 {
                                    eprintln!("scalefree: rank {me} refused a TCP lane from {from} (not a rank of this job)");
                                }
                                continue;
                            }
                            got.push((r, i, s));
                        }
                        Err(_) => {
                            if std::time::Instant::now() >= deadline {
                                return Err(Error::Timeout { timeout, waiting_for: format!("{} peers to open their TCP lanes to rank {me}", want - got.len()) });
                            }
                        }
                    }
                }
                Ok(got)
            }).map_err(|e| Error::io("spawn TCP lane acceptor", e))?
        };
        for r in (0..me).filter(|&r| connect[r]) {
            let a = offers[r].ok_or_else(|| Error::Bootstrap(format!("rank {r} offered no TCP lane")))?.addr;
            for i in 0..counts[r] {
                let left = deadline.saturating_duration_since(std::time::Instant::now()).max(Duration::from_millis(1));
                let mut s = TcpStream::connect_timeout(&a, left).map_err(|e| Error::io(format!("TCP lane: connect to rank {r} at {a}"), e))?;
                s.set_read_timeout(Some(left)).ok();
                dial_handshake(&mut s, key, me as u32, r as u32).map_err(|e| Error::Bootstrap(format!("TCP lane to rank {r} at {a}: {e}")))?;
                s.write_all(&(i as u32).to_le_bytes()).map_err(|e| Error::io(format!("TCP lane to rank {r} at {a}"), e))?;
                s.set_read_timeout(None).ok();
                streams[r][i] = Some(s);
            }
        }
        for (r, i, s) in acceptor.join().map_err(|_| Error::Bootstrap("the TCP lane acceptor panicked".into()))?? {
            streams[r as usize][i] = Some(s);
        }
        let gate = Arc::new(Gate { spinning: AtomicU32::new(0), lease_until: AtomicU64::new(0), epoch: std::time::Instant::now(),
                                   closed: Mutex::new(false), cv: Condvar::new() });
        let mut lanes = Lanes { sh: sh.clone(), gate: gate.clone(), lanes: (0..offers.len()).map(|_| None).collect(), send_on: vec![false; offers.len()], threads: Vec::new(), helper: None };
        for (r, ss) in streams.into_iter().enumerate() {
            if ss.iter().any(|s| s.is_none()) {
                continue;
            }
            let fences = Arc::new(Fences { seen: Mutex::new(vec![0; ss.len()]), cv: Condvar::new() });
            let mut made: Vec<Arc<Lane>> = Vec::new();
            for (i, s) in ss.into_iter().enumerate().rev() {
                let s = s.expect("checked above");
                s.set_nodelay(true).ok();
                let reader = s.try_clone().map_err(|e| Error::io("TCP lane: clone socket", e))?;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&reader);
                let lane = Arc::new(Lane {
                    peer: r as u32,
                    stream: s,
                    state: Mutex::new(State { queue: VecDeque::new(), busy: false, helpers: 0, closed: false, failed: None }),
                    cv: Condvar::new(),
                    reader: Mutex::new(Reader { s: reader, fd, scratch: Vec::new(), part: Vec::new(), done: false }),
                    index: i,
                    // Built last (streams in reverse): the first stream holds the others.
                    extra: if i == 0 { made.iter().rev().cloned().collect() } else { Vec::new() },
                    stripe: Mutex::new(Stripe::default()),
                    fences: fences.clone(),
                });
                let (l, shr, g) = (lane.clone(), sh.clone(), gate.clone());
                lanes.threads.push(
                    std::thread::Builder::new()
                        .name(format!("sf-lane-rx-{me}-{r}-{i}"))
                        .spawn(move || read_loop(&shr, &l, &g))
                        .map_err(|e| Error::io("spawn TCP lane reader", e))?,
                );
                let (l, shr) = (lane.clone(), sh.clone());
                lanes.threads.push(
                    std::thread::Builder::new()
                        .name(format!("sf-lane-tx-{me}-{r}-{i}"))
                        .spawn(move || write_loop(&shr, &l))
                        .map_err(|e| Error::io("spawn TCP lane writer", e))?,
                );
                sh.lane_fds.lock().unwrap()[r].push(std::os::fd::AsRawFd::as_raw_fd(&lane.stream));
                made.push(lane);
            }
            lanes.lanes[r] = made.pop();
        }
        Ok(lanes)
    }

    /// Sends writes to `peer` over its lane (if it has one).
    pub fn use_for(&mut self, peer: usize, on: bool) {
        self.send_on[peer] = on && self.lanes[peer].is_some();
        if self.active() {
            self.helper.get_or_insert_with(crate::wait::HelperThread::register);
        }
    }

    pub fn has(&self, peer: u32) -> bool {
        self.send_on.get(peer as usize).copied().unwrap_or(false)
    }

    /// Any lane at all (for reporting).
    pub fn active(&self) -> bool {
        self.send_on.iter().any(|&b| b)
    }

    /// The lanes' sockets, for a caller that polls them itself.
    pub fn fds(&self) -> Vec<std::os::fd::RawFd> {
        self.lanes.iter().flatten().map(|l| std::os::fd::AsRawFd::as_raw_fd(&l.stream)).collect()
    }

    fn lane(&self, peer: u32) -> &Arc<Lane> {
        self.lanes[peer as usize].as_ref().expect("checked by has()")
    }

    /// Writes `n` bytes from `src` into `peer`'s region `key` at `offset`, then raises the note
    /// there. `None` when already sent (`src` reusable), else the request to wait for.
    ///
    /// # Safety
    /// `src..src+n` must stay readable until the request completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_write(&self, peer: u32, src: *const u8, n: usize, key: u64, offset: u64, note: u64, index: u64, value: u32) -> Result<Option<Request>> {
        let frame = Frame { kind: KIND_WRITE, value, key, offset, len: n as u64, note, index };
        let lane = self.lane(peer);
        if note == super::NOTE_NONE && n >= STRIPE_MIN && !lane.extra.is_empty() {
            // Striped: queued on the next stream in turn (see [`Stripe`]).
            let mut sp = lane.stripe.lock().unwrap();
            let k = sp.next;
            sp.next = (k + 1) % (lane.extra.len() + 1);
            if k > 0 {
                sp.dirty = true;
            }
            let to = if k == 0 { lane } else { &lane.extra[k - 1] };
            return unsafe { self.send_on(to, frame, src, true) };
        }
        unsafe { self.send(peer, frame, src) }
    }

    /// Raises `peer`'s notification `slot` to `value`, after every earlier frame to it.
    pub fn notify(&self, peer: u32, slot: u32, value: u32) -> Result<Option<Request>> {
        let frame = Frame { kind: KIND_NOTIFY, value, index: slot as u64, ..Frame::default() };
        unsafe { self.send(peer, frame, std::ptr::null()) }
    }

    /// Sends `frame` on the first stream to `peer`, after a fence if striped writes went
    /// before it (see [`Stripe`]).
    unsafe fn send(&self, peer: u32, frame: Frame, src: *const u8) -> Result<Option<Request>> {
        let lane = self.lane(peer);
        if lane.extra.is_empty() {
            return unsafe { self.send_on(lane, frame, src, false) };
        }
        let mut sp = lane.stripe.lock().unwrap();
        if sp.dirty {
            sp.fence += 1;
            let fence = Frame { kind: KIND_FENCE, index: sp.fence, ..Frame::default() };
            for x in lane.extra.iter().chain([lane]) {
                unsafe { self.send_on(x, fence, std::ptr::null(), false) }?;
            }
            sp.dirty = false;
        }
        let r = unsafe { self.send_on(lane, frame, src, false) };
        drop(sp);
        r
    }

    /// Sends `frame` on one stream: written here when the stream is idle and the frame
    /// small (unless `queue`); a large one on an idle stream as far as the socket takes it
    /// now, the rest queued; else queued for its writer thread (or a waiter, see [`help`]).
    unsafe fn send_on(&self, lane: &Arc<Lane>, frame: Frame, src: *const u8, queue: bool) -> Result<Option<Request>> {
        let peer = lane.peer;
        let n = frame.len as usize;
        let mut st = lane.state.lock().unwrap();
        if let Some(why) = &st.failed {
            return Err(Error::PeerLost { rank: peer, pid: 0, detail: why.clone() });
        }
        let inline = !queue && st.queue.is_empty() && !st.busy && n + FRAME_LEN <= INLINE_MAX;
        if n >= BULK_FRAME && !(inline && keep_lease()) {
            self.gate.end_lease();
        }
        if inline {
            // Idle lane, small frame: written from here, in order behind everything sent. A
            // bulk frame keeps the readers' lease unless the socket cannot take it at once.
            let data = if n > 0 { unsafe { std::slice::from_raw_parts(src, n) } } else { &[][..] };
            let on_block = || {
                if n >= BULK_FRAME {
                    self.gate.end_lease()
                }
            };
            if let Err(e) = write_frame_or(&lane.stream, &frame, data, &on_block) {
                let why = format!("TCP lane to rank {peer} failed: {e}");
                st.failed = Some(why.clone());
                return Err(Error::PeerLost { rank: peer, pid: 0, detail: why });
            }
            return Ok(None);
        }
        let mut sent = 0;
        if !queue && st.queue.is_empty() && !st.busy {
            // Idle lane, large frame: what the socket takes now goes from here; the writer
            // thread (or a waiter, see [`help`]) sends the rest.
            let data = unsafe { std::slice::from_raw_parts(src, n) };
            match send_now(&lane.stream, &frame, data) {
                Ok(k) if k == FRAME_LEN + n => return Ok(None),
                Ok(k) => sent = k,
                Err(e) => {
                    let why = format!("TCP lane to rank {peer} failed: {e}");
                    st.failed = Some(why.clone());
                    return Err(Error::PeerLost { rank: peer, pid: 0, detail: why });
                }
            }
        }
        let pending = Arc::new(Pending { inflight: None, done: Default::default(), status: Default::default(), waiters: Default::default(), notify: None });
        // The writer thread sleeps with jobs queued only while the lane is busy or a caller
        // helps, and whoever ends that wakes it: only the first job needs to.
        let first = st.queue.is_empty();
        st.queue.push_back(Job { frame, src: src as usize, sent, pending: pending.clone() });
        drop(st);
        if first {
            lane.cv.notify_all();
        }
        Ok(Some(Request { pending, peer, what: "TCP lane write".into(), lane: Some(lane.clone()) }))
    }

    /// Runs whatever has arrived on the lanes, from a caller that waits (see [`drain`]).
    pub fn poll(&self, sh: &Shared) -> u32 {
        let mut k = 0;
        for lane in self.lanes.iter().flatten() {
            if let Ok(mut rd) = lane.reader.try_lock() {
                k += drain(sh, lane, &mut rd);
            }
        }
        k
    }

    /// What waiting callers tell when they read the lanes themselves.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Stops every lane: sockets shut down, threads joined.
    pub fn close(&mut self) {
        self.sh.lane_fds.lock().unwrap().iter_mut().for_each(|f| f.clear());
        *self.gate.closed.lock().unwrap() = true;
        self.gate.cv.notify_all();
        for lane in self.lanes.iter().flatten().flat_map(|l| l.extra.iter().chain([l])) {
            lane.state.lock().unwrap().closed = true;
            lane.cv.notify_all();
            let _ = lane.stream.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.close();
    }
}

/// Whether a bulk frame the caller writes keeps the readers' lease when the socket takes it
/// at once (`SCALEFREE_BULK_KEEP_LEASE=0`: every bulk frame calls the readers back, as
/// before). The caller then reads the peer's answer itself in its next wait instead of a
/// reader thread woken for it: 2 simulated hosts × 1 MiB, 0.56–0.83 ms against 0.79–3.2 ms
/// (A/B in the git history of `docs/benchmarks.md`).
fn keep_lease() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::config::env_switch("SCALEFREE_BULK_KEEP_LEASE"))
}

/// Sends what the socket takes now of header and data from byte `sent` of the frame on,
/// without blocking; returns how far the frame has gone.
fn send_now_from(s: &TcpStream, frame: &Frame, data: &[u8], mut sent: usize) -> std::io::Result<usize> {
    let hdr = frame.bytes();
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    let total = FRAME_LEN + data.len();
    while sent < total {
        let (a, b): (&[u8], &[u8]) = if sent < FRAME_LEN { (&hdr[sent..], data) } else { (&data[sent - FRAME_LEN..], &[]) };
        let mut iov = [libc::iovec { iov_base: a.as_ptr() as *mut libc::c_void, iov_len: a.len() },
                       libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }];
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = if b.is_empty() { 1 } else { 2 };
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r > 0 {
            sent += r as usize;
            continue;
        }
        if r == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => break,
            _ => return Err(e),
        }
    }
    Ok(sent)
}

/// What the socket takes now of a frame (see [`send_now_from`]).
fn send_now(s: &TcpStream, frame: &Frame, data: &[u8]) -> std::io::Result<usize> {
    send_now_from(s, frame, data, 0)
}

/// The rest of a frame from byte `sent` on, blocking.
fn write_rest(s: &TcpStream, frame: &Frame, data: &[u8], sent: usize) -> std::io::Result<()> {
    let hdr = frame.bytes();
    if sent < FRAME_LEN {
        write_all_vectored(s, &hdr[sent..], data)
    } else {
        write_all_vectored(s, &data[sent - FRAME_LEN..], &[])
    }
}

/// [`write_frame`], trying without blocking first: if the socket cannot take it all at once,
/// `on_block` runs before the rest is written blocking.
fn write_frame_or(s: &TcpStream, frame: &Frame, data: &[u8], on_block: &dyn Fn()) -> std::io::Result<()> {
    let sent = send_now(s, frame, data)?;
    if sent == FRAME_LEN + data.len() {
        return Ok(());
    }
    on_block();
    write_rest(s, frame, data, sent)
}

/// Header and data in as few system calls as the socket allows (one `writev` when it has room).
#[cfg(test)]
fn write_frame(s: &TcpStream, frame: &Frame, data: &[u8]) -> std::io::Result<()> {
    let hdr = frame.bytes();
    write_all_vectored(s, &hdr, data)
}

fn write_all_vectored(mut s: &TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let mut bufs = [std::io::IoSlice::new(a), std::io::IoSlice::new(b)];
    let mut bufs = &mut bufs[..];
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(k) => std::io::IoSlice::advance_slices(&mut bufs, k),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn job_data(job: &Job) -> &[u8] {
    let n = job.frame.len as usize;
    if n > 0 { unsafe { std::slice::from_raw_parts(job.src as *const u8, n) } } else { &[][..] }
}

/// Sends the rest of a queued job (what the caller did not send at once), blocking.
fn send_job(s: &TcpStream, job: &Job) -> std::io::Result<()> {
    write_rest(s, &job.frame, job_data(job), job.sent)
}

/// Sends the rest of a queued job as long as the socket keeps taking bytes: false (with
/// `job.sent` advanced) when it took nothing for `patience` (a peer that stopped reading:
/// the waiter goes back to its timed wait, the writer thread carries on).
fn send_job_within(s: &TcpStream, job: &mut Job, patience: Duration) -> std::io::Result<bool> {
    let total = FRAME_LEN + job.frame.len as usize;
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    let ms = patience.as_millis().clamp(1, i32::MAX as u128) as i32;
    loop {
        job.sent = send_now_from(s, &job.frame, job_data(job), job.sent)?;
        if job.sent == total {
            return Ok(true);
        }
        let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r == 0 {
            return Ok(false);
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(std::io::Error::last_os_error());
        }
    }
}

/// Completes a job that was sent (or failed: then every queued job fails and the peer is
/// marked lost). `st` is the lane's state, locked again after the send; `busy` is cleared.
/// False when the lane failed.
fn finish_job(sh: &Shared, lane: &Lane, mut st: std::sync::MutexGuard<'_, State>, job: Job, r: std::io::Result<()>) -> bool {
    st.busy = false;
    let mut lost = None;
    match r {
        Ok(()) => finish_pending(&job.pending, UCS_OK),
        Err(e) => {
            let why = format!("TCP lane to rank {} failed: {e}", lane.peer);
            finish_pending(&job.pending, UCS_ERR_CONNECTION_RESET);
            for j in st.queue.drain(..) {
                finish_pending(&j.pending, UCS_ERR_CONNECTION_RESET);
            }
            st.failed = Some(why.clone());
            lost = (!st.closed).then_some(why);
        }
    }
    let ok = st.failed.is_none();
    let wake = !st.queue.is_empty() || !ok || st.helpers > 0;
    drop(st);
    if wake {
        // The writer thread or a helper may wait for the lane to be free (a helper waits
        // for the job it needs, perhaps this one).
        lane.cv.notify_all();
    }
    if let Some(why) = lost {
        sh.mark_lost(lane.peer as usize, why);
    }
    ok
}

/// A caller waiting for a queued write (`pending`) on `lane` sends the lane's queue itself,
/// in order, up to and including that write; while the writer thread is sending a job it
/// waits for that one. After `patience` without progress (the writer thread still busy, or
/// the socket taking nothing) it leaves the rest to the writer thread and waits as usual,
/// with its timeout and the peer checks. Meanwhile the writer thread takes no new job. Between simulated
/// hosts on 2 cores, handing every large write to the writer thread and parking until it
/// was sent cost 1.2-1.3x a plain socket's time for 8 posted 1 MiB writes, against about
/// nothing this way (`docs/benchmarks/collectives.md`, "Posted one-sided writes").
pub(super) fn help(sh: &Shared, lane: &Lane, pending: &Pending, patience: Duration) {
    let mut st = lane.state.lock().unwrap();
    st.helpers += 1;
    let mut waited = Duration::ZERO;
    while pending.done.load(Ordering::Acquire) == 0 && !st.closed && st.failed.is_none() {
        if st.busy {
            if waited >= patience {
                break;
            }
            let t = std::time::Instant::now();
            st = lane.cv.wait_timeout(st, patience - waited).unwrap().0;
            waited += t.elapsed();
            continue;
        }
        let Some(mut job) = st.queue.pop_front() else { break };
        st.busy = true;
        drop(st);
        let r = send_job_within(&lane.stream, &mut job, patience);
        if let Ok(false) = r {
            // Stalled: back to the head of the queue, for the writer thread.
            st = lane.state.lock().unwrap();
            st.busy = false;
            st.queue.push_front(job);
            break;
        }
        let ok = finish_job(sh, lane, lane.state.lock().unwrap(), job, r.map(|_| ()));
        st = lane.state.lock().unwrap();
        if !ok {
            break;
        }
    }
    st.helpers -= 1;
    let wake = st.helpers == 0 && !st.queue.is_empty();
    drop(st);
    if wake {
        lane.cv.notify_all();
    }
}

fn write_loop(sh: &Shared, lane: &Lane) {
    loop {
        let job = {
            let mut st = lane.state.lock().unwrap();
            loop {
                if st.closed {
                    for j in st.queue.drain(..) {
                        finish_pending(&j.pending, UCS_ERR_CONNECTION_RESET);
                    }
                    return;
                }
                if st.failed.is_some() {
                    return;
                }
                if !st.busy && st.helpers == 0 {
                    if let Some(j) = st.queue.pop_front() {
                        st.busy = true;
                        break j;
                    }
                }
                st = lane.cv.wait(st).unwrap();
            }
        };
        let r = send_job(&lane.stream, &job);
        if !finish_job(sh, lane, lane.state.lock().unwrap(), job, r) {
            return;
        }
    }
}

/// What a socket has to read now.
enum Avail {
    Data(usize),
    Nothing,
    Closed,
}

/// Starts reading a frame header without blocking: what arrived of it goes to `hdr`
/// (`Data(k)`: `k` bytes, the rest to be read blocking).
fn available(fd: std::os::fd::RawFd, hdr: &mut [u8; FRAME_LEN]) -> Avail {
    let r = unsafe { libc::recv(fd, hdr.as_mut_ptr() as *mut libc::c_void, FRAME_LEN, libc::MSG_DONTWAIT) };
    match r {
        0 => Avail::Closed,
        r if r > 0 => Avail::Data(r as usize),
        _ => match std::io::Error::last_os_error().kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Avail::Nothing,
            // Let the read report it.
            _ => Avail::Data(0),
        },
    }
}

/// Handles every frame that has started to arrive (each read whole, blocking for its rest);
/// returns how many. Whoever holds the reader runs it: the lane's thread, woken by `poll`,
/// or a caller waiting for a notification (no thread wake-up on the way).
fn drain(sh: &Shared, lane: &Lane, rd: &mut Reader) -> u32 {
    let mut k = 0;
    let mut hdr = [0u8; FRAME_LEN];
    while !rd.done {
        match available(rd.fd, &mut hdr) {
            Avail::Nothing => break,
            // Closed between frames: the peer is done with us (its process exited or dropped
            // its device). Not an error here: if it died while we still need it, UCX
            // (endpoint error, heartbeats) or the process watch says so, as without lanes.
            Avail::Closed => rd.done = true,
            Avail::Data(got) => match read_frame(sh, lane, rd, &mut hdr, got) {
                Ok(()) => k += 1,
                Err(why) => {
                    rd.done = true;
                    if !lane.state.lock().unwrap().closed && !sh.stop.load(Ordering::SeqCst) {
                        sh.mark_lost(lane.peer as usize, why);
                    }
                }
            },
        }
    }
    if rd.done && lane.index > 0 {
        // A fence waiter on the first stream must not wait for this one any more.
        lane.fences.seen.lock().unwrap()[lane.index] = u64::MAX;
        lane.fences.cv.notify_all();
    }
    k
}

/// Handles one frame whose first `got` header bytes are in `hdr` already.
fn read_frame(sh: &Shared, lane: &Lane, rd: &mut Reader, hdr: &mut [u8; FRAME_LEN], got: usize) -> std::result::Result<(), String> {
    let peer = lane.peer as usize;
    rd.s.read_exact(&mut hdr[got..]).map_err(|e| format!("its TCP lane broke: {e}"))?;
    let f = Frame::parse(hdr);
    if let Some(t) = sh.last_heard.get(peer) {
        t.store(sh.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    match f.kind {
        KIND_WRITE => {
            let n = f.len as usize;
            let target = sh.region_target(f.key, f.offset as usize, n);
            let direct = target.and_then(|_| sh.direct_target(f.key, f.offset as usize, n));
            if let (Some((_, raddr, rlen)), Some((to, delta, reduce))) = (target, direct) {
                // Direct landing: into the caller's memory, then the flag, then the note.
                let r = match &reduce {
                    None => rd.s.read_exact(unsafe { std::slice::from_raw_parts_mut(to as *mut u8, n) }),
                    Some(f) => read_reducing(rd, to, n, f),
                };
                sh.direct_busy.fetch_sub(1, Ordering::SeqCst);
                r.map_err(|e| format!("its TCP lane broke mid-write: {e}"))?;
                if reduce.is_some() { &sh.reduced_bytes } else { &sh.direct_bytes }.fetch_add(n as u64, Ordering::Relaxed);
                let flag = (f.index as usize).checked_add(delta).filter(|&o| o + 4 <= rlen && o % 4 == 0);
                if let (NOTE_WORD, Some(o)) = (f.note, flag) {
                    unsafe { &*((raddr + o) as *const std::sync::atomic::AtomicU32) }.store(f.value, Ordering::Release);
                }
                sh.raise(raddr, rlen, f.note, f.index, f.value);
                return Ok(());
            }
            match target {
                Some((dst, _, _)) => rd.s.read_exact(unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) }),
                None => {
                    // A write to a region that is gone or out of bounds: dropped, as over UCX.
                    rd.scratch.resize(n.min(1 << 20), 0);
                    let mut left = n;
                    let mut r = Ok(());
                    while left > 0 && r.is_ok() {
                        let k = left.min(rd.scratch.len());
                        r = rd.s.read_exact(&mut rd.scratch[..k]);
                        left -= k;
                    }
                    r
                }
            }
            .map_err(|e| format!("its TCP lane broke mid-write: {e}"))?;
            if let Some((_, raddr, rlen)) = target {
                sh.raise(raddr, rlen, f.note, f.index, f.value);
            }
            Ok(())
        }
        KIND_NOTIFY => {
            sh.publish(f.index as u32, f.value);
            Ok(())
        }
        KIND_FENCE if lane.index > 0 => {
            let mut seen = lane.fences.seen.lock().unwrap();
            seen[lane.index] = seen[lane.index].max(f.index);
            lane.fences.cv.notify_all();
            Ok(())
        }
        KIND_FENCE => {
            // The first stream: on only once every extra stream has read this fence (their
            // reader threads read them; they never wait for this one).
            let mut seen = lane.fences.seen.lock().unwrap();
            while seen[1..].iter().any(|&s| s < f.index) {
                seen = lane.fences.cv.wait_timeout(seen, Duration::from_millis(100)).unwrap().0;
                if sh.stop.load(Ordering::SeqCst) || lane.state.lock().unwrap().closed {
                    return Err("its TCP lane closed at a fence".into());
                }
            }
            if seen[1..].contains(&u64::MAX) {
                return Err("one of its TCP lane's streams broke before a fence".into());
            }
            Ok(())
        }
        k => Err(format!("its TCP lane sent an unknown frame kind {k}")),
    }
}

/// Bytes a reducing window reads off the lane at a time: small enough to stay in the core's
/// cache between the kernel's copy and the reduction.
const REDUCE_PART: usize = 64 << 10;

/// Reads `n` bytes of a write in parts of [`REDUCE_PART`] and reduces each into `dst` at once.
fn read_reducing(rd: &mut Reader, dst: usize, n: usize, f: &super::Reducer) -> std::io::Result<()> {
    if rd.part.is_empty() {
        // u64s: aligned for every element type.
        rd.part = vec![0u64; REDUCE_PART / 8];
    }
    let mut done = 0;
    while done < n {
        let k = (n - done).min(REDUCE_PART);
        let part = unsafe { std::slice::from_raw_parts_mut(rd.part.as_mut_ptr() as *mut u8, k) };
        rd.s.read_exact(part)?;
        f((dst + done) as *mut u8, part.as_ptr(), k);
        done += k;
    }
    Ok(())
}

/// The lane's reader thread: sleeps in `poll` until data arrives, then drains — unless a
/// caller is spinning in a wait, which reads it itself (the thread stands down meanwhile).
fn read_loop(sh: &Shared, lane: &Lane, gate: &Gate) {
    let fd = lane.reader.lock().unwrap().fd;
    // Extra streams (striped writes and fences) are read by their thread alone: callers
    // read the first stream only.
    let gated = lane.index == 0;
    loop {
        let open = !gated || gate.stand_down();
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
        if gated && open && gate.callers_reading() {
            // Arrived while a caller spins (or reads its own arrivals): it is reading it.
            continue;
        }
        let mut rd = lane.reader.lock().unwrap();
        drain(sh, lane, &mut rd);
        if rd.done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A write of more than 4 GiB at an offset past 2^32 is one frame: its 64-bit length and
    /// offset survive the header, and the writer sends exactly that many bytes (Linux moves at
    /// most 2 GiB − 4 KiB per `writev`, so it takes several calls). The data is an untouched
    /// anonymous mapping (the zero page, no memory) with 4 marked bytes; the reader keeps
    /// 1 MiB at a time.
    #[test]
    fn a_frame_of_more_than_4_gib_goes_whole() {
        let n: usize = (1 << 32) + (3 << 20) + 5;
        let map = unsafe {
            libc::mmap(std::ptr::null_mut(), n, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        let data = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, n) };
        let marks = [(0usize, 1u8), ((1 << 31) - 1, 2), ((1 << 32) - 1, 3), (1 << 32, 4), (n - 1, 5)];
        for &(at, v) in &marks {
            data[at] = v;
        }
        let frame = Frame { kind: KIND_WRITE, value: 0xdead_beef, key: 7, offset: (5 << 32) + 64, len: n as u64, note: super::super::NOTE_POST | (3 << 32), index: (1 << 33) + 8 };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::scope(|sc| {
            let data = &*data;
            sc.spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                write_frame(&s, &frame, data).unwrap();
            });
            let (mut r, _) = l.accept().unwrap();
            let mut hdr = [0u8; FRAME_LEN];
            r.read_exact(&mut hdr).unwrap();
            let f = Frame::parse(&hdr);
            assert_eq!((f.kind, f.value, f.key, f.offset, f.len, f.note, f.index),
                       (frame.kind, frame.value, frame.key, frame.offset, n as u64, frame.note, frame.index));
            let mut part = vec![0u8; 1 << 20];
            let (mut got, mut seen) = (0usize, Vec::new());
            while got < f.len as usize {
                let k = (f.len as usize - got).min(part.len());
                r.read_exact(&mut part[..k]).unwrap();
                seen.extend(marks.iter().filter(|&&(at, _)| at >= got && at < got + k).map(|&(at, _)| (at, part[at - got])));
                got += k;
            }
            assert_eq!(seen, marks.to_vec());
            assert_eq!(r.read(&mut part[..1]).unwrap(), 0, "nothing after the frame");
        });
        unsafe { libc::munmap(map, n) };
    }

    /// A frame larger than the socket takes at once: `send_now` sends part of it without
    /// blocking (the header may be cut too), `send_job_within` stops when the socket takes
    /// nothing more, `send_job` sends exactly the rest, and a frame after it arrives after
    /// it, byte for byte.
    #[test]
    fn a_frame_sent_partly_at_once_then_queued_arrives_whole_and_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut r, _) = l.accept().unwrap();
        let small: libc::c_int = 16 << 10;
        unsafe {
            libc::setsockopt(std::os::fd::AsRawFd::as_raw_fd(&s), libc::SOL_SOCKET, libc::SO_SNDBUF,
                             &small as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t);
        }
        let n = 8 << 20;
        let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let frame = Frame { kind: KIND_WRITE, value: 9, key: 3, offset: 1 << 33, len: n as u64, note: 0, index: 5 };
        let sent = send_now(&s, &frame, &data).unwrap();
        assert!(sent > 0 && sent < FRAME_LEN + n, "the socket took {sent} bytes at once");
        let pending = Arc::new(Pending { inflight: None, done: Default::default(), status: Default::default(), waiters: Default::default(), notify: None });
        let mut job = Job { frame, src: data.as_ptr() as usize, sent, pending };
        // Nobody reads yet: a waiter sending the rest gives up after its patience, with what
        // went kept in the job.
        let t0 = Instant::now();
        assert!(!send_job_within(&s, &mut job, Duration::from_millis(20)).unwrap());
        assert!(t0.elapsed() >= Duration::from_millis(20) && job.sent >= sent && job.sent < FRAME_LEN + n);
        let lane_stream = s.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut hdr = [0u8; FRAME_LEN];
            r.read_exact(&mut hdr).unwrap();
            let f = Frame::parse(&hdr);
            let mut got = vec![0u8; f.len as usize];
            r.read_exact(&mut got).unwrap();
            let mut hdr2 = [0u8; FRAME_LEN];
            r.read_exact(&mut hdr2).unwrap();
            (f.key, f.offset, f.index, got, Frame::parse(&hdr2).kind)
        });
        // The rest, as the writer thread or a waiter sends it, then a notification.
        send_job(&lane_stream, &job).unwrap();
        write_all_vectored(&lane_stream, &Frame { kind: KIND_NOTIFY, index: 1, value: 2, ..Frame::default() }.bytes(), &[]).unwrap();
        let (key, offset, index, got, next) = reader.join().unwrap();
        assert_eq!((key, offset, index), (3, 1 << 33, 5));
        assert!(got == data, "the data arrived changed");
        assert_eq!(next, KIND_NOTIFY);
    }

    /// An acceptor on a port of its own admitting ranks above 0 with `key`; returns its port
    /// and what it admitted.
    fn acceptor(key: Key, within: Duration) -> (u16, std::thread::JoinHandle<Option<u32>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            accept_handshake(&mut s, &key, 0, &|r| r == 1, Instant::now() + within)
        });
        (port, h)
    }

    #[test]
    fn lanes_admit_only_ranks_that_know_the_job_key() {
        let key = lane_key("tok", "job");
        let (port, h) = acceptor(key.clone(), Duration::from_secs(20));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        dial_handshake(&mut s, &key, 1, 0).unwrap();
        assert_eq!(h.join().unwrap(), Some(1));
        // Another job's key, or another token: neither side accepts the other.
        for other in [lane_key("tok", "job2"), lane_key("tok2", "job"), lane_key("", "job")] {
            let (port, h) = acceptor(key.clone(), Duration::from_secs(20));
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert!(dial_handshake(&mut s, &other, 1, 0).is_err());
            drop(s);
            assert_eq!(h.join().unwrap(), None);
        }
        // The old FNV hello (16 bytes), then nothing: refused once the deadline passes.
        let (port, h) = acceptor(key.clone(), Duration::from_millis(500));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&[0u8; 16]).unwrap();
        let t0 = Instant::now();
        assert_eq!(h.join().unwrap(), None);
        assert!(t0.elapsed() < Duration::from_secs(30));
        drop(s);
    }

    #[test]
    fn a_pair_agrees_on_the_smaller_stream_count() {
        let addr: SocketAddr = "10.0.0.2:4711".parse().unwrap();
        let o = Offer { addr, streams: 4 };
        assert_eq!(Offer::parse(o.encode().as_bytes()), Some(o));
        assert_eq!(Offer::parse(b"[::1]:9 8"), Some(Offer { addr: "[::1]:9".parse().unwrap(), streams: 8 }));
        // No lane offered, or not an offer: no lane to that rank.
        for bad in [&b""[..], b"10.0.0.2:4711", b"10.0.0.2:4711 0", b"10.0.0.2:4711 9", b"10.0.0.2:4711 4 4", b"x 4", b"\xff"] {
            assert_eq!(Offer::parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        for (a, b, k) in [(1, 1, 1), (1, 4, 1), (4, 1, 1), (4, 8, 4), (8, 8, 8), (3, 5, 3)] {
            assert_eq!(Offer::agree(a, b), k);
            assert_eq!(Offer::agree(b, a), k);
        }
    }

    #[test]
    fn a_lane_handshake_does_not_carry_the_token() {
        const TOKEN: &str = "0123456789abcdef0123456789abcdef";
        let key = lane_key(TOKEN, "job");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let k2 = key.clone();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let r = accept_handshake(&mut s, &k2, 0, &|r| r == 1, Instant::now() + Duration::from_secs(5));
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            (r, rest)
        });
        // Everything the dialler sends, recorded on its way.
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        struct Tap<'a>(&'a mut TcpStream, Vec<u8>);
        let mut tap = Tap(&mut s, Vec::new());
        let mine = crate::auth::nonce().unwrap();
        let mut hello = [0u8; LANE_HELLO_LEN];
        hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello[4..8].copy_from_slice(&1u32.to_le_bytes());
        hello[8..].copy_from_slice(&mine);
        tap.0.write_all(&hello).unwrap();
        tap.1.extend_from_slice(&hello);
        let mut ch = [0u8; LANE_CHALLENGE_LEN];
        tap.0.read_exact(&mut ch).unwrap();
        let tag = crate::auth::answer(&key, &lane_context(1, 0), &mine, &ch).unwrap();
        tap.0.write_all(&tag).unwrap();
        tap.1.extend_from_slice(&tag);
        let sent = tap.1;
        drop(s);
        let (r, _) = h.join().unwrap();
        assert_eq!(r, Some(1));
        for bytes in [&sent[..], &ch[..]] {
            assert!(!bytes.windows(16).any(|w| w == &TOKEN.as_bytes()[..16]));
        }
        // And dial_handshake sends exactly a hello and a tag: 40 + 32 bytes.
        assert_eq!(sent.len(), LANE_HELLO_LEN + crate::auth::TAG_LEN);
    }
}
