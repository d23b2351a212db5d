//! Large collectives when peers are on other hosts (UCX): nothing of a peer is mapped
//! here, so data moves only by one-sided writes *into* peers' landing regions, each
//! raising a per-piece word at the target once the piece has landed.
//!
//! Allreduce is reduce-scatter then allgather, written all-to-all (each rank sends chunk
//! `q` of its buffer to rank `q`, which owns it), pipelined in pieces: a rank reduces a
//! piece of its chunk as soon as every peer's copy of it has landed, and forwards the
//! result to every peer at once. Bytes sent per rank: `2 (N-1)/N · n`, as a ring, in two
//! steps instead of `2 (N-1)`, which matters when every step pays a network latency.
//!
//! With several ranks per host the allreduce is hierarchical ([`hierarchical`]): reduce-scatter
//! within the host over shared memory, an allreduce of each rank's share with the ranks of
//! the same local index on the other hosts, and an allgather within the host. Every rank
//! carries `1/L` of the traffic between hosts, so each host sends its data once.
//!
//! The landing region (grown collectively when a larger call comes):
//! ```text
//! 0                          words[area][sender][piece] (u32, = call seq)
//! flags_delta                flags[area][sender][piece] (u32, = call seq: landed direct)
//! words_len + a*n*chunk_cap  area a: sender s's pieces at s * chunk_cap
//! ```
//! Direct landing: while a call gathers reduced pieces (allgather areas 1 and 3), the
//! transport is asked to receive peers' writes to those areas straight into the caller's
//! buffer where it can (TCP lanes: `Device::set_direct`), which saves copying them out of the
//! landing region; such a piece's flag word holds the call's sequence, any other piece is
//! copied as before. Writing into the caller's buffer early is safe: rank `q`'s reduced piece
//! `k` exists only after `q` received this rank's piece `k` of the same bytes, so that source
//! is no longer read. `SCALEFREE_DIRECT_LANDING=0` turns it off.
//! **Reduction on arrival**: the first peer's pieces of this rank's chunk (area 0; area 2 in
//! the hierarchical allreduce) are read off the lane in cache-sized parts and reduced into the
//! caller's buffer at once (`Window::reduce`), so they never pass through the landing region
//! (a write and a read of `n/N` bytes of memory fewer per rank); their flag words tell the
//! owner the piece is reduced already. Only the first peer's: the owner reduces the others'
//! after it, in peer order as before, so results stay bit-identical to reducing in that order.
//! `SCALEFREE_REDUCE_ON_ARRIVAL=0` turns it off.
//! Areas: 0 reduce-scatter, 1 allgather; the hierarchical allreduce adds 2 and 3 for its
//! reduce-scatter and allgather between hosts.
//! Reuse is safe without acknowledgements because every call starts with the all-to-all
//! header exchange: no rank writes call `s+1`'s data before every rank entered call `s+1`,
//! i.e. finished reading call `s`'s.

use scalefree_transport::{Reducer, Window};
use scalefree_transport::{Completion, Region, RemoteRegion, Result};

use crate::comm::Communicator;
use crate::dense::{chunk_bounds, share_bounds, ALIGN_ELEMS};
use crate::reduce::{reduce_into, DType, ReduceOp};

/// At most this many pieces per chunk (bounds the word area).
const MAX_PIECES: usize = 256;

/// The landing region of this rank and every peer's.
pub(crate) struct Landing {
    region: Region,
    remotes: Vec<RemoteRegion>,
    chunk_cap: usize,
}

/// Landing areas (see the module comment).
const AREAS: usize = 4;

/// Bytes from a piece's word to its direct-landing flag.
fn flags_delta(n: usize) -> usize {
    AREAS * n * MAX_PIECES * 4
}

fn words_len(n: usize) -> usize {
    (2 * flags_delta(n)).next_multiple_of(4096)
}

/// Whether gathered pieces may land straight in the caller's buffer (see the module comment).
pub(super) fn direct_landing_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| scalefree_transport::config::env_switch("SCALEFREE_DIRECT_LANDING"))
}

/// Whether the first peer's reduce-scatter pieces are reduced into the caller's buffer as
/// they are read off the network (see the module comment).
pub(super) fn reduce_on_arrival_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| scalefree_transport::config::env_switch("SCALEFREE_REDUCE_ON_ARRIVAL"))
}

/// A reduce-scatter area whose pieces from rank `from` are reduced into `dst` (this rank's
/// share, `len` bytes) as they arrive.
struct Reducing {
    area: usize,
    from: u32,
    dst: *mut u8,
    len: usize,
    dtype: DType,
    op: ReduceOp,
}

/// What a reducing window applies to each part that arrives.
pub(super) fn reducer(dtype: DType, op: ReduceOp) -> Reducer {
    let es = dtype.size_bytes();
    std::sync::Arc::new(move |d, src, bytes| unsafe { reduce_into(dtype, op, d, src, bytes / es) })
}

/// Direct landing in force until dropped (also when a call fails: the transport stops
/// writing into the caller's buffer before the call returns).
pub(super) struct DirectLanding {
    dev: scalefree_transport::Device,
    /// The reduce-scatter area that reduces on arrival, if one does.
    reduces: Option<usize>,
}

impl Drop for DirectLanding {
    fn drop(&mut self) {
        self.dev.clear_direct();
    }
}

/// Bytes of the largest of the `n` chunks ([`chunk_bounds`]) of `count` elements of `es` bytes.
pub(super) fn largest_chunk(count: usize, n: u32, es: usize) -> usize {
    (0..n).map(|q| chunk_bounds(count, n, q, ALIGN_ELEMS)).map(|(a, b)| (b - a) * es).max().unwrap_or(0)
}

/// How a chunk of `bytes` is cut into pieces: (piece bytes, number of pieces).
pub(super) fn pieces(bytes: usize, piece: usize, es: usize) -> (usize, usize) {
    let group = es * ALIGN_ELEMS;
    let p = piece.max(bytes.div_ceil(MAX_PIECES)).div_ceil(group).max(1) * group;
    (p, bytes.div_ceil(p))
}

impl Communicator {
    /// Makes sure every rank's landing region holds chunks of `chunk_bytes`. Collective:
    /// every rank calls it with the same value (derived from the agreed header).
    pub(super) fn landing(&mut self, chunk_bytes: usize) -> Result<&Landing> {
        let n = self.size as usize;
        if self.landing.as_ref().is_none_or(|l| l.chunk_cap < chunk_bytes) {
            let cap = chunk_bytes.max(1 << 20).next_multiple_of(4096);
            let region = self.dev.alloc_region(words_len(n) + AREAS * n * cap)?;
            let remotes = self.dev.exchange_regions(&region)?;
            self.landing = Some(Landing { region, remotes, chunk_cap: cap });
        }
        Ok(self.landing.as_ref().unwrap())
    }

    pub(super) fn net_piece_bytes(&self) -> usize {
        (self.opts.piece_bytes * 4).max(64 << 10)
    }

    /// Waits until word `off` of this rank's landing region reaches this call's sequence.
    pub(super) fn wait_landed(&self, off: usize, what: &dyn Fn() -> String) -> Result<()> {
        let l = self.landing.as_ref().unwrap();
        let w = unsafe { &*(l.region.as_ptr().add(off) as *const std::sync::atomic::AtomicU32) };
        let seq = self.seq;
        self.dev.wait_word(w, self.waiters(self.rank), |v| v != 0 && scalefree_transport::wait::seq_reached(v, seq), what)?;
        Ok(())
    }

    /// Sends `n` bytes at `src` into this rank's slot of rank `q`'s landing area `area` at
    /// `off`, raising word (area, this rank, `piece`).
    unsafe fn send_piece(&self, q: u32, src: *const u8, n: usize, area: usize, off: usize, piece: usize) -> Result<Completion> {
        unsafe { self.send_at(q, src, n, area, self.slot(self.rank) + off, piece) }
    }

    /// Where sender `s`'s slot starts in a landing area.
    fn slot(&self, s: u32) -> usize {
        s as usize * self.landing.as_ref().unwrap().chunk_cap
    }

    /// Sends `bytes` at `src` to rank `q`'s landing area `area` from byte `at` on, in pieces
    /// (piece `k` raising word (area, this rank, `k`)); returns their completions.
    pub(super) unsafe fn send_pieces(&self, q: u32, src: *const u8, bytes: usize, area: usize, at: usize, es: usize) -> Result<Vec<Completion>> {
        let (p, np) = pieces(bytes, self.net_piece_bytes(), es);
        (0..np).map(|k| unsafe { self.send_at(q, src.add(k * p), p.min(bytes - k * p), area, at + k * p, k) }).collect()
    }

    /// Offset in the landing region of area `area`'s first byte (each area holds `size`
    /// chunks of the region's chunk capacity).
    pub(super) fn area_base(&self, area: usize) -> usize {
        let l = self.landing.as_ref().unwrap();
        words_len(self.size as usize) + area * self.size as usize * l.chunk_cap
    }

    /// Sends `n` bytes at `src` into rank `q`'s landing area `area` at `at` bytes from the
    /// area's start (not a per-sender slot: the caller keeps senders apart), raising word
    /// (area, this rank, `piece`).
    pub(super) unsafe fn send_at(&self, q: u32, src: *const u8, n: usize, area: usize, at: usize, piece: usize) -> Result<Completion> {
        let l = self.landing.as_ref().unwrap();
        let word = self.landed_word(area, self.rank, piece);
        unsafe { self.chans[q as usize].start_write_raise(src, &l.remotes[q as usize], self.area_base(area) + at, n, word, self.seq) }
    }

    /// Local address of byte `at` of this rank's landing area `area`.
    pub(super) fn landed_at(&self, area: usize, at: usize) -> *const u8 {
        unsafe { self.landing.as_ref().unwrap().region.as_ptr().add(self.area_base(area) + at) }
    }

    /// Sets the direct-landing windows (see [`Self::direct_landing`]), replacing those of
    /// `guard` if it holds some; `guard` ends them when dropped (`None` without lanes).
    ///
    /// # Safety
    /// As [`scalefree_transport::Device::set_direct`].
    pub(super) unsafe fn set_windows(&self, windows: &[Window], reduces: Option<usize>, guard: &mut Option<DirectLanding>) {
        let l = self.landing.as_ref().unwrap();
        if unsafe { self.dev.set_direct(&l.region, windows, flags_delta(self.size as usize)) } {
            match guard {
                Some(g) => g.reduces = reduces,
                None => *guard = Some(DirectLanding { dev: self.dev.clone(), reduces }),
            }
        }
    }

    /// Local address of sender `s`'s data in this rank's landing area `area` at `off`.
    fn landed(&self, area: usize, s: u32, off: usize) -> *const u8 {
        self.landed_at(area, self.slot(s) + off)
    }

    pub(super) fn landed_word(&self, area: usize, s: u32, piece: usize) -> usize {
        ((area * self.size as usize + s as usize) * MAX_PIECES + piece) * 4
    }

    /// Asks for direct landing of what each sender `q` of `parts` `(q, at, len)` writes into
    /// area `area`: straight to `buf + at`, `len` bytes; and, with `reducing`, for reduction
    /// on arrival of one sender's pieces. Must be called after [`Self::landing`] for
    /// this call; pieces a peer sent before it are landed (and copied, or reduced) as usual.
    ///
    /// # Safety
    /// Each `buf + at .. + len`, and `reducing`'s destination, must stay valid and not be
    /// touched by this rank (but for reading a reduced piece) until the returned guard is
    /// dropped.
    unsafe fn direct_landing(&self, area: usize, parts: &[(u32, usize, usize)], buf: *mut u8, reducing: Option<Reducing>) -> Option<DirectLanding> {
        let base = |area: usize, q: u32| self.area_base(area) + self.slot(q);
        let mut windows: Vec<Window> = Vec::new();
        if direct_landing_on() {
            windows.extend(parts.iter().map(|&(q, at, len)| Window { offset: base(area, q), len, dst: unsafe { buf.add(at) }, reduce: None }));
        }
        let reduces = reducing.filter(|_| reduce_on_arrival_on()).map(|r| {
            windows.push(Window { offset: base(r.area, r.from), len: r.len, dst: r.dst, reduce: Some(reducer(r.dtype, r.op)) });
            r.area
        });
        if windows.is_empty() {
            return None;
        }
        let mut guard = None;
        unsafe { self.set_windows(&windows, reduces, &mut guard) };
        guard
    }

    /// Whether sender `s`'s reduce-scatter piece `piece` (landed already) was reduced as it
    /// arrived, under `direct`: then there is nothing left to reduce.
    pub(super) fn reduced_on_arrival(&self, direct: &Option<DirectLanding>, s: u32, piece: usize) -> bool {
        direct.as_ref().and_then(|d| d.reduces).is_some_and(|area| self.landed_direct(area, s, piece))
    }

    /// Whether sender `s`'s piece `piece` of area `area` (landed already) was received
    /// straight into the caller's buffer in this call.
    pub(super) fn landed_direct(&self, area: usize, s: u32, piece: usize) -> bool {
        let l = self.landing.as_ref().unwrap();
        let off = self.landed_word(area, s, piece) + flags_delta(self.size as usize);
        let w = unsafe { &*(l.region.as_ptr().add(off) as *const std::sync::atomic::AtomicU32) };
        w.load(std::sync::atomic::Ordering::Acquire) == self.seq
    }
}

pub(super) fn wait_all(pending: Vec<Completion>) -> Result<()> {
    for c in pending {
        c.wait()?;
    }
    Ok(())
}

/// Allreduce of `count` elements at `buf` after the header exchange of this call: the
/// group allreduce over every rank (rank `q` owns chunk `q`).
///
/// # Safety
/// `buf` valid for `count` elements of `dtype`.
pub(crate) unsafe fn allreduce(c: &mut Communicator, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
    c.landing(largest_chunk(count, c.size, dtype.size_bytes()))?;
    let all: Vec<u32> = (0..c.size).collect();
    unsafe { group_allreduce(c, &all, buf, 0, count, dtype, op, (0, 1), false) }.map(|_| ())
}

/// Reduce-scatter of `count` elements at `input` into this rank's share at `out`.
///
/// # Safety
/// `input` valid for `count` elements, `out` for the share.
pub(crate) unsafe fn reduce_scatter(c: &mut Communicator, input: *const u8, count: usize, out: *mut u8, dtype: DType, op: ReduceOp) -> Result<()> {
    let es = dtype.size_bytes();
    let n = c.size;
    let me = c.rank;
    let share = |q: u32| share_bounds(count, n, q);
    let cap = (0..n).map(|q| (share(q).1 - share(q).0) * es).max().unwrap_or(0);
    c.landing(cap)?;
    let piece = c.net_piece_bytes();
    let peers: Vec<u32> = c.peers().collect();
    let mut sent = Vec::new();
    for &q in &peers {
        let (a, b) = share(q);
        sent.extend(unsafe { c.send_pieces(q, input.add(a * es), (b - a) * es, 0, c.slot(me), es)? });
    }
    let (a, b) = share(me);
    let bytes = (b - a) * es;
    unsafe { std::ptr::copy(input.add(a * es), out, bytes) };
    let (p, np) = pieces(bytes, piece, es);
    for k in 0..np {
        let off = k * p;
        let len = p.min(bytes - off);
        for &q in &peers {
            let seq = c.seq;
            c.wait_landed(c.landed_word(0, q, k), &|| format!("rank {q}'s piece {k} of reduce_scatter call #{seq}"))?;
            unsafe { reduce_into(dtype, op, out.add(off), c.landed(0, q, off), len / es) };
        }
    }
    wait_all(sent)
}

/// Allgather: `nbytes` at `mine` (this rank's slot of `out`) to every rank's `out`.
///
/// # Safety
/// `out` valid for `size * nbytes` bytes.
pub(crate) unsafe fn allgather(c: &mut Communicator, mine: *const u8, nbytes: usize, out: *mut u8, es: usize) -> Result<()> {
    c.landing(nbytes)?;
    let piece = c.net_piece_bytes();
    let peers: Vec<u32> = c.peers().collect();
    let (p, np) = pieces(nbytes, piece, es);
    let mut sent = Vec::new();
    for k in 0..np {
        let off = k * p;
        for &q in &peers {
            sent.push(unsafe { c.send_piece(q, mine.add(off), p.min(nbytes - off), 1, off, k)? });
        }
    }
    for &q in &peers {
        for k in 0..np {
            let off = k * p;
            let seq = c.seq;
            c.wait_landed(c.landed_word(1, q, k), &|| format!("rank {q}'s piece {k} of allgather call #{seq}"))?;
            unsafe { std::ptr::copy_nonoverlapping(c.landed(1, q, off), out.add(q as usize * nbytes + off), p.min(nbytes - off)) };
        }
    }
    wait_all(sent)
}

/// Broadcast of `nbytes` at `buf` from `root`.
///
/// # Safety
/// `buf` valid for `nbytes` bytes.
pub(crate) unsafe fn broadcast(c: &mut Communicator, buf: *mut u8, nbytes: usize, root: u32, es: usize) -> Result<()> {
    c.landing(nbytes)?;
    let piece = c.net_piece_bytes();
    let (p, np) = pieces(nbytes, piece, es);
    if c.rank == root {
        let peers: Vec<u32> = c.peers().collect();
        let mut sent = Vec::new();
        for k in 0..np {
            let off = k * p;
            for &q in &peers {
                sent.push(unsafe { c.send_piece(q, buf.add(off), p.min(nbytes - off), 1, off, k)? });
            }
        }
        return wait_all(sent);
    }
    for k in 0..np {
        let off = k * p;
        let seq = c.seq;
        c.wait_landed(c.landed_word(1, root, k), &|| format!("rank {root}'s piece {k} of broadcast call #{seq}"))?;
        unsafe { std::ptr::copy_nonoverlapping(c.landed(1, root, off), buf.add(off), p.min(nbytes - off)) };
    }
    Ok(())
}

/// The hierarchical plan of this job, if it has one: (ranks of this host, ranks with this
/// rank's local index on every host), both in rank order. Needs more than one host and the
/// same number (more than one) of ranks on each.
pub(crate) fn host_groups(c: &Communicator) -> Option<(Vec<u32>, Vec<u32>)> {
    let dev = c.device();
    let n = c.size;
    let mine = dev.host_of(c.rank);
    let local: Vec<u32> = (0..n).filter(|&r| dev.host_of(r) == mine).collect();
    let mut hosts: Vec<u32> = (0..n).map(|r| dev.host_of(r)).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let l = local.len();
    if hosts.len() < 2 || l < 2 || hosts.iter().any(|&h| (0..n).filter(|&r| dev.host_of(r) == h).count() != l) {
        return None;
    }
    let idx = local.iter().position(|&r| r == c.rank).unwrap();
    let cross: Vec<u32> = hosts
        .iter()
        .map(|&h| (0..n).filter(|&r| dev.host_of(r) == h).nth(idx).unwrap())
        .collect();
    Some((local, cross))
}

/// Reduce-scatter (then, unless `scatter_only`, allgather) of elements `a..b` of `buf` among
/// `group` (which holds this rank), through landing areas `areas` (reduce-scatter, allgather),
/// pipelined in pieces: every group member gets its part of our elements; we reduce each piece
/// of our part as its copies land (unless it was reduced as it arrived) and pass it on at once.
/// The landing region must hold the largest part already ([`Communicator::landing`]).
/// Returns the bounds of this rank's share.
#[allow(clippy::too_many_arguments)]
unsafe fn group_allreduce(
    c: &mut Communicator,
    group: &[u32],
    buf: *mut u8,
    a: usize,
    b: usize,
    dtype: DType,
    op: ReduceOp,
    areas: (usize, usize),
    scatter_only: bool,
) -> Result<(usize, usize)> {
    let es = dtype.size_bytes();
    let g = group.len() as u32;
    let me_idx = group.iter().position(|&r| r == c.rank).unwrap() as u32;
    let part = |i: u32| {
        let (x, y) = chunk_bounds(b - a, g, i, ALIGN_ELEMS);
        (a + x, a + y)
    };
    let piece = c.net_piece_bytes();
    let peers: Vec<(u32, u32)> = (1..g).map(|k| (me_idx + k) % g).map(|i| (i, group[i as usize])).collect();
    let (x, y) = part(me_idx);
    let direct = if scatter_only {
        None
    } else {
        let parts: Vec<(u32, usize, usize)> = peers.iter().map(|&(i, q)| (q, part(i).0 * es, (part(i).1 - part(i).0) * es)).collect();
        let reducing = peers.first().map(|&(_, q)| Reducing { area: areas.0, from: q, dst: unsafe { buf.add(x * es) }, len: (y - x) * es, dtype, op });
        unsafe { c.direct_landing(areas.1, &parts, buf, reducing) }
    };
    let mut sent = Vec::new();
    for &(i, q) in &peers {
        let (x, y) = part(i);
        sent.extend(unsafe { c.send_pieces(q, buf.add(x * es), (y - x) * es, areas.0, c.slot(c.rank), es)? });
    }
    let bytes = (y - x) * es;
    let (p, np) = pieces(bytes, piece, es);
    let mut forwarded = Vec::new();
    for k in 0..np {
        let off = k * p;
        let len = p.min(bytes - off);
        let dst = unsafe { buf.add(x * es + off) };
        for &(_, q) in &peers {
            let seq = c.seq;
            c.wait_landed(c.landed_word(areas.0, q, k), &|| format!("rank {q}'s piece {k} of allreduce call #{seq}"))?;
            if !c.reduced_on_arrival(&direct, q, k) {
                unsafe { reduce_into(dtype, op, dst, c.landed(areas.0, q, off), len / es) };
            }
        }
        if !scatter_only {
            for &(_, q) in &peers {
                forwarded.push(unsafe { c.send_piece(q, dst, len, areas.1, off, k)? });
            }
        }
    }
    // Our buffer's other parts are overwritten below: their sends must be done first.
    wait_all(sent)?;
    if scatter_only {
        return Ok((x, y));
    }
    for &(i, q) in &peers {
        let (qx, qy) = part(i);
        let qbytes = (qy - qx) * es;
        let (qp, qnp) = pieces(qbytes, piece, es);
        for k in 0..qnp {
            let off = k * qp;
            let seq = c.seq;
            c.wait_landed(c.landed_word(areas.1, q, k), &|| format!("rank {q}'s reduced piece {k} of allreduce call #{seq}"))?;
            if !(direct.is_some() && c.landed_direct(areas.1, q, k)) {
                unsafe { std::ptr::copy_nonoverlapping(c.landed(areas.1, q, off), buf.add(qx * es + off), qp.min(qbytes - off)) };
            }
        }
    }
    drop(direct);
    wait_all(forwarded)?;
    Ok((x, y))
}

/// Hierarchical allreduce (see the module comment); `groups` from [`host_groups`].
///
/// # Safety
/// `buf` valid for `count` elements of `dtype`.
pub(crate) unsafe fn hierarchical(c: &mut Communicator, groups: &(Vec<u32>, Vec<u32>), buf: *mut u8, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
    let es = dtype.size_bytes();
    let (local, cross) = groups;
    let l = local.len() as u32;
    c.landing(largest_chunk(count, l, es))?;
    unsafe {
        // Within the host: this rank ends up owning [x, y), reduced over the host.
        let (x, y) = group_allreduce(c, local, buf, 0, count, dtype, op, (0, 1), true)?;
        // Between hosts: that share of every host, reduced and spread among them.
        group_allreduce(c, cross, buf, x, y, dtype, op, (2, 3), false)?;
        // Within the host again: every rank gets every share.
        let piece = c.net_piece_bytes();
        let bytes = (y - x) * es;
        let (p, np) = pieces(bytes, piece, es);
        let me = c.rank;
        let peers: Vec<u32> = local.iter().copied().filter(|&r| r != me).collect();
        let mut sent = Vec::new();
        for k in 0..np {
            let off = k * p;
            for &q in &peers {
                sent.push(c.send_piece(q, buf.add(x * es + off), p.min(bytes - off), 1, off, k)?);
            }
        }
        for &q in &peers {
            let qi = local.iter().position(|&r| r == q).unwrap() as u32;
            let (qx, qy) = chunk_bounds(count, l, qi, ALIGN_ELEMS);
            let qbytes = (qy - qx) * es;
            let (qp, qnp) = pieces(qbytes, piece, es);
            for k in 0..qnp {
                let off = k * qp;
                let seq = c.seq;
                c.wait_landed(c.landed_word(1, q, k), &|| format!("rank {q}'s share piece {k} of allreduce call #{seq}"))?;
                std::ptr::copy_nonoverlapping(c.landed(1, q, off), buf.add(qx * es + off), qp.min(qbytes - off));
            }
        }
        wait_all(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_and_stay_bounded() {
        for bytes in [0usize, 4, 64, 1000 * 4, 1 << 20, 333 << 20] {
            let (p, np) = pieces(bytes, 512 << 10, 4);
            assert!(np <= MAX_PIECES);
            assert!(p * np >= bytes);
            assert_eq!(p % 64, 0);
        }
    }
}
