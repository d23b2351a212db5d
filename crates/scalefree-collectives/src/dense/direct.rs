//! Direct reduce-scatter + allgather by one-sided reads, pipelined in pieces.
//!
//! Rank r owns chunk r of the vector. Reduce-scatter: for each piece of its chunk, r reads
//! that piece from every peer (a load from the peer's mapped region, or one
//! `process_vm_readv` into an L2-sized scratch buffer for ordinary memory) and reduces it
//! into its own buffer, then publishes its progress. Allgather: r reads every peer's reduced
//! chunk, piece by piece as the peer's progress allows, straight into its buffer. The
//! reads of a peer's original data (reduce-scatter) touch only the peer's own chunk, which
//! nobody writes before the peer has reduced it, so no copy of the input is ever needed.
//!
//! Bytes moved per rank: `(N-1)/N * n` read and reduced, `(N-1)/N * n` read and stored —
//! the minimum for an allreduce; no staging copy when buffers are addressable.

use scalefree_transport::Result;

use crate::comm::{Communicator, Exposed, Header};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};
use crate::reduce::{reduce3, DType, ReduceOp};


/// Reduces `[lo, hi)` (elements) of everybody's data: `dst = a op peer_1 op peer_2 ...`,
/// piece by piece, publishing progress after each piece. `a` is this rank's input.
///
/// # Safety
/// Pointers valid for the ranges used.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn reduce_range(
    c: &mut Communicator,
    headers: &[Header],
    exposed: &[Option<Exposed>],
    a: *const u8,
    dst: *mut u8,
    lo: usize,
    hi: usize,
    dtype: DType,
    op: ReduceOp,
    piece: usize,
    after_piece: &mut dyn FnMut(&Communicator, usize, usize) -> Result<()>,
) -> Result<()> {
    let es = dtype.size_bytes();
    let (start, end) = (lo * es, hi * es);
    let peers: Vec<u32> = c.peers().collect();
    for &q in &peers {
        c.await_peer_data(headers, q)?;
    }
    let scratch = c.scratch.as_mut_ptr();
    let mut off = start;
    let mut pieces = 0u32;
    while off < end {
        let n = piece.min(end - off);
        let mut first = true;
        for &q in &peers {
            let src = exposed[q as usize].as_ref().unwrap();
            let b = unsafe { c.peer_bytes(q, src, off, n, scratch)? };
            let d = unsafe { dst.add(off - start) };
            let x = if first { unsafe { a.add(off) } } else { d as *const u8 };
            unsafe { reduce3(dtype, op, d, x, b, n / es) };
            first = false;
        }
        after_piece(c, off, n)?;
        off += n;
        pieces += 1;
        c.publish_progress(pieces);
    }
    Ok(())
}

/// Elements in the largest of `n` ranks' chunks of `count` (the same on every rank).
pub(crate) fn largest_chunk(count: usize, n: u32) -> usize {
    (0..n).map(|k| { let (a, b) = chunk_bounds(count, n, k, ALIGN_ELEMS); b - a }).max().unwrap_or(0)
}

/// Allreduce by direct reduce-scatter and allgather. `buf` is the caller's buffer; `mine`
/// is where peers read this rank's data (`buf` itself, or a staged copy).
///
/// When every rank's buffer is addressable (no staging), the allgather is a push: right
/// after reducing a piece, while it is still in cache, the owner writes it into every
/// peer's buffer (the peer's copy of that piece was already read, by the owner itself).
/// That saves a pass over memory and the allgather's waits. Otherwise each rank pulls
/// every peer's reduced chunk, piece by piece as the peer's progress allows.
///
/// # Safety
/// `buf` valid for `count` elements; `mine` likewise.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn allreduce(
    c: &mut Communicator,
    headers: &[Header],
    exposed: &[Option<Exposed>],
    buf: *mut u8,
    mine: *mut u8,
    count: usize,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let es = dtype.size_bytes();
    let (n, me) = (c.size, c.rank);
    let piece = c.piece_len(es, largest_chunk(count, n) * es, 1);
    let (lo, hi) = chunk_bounds(count, n, me, ALIGN_ELEMS);
    let push = headers.iter().all(|h| h.staging_bytes == 0);
    let peers: Vec<u32> = c.peers().collect();
    let mut push_piece = |c: &Communicator, off: usize, len: usize| -> Result<()> {
        if push {
            for &q in &peers {
                let dst = exposed[q as usize].as_ref().unwrap();
                unsafe { c.write_peer(q, dst, off, buf.add(off), len)? };
            }
        }
        Ok(())
    };
    // Reduce my chunk into the place peers read it from (`mine`), then copy it home if staged.
    unsafe {
        reduce_range(c, headers, exposed, buf, mine.add(lo * es), lo, hi, dtype, op, piece, &mut push_piece)?;
        if mine != buf {
            std::ptr::copy_nonoverlapping(mine.add(lo * es), buf.add(lo * es), (hi - lo) * es);
        }
    }
    if push {
        return Ok(());
    }
    // Gather everybody else's chunk as soon as it is reduced.
    for q in peers {
        let (qlo, qhi) = chunk_bounds(count, n, q, ALIGN_ELEMS);
        let (start, end) = (qlo * es, qhi * es);
        let total = (end - start).div_ceil(piece) as u32;
        let src = exposed[q as usize].as_ref().unwrap();
        let mut have = 0u32;
        while have < total {
            let avail = c.wait_progress(q, have + 1)?.min(total);
            let from = start + have as usize * piece;
            let to = (start + avail as usize * piece).min(end);
            unsafe { c.read_peer(q, src, from, buf.add(from), to - from)? };
            have = avail;
        }
    }
    Ok(())
}
