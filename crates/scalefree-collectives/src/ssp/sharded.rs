//! Sharded-SSP: every rank hosts one shard of a parameter server for the reduction vector.
//!
//! Memory each rank exposes (one region, see [`Geo`]):
//!
//! * an *inbox* per worker for its shard: the worker's last pushed contribution (header:
//!   push count, clock, flags);
//! * a *view* per shard: the last state that shard delivered to this worker (a delivery
//!   count, then two buffers, each a header — how many of this worker's pushes it includes,
//!   its age, flags — and the data);
//! * an *ack* word per worker (Async): the last delivery that worker has copied out, so the
//!   shard never overwrites a view being read;
//! * the shard's *published* state (Sync), double buffered the same way.
//!
//! Every update is a mesh post (data and header, then the count word), so the protocol runs
//! across hosts, where nothing of a peer is mapped. Between ranks of one host a Sync shard's
//! published state is read in place; a worker on another host gets it delivered into its
//! view instead, as Async shards always do, and keeps a copy of its last push (`outbox`).
//!
//! Nothing is lost because of a cycle of credits: a worker pushes to a shard only once the
//! shard's state includes its previous push (until then new contributions accumulate in
//! *missed*), and a shard's inbox slot is therefore free whenever a push arrives. A worker's
//! own pushed-but-not-yet-included data stays in *inflight*, so its result is always
//! `view ⊕ inflight ⊕ missed`: its own contributions are always in.
//!
//! Sync shards deliver only after one push from every worker, and workers swap in all shards
//! at once (every shard then holds the same set of contributions: `stable_local_reduction`).
//! Async shards reduce each push on arrival and deliver to a worker when its push was taken
//! or when the state's age grew; workers take each shard as it comes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use scalefree_transport::{Device, Error, Result};

use super::{fill_identity, Buf, Kind, Mesh, PushOrder, Variant, FINAL, MESH_HEADER};
use crate::dense::share_bounds;
use crate::reduce::{DType, ReduceOp};

const FLAG_EMPTY: u32 = 1;
const FLAG_FINAL: u32 = 2;

/// Byte layout of every rank's region (the same formulas on every rank).
struct Geo {
    p: usize,
    /// Byte range of each shard in the vector.
    shard: Vec<(usize, usize)>,
    inbox_base: usize,
    /// Inbox slot stride of each shard's owner.
    stride: Vec<usize>,
    /// Offset of shard `s`'s view within a view block.
    view_off: Vec<usize>,
}

const OFF_ACKS: usize = MESH_HEADER;
const HDR: usize = 64;
// A state buffer's header: pushes of the receiving worker it includes, its age, flags.
const BUF_INCLUDED: usize = 0;
const BUF_AGE: usize = 8;
const BUF_FLAGS: usize = 16;
// A push's header after the count word: clock, flags (the data follows at `HDR`).
const PUSH_TAIL: usize = 8;

impl Geo {
    fn new(p: usize, count: usize, esize: usize) -> Self {
        let shard: Vec<_> = (0..p as u32)
            .map(|s| {
                let (lo, hi) = share_bounds(count, p as u32, s);
                (lo * esize, hi * esize)
            })
            .collect();
        let stride = shard.iter().map(|(lo, hi)| HDR + (hi - lo).next_multiple_of(64)).collect();
        let mut view_off = Vec::with_capacity(p);
        let mut o = 0;
        for (lo, hi) in &shard {
            view_off.push(o);
            o += HDR + 2 * (HDR + (hi - lo).next_multiple_of(64));
        }
        Geo { p, shard, inbox_base: OFF_ACKS + p * 64, stride, view_off }
    }
    fn len(&self, s: usize) -> usize {
        self.shard[s].1 - self.shard[s].0
    }
    fn views_base(&self, owner: usize) -> usize {
        self.inbox_base + self.p * self.stride[owner]
    }
    /// One double-buffered block: a count header, then two (header, data) buffers.
    fn block(&self, s: usize) -> usize {
        HDR + 2 * (HDR + self.len(s).next_multiple_of(64))
    }
    fn published(&self, owner: usize) -> usize {
        let views: usize = (0..self.p).map(|s| self.block(s)).sum();
        self.views_base(owner) + views
    }
    /// Buffer (header, then data) of state version `k` of shard `owner` (Sync: published in
    /// the shard's own region, double buffered, read in place by workers of its host).
    fn published_buf(&self, owner: usize, k: u64) -> usize {
        self.published(owner) + HDR + (k % 2) as usize * (HDR + self.len(owner).next_multiple_of(64))
    }
    fn region_len(&self, owner: usize) -> usize {
        self.published(owner) + self.block(owner)
    }
    /// Header of worker `w`'s inbox slot at shard `owner`.
    fn inbox(&self, owner: usize, w: usize) -> usize {
        self.inbox_base + w * self.stride[owner]
    }
    /// Header of shard `s`'s view at worker `owner`.
    fn view(&self, owner: usize, s: usize) -> usize {
        self.views_base(owner) + self.view_off[s]
    }
    /// Buffer (header, then data) of delivery number `k` of shard `s` at worker `owner`
    /// (views are double buffered: delivery `k` goes to buffer `k % 2`).
    fn view_buf(&self, owner: usize, s: usize, k: u64) -> usize {
        self.view(owner, s) + HDR + (k % 2) as usize * (HDR + self.len(s).next_multiple_of(64))
    }
    fn ack(w: usize) -> usize {
        OFF_ACKS + w * 64
    }
}

/// What the worker and shard halves share (the shard half may live on its own thread).
struct Shared {
    mesh: Mesh,
    geo: Geo,
    kind: Kind,
    async_: bool,
    /// The peers this rank pushes to (as a worker) and delivers to (as a shard), in order:
    /// cyclic starts at the next rank, so no shard or worker is hit by every rank at once.
    order: Vec<usize>,
    /// Set by the shard once it delivered a state holding every worker's final push to
    /// every worker.
    shard_done: AtomicBool,
    stop: AtomicBool,
    /// The caller is inside a call and steps the shard itself; the background thread then
    /// stays parked (it would only contend for the lock, or hold it while preempted on an
    /// oversubscribed host).
    in_call: AtomicBool,
    thread_error: Mutex<Option<Error>>,
}

// Mesh holds mapped peer regions and channels, which are safe to use from any thread.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// Whether shard `s` delivers its state into this rank's views (Async, or another
    /// host); the same holds from the shard's side for a worker `s`.
    fn views(&self, s: usize) -> bool {
        self.async_ || !self.mesh.is_mapped(s)
    }

    /// Posts the buffer at `buf` (a state-buffer header, then `n` bytes of data) as
    /// delivery `k` of this rank's shard into worker `w`'s view.
    ///
    /// # Safety
    /// `buf..buf+HDR+n` must be readable.
    unsafe fn post_view(&self, w: usize, buf: *const u8, n: usize, k: u64) -> Result<()> {
        let me = self.mesh.me;
        unsafe { self.mesh.post(w, self.geo.view_buf(w, me, k), buf, HDR + n, self.geo.view(w, me), k) }
    }

    fn thread_error(&self) -> Result<()> {
        match self.thread_error.lock().unwrap().as_ref() {
            None => Ok(()),
            Some(e) => Err(clone_error(e)),
        }
    }
}

/// The background shard's error, as seen by the caller (it may be reported more than once).
fn clone_error(e: &Error) -> Error {
    match e {
        Error::PeerLost { rank, pid, detail } => Error::PeerLost { rank: *rank, pid: *pid, detail: detail.clone() },
        Error::Timeout { timeout, waiting_for } => Error::Timeout { timeout: *timeout, waiting_for: waiting_for.clone() },
        Error::Io { what, source } => Error::io(what.clone(), std::io::Error::new(source.kind(), source.to_string())),
        other => Error::Io { what: "the SSP shard thread".into(), source: std::io::Error::other(other.to_string()) },
    }
}

/// The parameter-server shard this rank hosts.
struct Shard {
    sh: Arc<Shared>,
    state: Buf,
    /// Pushes of each worker reduced into `state`.
    taken: Vec<u64>,
    /// Clock of each worker's last reduced push (`FINAL` once it flushed).
    clocks: Vec<u64>,
    /// Deliveries made to each worker.
    delivered: Vec<u64>,
    /// Async: workers owed a delivery.
    owed: Vec<bool>,
    final_delivered: Vec<bool>,
    last_age: u64,
}

impl Shard {
    fn new(sh: Arc<Shared>) -> Self {
        let p = sh.geo.p;
        // Async: the state, with room for a buffer header in front (one post delivers both).
        let mut state = Buf::new(if sh.async_ { HDR + sh.geo.len(sh.mesh.me) } else { 0 });
        if sh.async_ {
            fill_identity(sh.kind.dtype, sh.kind.op, &mut state.bytes_mut()[HDR..]);
        } else {
            // Version 0 of the published state: the identity.
            let me = sh.mesh.me;
            let n = sh.geo.len(me);
            let v0 = unsafe { std::slice::from_raw_parts_mut(sh.mesh.base(me).add(sh.geo.published_buf(me, 0) + HDR), n) };
            fill_identity(sh.kind.dtype, sh.kind.op, v0);
        }
        Shard {
            sh,
            state,
            taken: vec![0; p],
            clocks: vec![0; p],
            delivered: vec![0; p],
            owed: vec![false; p],
            final_delivered: vec![false; p],
            last_age: 0,
        }
    }

    fn age(&self) -> u64 {
        self.clocks.iter().copied().min().unwrap_or(FINAL)
    }

    /// Takes every push that arrived and delivers state where due. Returns true if it did
    /// anything.
    fn step(&mut self) -> Result<bool> {
        if self.sh.async_ {
            self.step_async()
        } else {
            self.step_sync()
        }
    }

    /// Reads worker `w`'s new push header, if there is one: (data, clock) with `data` None
    /// for an empty push.
    fn arrival(&self, w: usize) -> Option<(Option<*const u8>, u64)> {
        let sh = &*self.sh;
        let me = sh.mesh.me;
        let h = sh.geo.inbox(me, w);
        let seq = sh.mesh.u64_at(me, h).load(Ordering::Acquire);
        if seq == self.taken[w] {
            return None;
        }
        debug_assert_eq!(seq, self.taken[w] + 1, "a worker pushed twice without credit");
        let clock = sh.mesh.u64_at(me, h + 8).load(Ordering::Relaxed);
        let flags = sh.mesh.u32_at(me, h + 16).load(Ordering::Relaxed);
        let data = (flags & FLAG_EMPTY == 0).then(|| unsafe { sh.mesh.base(me).add(h + HDR) as *const u8 });
        Some((data, if flags & FLAG_FINAL != 0 { FINAL } else { clock }))
    }

    /// Sync: once every worker has pushed, `next = current ⊕ all pushes` in one pass into
    /// the other published buffer, then one header store tells every worker of this host
    /// (they read the state in place: nobody still reads the buffer being written, because
    /// each worker pushed only after taking the current version) and one post delivers it
    /// to each worker on another host.
    fn step_sync(&mut self) -> Result<bool> {
        let sh = self.sh.clone();
        let sh = &*sh;
        let (me, p) = (sh.mesh.me, sh.geo.p);
        let arrivals: Vec<_> = (0..p).map(|w| self.arrival(w)).collect();
        if arrivals.iter().any(|a| a.is_none()) {
            return Ok(false);
        }
        let base = sh.mesh.base(me);
        let round = self.delivered[0];
        let cur = unsafe { base.add(sh.geo.published_buf(me, round) + HDR) };
        let nb = sh.geo.published_buf(me, round + 1);
        let next = unsafe { base.add(nb + HDR) };
        let mut srcs: Vec<*const u8> = vec![cur];
        for (w, a) in arrivals.into_iter().enumerate() {
            let (data, clock) = a.unwrap();
            srcs.extend(data);
            self.taken[w] += 1;
            self.clocks[w] = clock;
        }
        sh.kind.combine(next, &srcs, sh.geo.len(me));
        let age = self.age();
        sh.mesh.u64_at(me, nb + BUF_INCLUDED).store(round + 1, Ordering::Relaxed);
        sh.mesh.u64_at(me, nb + BUF_AGE).store(age, Ordering::Relaxed);
        sh.mesh.u32_at(me, nb + BUF_FLAGS).store(if age == FINAL { FLAG_FINAL } else { 0 }, Ordering::Relaxed);
        self.delivered.iter_mut().for_each(|d| *d = round + 1);
        sh.mesh.u64_at(me, sh.geo.published(me)).store(round + 1, Ordering::Release);
        for &w in &sh.order {
            if sh.views(w) {
                unsafe { sh.post_view(w, base.add(nb), sh.geo.len(me), round + 1) }?;
            } else {
                sh.mesh.ring(w);
            }
        }
        if age == FINAL {
            sh.shard_done.store(true, Ordering::Release);
            sh.mesh.ring(me);
        }
        Ok(true)
    }

    /// Async: reduce each push on arrival; deliver a copy of the state to a worker whose
    /// push was taken or whenever the state's age grew, once it has taken the last one.
    fn step_async(&mut self) -> Result<bool> {
        let sh = self.sh.clone();
        let sh = &*sh;
        let (me, p) = (sh.mesh.me, sh.geo.p);
        let n = sh.geo.len(me);
        let mut did = false;
        for w in 0..p {
            let Some((data, clock)) = self.arrival(w) else { continue };
            if let Some(src) = data {
                sh.kind.acc(unsafe { self.state.mut_ptr().add(HDR) }, src, n);
            }
            self.taken[w] += 1;
            self.clocks[w] = clock;
            self.owed[w] = true;
            did = true;
        }
        let age = self.age();
        if age > self.last_age {
            self.last_age = age;
            self.owed.iter_mut().for_each(|o| *o = true);
        }
        for &w in &sh.order {
            if self.owed[w] && sh.mesh.u64_at(me, Geo::ack(w)).load(Ordering::Acquire) == self.delivered[w] {
                self.deliver(w)?;
                self.owed[w] = false;
                did = true;
            }
        }
        Ok(did)
    }

    fn deliver(&mut self, w: usize) -> Result<()> {
        let sh = &*self.sh;
        let me = sh.mesh.me;
        let age = self.age();
        let flags = if age == FINAL { FLAG_FINAL } else { 0 };
        let head = self.state.mut_ptr();
        unsafe {
            (head.add(BUF_INCLUDED) as *mut u64).write(self.taken[w]);
            (head.add(BUF_AGE) as *mut u64).write(age);
            (head.add(BUF_FLAGS) as *mut u64).write(flags as u64);
            sh.post_view(w, head, sh.geo.len(me), self.delivered[w] + 1)?;
        }
        self.delivered[w] += 1;
        if age == FINAL {
            self.final_delivered[w] = true;
            if self.final_delivered.iter().all(|&d| d) {
                sh.shard_done.store(true, Ordering::Release);
                // This rank's flush may be parked waiting for exactly this.
                sh.mesh.ring(me);
            }
        }
        Ok(())
    }
}

/// The worker half: what this rank has contributed and what it has seen of each shard.
///
/// Nothing is copied to keep a view or the data in flight: a shard's deliveries are read in
/// place from this rank's region (double buffered, so the shard writes the next one into
/// the other buffer), and the last push to a shard is read back from that shard's inbox,
/// which nobody touches until this rank pushes again.
struct Worker {
    sh: Arc<Shared>,
    /// Contributions not yet pushed, per shard (`missed_empty`: nothing there).
    missed: Vec<Buf>,
    missed_empty: Vec<bool>,
    /// Whether the last push to each shard held data its view does not include yet.
    inflight_live: Vec<bool>,
    /// The identity, standing in for a shard that has delivered nothing yet.
    identity: Buf,
    /// Age of each shard's view, the deliveries seen, and how many of this worker's pushes
    /// the view includes.
    view_age: Vec<u64>,
    seen: Vec<u64>,
    included: Vec<u64>,
    pushes: Vec<u64>,
    flushing: bool,
    final_sent: Vec<bool>,
    /// The caller's clock, stamped on pushes.
    clock: u64,
    /// Per shard on another host: the last push as posted (header tail, then data), kept
    /// as the in-flight data (a shard of this host keeps it readable in its inbox).
    outbox: Vec<Buf>,
}

impl Worker {
    fn new(sh: Arc<Shared>) -> Self {
        let p = sh.geo.p;
        let longest = (0..p).map(|s| sh.geo.len(s)).max().unwrap_or(0);
        let mut identity = Buf::new(longest);
        fill_identity(sh.kind.dtype, sh.kind.op, identity.bytes_mut());
        Worker {
            missed: (0..p).map(|s| Buf::new(sh.geo.len(s))).collect(),
            missed_empty: vec![true; p],
            inflight_live: vec![false; p],
            identity,
            view_age: vec![0; p],
            seen: vec![0; p],
            included: vec![0; p],
            pushes: vec![0; p],
            flushing: false,
            final_sent: vec![false; p],
            clock: 0,
            outbox: (0..p).map(|s| Buf::new(if sh.mesh.is_mapped(s) { 0 } else { HDR - PUSH_TAIL + sh.geo.len(s) })).collect(),
            sh,
        }
    }

    fn credit(&self, s: usize) -> bool {
        self.included[s] == self.pushes[s]
    }

    /// Pushes `contribution` straight from the caller's buffer where the shard can take it
    /// and nothing older is waiting; accumulates it into *missed* elsewhere.
    fn contribute(&mut self, contribution: &[u8]) -> Result<()> {
        let p = self.sh.geo.p;
        let direct: Vec<bool> = if self.sh.async_ {
            (0..p).map(|s| self.missed_empty[s] && self.credit(s)).collect()
        } else {
            let all = (0..p).all(|s| self.missed_empty[s] && self.credit(s));
            vec![all; p]
        };
        for &s in &self.sh.clone().order {
            let direct = direct[s];
            let (lo, hi) = self.sh.geo.shard[s];
            if direct {
                self.push(s, Some(contribution[lo..hi].as_ptr()))?;
            } else if self.missed_empty[s] {
                self.missed[s].bytes_mut().copy_from_slice(&contribution[lo..hi]);
                self.missed_empty[s] = false;
            } else {
                self.sh.kind.acc(self.missed[s].mut_ptr(), contribution[lo..hi].as_ptr(), hi - lo);
            }
        }
        Ok(())
    }

    /// Age of the oldest data in the view (`FINAL` when every shard is final).
    fn age(&self) -> u64 {
        self.view_age.iter().copied().min().unwrap_or(FINAL)
    }

    /// Takes note of shard `s`'s new delivery, if there is one.
    /// Where shard `s` tells this worker about new state: (rank, header offset).
    fn view_header(&self, s: usize) -> (usize, usize) {
        let sh = &*self.sh;
        if sh.views(s) {
            (sh.mesh.me, sh.geo.view(sh.mesh.me, s))
        } else {
            (s, sh.geo.published(s))
        }
    }

    /// Where version `k` of shard `s` is, for this worker: (rank, buffer offset).
    fn state_buf(&self, s: usize, k: u64) -> (usize, usize) {
        let sh = &*self.sh;
        if sh.views(s) {
            (sh.mesh.me, sh.geo.view_buf(sh.mesh.me, s, k))
        } else {
            (s, sh.geo.published_buf(s, k))
        }
    }

    fn take_view(&mut self, s: usize) -> bool {
        let sh = &*self.sh;
        let (owner, h) = self.view_header(s);
        let seq = sh.mesh.u64_at(owner, h).load(Ordering::Acquire);
        if seq == self.seen[s] {
            return false;
        }
        // Sync: version k holds push k of every worker.
        let (owner, b) = self.state_buf(s, seq);
        self.included[s] = sh.mesh.u64_at(owner, b + BUF_INCLUDED).load(Ordering::Relaxed);
        self.view_age[s] = sh.mesh.u64_at(owner, b + BUF_AGE).load(Ordering::Relaxed);
        if self.included[s] == self.pushes[s] {
            self.inflight_live[s] = false;
        }
        self.seen[s] = seq;
        true
    }

    /// Pushes `src` (the caller's data) or, with `None`, the missed contributions to shard `s`.
    fn push(&mut self, s: usize, src: Option<*const u8>) -> Result<()> {
        let sh = &*self.sh;
        let me = sh.mesh.me;
        let h = sh.geo.inbox(s, me);
        let n = sh.geo.len(s);
        let empty = src.is_none() && self.missed_empty[s];
        let data = (!empty).then(|| src.unwrap_or_else(|| self.missed[s].ptr()));
        let mut flags = if empty { FLAG_EMPTY } else { 0 };
        if self.flushing {
            flags |= FLAG_FINAL;
            self.final_sent[s] = true;
        }
        self.pushes[s] += 1;
        if sh.mesh.is_mapped(s) {
            // Data straight from the caller's buffer, then clock and flags with the count.
            if let Some(p) = data {
                unsafe { sh.mesh.put(s, h + HDR, p, n) }?;
            }
            let tail = [self.clock, flags as u64];
            unsafe { sh.mesh.post(s, h + PUSH_TAIL, tail.as_ptr() as *const u8, 16, h, self.pushes[s]) }?;
        } else {
            // One message: clock, flags and data, copied where they stay as the in-flight data.
            let ob = self.outbox[s].mut_ptr();
            unsafe {
                (ob as *mut u64).write(self.clock);
                (ob.add(8) as *mut u64).write(flags as u64);
                if let Some(p) = data {
                    std::ptr::copy_nonoverlapping(p, ob.add(HDR - PUSH_TAIL), n);
                }
                let len = HDR - PUSH_TAIL + if empty { 0 } else { n };
                sh.mesh.post(s, h + PUSH_TAIL, ob, len, h, self.pushes[s])?;
            }
        }
        self.inflight_live[s] = !empty;
        if src.is_none() {
            self.missed_empty[s] = true;
        }
        Ok(())
    }

    /// Takes deliveries and pushes where credit allows. Returns true if it did anything.
    fn step(&mut self) -> Result<bool> {
        let p = self.sh.geo.p;
        let me = self.sh.mesh.me;
        let mut did = false;
        let sh = self.sh.clone();
        if sh.async_ {
            for &s in &sh.order {
                if self.take_view(s) {
                    // The view now in use is the other buffer: the shard may fill this one.
                    // A final delivery is the shard's last (its rank may be gone already).
                    if self.view_age[s] != FINAL {
                        let ack = Geo::ack(me);
                        let none = std::ptr::NonNull::<u8>::dangling().as_ptr();
                        unsafe { self.sh.mesh.post(s, ack, none, 0, ack, self.seen[s]) }?;
                    }
                    did = true;
                }
                if self.credit(s) && (!self.missed_empty[s] || (self.flushing && !self.final_sent[s])) {
                    self.push(s, None)?;
                    did = true;
                }
            }
        } else {
            let ready = (0..p).all(|s| {
                let (owner, h) = self.view_header(s);
                self.sh.mesh.u64_at(owner, h).load(Ordering::Acquire) != self.seen[s]
            });
            if ready {
                for s in 0..p {
                    self.take_view(s);
                }
                did = true;
            }
            let credit = (0..p).all(|s| self.credit(s));
            let want = self.missed_empty.iter().any(|e| !e) || (self.flushing && self.age() != FINAL);
            if credit && want {
                for &s in &sh.order {
                    self.push(s, None)?;
                }
                did = true;
            }
        }
        Ok(did)
    }

    /// `out = view ⊕ inflight ⊕ missed`, shard by shard, in one pass each.
    fn result(&self, out: &mut [u8]) {
        let sh = &*self.sh;
        let (k, me) = (sh.kind, sh.mesh.me);
        for s in 0..sh.geo.p {
            let (lo, hi) = sh.geo.shard[s];
            let o = out[lo..hi].as_mut_ptr();
            let n = hi - lo;
            let view = if self.seen[s] == 0 {
                self.identity.ptr()
            } else {
                let (owner, b) = self.state_buf(s, self.seen[s]);
                unsafe { sh.mesh.base(owner).add(b + HDR) as *const u8 }
            };
            let inflight = if sh.mesh.is_mapped(s) {
                unsafe { sh.mesh.base(s).add(sh.geo.inbox(s, me) + HDR) as *const u8 }
            } else {
                unsafe { self.outbox[s].ptr().add(HDR - PUSH_TAIL) }
            };
            match (self.inflight_live[s], !self.missed_empty[s]) {
                (false, false) => unsafe { std::ptr::copy_nonoverlapping(view, o, n) },
                (true, false) => k.acc3(o, view, inflight, n),
                (false, true) => k.acc3(o, view, self.missed[s].ptr(), n),
                (true, true) => k.acc4(o, view, inflight, self.missed[s].ptr(), n),
            }
        }
    }
}

/// A Sharded-SSP reduction: the worker half runs in the caller; the shard half runs in the
/// caller too (it makes progress whenever this rank is inside a call) or, for the Thread
/// variants, on a background thread that serves it as soon as updates arrive.
pub(crate) struct Sharded {
    sh: Arc<Shared>,
    worker: Worker,
    /// The shard. The caller steps it whenever it is inside a call (so a caller about to
    /// wait does the work itself instead of waiting for a thread to wake up); the Thread
    /// variants' background thread steps it in between calls.
    shard: Arc<Mutex<Shard>>,
    thread: Option<JoinHandle<()>>,
}

impl Sharded {
    pub(crate) fn new(dev: &Device, count: usize, dtype: DType, op: ReduceOp, variant: Variant, order: PushOrder) -> Result<Self> {
        let p = dev.size() as usize;
        let geo = Geo::new(p, count, dtype.size_bytes());
        let mesh = Mesh::new_posting(dev, geo.region_len(dev.rank() as usize))?;
        let async_ = matches!(variant, Variant::ShardedAsync | Variant::ShardedAsyncThread);
        let sh = Arc::new(Shared {
            mesh,
            geo,
            kind: Kind { dtype, op },
            async_,
            order: order.sequence(dev.rank() as usize, p),
            shard_done: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            in_call: AtomicBool::new(false),
            thread_error: Mutex::new(None),
        });
        let shard = Shard::new(sh.clone());
        let worker = Worker::new(sh.clone());
        let threaded = matches!(variant, Variant::ShardedThread | Variant::ShardedAsyncThread);
        let shard = Arc::new(Mutex::new(shard));
        let thread = if threaded {
            let (sh2, shard2) = (sh.clone(), shard.clone());
            let t = std::thread::Builder::new()
                .name(format!("ssp-shard-{}", sh.mesh.me))
                .spawn(move || serve(shard2, sh2))
                .map_err(|e| Error::io("spawning the SSP shard thread", e))?;
            Some(t)
        } else {
            None
        };
        // Every rank's region is zeroed; no peer writes before its first call.
        Ok(Sharded { sh, worker, shard, thread })
    }

    /// Runs the worker (and inline shard) until `done` holds, parking between updates.
    fn progress(&mut self, done: &dyn Fn(&Worker, &Shared) -> bool, what: &dyn Fn() -> String) -> Result<Duration> {
        let mut waited = Duration::ZERO;
        loop {
            let seen = self.sh.mesh.my_bell();
            let mut did = true;
            while did {
                did = false;
                // Blocking: the thread holds the lock for one step at most, and stays out
                // while `in_call` is set (a try-lock could miss work the thread skipped).
                did |= self.shard.lock().unwrap_or_else(|p| p.into_inner()).step()?;
                did |= self.worker.step()?;
            }
            if done(&self.worker, &self.sh) {
                return Ok(waited);
            }
            self.sh.thread_error()?;
            let t = Instant::now();
            self.sh.mesh.wait_bell(seen, None, what, &|| self.sh.thread_error(), true)?;
            waited += t.elapsed();
        }
    }

    pub(crate) fn allreduce(&mut self, contribution: &[u8], out: &mut [u8], clock: u64, slack: u64) -> Result<(Duration, u64)> {
        self.sh.in_call.store(true, Ordering::SeqCst);
        let r = self.allreduce_inner(contribution, out, clock, slack);
        self.leave_call();
        r
    }

    /// Hands the shard back to the background thread (which may have updates to serve).
    fn leave_call(&self) {
        self.sh.in_call.store(false, Ordering::SeqCst);
        if self.thread.is_some() {
            self.sh.mesh.ring(self.sh.mesh.me);
        }
    }

    fn allreduce_inner(&mut self, contribution: &[u8], out: &mut [u8], clock: u64, slack: u64) -> Result<(Duration, u64)> {
        // Take what arrived (pushes made now carry the previous clock: they hold nothing
        // newer), then add this call's contribution.
        self.shard.lock().unwrap_or_else(|p| p.into_inner()).step()?;
        self.worker.step()?;
        self.worker.clock = clock;
        self.worker.contribute(contribution)?;
        let need = clock.saturating_sub(slack);
        let waited = self.progress(&|w, _| w.age() >= need, &|| {
            format!("SSP data of clock >= {need} from every shard (clock {clock}, slack {slack})")
        })?;
        self.worker.result(out);
        let age = self.worker.age().min(clock);
        Ok((waited, age))
    }

    pub(crate) fn flush(&mut self, out: &mut [u8]) -> Result<()> {
        self.sh.in_call.store(true, Ordering::SeqCst);
        let r = self.flush_inner(out);
        self.leave_call();
        r
    }

    fn flush_inner(&mut self, out: &mut [u8]) -> Result<()> {
        self.worker.flushing = true;
        let r = self.progress(&|w, sh| w.age() == FINAL && sh.shard_done.load(Ordering::Acquire), &|| {
            "every rank to flush its SSP reduction".to_string()
        });
        r?;
        self.worker.result(out);
        Ok(())
    }
}

impl Drop for Sharded {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::Release);
        self.sh.mesh.ring(self.sh.mesh.me);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The background shard server of the Thread variants.
fn serve(shard: Arc<Mutex<Shard>>, sh: Arc<Shared>) {
    let idle = Some(Duration::from_secs(3600));
    loop {
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        let seen = sh.mesh.my_bell();
        let r = (|| -> Result<()> {
            if !sh.in_call.load(Ordering::SeqCst) {
                let mut sd = shard.lock().unwrap_or_else(|p| p.into_inner());
                while sd.step()? {}
            }
            Ok(())
        })();
        let r = r.and_then(|_| {
            sh.mesh.wait_bell_with(seen, idle, &|| "updates for this rank's SSP shard".to_string(), &|| {
                if sh.stop.load(Ordering::Acquire) {
                    Err(Error::Interrupted(String::new()))
                } else {
                    Ok(())
                }
            }, false, true)
        });
        match r {
            Ok(()) | Err(Error::Timeout { .. }) => {}
            Err(Error::Interrupted(_)) => return,
            Err(e) => {
                if !sh.stop.load(Ordering::Acquire) {
                    *sh.thread_error.lock().unwrap() = Some(e);
                    sh.mesh.ring(sh.mesh.me);
                }
                return;
            }
        }
    }
}
