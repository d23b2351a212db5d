//! Entry points of the dense collectives. Each validates its arguments, announces the call
//! (`Communicator::post`), and hands over to one algorithm file.

pub mod all_to_all;
pub mod direct;
pub mod doubling;
pub mod halving;
pub mod hierarchical;
pub mod landing;
pub mod one_shot;
pub mod ring;
pub mod wire;

use scalefree_transport::{Error, Result};

use crate::comm::{Communicator, Header, Kind};
use crate::dense::doubling::Combine;
use crate::dense::hierarchical::Plan;
use crate::dense::wire::Wire;
use crate::reduce::{DType, ReduceOp};
use crate::Algorithm;

/// Largest broadcast made in one call; larger ones go in pieces of this size (so a staged
/// root buffer needs at most this much staging memory).
pub const MAX_BROADCAST_PIECE: usize = 64 << 20;

/// `[lo, hi)` element bounds of rank `i`'s share of `count` elements, split as evenly as
/// possible: rank i gets `count*i/n .. count*(i+1)/n`.
pub fn share_bounds(count: usize, n: u32, i: u32) -> (usize, usize) {
    let f = |k: u32| ((count as u128 * k as u128) / n as u128) as usize;
    (f(i), f(i + 1))
}

/// Chunk boundaries of the allreduce algorithms are multiples of this many elements.
pub(crate) const ALIGN_ELEMS: usize = 16;

/// Like [`share_bounds`] but boundaries rounded down to `align` elements (cache lines).
pub(crate) fn chunk_bounds(count: usize, n: u32, i: u32, align: usize) -> (usize, usize) {
    let f = |k: u32| {
        if k == n {
            count
        } else {
            let b = ((count as u128 * k as u128) / n as u128) as usize;
            b / align * align
        }
    };
    (f(i), f(i + 1))
}

impl Communicator {
    fn pick(&self, requested: Algorithm, nbytes: usize) -> Result<Algorithm> {
        let hierarchy = || if self.net { Plan::of(self).filter(Plan::has_hierarchy) } else { None };
        Ok(match requested {
            // Nothing to move: only the header exchange (agreement, sequence) remains.
            _ if nbytes == 0 => Algorithm::OneShot,
            Algorithm::Auto => {
                if nbytes <= self.opts.one_shot_max_bytes.min(self.opts.inline_bytes) {
                    Algorithm::OneShot
                } else if hierarchy().is_some_and(|p| hierarchical::pays(&p, self.size, &hierarchical::host_counts(self))) {
                    Algorithm::Hierarchical
                } else {
                    Algorithm::Direct
                }
            }
            // Only jobs on several hosts with several ranks on one of them have a hierarchy.
            Algorithm::Hierarchical if hierarchy().is_none() => Algorithm::Direct,
            Algorithm::OneShot if nbytes > self.opts.inline_bytes => {
                return Err(Error::InvalidArgument(format!(
                    "one_shot carries at most {} bytes (SCALEFREE_INLINE_BYTES); this call has {nbytes}",
                    self.opts.inline_bytes
                )))
            }
            a => a,
        })
    }

    /// Allreduce of `count` elements at `buf`, in place. Returns the algorithm used.
    ///
    /// # Safety
    /// `buf` must be valid for reads and writes of `count` elements of `dtype`, aligned to
    /// the element size, and not touched by anyone else during the call.
    pub unsafe fn allreduce(&mut self, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp, algo: Algorithm) -> Result<Algorithm> {
        unsafe { self.allreduce_wire(buf, count, dtype, op, algo, Wire::Exact) }
    }

    /// [`Self::allreduce`] with `wire` values on the network between hosts (`dense::wire`):
    /// float32 sums only. A large call across hosts then goes by the hierarchical plan
    /// whatever `algo` says (reported as `Direct` when every host has one rank); small calls
    /// (one-shot) and calls on one host are exact.
    ///
    /// # Safety
    /// As [`Self::allreduce`].
    pub unsafe fn allreduce_wire(&mut self, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp, algo: Algorithm, wire: Wire) -> Result<Algorithm> {
        if wire != Wire::Exact && (dtype != DType::F32 || op != ReduceOp::Sum) {
            return Err(Error::InvalidArgument(format!(
                "wire={} compresses float32 sums only, not {} {}", wire.name(), dtype.name(), op.name()
            )));
        }
        let nbytes = count * dtype.size_bytes();
        let mut used = self.pick(algo, nbytes)?;
        if self.size == 1 {
            return Ok(used);
        }
        let compressed = if wire != Wire::Exact && self.net && used != Algorithm::OneShot { Plan::of(self) } else { None };
        if let Some(p) = &compressed {
            used = if p.has_hierarchy() { Algorithm::Hierarchical } else { Algorithm::Direct };
        }
        let mut hdr = Header::new(Kind::Allreduce, dtype, Some(op), count, 0, used);
        hdr.wire = wire as u32;
        if used == Algorithm::OneShot && self.doubling() {
            // Between hosts: log2 N rounds of one message each, the header travelling along.
            unsafe { doubling::allreduce(self, hdr, buf, nbytes, Combine::Reduce(dtype, op))? };
            return Ok(used);
        }
        if nbytes == 0 {
            // Still a collective call: ranks must agree, and sequence numbers stay in step.
            self.post(hdr, &|_| (std::ptr::null(), 0))?;
            return Ok(used);
        }
        unsafe {
            match used {
                Algorithm::OneShot => {
                    self.post(hdr, &|_| (buf as *const u8, nbytes))?;
                    one_shot::allreduce(self, buf, count, dtype, op);
                }
                _ if self.net => {
                    let plan = match compressed {
                        Some(p) => Some((p, wire)),
                        None if used == Algorithm::Hierarchical => Plan::of(self).map(|p| (p, Wire::Exact)),
                        None => None,
                    };
                    hdr.halving = (plan.is_none() && halving::suits(self.size, nbytes)) as u32;
                    self.post(hdr, &|_| (std::ptr::null(), 0))?;
                    match plan {
                        Some((p, w)) => hierarchical::hierarchical(self, &p, buf, count, dtype, op, w)?,
                        None if hdr.halving != 0 => halving::allreduce(self, buf, count, dtype, op)?,
                        None => all_to_all::allreduce(self, buf, count, dtype, op)?,
                    }
                }
                Algorithm::Direct | Algorithm::Ring | Algorithm::Hierarchical => {
                    self.expose_with(&mut hdr, buf, nbytes, self.opts.stage_max_bytes);
                    let headers = self.post(hdr, &|_| (std::ptr::null(), 0))?;
                    let exposed = self.resolve(&headers)?;
                    // Peers read: direct — every chunk but mine; ring — only my chunk.
                    let es = dtype.size_bytes();
                    let (lo, hi) = chunk_bounds(count, self.size, self.rank, ALIGN_ELEMS);
                    let ranges = if used == Algorithm::Ring {
                        vec![(lo * es, hi * es)]
                    } else {
                        vec![(0, lo * es), (hi * es, nbytes)]
                    };
                    let mine = self.stage_in(&hdr, buf, &ranges)?;
                    if used == Algorithm::Ring {
                        ring::allreduce(self, &headers, &exposed, buf, mine, count, dtype, op)?;
                    } else {
                        direct::allreduce(self, &headers, &exposed, buf, mine, count, dtype, op)?;
                    }
                    self.finish()?;
                }
                Algorithm::Auto => unreachable!(),
            }
        }
        Ok(used)
    }

    /// Reduce-scatter: `input` holds `count` elements on every rank; `out` receives this
    /// rank's share `share_bounds(count, size, rank)` of the reduction.
    ///
    /// # Safety
    /// `input` valid for `count` elements, `out` for the share, not overlapping.
    pub unsafe fn reduce_scatter(&mut self, input: *const u8, count: usize, out: *mut u8, dtype: DType, op: ReduceOp, algo: Algorithm) -> Result<()> {
        let es = dtype.size_bytes();
        let (lo, hi) = share_bounds(count, self.size, self.rank);
        if self.size == 1 {
            unsafe { std::ptr::copy(input, out, count * es) };
            return Ok(());
        }
        let largest_share = share_bounds(count, self.size, self.size - 1);
        let share_bytes = (largest_share.1 - largest_share.0 + 1) * es;
        let used = self.pick(if algo == Algorithm::Ring { Algorithm::Direct } else { algo }, share_bytes)?;
        let mut hdr = Header::new(Kind::ReduceScatter, dtype, Some(op), count, 0, used);
        let size = self.size;
        unsafe {
            if used == Algorithm::OneShot && self.doubling() && count * es <= self.opts.inline_bytes {
                // Between hosts: the allreduce of the whole (small) vector, log2 N rounds.
                let mut all = std::slice::from_raw_parts(input, count * es).to_vec();
                doubling::allreduce(self, hdr, all.as_mut_ptr(), all.len(), Combine::Reduce(dtype, op))?;
                std::ptr::copy_nonoverlapping(all.as_ptr().add(lo * es), out, (hi - lo) * es);
            } else if used == Algorithm::OneShot {
                let payload = |p: u32| {
                    let (a, b) = share_bounds(count, size, p);
                    (input.add(a * es), (b - a) * es)
                };
                self.post(hdr, &payload)?;
                one_shot::fold_share(self, input.add(lo * es), out, hi - lo, dtype, op);
            } else if self.net {
                self.post(hdr, &|_| (std::ptr::null(), 0))?;
                all_to_all::reduce_scatter(self, input, count, out, dtype, op)?;
            } else {
                self.expose(&mut hdr, input, count * es);
                let headers = self.post(hdr, &|_| (std::ptr::null(), 0))?;
                let exposed = self.resolve(&headers)?;
                self.stage_in(&hdr, input, &[(0, count * es)])?;
                let piece = self.piece_len(es, count * es, 1); // a bound of every share
                direct::reduce_range(self, &headers, &exposed, input, out, lo, hi, dtype, op, piece, &mut |_, _, _| Ok(()))?;
                self.finish()?;
            }
        }
        Ok(())
    }

    /// Allgather: every rank contributes `count` elements at `input`; `out` receives
    /// `size * count` elements, rank r's at `out[r*count..]`. `input` may be this rank's
    /// slot inside `out`.
    ///
    /// # Safety
    /// `input` valid for `count` elements and `out` for `size*count`.
    pub unsafe fn allgather(&mut self, input: *const u8, count: usize, out: *mut u8, dtype: DType, algo: Algorithm) -> Result<()> {
        let es = dtype.size_bytes();
        let nbytes = count * es;
        let me = self.rank as usize;
        unsafe {
            if !std::ptr::eq(input, out.add(me * nbytes)) {
                std::ptr::copy(input, out.add(me * nbytes), nbytes);
            }
        }
        if self.size == 1 {
            return Ok(());
        }
        let used = self.pick(if algo == Algorithm::Ring { Algorithm::Direct } else { algo }, nbytes)?;
        let mut hdr = Header::new(Kind::Allgather, dtype, None, count, 0, used);
        let mine_in_out = unsafe { out.add(me * nbytes) as *const u8 };
        let total = nbytes * self.size as usize;
        unsafe {
            if used == Algorithm::OneShot && self.small_allgather_doubles(total) {
                let all = self.gather_small(hdr, total, me * nbytes, std::slice::from_raw_parts(mine_in_out, nbytes))?;
                std::ptr::copy_nonoverlapping(all.as_ptr(), out, total);
            } else if used == Algorithm::OneShot {
                self.post(hdr, &|_| (mine_in_out, nbytes))?;
                for q in self.peers().collect::<Vec<_>>() {
                    std::ptr::copy_nonoverlapping(self.inbox_payload(q), out.add(q as usize * nbytes), nbytes);
                }
            } else if self.net {
                self.post(hdr, &|_| (std::ptr::null(), 0))?;
                all_to_all::allgather(self, mine_in_out, nbytes, out, es)?;
            } else {
                self.expose(&mut hdr, mine_in_out, nbytes);
                let headers = self.post(hdr, &|_| (std::ptr::null(), 0))?;
                let exposed = self.resolve(&headers)?;
                self.stage_in(&hdr, mine_in_out, &[(0, nbytes)])?;
                for q in self.peers().collect::<Vec<_>>() {
                    self.await_peer_data(&headers, q)?;
                    let src = exposed[q as usize].as_ref().unwrap();
                    self.read_peer(q, src, 0, out.add(q as usize * nbytes), nbytes)?;
                }
                self.finish()?;
            }
        }
        Ok(())
    }

    /// Whether a small allgather of `total` bytes in all goes by doubling between hosts: its
    /// messages carry the whole gathered buffer (zeros where not filled yet), so it pays only
    /// with more than two parties in the rounds and while that buffer stays small. Measured
    /// across 4 simulated hosts (docs/benchmarks.md before its split, in git history): 8 B and 1 KiB per rank faster than the
    /// one-shot exchange (135 / 152 µs against 215 / 221 µs), 8 KiB (32 KiB gathered) slower
    /// (258 against 230 µs); at 2 hosts the one-shot exchange's half-size messages win.
    fn small_allgather_doubles(&self, total: usize) -> bool {
        const MAX_GATHERED: usize = 8 << 10;
        self.small.as_ref().is_some_and(|l| l.rounds_of() > 2) && total <= MAX_GATHERED.min(self.opts.inline_bytes)
    }

    /// Between hosts, by doubling: `total` bytes that are zero on every rank but for what each
    /// contributes (`mine`, at `at`), merged by OR in log2 N rounds; returns the whole.
    fn gather_small(&mut self, hdr: Header, total: usize, at: usize, mine: &[u8]) -> Result<Vec<u8>> {
        let mut all = vec![0u8; total];
        all[at..at + mine.len()].copy_from_slice(mine);
        unsafe { doubling::allreduce(self, hdr, all.as_mut_ptr(), total, Combine::Or)? };
        Ok(all)
    }

    /// Broadcast `count` elements from `root`'s `buf` into every rank's `buf` (in pieces of
    /// at most [`MAX_BROADCAST_PIECE`] bytes).
    ///
    /// # Safety
    /// `buf` valid for `count` elements.
    pub unsafe fn broadcast(&mut self, buf: *mut u8, count: usize, dtype: DType, root: u32, algo: Algorithm) -> Result<()> {
        if root >= self.size {
            return Err(Error::InvalidArgument(format!("root {root} is not a rank of a group of {}", self.size)));
        }
        if self.size == 1 {
            return Ok(());
        }
        let nbytes = count * dtype.size_bytes();
        if nbytes > MAX_BROADCAST_PIECE {
            // In pieces: a root buffer that peers cannot reach directly is staged, and the
            // staging region (kept for later calls) would otherwise be as large as the buffer
            // (DDP broadcasting a 2.56 GB embedding table left 2.4 GiB of shared memory
            // mapped in every rank).
            let per = MAX_BROADCAST_PIECE / dtype.size_bytes();
            let mut at = 0;
            while at < count {
                let n = per.min(count - at);
                unsafe { self.broadcast(buf.add(at * dtype.size_bytes()), n, dtype, root, algo)? };
                at += n;
            }
            return Ok(());
        }
        let used = self.pick(if algo == Algorithm::Ring { Algorithm::Direct } else { algo }, nbytes)?;
        let mut hdr = Header::new(Kind::Broadcast, dtype, None, count, root, used);
        let is_root = self.rank == root;
        unsafe {
            if used == Algorithm::OneShot && self.doubling() {
                let mine: &[u8] = if is_root { std::slice::from_raw_parts(buf, nbytes) } else { &[] };
                let all = self.gather_small(hdr, nbytes, 0, mine)?;
                if !is_root {
                    std::ptr::copy_nonoverlapping(all.as_ptr(), buf, nbytes);
                }
            } else if used == Algorithm::OneShot {
                self.post(hdr, &|_| if is_root { (buf as *const u8, nbytes) } else { (std::ptr::null(), 0) })?;
                if !is_root {
                    std::ptr::copy_nonoverlapping(self.inbox_payload(root), buf, nbytes);
                }
            } else if self.net {
                self.post(hdr, &|_| (std::ptr::null(), 0))?;
                all_to_all::broadcast(self, buf, nbytes, root, dtype.size_bytes())?;
            } else {
                if is_root {
                    self.expose(&mut hdr, buf, nbytes);
                }
                let headers = self.post(hdr, &|_| (std::ptr::null(), 0))?;
                let exposed = self.resolve(&headers)?;
                if is_root {
                    self.stage_in(&hdr, buf, &[(0, nbytes)])?;
                } else {
                    self.await_peer_data(&headers, root)?;
                    let src = exposed[root as usize].as_ref().unwrap();
                    self.read_peer(root, src, 0, buf, nbytes)?;
                }
                self.finish()?;
            }
        }
        Ok(())
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&mut self) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let hdr = Header::new(Kind::Barrier, DType::U8, None, 0, 0, Algorithm::Auto);
        if self.doubling() {
            // The agreement of an empty doubling allreduce is a barrier, in log2 N rounds.
            return unsafe { doubling::allreduce(self, hdr, std::ptr::null_mut(), 0, Combine::Or) };
        }
        self.post(hdr, &|_| (std::ptr::null(), 0))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything() {
        for count in [0usize, 1, 7, 1000, 1 << 20] {
            for n in 1..=5u32 {
                let mut next = 0;
                for i in 0..n {
                    let (a, b) = share_bounds(count, n, i);
                    assert_eq!(a, next);
                    next = b;
                    let (c, d) = chunk_bounds(count, n, i, 16);
                    assert!(c <= d && d <= count);
                }
                assert_eq!(next, count);
                assert_eq!(chunk_bounds(count, n, n - 1, 16).1, count);
            }
        }
    }
}
