//! UCX backend: ranks on different hosts (or any ranks, with `SCALEFREE_TRANSPORT=ucx`).
//!
//! The same pieces as the shared-memory backend:
//! * **memory**: a region is a local memfd mapping registered with `ucp_mem_map`; its packed
//!   remote key travels beside the handle (see [`Net::exchange_rkeys`]);
//! * **copies**: `write` is `ucp_put_nbx`, `read` is `ucp_get_nbx`;
//! * **notifications**: an active message whose handler stores the value in the target's
//!   notification slot and wakes a parked waiter. `notify` after `write` flushes the endpoint
//!   first (remote completion of the put), so the data is in place before the notification
//!   is seen: ordering by flush. `write_notify` sends the data and the notification as one
//!   active message (eager, or rendezvous into the region for large data); the handler
//!   publishes the notification only once the data has landed.
//!
//! Waiting: a caller spins briefly calling `ucp_worker_progress`, then parks on the same
//! futex words as the shared-memory backend. A progress thread sleeps on the worker's event
//! file descriptor (`ucp_worker_arm` + `poll`) and runs the handlers when traffic arrives, so
//! nobody busy-polls the network without bound.

mod backend;
pub mod ffi;
pub(crate) mod lanes;

pub use backend::Ucx;
pub use crate::backends::{Note, Reducer, Window};

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ffi::*;

use crate::error::{Error, Result};
use crate::wait::{self, WaitPolicy};

const AM_NOTIFY: u32 = 0x5346_0001 & 0xffff;
const AM_WRITE: u32 = 0x5346_0002 & 0xffff;
const AM_HEARTBEAT: u32 = 0x5346_0003 & 0xffff;
/// "Rank N is lost": sent by the rank that saw it to every other peer, so that the first
/// failure is what everybody reports (not the exit of a peer that stopped because of it).
const AM_LOST: u32 = 0x5346_0004 & 0xffff;
/// The longest reason an `AM_LOST` carries.
const LOST_WHY_MAX: usize = 240;

/// Header of a write-with-notification active message.
#[repr(C)]
#[derive(Clone, Copy)]
struct WriteHeader {
    key: u64,
    offset: u64,
    /// What to raise once the data is in place: `NOTE_*`, with `index` and `value`.
    note: u64,
    index: u64,
    value: u32,
    _pad: u32,
}

const NOTE_NONE: u64 = 0;
const NOTE_SLOT: u64 = 1;
const NOTE_WORD: u64 = 2;
/// Mesh post: store a 64-bit value (high half in the note's upper 32 bits) at `index`, then
/// ring the region's mesh bell (see [`crate::mesh`]).
const NOTE_POST: u64 = 3;

/// Header of a notification active message.
#[repr(C)]
#[derive(Clone, Copy)]
struct NotifyHeader {
    slot: u32,
    value: u32,
}

/// A region registered with UCX; unregistered on drop.
pub struct Registration {
    shared: Arc<Shared>,
    memh: ucp_mem_h,
    key: u64,
    /// The packed remote key, sent to peers.
    pub rkey: Vec<u8>,
}
unsafe impl Send for Registration {}
unsafe impl Sync for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.regions.lock().unwrap().remove(&self.key);
        unsafe { (self.shared.ucp.mem_unmap)(self.shared.ctx, self.memh) };
    }
}

/// A peer's region as seen from here: its address and the unpacked remote key.
pub struct RemoteKey {
    shared: Arc<Shared>,
    pub peer: u32,
    rkey: ucp_rkey_h,
    pub addr: u64,
}
unsafe impl Send for RemoteKey {}
unsafe impl Sync for RemoteKey {}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        unsafe { (self.shared.ucp.rkey_destroy)(self.rkey) };
    }
}

struct LocalReg {
    addr: usize,
    len: usize,
}

/// Swaps bytes with every rank (all ranks' contributions, by rank).
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// The endpoint error handler's argument: the shared state and the peer.
type ErrArg = (std::sync::Weak<Shared>, u32);

/// State the progress thread, handlers and callers share.
pub(crate) struct Shared {
    ucp: &'static Ucp,
    ctx: ucp_context_h,
    worker: ucp_worker_h,
    me: u32,
    /// An endpoint per rank (this one too: writes to itself go through UCX's `self`).
    eps: std::sync::OnceLock<Vec<ucp_ep_h>>,
    /// The error handler's argument per endpoint; freed with the endpoints.
    #[allow(clippy::vec_box)] // boxed: UCX keeps a pointer to each
    err_args: Mutex<Vec<Box<ErrArg>>>,
    /// Why each peer was lost (set by the endpoint error handler), if it was.
    lost: Vec<Mutex<Option<String>>>,
    any_lost: AtomicBool,
    /// The peer lost first: what every error reports (a peer lost later may have stopped
    /// because of it).
    first_lost: Mutex<Option<u32>>,
    /// Losses seen here and not yet told to the other peers.
    to_announce: Mutex<Vec<u32>>,
    announcing: AtomicBool,
    regions: Mutex<HashMap<u64, LocalReg>>,
    /// This rank's notification slots and their waiter count (in the device's control
    /// segment, which outlives the progress thread).
    slots: *const AtomicU32,
    nslots: usize,
    waiters: *const AtomicU32,
    stop: AtomicBool,
    /// Requests in flight (sends, and rendezvous receives into regions). While any is, the
    /// progress thread sleeps on the event descriptor for at most a millisecond.
    inflight: AtomicU32,
    /// Heartbeats: when each peer was last heard from (ms since `epoch`), which peers are
    /// watched (those on other hosts), and after how long silence means lost.
    epoch: std::time::Instant,
    last_heard: Vec<std::sync::atomic::AtomicU64>,
    watched: Mutex<Vec<bool>>,
    peer_timeout: std::time::Duration,
    /// Each peer's TCP lane sockets, if it has any (shut down when the peer is lost).
    lane_fds: Mutex<Vec<Vec<c_int>>>,
    /// Direct landing (see [`Net::set_direct`]): lane writes into these windows of a region
    /// go straight to the caller's memory.
    direct: Mutex<Option<Direct>>,
    /// Lane readers writing into a direct window right now.
    direct_busy: AtomicU32,
    /// Bytes received by direct landing so far, copied and reduced (for tests and reports).
    direct_bytes: std::sync::atomic::AtomicU64,
    reduced_bytes: std::sync::atomic::AtomicU64,
    /// An eventfd that wakes callers parked in `poll` on the lanes ([`Net::wait_reading`])
    /// when another thread raises a word (a lane reader, a UCX handler), and how many are
    /// parked so.
    kick_fd: c_int,
    pollers: AtomicU32,
    /// [`Net::wait_reading`]'s spin: waits so far, and a credit that spins ending their
    /// wait raise and spins in vain lower.
    waits: AtomicU32,
    spin_credit: AtomicU32,
}
unsafe impl Send for Shared {}

/// The most credit spins that ended their wait can build up.
const SPIN_CREDIT_MAX: u32 = 4;

/// Windows of one region whose lane writes land elsewhere (see [`Net::set_direct`]).
struct Direct {
    key: u64,
    windows: Vec<Window>,
    /// The flag word of a write's note word is this many bytes after it.
    flag_delta: usize,
}
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        let u = self.ucp;
        unsafe {
            for &ep in self.eps.get().map(|v| v.as_slice()).unwrap_or(&[]) {
                if !ep.is_null() {
                    let mut p = ucp_request_param_t::zeroed();
                    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
                    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
                    let r = (u.ep_close_nbx)(ep, &p);
                    if !r.is_null() && !ptr_is_err(r) {
                        while (u.request_check_status)(r) == UCS_INPROGRESS {
                            (u.worker_progress)(self.worker);
                        }
                        (u.request_free)(r);
                    }
                }
            }
            (u.worker_destroy)(self.worker);
            (u.cleanup)(self.ctx);
            libc::close(self.kick_fd);
        }
    }
}

impl Shared {
    fn slot(&self, slot: u32) -> Option<&AtomicU32> {
        ((slot as usize) < self.nslots).then(|| unsafe { &*self.slots.add(slot as usize) })
    }
    /// Raises `slot` to `value` (sequence order: a late, smaller value never lowers it) and
    /// wakes waiters.
    fn publish(&self, slot: u32, value: u32) {
        if let Some(w) = self.slot(slot) {
            raise_word(w, value);
            wait::wake_if_waiting(w, unsafe { &*self.waiters });
            self.kick();
        }
    }
    /// Wakes callers parked in `poll` on the lanes, if any (after a word was raised).
    fn kick(&self) {
        if self.pollers.load(Ordering::SeqCst) > 0 {
            let one = 1u64;
            unsafe { libc::write(self.kick_fd, &one as *const u64 as *const c_void, 8) };
        }
    }
    fn progress(&self) -> u32 {
        let k = unsafe { (self.ucp.worker_progress)(self.worker) };
        if self.announcing.load(Ordering::Relaxed) {
            self.announce_losses();
        }
        k
    }
    /// Tells every peer still here about the losses seen here (outside any UCX callback).
    fn announce_losses(&self) {
        let lost: Vec<u32> = std::mem::take(&mut *self.to_announce.lock().unwrap());
        self.announcing.store(false, Ordering::Relaxed);
        let Some(eps) = self.eps.get() else { return };
        for peer in lost {
            let why = self.lost[peer as usize].lock().unwrap().clone().unwrap_or_default();
            let mut h = Vec::with_capacity(8 + LOST_WHY_MAX);
            h.extend_from_slice(&self.me.to_le_bytes());
            h.extend_from_slice(&peer.to_le_bytes());
            let mut n = why.len().min(LOST_WHY_MAX);
            while !why.is_char_boundary(n) {
                n -= 1;
            }
            h.extend_from_slice(&why.as_bytes()[..n]);
            for (r, &ep) in eps.iter().enumerate() {
                if r as u32 == self.me || r as u32 == peer || ep.is_null() || self.lost[r].lock().unwrap().is_some() {
                    continue;
                }
                let mut p = ucp_request_param_t::zeroed();
                p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
                p.cb = free_cb as *const c_void;
                p.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
                // Completes (and is freed) in its callback, or at once; best effort.
                let _ = unsafe { (self.ucp.am_send_nbx)(ep, AM_LOST, h.as_ptr() as *const c_void, h.len(), std::ptr::null(), 0, &p) };
            }
        }
    }
    /// Where `len` bytes at `offset` of this rank's region `key` go: (address, region
    /// address, region length); `None` when the region is gone or too short.
    fn region_target(&self, key: u64, offset: usize, len: usize) -> Option<(usize, usize, usize)> {
        let regs = self.regions.lock().unwrap();
        regs.get(&key).and_then(|r| {
            let end = offset.checked_add(len)?;
            (end <= r.len).then_some((r.addr + offset, r.addr, r.len))
        })
    }
    /// Where a lane write of `len` bytes at `offset` of region `key` lands instead of the
    /// region, if it falls whole into a direct window: (destination, flag delta, the window's
    /// reducer if it reduces). The caller holds `direct_busy` raised until the bytes are in
    /// (see [`Net::clear_direct`]).
    fn direct_target(&self, key: u64, offset: usize, len: usize) -> Option<(usize, usize, Option<Reducer>)> {
        let d = self.direct.lock().unwrap();
        let d = d.as_ref().filter(|d| d.key == key)?;
        let end = offset.checked_add(len)?;
        let w = d.windows.iter().find(|w| offset >= w.offset && end <= w.offset + w.len)?;
        self.direct_busy.fetch_add(1, Ordering::SeqCst);
        Some((w.dst as usize + (offset - w.offset), d.flag_delta, w.reduce.clone()))
    }
    fn raise(&self, region_addr: usize, region_len: usize, note: u64, index: u64, value: u32) {
        match note {
            NOTE_SLOT => self.publish(index as u32, value),
            n if n & 0xffff_ffff == NOTE_POST && index.checked_add(8).is_some_and(|e| e as usize <= region_len) && index.is_multiple_of(8)
                && region_len >= crate::mesh::MESH_HEADER =>
            {
                let v = post_value(n, value);
                // The data has landed already: only the word and the doorbell are left.
                unsafe { crate::mesh::post_mapped(region_addr as *mut u8, 0, std::ptr::null(), 0, index as usize, v) };
                self.kick();
            }
            NOTE_WORD if index.checked_add(4).is_some_and(|e| e as usize <= region_len) && index.is_multiple_of(4) => {
                let w = unsafe { &*((region_addr + index as usize) as *const AtomicU32) };
                raise_word(w, value);
                wait::wake_all(w);
                self.kick();
            }
            _ => {}
        }
    }
}

/// Raises `w` to `value` in sequence order (a late, smaller value never lowers it).
/// A note on the wire (UCX's [`WriteHeader`] and a lane's frame): `(note, index, value)`. A
/// post's 64-bit value travels as its high half in the note's upper 32 bits and its low half
/// in `value` (see [`post_value`]).
fn note_parts(note: Note) -> (u64, u64, u32) {
    match note {
        Note::None => (NOTE_NONE, 0, 0),
        Note::Slot(s, v) => (NOTE_SLOT, s as u64, v),
        Note::Word(o, v) => (NOTE_WORD, o, v),
        Note::Post(o, v) => (NOTE_POST | ((v >> 32) << 32), o, v as u32),
    }
}

/// A post's 64-bit value from its note and `value` (see [`note_parts`]).
fn post_value(note: u64, value: u32) -> u64 {
    (note >> 32) << 32 | value as u64
}

fn raise_word(w: &AtomicU32, value: u32) {
    let mut cur = w.load(Ordering::Acquire);
    while cur == 0 || wait::seq_reached(value, cur) {
        match w.compare_exchange_weak(cur, value, Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => break,
            Err(v) => cur = v,
        }
    }
}

/// Completion state of one UCX request, shared with its callback.
struct Pending {
    /// Counts the request in `Shared::inflight` until it completes.
    inflight: Option<Arc<Shared>>,
    done: AtomicU32,
    status: AtomicU32,
    waiters: AtomicU32,
    /// For a notification raised when a rendezvous receive completes: the shared state,
    /// the region's address and length, and the note.
    notify: Option<(Arc<Shared>, usize, usize, u64, u64, u32)>,
}

unsafe extern "C" fn send_cb(request: *mut c_void, status: ucs_status_t, user: *mut c_void) {
    let p = unsafe { Arc::from_raw(user as *const Pending) };
    finish_pending(&p, status);
    unsafe { (ucp_static().request_free)(request) };
}

unsafe extern "C" fn recv_data_cb(request: *mut c_void, status: ucs_status_t, _len: usize, user: *mut c_void) {
    unsafe { send_cb(request, status, user) }
}

fn finish_pending(p: &Pending, status: ucs_status_t) {
    p.status.store(status as u32, Ordering::Release);
    if let Some(sh) = &p.inflight {
        sh.inflight.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some((sh, addr, len, note, index, value)) = &p.notify {
        if status == UCS_OK {
            sh.raise(*addr, *len, *note, *index, *value);
        }
    }
    wait::publish(&p.done, &p.waiters, 1);
}

fn ucp_static() -> &'static Ucp {
    ffi::ucp().expect("UCX callbacks run only after UCX was loaded")
}

unsafe extern "C" fn err_cb(arg: *mut c_void, _ep: ucp_ep_h, status: ucs_status_t) {
    // `arg` is a pointer to (Shared, peer) made at endpoint creation.
    let (sh, peer) = unsafe { &*(arg as *const (std::sync::Weak<Shared>, u32)) };
    if let Some(sh) = sh.upgrade() {
        let why = format!("UCX endpoint failed: {}", sh.ucp.status(status));
        sh.mark_lost(*peer as usize, why);
    }
}

/// An active-message handler that reads only the message header: `$body` gets the device's
/// shared state and the header bytes, and the generated callback returns `UCS_OK`.
macro_rules! header_handler {
    ($name:ident, |$sh:ident, $h:ident| $body:block) => {
        unsafe extern "C" fn $name(
            arg: *mut c_void,
            header: *const c_void,
            hlen: usize,
            _data: *mut c_void,
            _len: usize,
            _param: *const ucp_am_recv_param_t,
        ) -> ucs_status_t {
            let $sh = unsafe { &*(arg as *const Shared) };
            let $h: &[u8] = if hlen == 0 { &[] } else { unsafe { std::slice::from_raw_parts(header as *const u8, hlen) } };
            $body
            UCS_OK
        }
    };
}

header_handler!(am_notify, |sh, h| {
    if h.len() == std::mem::size_of::<NotifyHeader>() {
        let n = unsafe { (h.as_ptr() as *const NotifyHeader).read_unaligned() };
        sh.publish(n.slot, n.value);
    }
});

header_handler!(am_heartbeat, |sh, h| {
    if let Ok(from) = <[u8; 4]>::try_from(h) {
        if let Some(t) = sh.last_heard.get(u32::from_ne_bytes(from) as usize) {
            t.store(sh.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
});

header_handler!(am_lost, |sh, h| {
    if h.len() >= 8 {
        let from = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let peer = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        if peer < sh.lost.len() && peer as u32 != sh.me {
            let why = String::from_utf8_lossy(&h[8..]);
            sh.mark_lost_as(peer, format!("{why} (seen by rank {from})"), false);
        }
    }
});

unsafe extern "C" fn free_cb(request: *mut c_void, _status: ucs_status_t, _user: *mut c_void) {
    unsafe { (ucp_static().request_free)(request) };
}

impl Shared {
    /// Marks `peer` lost (once), tells the other peers, and wakes every waiter so it
    /// re-checks liveness now.
    fn mark_lost(&self, peer: usize, why: String) {
        self.mark_lost_as(peer, why, true);
    }

    /// [`Shared::mark_lost`]; `seen`: this rank saw it (rather than being told), so it
    /// tells the others.
    fn mark_lost_as(&self, peer: usize, why: String, seen: bool) {
        let mut l = self.lost[peer].lock().unwrap();
        if l.is_some() {
            return;
        }
        *l = Some(why);
        drop(l);
        self.first_lost.lock().unwrap().get_or_insert(peer as u32);
        if seen {
            self.to_announce.lock().unwrap().push(peer as u32);
            self.announcing.store(true, Ordering::Relaxed);
        }
        self.any_lost.store(true, Ordering::SeqCst);
        // A caller blocked writing to its lane (a host cut off: the socket would block for
        // minutes) gets an error now.
        for &fd in self.lane_fds.lock().unwrap().get(peer).into_iter().flatten() {
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        for s in 0..self.nslots {
            let w = unsafe { &*self.slots.add(s) };
            wait::wake_if_waiting(w, unsafe { &*self.waiters });
        }
    }

    /// Sends a heartbeat to every watched peer and declares lost the ones silent for longer
    /// than the peer timeout (a host cut off: no error from the socket for minutes).
    fn heartbeat(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        let watched = self.watched.lock().unwrap().clone();
        let Some(eps) = self.eps.get() else { return };
        for (r, w) in watched.iter().enumerate() {
            if !*w || self.lost[r].lock().unwrap().is_some() {
                continue;
            }
            let me = self.me;
            let mut p = ucp_request_param_t::zeroed();
            p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
            p.cb = free_cb as *const c_void;
            p.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
            let req = unsafe { (self.ucp.am_send_nbx)(eps[r], AM_HEARTBEAT, &me as *const u32 as *const c_void, 4, std::ptr::null(), 0, &p) };
            let _ = req; // completes (and is freed) in its callback, or at once
            let heard = self.last_heard[r].load(Ordering::Relaxed);
            let silent = std::time::Duration::from_millis(now.saturating_sub(heard));
            if silent > self.peer_timeout {
                self.mark_lost(r, format!(
                    "nothing heard for {:.0} s (SCALEFREE_PEER_TIMEOUT): its host is unreachable or the process is stopped",
                    silent.as_secs_f64()
                ));
            }
        }
    }
}

unsafe extern "C" fn am_write(
    arg: *mut c_void,
    header: *const c_void,
    hlen: usize,
    data: *mut c_void,
    len: usize,
    param: *const ucp_am_recv_param_t,
) -> ucs_status_t {
    let sh_ptr = arg as *const Shared;
    let sh = unsafe { &*sh_ptr };
    if hlen != std::mem::size_of::<WriteHeader>() {
        return UCS_OK;
    }
    let h = unsafe { (header as *const WriteHeader).read_unaligned() };
    let target = sh.region_target(h.key, h.offset as usize, len);
    let Some((dst, raddr, rlen)) = target else {
        // A write to a region that is gone or out of its bounds: dropped (the sender checked
        // bounds against the handle; this only happens after the region was freed).
        return UCS_OK;
    };
    let rndv = unsafe { (*param).recv_attr } & UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    if !rndv {
        unsafe { std::ptr::copy_nonoverlapping(data as *const u8, dst as *mut u8, len) };
        sh.raise(raddr, rlen, h.note, h.index, h.value);
        return UCS_OK;
    }
    // Large data: receive it straight into the region, notify when it has landed.
    let strong = unsafe {
        Arc::increment_strong_count(sh_ptr);
        Arc::from_raw(sh_ptr)
    };
    let pending = Arc::new(Pending {
        inflight: Some(strong.clone()),
        done: AtomicU32::new(0),
        status: AtomicU32::new(0),
        waiters: AtomicU32::new(0),
        notify: Some((strong, raddr, rlen, h.note, h.index, h.value)),
    });
    let mut p = ucp_request_param_t::zeroed();
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb = recv_data_cb as *const c_void;
    let user = Arc::into_raw(pending.clone());
    p.user_data = user as *mut c_void;
    sh.inflight.fetch_add(1, Ordering::SeqCst);
    let r = unsafe { (sh.ucp.am_recv_data_nbx)(sh.worker, data, dst as *mut c_void, len, &p) };
    if r.is_null() || ptr_is_err(r) {
        drop(unsafe { Arc::from_raw(user) });
        finish_pending(&pending, if r.is_null() { UCS_OK } else { ptr_status(r) });
    }
    UCS_INPROGRESS
}

/// An operation in flight (see [`Net::start_write_notify`]).
pub struct Request {
    pending: Arc<Pending>,
    peer: u32,
    what: String,
    /// For a lane write still queued: its lane, whose queue a waiter sends itself while
    /// the lane's writer thread is not sending (see [`lanes::help`]).
    lane: Option<Arc<lanes::Lane>>,
}

impl Request {
    /// True once the operation's buffers may be reused.
    pub fn test(&self) -> bool {
        self.pending.done.load(Ordering::Acquire) != 0
    }
}

/// One rank's UCX endpoint set: context, worker, an endpoint per peer, and the progress
/// thread. Dropping it stops the thread; the UCX objects go when the last region or remote
/// key referring to them does.
pub struct Net {
    pub(crate) shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Plain TCP lanes for bulk writes to peers UCX reaches only over TCP (see [`lanes`]).
    lanes: Option<lanes::Lanes>,
    /// Per peer: an operation went to it over UCX since the last flush (see [`Net::notify`]).
    unflushed: Vec<AtomicBool>,
}

/// What UCX was found and what it offers, for `scalefree info` and error messages.
pub fn describe() -> Result<String> {
    let u = ffi::ucp()?;
    Ok(format!("UCX {}.{}.{} ({})", u.version.0, u.version.1, u.version.2, u.path))
}

impl Net {
    /// Collective: creates the worker, swaps worker addresses with every rank through
    /// `exchange` (all ranks' bytes, by rank), and connects to every peer.
    ///
    /// # Safety
    /// `slots` (`nslots` words) and `waiters` must stay valid until the returned value drops.
    pub unsafe fn new(
        me: u32,
        size: u32,
        slots: *const AtomicU32,
        nslots: usize,
        waiters: *const AtomicU32,
        exchange: &mut Exchange,
    ) -> Result<Net> {
        let u = ffi::ucp()?;
        set_default_env();
        let mut config: *mut ucp_config_t = std::ptr::null_mut();
        u.check(unsafe { (u.config_read)(std::ptr::null(), std::ptr::null(), &mut config) }, "ucp_config_read")?;
        let mut params: ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
        params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
        let name = std::ffi::CString::new(format!("scalefree-r{me}")).unwrap();
        params.name = name.as_ptr();
        let mut ctx: ucp_context_h = std::ptr::null_mut();
        let s = unsafe { (u.init_version)(API_MAJOR, API_MINOR, &params, config, &mut ctx) };
        unsafe { (u.config_release)(config) };
        u.check(s, "ucp_init")?;
        let mut wp: ucp_worker_params_t = unsafe { std::mem::zeroed() };
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_MULTI;
        let mut worker: ucp_worker_h = std::ptr::null_mut();
        let s = unsafe { (u.worker_create)(ctx, &wp, &mut worker) };
        if s != UCS_OK {
            unsafe { (u.cleanup)(ctx) };
            return Err(Error::Unsupported(format!("ucp_worker_create: {}", u.status(s))));
        }
        let mut efd: c_int = -1;
        let s = unsafe { (u.worker_get_efd)(worker, &mut efd) };
        if s != UCS_OK {
            unsafe { (u.worker_destroy)(worker); (u.cleanup)(ctx) };
            return Err(Error::Unsupported(format!("ucp_worker_get_efd: {}", u.status(s))));
        }
        // Our worker address, swapped with every rank.
        let mut attr: ucp_worker_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
        u.check(unsafe { (u.worker_query)(worker, &mut attr) }, "ucp_worker_query")?;
        let addr = unsafe { std::slice::from_raw_parts(attr.address as *const u8, attr.address_length) }.to_vec();
        unsafe { (u.worker_release_address)(worker, attr.address) };
        let all = exchange(&addr)?;
        if all.len() != size as usize {
            return Err(Error::Bootstrap(format!("address exchange returned {} of {size} ranks", all.len())));
        }
        let kick_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if kick_fd < 0 {
            return Err(Error::io("eventfd for the UCX backend", std::io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared {
            ucp: u,
            ctx,
            worker,
            me,
            eps: std::sync::OnceLock::new(),
            err_args: Mutex::new(Vec::new()),
            lost: (0..size).map(|_| Mutex::new(None)).collect(),
            any_lost: AtomicBool::new(false),
            first_lost: Mutex::new(None),
            to_announce: Mutex::new(Vec::new()),
            announcing: AtomicBool::new(false),
            regions: Mutex::new(HashMap::new()),
            slots,
            nslots,
            waiters,
            stop: AtomicBool::new(false),
            inflight: AtomicU32::new(0),
            epoch: std::time::Instant::now(),
            last_heard: (0..size).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            watched: Mutex::new(vec![false; size as usize]),
            peer_timeout: peer_timeout(),
            lane_fds: Mutex::new(vec![Vec::new(); size as usize]),
            direct: Mutex::new(None),
            direct_busy: AtomicU32::new(0),
            direct_bytes: std::sync::atomic::AtomicU64::new(0),
            reduced_bytes: std::sync::atomic::AtomicU64::new(0),
            kick_fd,
            pollers: AtomicU32::new(0),
            waits: AtomicU32::new(0),
            spin_credit: AtomicU32::new(SPIN_CREDIT_MAX),
        });
        let weak = Arc::downgrade(&shared);
        let mut eps = vec![std::ptr::null_mut(); size as usize];
        for (r, peer_addr) in all.iter().enumerate() {
            let arg = Box::new((weak.clone(), r as u32));
            let mut ep_params: ucp_ep_params_t = unsafe { std::mem::zeroed() };
            ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep_params.address = peer_addr.as_ptr() as *const c_void;
            ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
            ep_params.err_cb = Some(err_cb);
            ep_params.err_arg = &*arg as *const _ as *mut c_void;
            let mut ep: ucp_ep_h = std::ptr::null_mut();
            if let Err(e) = u.check(unsafe { (u.ep_create)(worker, &ep_params, &mut ep) }, &format!("ucp_ep_create to rank {r}")) {
                let _ = shared.eps.set(eps);
                return Err(e);
            }
            eps[r] = ep;
            shared.err_args.lock().unwrap().push(arg);
        }
        let _ = shared.eps.set(eps);
        // Active-message handlers get the shared state as their argument.
        for (id, cb) in [(AM_NOTIFY, am_notify as AmCb), (AM_WRITE, am_write as AmCb), (AM_HEARTBEAT, am_heartbeat as AmCb), (AM_LOST, am_lost as AmCb)] {
            let hp = ucp_am_handler_param_t {
                field_mask: UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
                id,
                flags: UCP_AM_FLAG_WHOLE_MSG,
                cb: Some(cb),
                arg: Arc::as_ptr(&shared) as *mut c_void,
            };
            u.check(unsafe { (u.worker_set_am_recv_handler)(worker, &hp) }, "ucp_worker_set_am_recv_handler")?;
        }
        let th = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sf-ucx-progress-{me}"))
            .spawn(move || progress_loop(&th, efd))
            .map_err(|e| Error::io("spawn UCX progress thread", e))?;
        let net = Net { shared, thread: Some(thread), lanes: None, unflushed: (0..size).map(|_| AtomicBool::new(true)).collect() };
        // Wire up every endpoint before anyone relies on it (connection set-up is lazy).
        for r in 0..size {
            if r != me {
                net.flush(r)?;
            }
        }
        exchange(&[])?;
        Ok(net)
    }

    pub fn ucp(&self) -> &'static Ucp {
        self.shared.ucp
    }

    /// Runs the handlers of whatever has arrived (callers do this while they spin).
    pub fn progress(&self) -> u32 {
        let k = self.shared.progress();
        match &self.lanes {
            Some(l) => k + l.poll(&self.shared),
            None => k,
        }
    }

    /// `PeerLost` for the first peer lost.
    pub fn check_alive(&self) -> Result<()> {
        if !self.shared.any_lost.load(Ordering::SeqCst) {
            return Ok(());
        }
        let first = *self.shared.first_lost.lock().unwrap();
        match first {
            Some(first) => Err(self.lost_report(first, "")),
            None => Ok(()),
        }
    }

    /// Whether `peer` is known lost (its endpoint or lane failed, it fell silent, or a peer
    /// said so).
    pub fn is_lost(&self, peer: u32) -> bool {
        self.shared.lost.get(peer as usize).is_some_and(|l| l.lock().unwrap().is_some())
    }

    /// Records `peer` (on this host) as lost and tells the peers on other hosts.
    pub fn note_lost(&self, peer: u32, why: String) {
        self.shared.mark_lost(peer as usize, why);
        self.shared.announce_losses();
    }

    /// `PeerLost` for an operation on `peer` that failed because it is gone: names the
    /// first peer lost, which may be another one (`peer` stopped because of it).
    fn lost_report(&self, peer: u32, what: &str) -> Error {
        let sh = &self.shared;
        let why = |r: u32| {
            let why = sh.lost[r as usize].lock().unwrap().clone().unwrap_or_default();
            if what.is_empty() { why } else { format!("{what}: {why}") }
        };
        let first = sh.first_lost.lock().unwrap().unwrap_or(peer);
        if first == peer {
            return Error::PeerLost { rank: peer, pid: 0, detail: why(peer) };
        }
        Error::PeerLost { rank: first, pid: 0, detail: format!("{}; then rank {peer} went away too ({})", why(first), why(peer)) }
    }

    /// A lane's `PeerLost` for `peer`, recorded as a loss and reported as the first one.
    fn lane_lost(&self, e: Error) -> Error {
        match e {
            Error::PeerLost { rank, detail, .. } => {
                self.shared.mark_lost(rank as usize, detail);
                self.lost_report(rank, "TCP lane")
            }
            e => e,
        }
    }

    fn lost_error(&self, peer: u32, what: &str, status: ucs_status_t) -> Error {
        if self.shared.lost[peer as usize].lock().unwrap().is_some() {
            return self.lost_report(peer, what);
        }
        Error::Io {
            what: format!("{what} (rank {peer})"),
            source: std::io::Error::other(self.shared.ucp.status(status)),
        }
    }

    /// Registers `len` bytes at `addr` (a region's mapping) under `key`.
    pub fn register(&self, addr: *mut u8, len: usize, key: u64) -> Result<Registration> {
        let u = self.shared.ucp;
        let mut mp: ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = addr as *mut c_void;
        mp.length = len.max(1);
        let mut memh: ucp_mem_h = std::ptr::null_mut();
        u.check(unsafe { (u.mem_map)(self.shared.ctx, &mp, &mut memh) }, "ucp_mem_map")?;
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut n = 0usize;
        if let Err(e) = u.check(unsafe { (u.rkey_pack)(self.shared.ctx, memh, &mut buf, &mut n) }, "ucp_rkey_pack") {
            unsafe { (u.mem_unmap)(self.shared.ctx, memh) };
            return Err(e);
        }
        let rkey = unsafe { std::slice::from_raw_parts(buf as *const u8, n) }.to_vec();
        unsafe { (u.rkey_buffer_release)(buf) };
        self.shared.regions.lock().unwrap().insert(key, LocalReg { addr: addr as usize, len });
        Ok(Registration { shared: self.shared.clone(), memh, key, rkey })
    }

    /// Unpacks a peer's packed remote key for its region at `addr`.
    pub fn remote_key(&self, peer: u32, addr: u64, packed: &[u8]) -> Result<Arc<RemoteKey>> {
        let u = self.shared.ucp;
        let mut rkey: ucp_rkey_h = std::ptr::null_mut();
        let ep = self.ep(peer)?;
        u.check(unsafe { (u.ep_rkey_unpack)(ep, packed.as_ptr() as *const c_void, &mut rkey) }, &format!("ucp_ep_rkey_unpack (rank {peer})"))?;
        Ok(Arc::new(RemoteKey { shared: self.shared.clone(), peer, rkey, addr }))
    }

    fn ep(&self, peer: u32) -> Result<ucp_ep_h> {
        self.shared.eps.get().and_then(|v| v.get(peer as usize)).copied().filter(|e| !e.is_null())
            .ok_or_else(|| Error::InvalidArgument(format!("no UCX endpoint to rank {peer}")))
    }

    /// Issues one request and waits for its local completion (buffers reusable).
    fn run(&self, peer: u32, what: &str, policy: &WaitPolicy, issue: &mut dyn FnMut(&ucp_request_param_t) -> ucs_status_ptr_t) -> Result<()> {
        match self.start(peer, what, issue)? {
            None => Ok(()),
            Some(req) => self.wait_request(&req, policy),
        }
    }

    /// Issues one request; `None` when it completed at once.
    fn start(&self, peer: u32, what: &str, issue: &mut dyn FnMut(&ucp_request_param_t) -> ucs_status_ptr_t) -> Result<Option<Request>> {
        // Before it is issued: a flush that sees it clear was issued after this operation.
        if let Some(f) = self.unflushed.get(peer as usize) {
            f.store(true, Ordering::SeqCst);
        }
        self.start_unmarked(peer, what, issue)
    }

    /// [`Net::start`] without marking `peer` unflushed (for the flush itself).
    fn start_unmarked(&self, peer: u32, what: &str, issue: &mut dyn FnMut(&ucp_request_param_t) -> ucs_status_ptr_t) -> Result<Option<Request>> {
        self.shared.inflight.fetch_add(1, Ordering::SeqCst);
        let pending = Arc::new(Pending { inflight: Some(self.shared.clone()), done: AtomicU32::new(0), status: AtomicU32::new(0), waiters: AtomicU32::new(0), notify: None });
        let mut p = ucp_request_param_t::zeroed();
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb = send_cb as *const c_void;
        let user = Arc::into_raw(pending.clone());
        p.user_data = user as *mut c_void;
        let r = issue(&p);
        if r.is_null() || ptr_is_err(r) {
            // No callback will run: undo its share.
            drop(unsafe { Arc::from_raw(user) });
            self.shared.inflight.fetch_sub(1, Ordering::SeqCst);
            if r.is_null() {
                return Ok(None);
            }
            return Err(self.lost_error(peer, what, ptr_status(r)));
        }
        Ok(Some(Request { pending, peer, what: what.to_string(), lane: None }))
    }

    /// Waits for a request started by one of the `start_*` calls.
    pub fn wait_request(&self, req: &Request, policy: &WaitPolicy) -> Result<()> {
        let (peer, what) = (req.peer, &req.what);
        if let Some(lane) = &req.lane {
            lanes::help(&self.shared, lane, &req.pending, policy.check_interval);
        }
        self.wait_word(&req.pending.done, &req.pending.waiters, |v| v != 0, policy, &|| format!("{what} to rank {peer} to complete"))?;
        let st = req.pending.status.load(Ordering::Acquire) as ucs_status_t;
        if st != UCS_OK {
            return Err(self.lost_error(peer, what, st));
        }
        Ok(())
    }

    /// Waits on a local word while driving progress: spin with progress, then park (the
    /// progress thread wakes us).
    pub fn wait_word(&self, word: &AtomicU32, waiters: &AtomicU32, mut ready: impl FnMut(u32) -> bool, policy: &WaitPolicy, what: &dyn Fn() -> String) -> Result<u32> {
        wait::wait_until_hooked(word, waiters, |v| {
            if ready(v) {
                return true;
            }
            self.progress();
            ready(word.load(Ordering::Acquire))
        }, policy, what, &|| self.check_alive(), self.spin_hook())
    }

    /// How long [`Net::wait_reading`] spins before it parks: `spin` while spinning pays
    /// (recent waits ended during their spin), else not at all but for every 32nd wait,
    /// which tries again. Where ranks outnumber cores (simulated hosts) a spinning waiter
    /// only delays the rank that would send it its message.
    fn spin_budget(&self, spin: std::time::Duration) -> std::time::Duration {
        let sh = &self.shared;
        let probe = sh.waits.fetch_add(1, Ordering::Relaxed).is_multiple_of(32);
        if sh.spin_credit.load(Ordering::Relaxed) > 0 || probe { spin } else { std::time::Duration::ZERO }
    }

    /// Records whether a spin of `spin` ended the wait.
    fn spun(&self, spin: std::time::Duration, hit: bool) {
        if spin.is_zero() {
            return;
        }
        let c = &self.shared.spin_credit;
        let v = c.load(Ordering::Relaxed);
        c.store(if hit { (v + 1).min(SPIN_CREDIT_MAX) } else { v.saturating_sub(1) }, Ordering::Relaxed);
    }

    /// Whether [`Net::wait_reading`] can serve a wait for a word only `peer` raises: it
    /// writes to this rank over a TCP lane (`SCALEFREE_OWN_READS=0` turns it off).
    pub fn reads_own_from(&self, peer: u32) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| crate::config::env_switch("SCALEFREE_OWN_READS"))
            && self.lanes.as_ref().is_some_and(|l| l.has(peer))
    }

    /// Waits until `ready(word)` holds, reading the lanes in this thread: spin (driving
    /// progress) for `policy.spin`, then park in `poll` on the lanes' sockets and an
    /// eventfd that other threads raising a word write to, and read whatever arrives here.
    /// The lanes' reader threads stand down meanwhile and for a moment after (the next
    /// call's messages must not wake them), so a small message costs the receiver one
    /// wake-up, not two (reader, then waiter). Only for a word that arrivals over the lanes
    /// raise ([`Net::reads_own_from`]): a peer on this host raises its words by futex.
    pub fn wait_reading(&self, word: &AtomicU32, mut ready: impl FnMut(u32) -> bool, policy: &WaitPolicy, what: &dyn Fn() -> String,
                        liveness: &dyn Fn() -> Result<()>) -> Result<u32> {
        let v = word.load(Ordering::Acquire);
        if ready(v) {
            return Ok(v);
        }
        let lanes = self.lanes.as_ref().expect("checked by reads_own_from");
        let gate = lanes.gate();
        wait::SpinHook::enter(gate);
        struct Leave<'a>(&'a lanes::Gate);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.leave_leased();
            }
        }
        let _leave = Leave(gate);
        let start = std::time::Instant::now();
        let spin = self.spin_budget(policy.spin);
        loop {
            // Each check is a few system calls: the clock is cheap beside them.
            self.progress();
            let v = word.load(Ordering::Acquire);
            if ready(v) {
                self.spun(spin, true);
                return Ok(v);
            }
            if start.elapsed() >= spin {
                break;
            }
        }
        self.spun(spin, false);
        let sh = &self.shared;
        let mut fds: Vec<libc::pollfd> = lanes.fds().into_iter().chain([sh.kick_fd])
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 }).collect();
        let kick = fds.len() - 1;
        wait::park_until(start, policy, what, liveness, || {
            sh.pollers.fetch_add(1, Ordering::SeqCst);
            let v = word.load(Ordering::SeqCst);
            if ready(v) {
                sh.pollers.fetch_sub(1, Ordering::SeqCst);
                return Some(v);
            }
            let ms = policy.check_interval.as_millis().clamp(1, i32::MAX as u128) as i32;
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            sh.pollers.fetch_sub(1, Ordering::SeqCst);
            let kicked = fds[kick].revents & libc::POLLIN != 0;
            for (k, p) in fds.iter_mut().enumerate() {
                if p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0 && k != kick {
                    // A lane its peer closed (done with this job, or gone) or that broke: what
                    // is left on it is read below, and then it is not polled again (it would
                    // be readable for ever). A peer that is gone is the liveness check's to
                    // report, at its usual pace: a peer that finished the job and left is no
                    // error for a wait that does not need it.
                    p.fd = -1;
                }
                p.revents = 0;
            }
            if kicked {
                let mut count = 0u64;
                unsafe { libc::read(sh.kick_fd, &mut count as *mut u64 as *mut c_void, 8) };
            }
            self.progress();
            let v = word.load(Ordering::Acquire);
            ready(v).then_some(v)
        })
    }

    /// For a waiter that drives progress while it spins: the lanes' reader threads stand
    /// down meanwhile (see [`lanes::Gate`]).
    pub fn spin_hook(&self) -> Option<&dyn wait::SpinHook> {
        self.lanes.as_ref().map(|l| l.gate() as &dyn wait::SpinHook)
    }

    /// One-sided write of `n` bytes from `src` to `remote.addr + off`; returns once `src`
    /// may be reused.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    pub unsafe fn put(&self, src: *const u8, remote: &RemoteKey, off: usize, n: usize, policy: &WaitPolicy) -> Result<()> {
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.run(remote.peer, "ucp_put_nbx", policy, &mut |p| unsafe {
            (u.put_nbx)(ep, src as *const c_void, n, remote.addr + off as u64, remote.rkey, p)
        })
    }

    /// One-sided read of `n` bytes at `remote.addr + off` into `dst`; returns once they are here.
    ///
    /// # Safety
    /// `dst..dst+n` must be writable.
    pub unsafe fn get(&self, remote: &RemoteKey, off: usize, dst: *mut u8, n: usize, policy: &WaitPolicy) -> Result<()> {
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.run(remote.peer, "ucp_get_nbx", policy, &mut |p| unsafe {
            (u.get_nbx)(ep, dst as *mut c_void, n, remote.addr + off as u64, remote.rkey, p)
        })
    }

    /// [`Net::put`] without waiting: over a TCP lane, a queued lane write; else
    /// `ucp_put_nbx`. `src` must stay untouched until the returned request (if any)
    /// completes.
    ///
    /// # Safety
    /// `src..src+n` must stay readable until then.
    pub unsafe fn start_put(&self, src: *const u8, remote: &RemoteKey, key: u64, off: usize, n: usize) -> Result<Option<Request>> {
        if self.lanes.as_ref().is_some_and(|l| l.has(remote.peer)) {
            return unsafe { self.start_write_notify(remote.peer, src, n, key, off, Note::None) };
        }
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.start(remote.peer, "ucp_put_nbx", &mut |p| unsafe {
            (u.put_nbx)(ep, src as *const c_void, n, remote.addr + off as u64, remote.rkey, p)
        })
    }

    /// [`Net::get`] without waiting: `dst` holds the bytes once the returned request (if
    /// any) completes.
    ///
    /// # Safety
    /// `dst..dst+n` must stay writable (and unread) until then.
    pub unsafe fn start_get(&self, remote: &RemoteKey, off: usize, dst: *mut u8, n: usize) -> Result<Option<Request>> {
        let ep = self.ep(remote.peer)?;
        let u = self.shared.ucp;
        self.start(remote.peer, "ucp_get_nbx", &mut |p| unsafe {
            (u.get_nbx)(ep, dst as *mut c_void, n, remote.addr + off as u64, remote.rkey, p)
        })
    }

    /// Waits until every operation issued to `peer` has completed at the peer.
    pub fn flush(&self, peer: u32) -> Result<()> {
        let ep = self.ep(peer)?;
        if let Some(f) = self.unflushed.get(peer as usize) {
            // Cleared before the flush is issued: it covers every operation issued before;
            // one issued meanwhile sets it again (see `start`).
            f.store(false, Ordering::SeqCst);
        }
        let u = self.shared.ucp;
        let policy = WaitPolicy::for_load(1, std::time::Duration::from_secs(3600));
        match self.start_unmarked(peer, "ucp_ep_flush_nbx", &mut |p| unsafe { (u.ep_flush_nbx)(ep, p) })? {
            None => Ok(()),
            Some(req) => self.wait_request(&req, &policy),
        }
    }

    /// [`Net::flush`] if an operation went to `peer` over UCX since the last one.
    fn flush_if_needed(&self, peer: u32) -> Result<()> {
        match self.unflushed.get(peer as usize) {
            Some(f) if !f.load(Ordering::SeqCst) => Ok(()),
            _ => self.flush(peer),
        }
    }

    /// Delivers `value` into `peer`'s notification `slot`, after every earlier write to
    /// that peer has landed (flush first, if anything went to it over UCX since the last).
    pub fn notify(&self, peer: u32, slot: u32, value: u32, policy: &WaitPolicy) -> Result<()> {
        // Only when an operation went to `peer` over UCX since the last flush: a flush over
        // UCX's tcp transport is a round trip through both ranks' progress, which cost 8
        // posted 1 MiB lane writes and their notification about 0.3-0.5 ms per round
        // between 2 simulated hosts (`docs/benchmarks/collectives.md`).
        self.flush_if_needed(peer)?;
        if let Some(l) = self.lanes.as_ref().filter(|l| l.has(peer)) {
            // Behind every lane write to this peer (same socket), after the puts (flushed).
            return match l.notify(peer, slot, value).map_err(|e| self.lane_lost(e))? {
                None => Ok(()),
                Some(r) => self.wait_request(&r, policy),
            };
        }
        let h = NotifyHeader { slot, value };
        let ep = self.ep(peer)?;
        let u = self.shared.ucp;
        self.run(peer, "ucp_am_send_nbx (notify)", policy, &mut |p| unsafe {
            let mut p2 = std::ptr::read(p);
            p2.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            p2.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
            (u.am_send_nbx)(ep, AM_NOTIFY, &h as *const _ as *const c_void, std::mem::size_of::<NotifyHeader>(), std::ptr::null(), 0, &p2)
        })
    }

    /// Writes `n` bytes from `src` into `peer`'s region `key` at `off` and then raises
    /// `note`, as one active message.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_notify(&self, peer: u32, src: *const u8, n: usize, key: u64, off: usize, note: Note, policy: &WaitPolicy) -> Result<()> {
        match unsafe { self.start_write_notify(peer, src, n, key, off, note)? } {
            None => Ok(()),
            Some(r) => self.wait_request(&r, policy),
        }
    }

    /// [`Net::write_notify`] without waiting: `src` must stay untouched until the returned
    /// request (if any) completes.
    ///
    /// # Safety
    /// `src..src+n` must stay readable until then.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_write_notify(&self, peer: u32, src: *const u8, n: usize, key: u64, off: usize, note: Note) -> Result<Option<Request>> {
        let (note, index, value) = note_parts(note);
        if let Some(l) = self.lanes.as_ref().filter(|l| l.has(peer)) {
            return unsafe { l.start_write(peer, src, n, key, off as u64, note, index, value) }.map_err(|e| self.lane_lost(e));
        }
        let h = WriteHeader { key, offset: off as u64, note, index, value, _pad: 0 };
        let ep = self.ep(peer)?;
        let u = self.shared.ucp;
        self.start(peer, "ucp_am_send_nbx (write)", &mut |p| unsafe {
            let mut p2 = std::ptr::read(p);
            p2.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            p2.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
            (u.am_send_nbx)(ep, AM_WRITE, &h as *const _ as *const c_void, std::mem::size_of::<WriteHeader>(), src as *const c_void, n, &p2)
        })
    }

    /// Collective: opens TCP lanes (see [`lanes`]) to the peers in `remote` (true: on another
    /// host), listening on `ip`; writes to a peer go over its lane when UCX reaches it only
    /// over TCP (or always, with `SCALEFREE_TCP_LANES=1`). `SCALEFREE_TCP_LANES=0`: none.
    pub fn open_lanes(&mut self, ip: std::net::IpAddr, remote: &[bool], token: &str, job_id: &str, timeout: std::time::Duration,
                      exchange: &mut Exchange) -> Result<()> {
        let setting = lanes::setting();
        let listener = match setting {
            Some(_) if remote.iter().any(|&r| r) => Some(lanes::Listener::bind(ip)?),
            _ => None,
        };
        // Each rank's address and stream count: a pair opens the smaller count of streams.
        let mine = listener.as_ref().map(|l| l.offer.encode()).unwrap_or_default();
        let all = exchange(mine.as_bytes())?;
        let offers: Vec<Option<lanes::Offer>> = all.iter().map(|b| lanes::Offer::parse(b)).collect();
        let Some(listener) = listener else { return Ok(()) };
        let connect: Vec<bool> = (0..remote.len()).map(|r| remote[r] && offers[r].is_some()).collect();
        let mut l = lanes::Lanes::open(&self.shared, listener, &offers, &connect, &lanes::lane_key(token, job_id), timeout)?;
        for (r, &wanted) in connect.iter().enumerate() {
            if wanted {
                let tcp_only = self.transports(r as u32).map(|t| !t.is_empty() && t.iter().all(|x| x.starts_with("tcp/"))).unwrap_or(false);
                l.use_for(r, setting == Some(true) || tcp_only);
            }
        }
        self.lanes = Some(l);
        Ok(())
    }

    /// Direct landing: until [`Net::clear_direct`], bytes that peers write over TCP lanes
    /// into region `key` that fall whole inside a window are received into the window's `dst`
    /// instead: copied there, or, for a window with a reducer, read in cache-sized parts and
    /// reduced into it part by part (the bytes never pass through the region, nor through
    /// memory: the owner has nothing left to reduce). A write that landed so also stores its
    /// note's value into the 32-bit word `flag_delta` bytes after its note word (before
    /// raising the note), so the owner can tell, per write, where its bytes are: writes over
    /// UCX, or not whole inside a window, land in the region as always.
    ///
    /// # Safety
    /// Every window's `dst..dst+len` must stay writable (and readable, for a reducing one),
    /// and untouched by anyone else, until `clear_direct` returns.
    pub unsafe fn set_direct(&self, key: u64, windows: &[Window], flag_delta: usize) {
        *self.shared.direct.lock().unwrap() = Some(Direct { key, windows: windows.to_vec(), flag_delta });
    }

    /// Ends direct landing; returns once no lane reader writes into a window any more. A
    /// reader still inside a write after `timeout` (its peer stopped mid-write) has its lane
    /// shut down, so that it stops touching the caller's memory.
    pub fn clear_direct(&self, timeout: std::time::Duration) {
        let sh = &self.shared;
        *sh.direct.lock().unwrap() = None;
        let start = std::time::Instant::now();
        let mut shut = false;
        while sh.direct_busy.load(Ordering::SeqCst) > 0 {
            if !shut && start.elapsed() >= timeout {
                for fd in sh.lane_fds.lock().unwrap().iter().flatten() {
                    unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
                }
                shut = true;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Bytes received by direct landing since this device opened: (copied, reduced).
    pub fn direct_landed_bytes(&self) -> (u64, u64) {
        (self.shared.direct_bytes.load(Ordering::Relaxed), self.shared.reduced_bytes.load(Ordering::Relaxed))
    }

    /// Whether bulk writes to some peer go over TCP lanes.
    pub fn lanes_active(&self) -> bool {
        self.lanes.as_ref().is_some_and(|l| l.active())
    }

    /// The transports (`name/device`) the endpoint to `peer` uses, e.g. `["tcp/eth0"]`.
    pub fn transports(&self, peer: u32) -> Result<Vec<String>> {
        let ep = self.ep(peer)?;
        let u = self.shared.ucp;
        let mut attr: ucp_ep_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
        attr.entry_size = std::mem::size_of::<ucp_transport_entry_t>();
        let mut storage: Vec<ucp_transport_entry_t> = (0..16).map(|_| ucp_transport_entry_t { transport_name: std::ptr::null(), device_name: std::ptr::null() }).collect();
        attr.entries = storage.as_mut_ptr();
        attr.num_entries = storage.len() as u32;
        u.check(unsafe { (u.ep_query)(ep, &mut attr) }, "ucp_ep_query")?;
        let mut out = Vec::new();
        for e in storage.iter().take(attr.num_entries as usize) {
            let s = |p: *const std::ffi::c_char| if p.is_null() { String::from("?") } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() };
            let t = format!("{}/{}", s(e.transport_name), s(e.device_name));
            if !out.contains(&t) {
                out.push(t);
            }
        }
        Ok(out)
    }

    pub fn rank(&self) -> u32 {
        self.shared.me
    }

    /// Watches `peers` (true: on another host) with heartbeats; the others are watched by
    /// the shared-memory backend (their process ids).
    pub fn watch(&self, peers: Vec<bool>) {
        let now = self.shared.epoch.elapsed().as_millis() as u64;
        for (r, w) in peers.iter().enumerate() {
            if *w {
                self.shared.last_heard[r].store(now, Ordering::Relaxed);
            }
        }
        *self.shared.watched.lock().unwrap() = peers;
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(mut l) = self.lanes.take() {
            l.close();
        }
        unsafe { (self.shared.ucp.worker_signal)(self.shared.worker) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sleeps on the worker's event descriptor; runs handlers when anything arrives.
fn progress_loop(sh: &Shared, efd: c_int) {
    let u = sh.ucp;
    let every = (sh.peer_timeout / 10).clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1));
    let mut last_beat = std::time::Instant::now();
    while !sh.stop.load(Ordering::SeqCst) {
        if last_beat.elapsed() >= every {
            sh.heartbeat();
            last_beat = std::time::Instant::now();
        }
        while sh.progress() != 0 {}
        let s = unsafe { (u.worker_arm)(sh.worker) };
        if s == UCS_ERR_BUSY {
            continue;
        }
        // With data in flight, look again soon even without an event (a socket that can
        // take more data is not always reported); otherwise sleep until something arrives.
        let ms = if sh.inflight.load(Ordering::SeqCst) > 0 { 1 } else { every.as_millis().min(100) as i32 };
        let mut p = libc::pollfd { fd: efd, events: libc::POLLIN, revents: 0 };
        unsafe { libc::poll(&mut p, 1, ms) };
    }
}

/// Silence after which a peer on another host counts as lost (`SCALEFREE_PEER_TIMEOUT`
/// seconds, default 30; on one host the same silence from a live peer is a warning).
fn peer_timeout() -> std::time::Duration {
    crate::wait::peer_timeout_from_env()
}

/// Defaults that make a dead peer an error within seconds rather than minutes (each only
/// when the user did not set it).
fn set_default_env() {
    if let (Some(name), None) = (crate::config::ifname(), std::env::var_os("UCX_NET_DEVICES")) {
        // The interface the user chose for traffic between hosts (shared memory is not a net device).
        std::env::set_var("UCX_NET_DEVICES", &name);
    }
    for (k, v) in [
        ("UCX_TCP_KEEPIDLE", "2s"),
        ("UCX_TCP_KEEPINTVL", "1s"),
        ("UCX_TCP_KEEPCNT", "5"),
        ("UCX_KEEPALIVE_INTERVAL", "2s"),
        // Fewer, larger socket reads and writes for bulk data (measured: faster at 512 KiB
        // pieces on 2 cores).
        ("UCX_TCP_TX_SEG_SIZE", "256k"),
        ("UCX_TCP_RX_SEG_SIZE", "256k"),
    ] {
        if std::env::var_os(k).is_none() {
            // Only read by UCX at ucp_config_read, on this thread, before other threads use it.
            std::env::set_var(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A post's 64-bit counter and offset past 2^32 survive the note's encoding.
    #[test]
    fn notes_carry_64_bit_posts_and_offsets() {
        for v in [0u64, 1, u32::MAX as u64, 1 << 32, (7 << 32) | 5, u64::MAX] {
            let (note, index, value) = note_parts(Note::Post((5 << 32) + 8, v));
            assert_eq!((note & 0xffff_ffff, index), (NOTE_POST, (5 << 32) + 8));
            assert_eq!(post_value(note, value), v);
        }
        assert_eq!(note_parts(Note::Word(1 << 40, 3)), (NOTE_WORD, 1 << 40, 3));
        assert_eq!(note_parts(Note::Slot(9, u32::MAX)), (NOTE_SLOT, 9, u32::MAX));
        assert_eq!(note_parts(Note::None), (NOTE_NONE, 0, 0));
    }
}
