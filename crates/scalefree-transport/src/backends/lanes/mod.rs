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
//!
//! One concern per file: `framing.rs` (the frame header, sending a frame), `handshake.rs`
//! (listening, proving a connection belongs to the job, connecting every pair),
//! `striping.rs` (streams per pair, fences), `writer.rs` (the queue, the writer thread, a
//! waiter sending the queue itself), `reader.rs` (reading frames, the reader thread),
//! `gate.rs` (reader threads standing down while callers read), `landing.rs` (direct
//! landing). The lanes see the backend whose writes they carry only through [`Arrivals`].

mod framing;
mod gate;
mod handshake;
mod landing;
mod reader;
mod sealing;
mod striping;
mod writer;

pub(crate) use gate::Gate;
pub(crate) use handshake::{lane_key, Listener};
pub(crate) use landing::Landing;
pub(crate) use striping::Offer;

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use framing::{send_now, write_frame_or, Frame, FRAME_LEN, KIND_BEAT, KIND_BYE, KIND_FENCE, KIND_NOTIFY, KIND_READ, KIND_WRITE};
use reader::{drain, read_loop, Reader};
use sealing::{wire_len, Sealer};
use striping::{Fences, Stripe, STRIPE_MIN};
use writer::{help, write_loop, State, Job};
use crate::auth::Key;
use crate::backends::wire::NOTE_NONE;
use crate::backends::{Helper, OpState, Request};
use crate::error::{Error, Result};

/// Frames up to this size are written by the caller when the lane is idle (no hand-off to
/// the writer thread: at 1 MiB allreduce that hand-off cost more than the overlap it buys).
const INLINE_MAX: usize = 1 << 20;
/// Frames from this size on are bulk: sending one ends a reader lease (see [`Gate::end_lease`])
/// unless the caller writes it and the socket takes it at once (see [`keep_lease`]).
const BULK_FRAME: usize = 64 << 10;

/// What the lanes need of the backend they carry writes for (the UCX backend's shared
/// state): where an arriving write lands, what its note raises, and who hears of a lost peer.
pub(crate) trait Arrivals: Send + Sync {
    /// This rank.
    fn rank(&self) -> u32;
    /// Where `len` bytes at `offset` of this rank's region `key` go: (address, region
    /// address, region length); `None` when the region is gone or too short.
    fn target(&self, key: u64, offset: usize, len: usize) -> Option<(usize, usize, usize)>;
    /// Raises a write's note (`(note, index, value)` as on the wire, see
    /// [`crate::backends::wire`]) once its bytes are in the region at `region_addr`.
    fn raise(&self, region_addr: usize, region_len: usize, note: u64, index: u64, value: u32);
    /// Raises this rank's notification `slot` to `value`.
    fn publish(&self, slot: u32, value: u32);
    /// Something arrived from `peer` (it is alive).
    fn heard_from(&self, peer: u32);
    /// `peer` is lost, for `why`.
    fn lost(&self, peer: u32, why: String);
    /// The backend is closing (readers stop waiting for fences).
    fn stopping(&self) -> bool;
    /// `fd` is a socket of `peer`'s lane: shut it down when the peer is lost.
    fn lane_opened(&self, peer: u32, fd: std::os::fd::RawFd);
    /// Every lane socket is closing: none is to be shut down any more.
    fn lanes_closed(&self);
}

/// What a rank's lanes share with their threads: the backend they carry writes for and the
/// direct-landing windows.
pub(crate) struct Link {
    pub(crate) to: Arc<dyn Arrivals>,
    pub(crate) landing: Landing,
    /// Reads this rank asked for over a lane and not yet answered, by number.
    pub(crate) reads: Mutex<std::collections::HashMap<u64, PendingRead>>,
    pub(crate) next_read: AtomicU64,
}

/// A read waiting for its answer: where the bytes go and how many, and its completion.
pub(crate) struct PendingRead {
    pub(crate) dst: usize,
    pub(crate) n: usize,
    pub(crate) op: Arc<OpState>,
}

pub(crate) struct Lane {
    link: Arc<Link>,
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
    /// The sending half of a sealed stream (`SCALEFREE_ENCRYPT=1`), locked by whoever sends
    /// a frame (one at a time anyway, see [`State::busy`]).
    seal: Option<Mutex<Sealer>>,
}

/// The lanes of one rank: one per peer on another host that offered one.
pub(crate) struct Lanes {
    sh: Arc<Link>,
    gate: Arc<Gate>,
    lanes: Vec<Option<Arc<Lane>>>,
    /// Which peers writes go to over a lane (the others use UCX even if a lane exists).
    send_on: Vec<bool>,
    threads: Vec<JoinHandle<()>>,
    /// While writes go over lanes, their threads and the kernel's TCP work need the cores a
    /// yielding waiter would keep: the process's waits skip their yield phase (measured on 4
    /// simulated hosts: 1 MiB allreduce 3.7 -> 1.9 ms).
    helper: Option<crate::wait::HelperThread>,
    /// Every frame is sealed (see [`sealing`]).
    sealed: bool,
}

/// The lane setting: `None` off, `Some(true)` forced, `Some(false)` auto.
pub(crate) fn setting() -> Option<bool> {
    match std::env::var("SCALEFREE_TCP_LANES").ok().as_deref().map(str::trim) {
        Some("0") | Some("off") | Some("no") => None,
        Some("1") | Some("on") | Some("yes") => Some(true),
        _ => Some(false),
    }
}

/// A check of the peers' liveness for the waits of the set-up (`Err`: a peer is lost).
pub type Alive = Arc<dyn Fn() -> Result<()> + Send + Sync>;

impl Lanes {
    /// Collective between the ranks in `connect` (true: open a lane to that rank; both sides
    /// must agree): lower ranks are dialled by higher ones. `offers[r]` is rank `r`'s
    /// listening address and stream count; a pair opens as many streams as the smaller of
    /// its two offers. Every lane proves both ends know the job's key (`lane_key`); with
    /// `sealed`, every frame is sealed too, with keys of each stream's own (see [`sealing`]).
    /// `alive` fails when a peer is lost meanwhile: the waits of the set-up check it.
    #[allow(clippy::too_many_arguments)]
    pub fn open(to: Arc<dyn Arrivals>, listener: Listener, offers: &[Option<Offer>], connect: &[bool], key: &Key, sealed: bool, timeout: Duration,
                alive: Alive) -> Result<Lanes> {
        let me = to.rank() as usize;
        let streams = handshake::connect(me, listener, offers, connect, key, sealed, timeout, alive)?;
        let sh = Arc::new(Link { to, landing: Landing::default(), reads: Mutex::default(), next_read: AtomicU64::new(0) });
        let gate = Arc::new(Gate { spinning: AtomicU32::new(0), lease_until: AtomicU64::new(0), epoch: std::time::Instant::now(),
                                   closed: Mutex::new(false), cv: Condvar::new() });
        let mut lanes = Lanes { sh: sh.clone(), gate: gate.clone(), lanes: (0..offers.len()).map(|_| None).collect(), send_on: vec![false; offers.len()], threads: Vec::new(), helper: None, sealed };
        for (r, ss) in streams.into_iter().enumerate() {
            if ss.iter().any(|s| s.is_none()) {
                continue;
            }
            let fences = Arc::new(Fences { seen: Mutex::new(vec![0; ss.len()]), cv: Condvar::new() });
            let mut made: Vec<Arc<Lane>> = Vec::new();
            for (i, s) in ss.into_iter().enumerate().rev() {
                let (s, seal) = s.expect("checked above");
                let (seal, open) = seal.map_or((None, None), |(se, op)| (Some(Mutex::new(se)), Some(op)));
                s.set_nodelay(true).ok();
                let reader = s.try_clone().map_err(|e| Error::io("TCP lane: clone socket", e))?;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&reader);
                let lane = Arc::new(Lane {
                    link: sh.clone(),
                    peer: r as u32,
                    stream: s,
                    state: Mutex::new(State { queue: VecDeque::new(), busy: false, helpers: 0, closed: false, failed: None }),
                    cv: Condvar::new(),
                    reader: Mutex::new(Reader { s: reader, fd, scratch: Vec::new(), part: Vec::new(), done: false, open, bye: false }),
                    index: i,
                    // Built last (streams in reverse): the first stream holds the others.
                    extra: if i == 0 { made.iter().rev().cloned().collect() } else { Vec::new() },
                    stripe: Mutex::new(Stripe::default()),
                    fences: fences.clone(),
                    seal,
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
                sh.to.lane_opened(r as u32, std::os::fd::AsRawFd::as_raw_fd(&lane.stream));
                made.push(lane);
            }
            lanes.lanes[r] = made.pop();
        }
        if sealed {
            // No UCX heartbeats go to peers of sealed lanes: a beat on every idle lane.
            let (all, g) = (lanes.lanes.iter().flatten().cloned().collect::<Vec<_>>(), gate.clone());
            lanes.threads.push(
                std::thread::Builder::new()
                    .name(format!("sf-lane-beat-{me}"))
                    .spawn(move || beat_loop(&all, &g))
                    .map_err(|e| Error::io("spawn TCP lane heartbeat", e))?,
            );
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

    /// Whether the lanes seal their frames (`SCALEFREE_ENCRYPT=1`).
    pub fn sealed(&self) -> bool {
        self.sealed
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
        if note == NOTE_NONE && n >= STRIPE_MIN && !lane.extra.is_empty() {
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

    /// Reads `n` bytes at `offset` of `peer`'s region `key` into `dst` over the lane: the
    /// peer's lane reader answers with the bytes (its writer thread sends them). Used where
    /// nothing may go over UCX (sealed lanes).
    ///
    /// # Safety
    /// `dst..dst+n` must stay writable (and unread) until the request completes.
    pub unsafe fn start_read(&self, peer: u32, key: u64, offset: u64, dst: *mut u8, n: usize) -> Result<Request> {
        let id = self.sh.next_read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let op = Arc::new(OpState::default());
        self.sh.reads.lock().unwrap().insert(id, PendingRead { dst: dst as usize, n, op: op.clone() });
        let frame = Frame { kind: KIND_READ, key, offset, note: n as u64, index: id, ..Frame::default() };
        if let Err(e) = unsafe { self.send(peer, frame, std::ptr::null()) } {
            self.sh.reads.lock().unwrap().remove(&id);
            return Err(e);
        }
        Ok(Request { op, peer, what: "TCP lane read".into(), helper: None })
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
            if let Err(e) = write_frame_or(&lane.stream, lane.seal.as_ref(), &frame, data, &on_block) {
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
            match send_now(&lane.stream, lane.seal.as_ref(), &frame, data) {
                Ok(k) if k == wire_len(n, lane.seal.is_some()) => return Ok(None),
                Ok(k) => sent = k,
                Err(e) => {
                    let why = format!("TCP lane to rank {peer} failed: {e}");
                    st.failed = Some(why.clone());
                    return Err(Error::PeerLost { rank: peer, pid: 0, detail: why });
                }
            }
        }
        let pending = Arc::new(OpState::default());
        // The writer thread sleeps with jobs queued only while the lane is busy or a caller
        // helps, and whoever ends that wakes it: only the first job needs to.
        let first = st.queue.is_empty();
        st.queue.push_back(Job { frame, src: src as usize, sent, pending: pending.clone() });
        drop(st);
        if first {
            lane.cv.notify_all();
        }
        Ok(Some(Request { op: pending, peer, what: "TCP lane write".into(), helper: Some(lane.clone()) }))
    }

    /// Runs whatever has arrived on the lanes, from a caller that waits (see [`drain`]).
    pub fn poll(&self) -> u32 {
        let mut k = 0;
        for lane in self.lanes.iter().flatten() {
            if let Ok(mut rd) = lane.reader.try_lock() {
                k += drain(&self.sh, lane, &mut rd);
            }
        }
        k
    }

    /// What waiting callers tell when they read the lanes themselves.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Stops every lane: sockets shut down (a sealed one after a goodbye), threads joined;
    /// reads still waiting fail.
    pub fn close(&mut self) {
        if self.sealed {
            for lane in self.lanes.iter().flatten().flat_map(|l| l.extra.iter().chain([l])) {
                lane.say_goodbye();
            }
        }
        self.sh.to.lanes_closed();
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
        for (_, p) in self.sh.reads.lock().unwrap().drain() {
            p.op.finish(OpState::BROKEN);
        }
    }

    /// Direct landing (see [`Landing::set`]) of lane writes into region `key`.
    ///
    /// # Safety
    /// As [`Landing::set`].
    pub unsafe fn set_direct(&self, key: u64, windows: &[crate::backends::Window], flag_delta: usize) {
        unsafe { self.sh.landing.set(key, windows, flag_delta) }
    }

    /// Ends direct landing (see [`Landing::clear`]): a reader stuck mid-write after
    /// `timeout` has every lane shut down.
    pub fn clear_direct(&self, timeout: Duration) {
        self.sh.landing.clear(timeout, || {
            for lane in self.lanes.iter().flatten().flat_map(|l| l.extra.iter().chain([l])) {
                let _ = lane.stream.shutdown(Shutdown::Both);
            }
        });
    }

    /// Bytes received by direct landing since the lanes opened: (copied, reduced).
    pub fn landed_bytes(&self) -> (u64, u64) {
        self.sh.landing.landed_bytes()
    }
}

impl Lane {
    /// Sends a goodbye ([`KIND_BYE`]) if the stream is idle and the socket takes it at once
    /// (never blocks: a peer that stopped reading gets none, and takes the close for a loss).
    fn say_goodbye(&self) {
        let st = self.state.lock().unwrap();
        if st.queue.is_empty() && !st.busy && st.failed.is_none() && !st.closed {
            let _ = send_now(&self.stream, self.seal.as_ref(), &Frame { kind: KIND_BYE, ..Frame::default() }, &[]);
        }
    }
}

/// Sealed lanes' heartbeat: every [`beat_every`], a beat ([`KIND_BEAT`]) queued on each idle
/// first stream (one with frames queued or going shows the peer alive anyway), until the
/// lanes close.
fn beat_loop(lanes: &[Arc<Lane>], gate: &Gate) {
    let every = beat_every();
    let mut last = std::time::Instant::now();
    loop {
        {
            // (The gate's lock is not held below: senders take it while holding a lane's.)
            let closed = gate.closed.lock().unwrap();
            let closed = gate.cv.wait_timeout(closed, every.saturating_sub(last.elapsed())).unwrap().0;
            if *closed {
                return;
            }
        }
        if last.elapsed() < every {
            continue;
        }
        last = std::time::Instant::now();
        for lane in lanes {
            let idle = {
                let st = lane.state.lock().unwrap();
                st.queue.is_empty() && !st.busy
            };
            if idle {
                writer::enqueue(lane, Frame { kind: KIND_BEAT, ..Frame::default() }, 0);
            }
        }
    }
}

/// How often sealed lanes beat: a tenth of the peer timeout, 0.1-1 s (as UCX's heartbeats).
fn beat_every() -> Duration {
    (crate::wait::peer_timeout_from_env() / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

impl Helper for Lane {
    fn help(&self, op: &OpState, patience: Duration) {
        help(&self.link, self, op, patience);
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
