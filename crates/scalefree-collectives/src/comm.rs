//! The communicator: per-rank control region, the header exchange every collective starts
//! with, and how each rank exposes its buffer to the others.
//!
//! Every collective call begins with [`Communicator::post`]: each rank writes a 128-byte
//! header (and, for small messages, the payload) into every peer's inbox and raises that
//! peer's flag to the call's sequence number. Once a rank has all headers it checks that
//! the ranks agree (kind, dtype, op, count, root, algorithm) and raises the same error on
//! every rank if not. Inboxes are double-buffered by sequence parity: a rank can only reach
//! call `s` after every peer has started call `s-1`, i.e. finished reading call `s-2`'s
//! inbox, so no acknowledgement is needed.
//!
//! Control region layout (one per rank, mapped by all):
//! ```text
//! 0     waiters (u32)          futex waiter count for every word in this region
//! 64    progress (u32)         pieces of this rank's work published (tagged with seq)
//! 128   done (u32)             last call whose buffers peers may no longer touch
//! 192   ready (u32)            staged data of this call is in place (fallback path)
//! 256   flag[s] (u32, 64 B apart)          header from rank s has arrived (= its seq)
//!       +4 ready[s], +8 done[s] (u32)      over the network: rank s's ready / done words
//! ...   inbox[s][parity] (128 B header + inline payload)
//! ```
//!
//! Over the network nothing of a peer is mapped, so a rank never polls a peer's words: the
//! ready and done signals are pushed instead, each into the sender's line of every peer's
//! flags (one empty write with a raised word per peer).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use scalefree_transport::config::env_bytes;
use scalefree_transport::wait::{publish, seq_reached};
use scalefree_transport::{Channel, Device, Error, Region, RegionHandle, RemoteRegion, Result};

use crate::reduce::{DType, ReduceOp};
use crate::Algorithm;

const OFF_WAITERS: usize = 0;
const OFF_PROGRESS: usize = 64;
const OFF_DONE: usize = 128;
const OFF_READY: usize = 192;
const OFF_FLAGS: usize = 256;
/// Over the network: offsets in a sender's 64-byte flag line of its pushed ready / done words.
const NET_READY: usize = 4;
const NET_DONE: usize = 8;
pub(crate) const HEADER_BYTES: usize = 128;

/// Tunables of a communicator. Defaults come from `SCALEFREE_*` variables (docs/config.md).
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// Payload capacity of each inbox; messages up to this size travel inline.
    pub inline_bytes: usize,
    /// `auto` uses the one-shot allreduce up to this many bytes.
    pub one_shot_max_bytes: usize,
    /// Pipelining granularity of the direct and ring algorithms.
    pub piece_bytes: usize,
    /// Ordinary (unregistered) buffers up to this size are staged through shared memory
    /// rather than read by cross-memory attach.
    pub stage_max_bytes: usize,
    /// How small allreduces travel when every peer is on another host.
    pub small_net: SmallNet,
}

/// How a small allreduce travels between hosts (one rank per host):
/// `SCALEFREE_SMALL_NET=doubling` (default) or `one_shot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallNet {
    /// Recursive doubling (`dense::doubling`): log2 N rounds of one message per rank.
    Doubling,
    /// The one-shot exchange: every rank writes to every peer, one round.
    OneShot,
}

impl SmallNet {
    fn from_env() -> SmallNet {
        match std::env::var("SCALEFREE_SMALL_NET").ok().as_deref().map(str::trim) {
            Some("one_shot") => SmallNet::OneShot,
            _ => SmallNet::Doubling,
        }
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            inline_bytes: env_bytes("SCALEFREE_INLINE_BYTES", 256 << 10),
            one_shot_max_bytes: env_bytes("SCALEFREE_ONE_SHOT_MAX", 32 << 10),
            piece_bytes: env_bytes("SCALEFREE_PIECE_BYTES", 128 << 10).max(4096),
            stage_max_bytes: env_bytes("SCALEFREE_STAGE_MAX", 4 << 20),
            small_net: SmallNet::from_env(),
        }
    }
}

/// What kind of collective a header announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Kind {
    Allreduce = 1,
    ReduceScatter = 2,
    Allgather = 3,
    Broadcast = 4,
    Barrier = 5,
    Sparse = 6,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Allreduce => "allreduce",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Allgather => "allgather",
            Kind::Broadcast => "broadcast",
            Kind::Barrier => "barrier",
            Kind::Sparse => "sparse_allreduce",
        }
    }
    fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Kind::Allreduce,
            2 => Kind::ReduceScatter,
            3 => Kind::Allgather,
            4 => Kind::Broadcast,
            5 => Kind::Barrier,
            6 => Kind::Sparse,
            _ => return None,
        })
    }
}

/// The fixed-size announcement of a collective call.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct Header {
    pub seq: u32,
    pub kind: u32,
    pub dtype: u32,
    pub op: u32,
    pub count: u64,
    pub root: u32,
    pub algo: u32,
    /// Where peers can read this rank's data: a region handle and the offset in it.
    pub handle: [u8; RegionHandle::BYTES],
    pub offset: u64,
    /// Bytes of staging this rank needs (0 when its buffer is directly addressable).
    pub staging_bytes: u64,
    /// What follows the header in the inbox: the payload as posted (0), or a summary and
    /// partial result of `dense::doubling` (`doubling::FOLLOWS_SUMMARY`).
    pub follows: u32,
    /// How a large allreduce between hosts goes: 0 all-to-all, 1 by halving and doubling
    /// (`dense::halving`; agreed like the algorithm, as it depends on each rank's settings).
    pub halving: u32,
    /// What the step between hosts carries (`dense::wire::Wire`; 0: the dtype itself).
    pub wire: u32,
    _pad: [u8; HEADER_BYTES - 100],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES);

impl Header {
    pub fn new(kind: Kind, dtype: DType, op: Option<ReduceOp>, count: usize, root: u32, algo: Algorithm) -> Self {
        Header {
            seq: 0,
            kind: kind as u32,
            dtype: dtype as u32,
            op: op.map(|o| o as u32).unwrap_or(0),
            count: count as u64,
            root,
            algo: algo as u32,
            handle: [0; RegionHandle::BYTES],
            offset: 0,
            staging_bytes: 0,
            follows: 0,
            halving: 0,
            wire: 0,
            _pad: [0; HEADER_BYTES - 100],
        }
    }

    /// The header as it travels (`#[repr(C)]`, no padding but `_pad`).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self as *const Header as *const u8, HEADER_BYTES) }
    }

    /// An all-zero header (fields filled in by the caller).
    pub fn zeroed() -> Self {
        Header::new(Kind::Barrier, DType::U8, None, 0, 0, Algorithm::Auto)
    }

    pub(crate) fn describe(&self) -> String {
        let dt = DType::from_u32(self.dtype).map(|d| d.name()).unwrap_or("?");
        let mut s = format!(
            "{} of {} {dt}",
            Kind::from_u32(self.kind).map(|k| k.name()).unwrap_or("?"),
            self.count
        );
        if let Some(op) = ReduceOp::from_u32(self.op) {
            s += &format!(" op={}", op.name());
        }
        if self.kind == Kind::Broadcast as u32 {
            s += &format!(" root={}", self.root);
        }
        if let Some(a) = Algorithm::from_u32(self.algo) {
            s += &format!(" ({}{})", a.name(), if self.halving != 0 { ", by halving between hosts" } else { "" });
        }
        if let Some(w) = crate::dense::wire::Wire::from_u32(self.wire).filter(|&w| w != crate::dense::wire::Wire::Exact) {
            s += &format!(" wire={}", w.name());
        }
        s
    }
}

/// How a peer's data for the current call is reached.
pub(crate) struct Exposed {
    pub remote: RemoteRegion,
    pub offset: usize,
}

/// A communicator over all ranks of a device: owns the control region and staging.
pub struct Communicator {
    pub(crate) dev: Device,
    pub(crate) opts: CommOptions,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) seq: u32,
    ctrl: Region,
    pub(crate) ctrls: Vec<RemoteRegion>,
    pub(crate) chans: Vec<Channel>,
    slot_bytes: usize,
    off_inbox: usize,
    /// Scratch for cross-memory-attach reads (one piece) and one-shot accumulation.
    pub(crate) scratch: Vec<u8>,
    /// Staging region for buffers peers cannot address (no CMA, not in a region).
    pub(crate) staging: Option<Region>,
    pub(crate) peer_staging: Vec<Option<RemoteRegion>>,
    /// Peers are reached over the network (nothing of theirs is mapped here): large calls
    /// go through `dense::all_to_all`, headers through one write per peer.
    pub(crate) net: bool,
    /// Landing region of `dense::landing` (grown on demand).
    pub(crate) landing: Option<crate::dense::landing::Landing>,
    /// Per-peer send buffers of the header exchange over the network.
    post_bufs: Vec<Vec<u8>>,
    /// Who takes part in the recursive doubling of small allreduces between hosts (one
    /// rank per host, or each host's first rank for the others on it), when they go so
    /// (`CommOptions::small_net`); `None` on one host, or hosts of unequal rank counts.
    pub(crate) small: Option<std::sync::Arc<crate::dense::doubling::Layout>>,
    /// Bytes of this rank's data copied into the transport's buffers to be sent: into the
    /// staging region (`stage_in`) and into header messages (inline payloads, recursive
    /// doubling). Shared with whoever reads it (`staged_counter`).
    staged: Arc<AtomicU64>,
}

impl Communicator {
    /// Collective: every rank of `dev` must call it.
    pub fn new(dev: Device, opts: CommOptions) -> Result<Self> {
        let size = dev.size();
        let rank = dev.rank();
        let slot_bytes = (HEADER_BYTES + crate::dense::doubling::SUMMARY_BYTES + opts.inline_bytes).next_multiple_of(64);
        let off_inbox = (OFF_FLAGS + size as usize * 64).next_multiple_of(4096);
        let len = off_inbox + size as usize * 2 * slot_bytes;
        let ctrl = dev.alloc_region(len)?;
        let ctrls = dev.exchange_regions(&ctrl)?;
        let chans = (0..size).map(|r| dev.channel(r)).collect::<Result<Vec<_>>>()?;
        let scratch = vec![0u8; opts.piece_bytes.max(opts.inline_bytes)];
        // A property of the whole job (every rank must decide alike): no two ranks share a
        // host, and peers are reached over the network.
        let mut hosts: Vec<u32> = (0..size).map(|r| dev.host_of(r)).collect();
        hosts.sort_unstable();
        hosts.dedup();
        let all_remote = hosts.len() == size as usize && ctrls.iter().enumerate().all(|(r, c)| r as u32 == rank || c.mapped_ptr().is_none());
        let mut c = Communicator {
            dev,
            opts,
            rank,
            size,
            seq: 0,
            net: ctrls.iter().any(|r| r.mapped_ptr().is_none()),
            small: None,
            ctrl,
            ctrls,
            chans,
            slot_bytes,
            off_inbox,
            scratch,
            staging: None,
            peer_staging: (0..size).map(|_| None).collect(),
            landing: None,
            post_bufs: (0..size).map(|_| Vec::new()).collect(),
            staged: Arc::new(AtomicU64::new(0)),
        };
        if size > 1 && c.opts.small_net == SmallNet::Doubling {
            c.small = if all_remote {
                Some(crate::dense::doubling::Layout::flat(size))
            } else if c.net {
                crate::dense::hierarchical::host_groups(&c).map(|g| crate::dense::doubling::Layout::by_host(rank, &g))
            } else {
                None
            }
            .map(std::sync::Arc::new);
        }
        Ok(c)
    }

    /// The running count of bytes this rank copied into the transport's buffers to send
    /// them (see the field `staged`); readable while a call is in progress.
    pub fn staged_counter(&self) -> Arc<AtomicU64> {
        self.staged.clone()
    }

    /// Adds `n` bytes to the count of staged bytes.
    pub(crate) fn count_staged(&self, n: usize) {
        if n > 0 {
            self.staged.fetch_add(n as u64, AtomicOrdering::Relaxed);
        }
    }

    /// Small allreduces go by recursive doubling (`dense::doubling`) rather than the
    /// one-shot exchange: peers are on other hosts, on hosts of equal rank counts, and
    /// `small_net` allows it.
    pub(crate) fn doubling(&self) -> bool {
        self.small.is_some()
    }

    /// Whether peers are reached over the network (UCX) rather than shared memory.
    pub fn is_networked(&self) -> bool {
        self.net
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn size(&self) -> u32 {
        self.size
    }
    pub fn device(&self) -> &Device {
        &self.dev
    }
    pub fn options(&self) -> &CommOptions {
        &self.opts
    }

    fn ctrl_ptr(&self, rank: u32) -> *mut u8 {
        if rank == self.rank {
            return self.ctrl.as_ptr();
        }
        self.ctrls[rank as usize].mapped_ptr().expect("control regions are shared memory")
    }
    pub(crate) fn word(&self, rank: u32, off: usize) -> &AtomicU32 {
        unsafe { &*(self.ctrl_ptr(rank).add(off) as *const AtomicU32) }
    }
    pub(crate) fn waiters(&self, rank: u32) -> &AtomicU32 {
        self.word(rank, OFF_WAITERS)
    }
    pub(crate) fn progress(&self, rank: u32) -> &AtomicU32 {
        self.word(rank, OFF_PROGRESS)
    }
    fn done_word(&self, rank: u32) -> &AtomicU32 {
        self.word(rank, OFF_DONE)
    }
    fn flag(&self, receiver: u32, sender: u32) -> &AtomicU32 {
        self.word(receiver, OFF_FLAGS + sender as usize * 64)
    }
    fn inbox_off(&self, sender: u32, seq: u32) -> usize {
        self.off_inbox + (sender as usize * 2 + (seq & 1) as usize) * self.slot_bytes
    }
    /// The inline payload rank `sender` posted to this rank in the current call.
    pub(crate) fn inbox_payload(&self, sender: u32) -> *const u8 {
        unsafe { self.ctrl_ptr(self.rank).add(self.inbox_off(sender, self.seq) + HEADER_BYTES) }
    }

    /// Peers in the order this rank visits them (starting after itself spreads the load).
    pub(crate) fn peers(&self) -> impl Iterator<Item = u32> + '_ {
        (1..self.size).map(move |i| (self.rank + i) % self.size)
    }

    /// Starts a call: sends `hdr` (plus `payload(peer)`, inline) to every peer, then waits
    /// for every peer's header and checks that they agree. Returns all headers by rank.
    pub(crate) fn post(
        &mut self,
        mut hdr: Header,
        payload: &dyn Fn(u32) -> (*const u8, usize),
    ) -> Result<Vec<Header>> {
        let seq = self.next_seq();
        hdr.seq = seq;
        let me = self.rank;
        let peers: Vec<u32> = self.peers().collect();
        let mut sends = Vec::new();
        if self.net {
            // One write per peer: header and payload together, raising our flag there.
            for &p in &peers {
                let (ptr, n) = payload(p);
                let data = if n > 0 { unsafe { std::slice::from_raw_parts(ptr, n) } } else { &[][..] };
                self.count_staged(n);
                sends.push(unsafe { self.send_inbox(p, seq, &[hdr.as_bytes(), data])? });
            }
        }
        for &p in peers.iter().filter(|_| !self.net) {
            let (ptr, n) = payload(p);
            debug_assert!(n <= self.opts.inline_bytes);
            self.count_staged(n);
            let off = self.inbox_off(me, seq);
            let ch = &self.chans[p as usize];
            let dst = &self.ctrls[p as usize];
            unsafe {
                ch.write_from(ptr, dst, off + HEADER_BYTES, n)?;
                ch.write_from(&hdr as *const Header as *const u8, dst, off, HEADER_BYTES)?;
            }
            publish(self.flag(p, me), self.waiters(p), seq);
        }
        let mut headers = vec![hdr; self.size as usize];
        for &q in &peers {
            headers[q as usize] = self.await_small(q)?;
        }
        for c in sends {
            c.wait()?;
        }
        // Everyone compares everyone, so every rank raises the same error.
        // `follows`: a rank that started this call by `dense::doubling` took another path.
        let key = |h: &Header| (h.kind, h.dtype, h.op, h.count, h.root, h.algo, h.follows, h.halving, h.wire);
        if let Some(bad) = headers.iter().position(|h| key(h) != key(&headers[0])) {
            let (a, b) = (headers[0].describe(), headers[bad].describe());
            let why = if a == b { " (SCALEFREE_SMALL_NET differs between them)" } else { "" };
            return Err(Error::Mismatch(format!("rank 0 called {a} but rank {bad} called {b}{why}")));
        }
        Ok(headers)
    }

    /// Starts a call: its sequence number (never 0).
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        if self.seq == 0 {
            self.seq = 1;
        }
        self.seq
    }

    /// Over the network: writes `parts` one after the other (a header and what follows it)
    /// into this rank's inbox at `peer` for call `seq` and raises this rank's flag there, as
    /// one write from `peer`'s send buffer.
    ///
    /// # Safety
    /// The completion of the previous `send_inbox` to `peer` must be done (its buffer is
    /// reused), and this one's before the next.
    pub(crate) unsafe fn send_inbox(&mut self, peer: u32, seq: u32, parts: &[&[u8]]) -> Result<scalefree_transport::Completion> {
        let mut msg = std::mem::take(&mut self.post_bufs[peer as usize]);
        msg.clear();
        for p in parts {
            msg.extend_from_slice(p);
        }
        debug_assert!(msg.len() <= self.slot_bytes);
        let off = self.inbox_off(self.rank, seq);
        let r = unsafe {
            self.chans[peer as usize].start_write_raise(msg.as_ptr(), &self.ctrls[peer as usize], off, msg.len(), OFF_FLAGS + self.rank as usize * 64, seq)
        };
        // Moving the vector back leaves its bytes where the write reads them.
        self.post_bufs[peer as usize] = msg;
        r
    }

    /// Waits until `peer`'s message of the current call is in this rank's inbox; returns
    /// its header. A latency-bound message (a small call's): from another host this thread
    /// reads it itself (`Device::wait_from`).
    pub(crate) fn await_small(&self, peer: u32) -> Result<Header> {
        let (me, seq) = (self.rank, self.seq);
        let what = || format!("rank {peer} to start collective call #{seq}");
        self.dev.wait_from(peer, self.flag(me, peer), self.waiters(me), |v| seq_reached(v, seq), &what)?;
        Ok(unsafe { std::ptr::read_volatile(self.inbox_ptr(peer) as *const Header) })
    }

    /// Start of `peer`'s message of the current call in this rank's inbox.
    pub(crate) fn inbox_ptr(&self, peer: u32) -> *const u8 {
        unsafe { self.ctrl_ptr(self.rank).add(self.inbox_off(peer, self.seq)) }
    }

    /// How peers will reach `len` bytes at `ptr` on this rank: the registered region that
    /// contains it, the process memory itself (cross-memory attach), or neither (staging).
    pub(crate) fn expose(&self, hdr: &mut Header, ptr: *const u8, len: usize) {
        self.expose_with(hdr, ptr, len, usize::MAX)
    }

    /// Like `expose`, but ordinary memory of at most `stage_max` bytes is staged even when
    /// cross-memory attach works: for cache-resident sizes plain loads from a mapped peer
    /// beat a system call per piece.
    pub(crate) fn expose_with(&self, hdr: &mut Header, ptr: *const u8, len: usize, stage_max: usize) {
        if let Some((region, off)) = self.dev.find_region(ptr, len) {
            hdr.handle = region.handle().to_bytes();
            hdr.offset = off as u64;
        } else if self.dev.cma_everywhere() && len > stage_max {
            hdr.handle = self.dev.process_handle(ptr, len).to_bytes();
            hdr.offset = 0;
        } else {
            hdr.staging_bytes = len as u64;
        }
    }

    /// After `post`: grows staging regions collectively where any rank needs more, and
    /// returns how to reach each rank's data (None for this rank).
    pub(crate) fn resolve(&mut self, headers: &[Header]) -> Result<Vec<Option<Exposed>>> {
        let grow = headers.iter().enumerate().any(|(r, h)| {
            h.staging_bytes > 0
                && self.peer_staging[r].as_ref().map(|s| (s.len() as u64) < h.staging_bytes).unwrap_or(true)
        });
        if grow {
            let need = headers[self.rank as usize].staging_bytes as usize;
            let have = self.staging.as_ref().map(|s| s.len()).unwrap_or(0);
            if need > have || self.staging.is_none() {
                self.staging = Some(self.dev.alloc_region(need.max(have).max(4096))?);
            }
            let all = self.dev.exchange_regions(self.staging.as_ref().unwrap())?;
            self.peer_staging = all.into_iter().map(Some).collect();
        }
        let mut out = Vec::with_capacity(headers.len());
        for (r, h) in headers.iter().enumerate() {
            if r as u32 == self.rank || (h.staging_bytes == 0 && h.handle == [0; RegionHandle::BYTES]) {
                // This rank, or a rank that exposes nothing in this call.
                out.push(None);
            } else if h.staging_bytes > 0 {
                out.push(Some(Exposed { remote: self.peer_staging[r].clone().unwrap(), offset: 0 }));
            } else {
                let handle = RegionHandle::from_bytes(&h.handle)?;
                out.push(Some(Exposed { remote: self.dev.attach(&handle)?, offset: h.offset as usize }));
            }
        }
        Ok(out)
    }

    /// Ends a call whose buffers peers read directly: publish that this rank is done with
    /// everybody's buffers, then wait until every peer is done with ours.
    pub(crate) fn finish(&self) -> Result<()> {
        let seq = self.seq;
        let me = self.rank;
        if self.net {
            self.push_word(NET_DONE, seq)?;
        } else {
            publish(self.done_word(me), self.waiters(me), seq);
        }
        for q in self.peers() {
            let what = || format!("rank {q} to finish collective call #{seq}");
            let (w, waiters) = if self.net { (self.pushed(q, NET_DONE), self.waiters(me)) } else { (self.done_word(q), self.waiters(q)) };
            self.dev.wait_word(w, waiters, |v| seq_reached(v, seq), &what)?;
        }
        Ok(())
    }

    /// Over the network: raises this rank's word at `rel` of its flag line in every peer's
    /// control region to `value` (an empty write each), returning once all are sent.
    fn push_word(&self, rel: usize, value: u32) -> Result<()> {
        let me = self.rank as usize;
        let mut sends = Vec::new();
        for p in self.peers() {
            let ch = &self.chans[p as usize];
            let src = std::ptr::NonNull::<u8>::dangling().as_ptr();
            sends.push(unsafe { ch.start_write_raise(src, &self.ctrls[p as usize], OFF_FLAGS, 0, OFF_FLAGS + me * 64 + rel, value)? });
        }
        for c in sends {
            c.wait()?;
        }
        Ok(())
    }

    /// Over the network: the word at `rel` of rank `q`'s flag line here (pushed by `q`).
    fn pushed(&self, q: u32, rel: usize) -> &AtomicU32 {
        self.word(self.rank, OFF_FLAGS + q as usize * 64 + rel)
    }

    /// Staged exposure only: this rank's staging region now holds the call's data.
    pub(crate) fn publish_ready(&self) -> Result<()> {
        let me = self.rank;
        if self.net {
            return self.push_word(NET_READY, self.seq);
        }
        publish(self.word(me, OFF_READY), self.waiters(me), self.seq);
        Ok(())
    }

    /// Waits until rank `q`'s staged data for this call is in place.
    pub(crate) fn wait_ready(&self, q: u32) -> Result<()> {
        let seq = self.seq;
        let what = || format!("rank {q} to stage its data for call #{seq}");
        let (w, waiters) = if self.net { (self.pushed(q, NET_READY), self.waiters(self.rank)) } else { (self.word(q, OFF_READY), self.waiters(q)) };
        self.dev.wait_word(w, waiters, |v| seq_reached(v, seq), &what)?;
        Ok(())
    }

    /// The local pointer peers read this rank's data from: the buffer itself, or the
    /// staging region after copying the byte `ranges` peers will read into it (and
    /// announcing that).
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes.
    pub(crate) unsafe fn stage_in(&self, my_hdr: &Header, ptr: *const u8, ranges: &[(usize, usize)]) -> Result<*mut u8> {
        if my_hdr.staging_bytes == 0 {
            return Ok(ptr as *mut u8);
        }
        let st = self.staging.as_ref().expect("resolve allocated staging").as_ptr();
        for &(a, b) in ranges {
            if b > a {
                unsafe { std::ptr::copy_nonoverlapping(ptr.add(a), st.add(a), b - a) };
                self.count_staged(b - a);
            }
        }
        self.publish_ready()?;
        Ok(st)
    }

    /// Before reading rank `q`'s data: waits for it if it is staged.
    pub(crate) fn await_peer_data(&self, headers: &[Header], q: u32) -> Result<()> {
        if headers[q as usize].staging_bytes > 0 {
            self.wait_ready(q)?;
        }
        Ok(())
    }

    /// Tag for progress words: low 24 bits count (at most [`PROGRESS_MAX`]), high 8 bits
    /// the call's sequence.
    #[inline]
    pub(crate) fn progress_tag(&self, count: u32) -> u32 {
        ((self.seq & 0xff) << 24) | (count & 0x00ff_ffff)
    }

    pub(crate) fn publish_progress(&self, count: u32) {
        let me = self.rank;
        publish(self.progress(me), self.waiters(me), self.progress_tag(count));
    }

    /// Whether rank `q` has published at least `count` pieces in this call (no wait).
    pub(crate) fn progress_reached(&self, q: u32, count: u32) -> bool {
        let v = self.progress(q).load(std::sync::atomic::Ordering::Acquire);
        (v & 0xff00_0000) == (self.seq & 0xff) << 24 && (v & 0x00ff_ffff) >= count
    }

    /// Waits until rank `q` has published at least `count` pieces in this call.
    pub(crate) fn wait_progress(&self, q: u32, count: u32) -> Result<u32> {
        let tag_hi = (self.seq & 0xff) << 24;
        let seq = self.seq;
        let what = || format!("rank {q} to reduce piece {count} of call #{seq}");
        let v = self.dev.wait_word(
            self.progress(q),
            self.waiters(q),
            |v| (v & 0xff00_0000) == tag_hi && (v & 0x00ff_ffff) >= count,
            &what,
        )?;
        Ok(v & 0x00ff_ffff)
    }

    /// Pipelining granularity for `es`-byte elements: `piece_bytes` rounded to whole
    /// cache-line-aligned element groups (the chunk-boundary alignment), enlarged where
    /// `rounds` rounds of pieces of a `chunk_bytes` chunk would count past the progress
    /// words' 24 bits (see [`piece_within`]). Every rank passes the same values. Sizes the
    /// scratch buffer for a piece.
    pub(crate) fn piece_len(&mut self, es: usize, chunk_bytes: usize, rounds: usize) -> usize {
        let group = es * crate::dense::ALIGN_ELEMS;
        let piece = piece_within((self.opts.piece_bytes / group).max(1) * group, group, chunk_bytes, rounds);
        if self.scratch.len() < piece {
            self.scratch.resize(piece, 0);
        }
        piece
    }

    /// `n` bytes of rank `q`'s exposed data at `off`, readable here: a pointer into the
    /// peer's mapping, or `scratch` after one cross-memory-attach read into it.
    ///
    /// # Safety
    /// `scratch` must be valid for `n` bytes and not in use by the caller.
    pub(crate) unsafe fn peer_bytes(&self, q: u32, src: &Exposed, off: usize, n: usize, scratch: *mut u8) -> Result<*const u8> {
        match src.remote.mapped_ptr() {
            Some(p) => Ok(unsafe { p.add(src.offset + off) }),
            None => {
                unsafe { self.read_peer(q, src, off, scratch, n)? };
                Ok(scratch)
            }
        }
    }

    /// Writes `n` bytes from `src` into rank `q`'s exposed buffer at `off`.
    ///
    /// # Safety
    /// `src` must be valid for `n` bytes.
    pub(crate) unsafe fn write_peer(&self, q: u32, dst: &Exposed, off: usize, src: *const u8, n: usize) -> Result<()> {
        unsafe { self.chans[q as usize].write_from(src, &dst.remote, dst.offset + off, n) }
    }

    /// Reads `n` bytes of rank `q`'s exposed data at `off` into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes.
    pub(crate) unsafe fn read_peer(&self, q: u32, src: &Exposed, off: usize, dst: *mut u8, n: usize) -> Result<()> {
        unsafe { self.chans[q as usize].read_into(&src.remote, src.offset + off, dst, n) }
    }
}

/// Pieces a progress word counts: its low 24 bits (the high 8 carry the call's sequence).
pub(crate) const PROGRESS_MAX: usize = 0x00ff_ffff;

/// `piece` (a multiple of `group`), or the least multiple of `group` above it with which
/// `rounds` rounds of a `chunk_bytes` chunk's pieces count at most [`PROGRESS_MAX`]: the
/// count stays exact for chunks of any size (at the default 128 KiB pieces this takes
/// chunks of terabytes; the progress counts would wrap otherwise).
pub(crate) fn piece_within(piece: usize, group: usize, chunk_bytes: usize, rounds: usize) -> usize {
    let per_round = (PROGRESS_MAX / rounds.max(1)).max(1);
    piece.max(chunk_bytes.div_ceil(per_round).div_ceil(group) * group)
}

#[cfg(test)]
mod piece_tests {
    use super::*;

    /// Chunks past 2^32 bytes and pieces past 2^24: the count of every round fits 24 bits.
    #[test]
    fn pieces_of_huge_chunks_count_within_24_bits() {
        let group = 4 * crate::dense::ALIGN_ELEMS;
        let default = 128 << 10;
        for chunk in [0usize, 1, 5 << 30, 1 << 41, (3 << 42) + 7, usize::MAX / 2] {
            for rounds in [1usize, 2, 14, 62, 1 << 12] {
                let p = piece_within(default, group, chunk, rounds);
                assert!(p >= default && p % group == 0);
                assert!(chunk.div_ceil(p) * rounds <= PROGRESS_MAX, "{chunk} bytes, {rounds} rounds: piece {p}");
                if chunk.div_ceil(default) * rounds <= PROGRESS_MAX {
                    assert_eq!(p, default, "unchanged where the count fits");
                }
            }
        }
        // 2 TiB chunks over 1 round fit 2^24 pieces of 128 KiB exactly; one more byte doesn't.
        assert_eq!(piece_within(default, group, PROGRESS_MAX * default, 1), default);
        assert_eq!(piece_within(default, group, PROGRESS_MAX * default + 1, 1), default + group);
    }
}
