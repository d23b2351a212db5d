//! Landing regions: what the collectives for peers that are not mapped here (on other hosts,
//! over the network) write into. Nothing of such a peer is mapped here, so data moves only
//! by one-sided writes *into* peers' landing regions, each raising a per-piece word at the
//! target once the piece has landed. The algorithms on top: [`super::all_to_all`] (the
//! put-based all-to-all) and [`super::hierarchical`].
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
use crate::dense::{chunk_bounds, ALIGN_ELEMS};
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
pub(super) struct Reducing {
    pub(super) area: usize,
    pub(super) from: u32,
    pub(super) dst: *mut u8,
    pub(super) len: usize,
    pub(super) dtype: DType,
    pub(super) op: ReduceOp,
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
    pub(super) unsafe fn send_piece(&self, q: u32, src: *const u8, n: usize, area: usize, off: usize, piece: usize) -> Result<Completion> {
        unsafe { self.send_at(q, src, n, area, self.slot(self.rank) + off, piece) }
    }

    /// This rank's own slot of `area` in its own landing region: nobody else writes there,
    /// so a call may use it as scratch (`dense::wire` does).
    pub(super) fn own_slot(&self, area: usize) -> *mut u8 {
        self.landed_at(area, self.slot(self.rank)) as *mut u8
    }

    /// Bytes of each sender's slot in a landing area.
    pub(super) fn chunk_cap(&self) -> usize {
        self.landing.as_ref().unwrap().chunk_cap
    }

    /// Where sender `s`'s slot starts in a landing area.
    pub(super) fn slot(&self, s: u32) -> usize {
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
    pub(super) fn landed(&self, area: usize, s: u32, off: usize) -> *const u8 {
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
    pub(super) unsafe fn direct_landing(&self, area: usize, parts: &[(u32, usize, usize)], buf: *mut u8, reducing: Option<Reducing>) -> Option<DirectLanding> {
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
