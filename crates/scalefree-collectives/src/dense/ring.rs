//! The pipelined ring, by one-sided reads from the left neighbour.
//!
//! Reduce-scatter, steps s = 0..N-2: rank r reads chunk `(r-s-1) mod N` from its left
//! neighbour (which accumulated it in its step s-1) and reduces it with its own copy. After
//! N-1 steps rank r holds the full reduction of chunk `(r+1) mod N`. Allgather, steps
//! s = 0..N-2: rank r copies chunk `(r-s) mod N` from its left neighbour. Every piece of
//! every step is gated by the neighbour's progress counter, so steps overlap in a pipeline,
//! and before overwriting a chunk the rank checks that its right neighbour has read it.
//!
//! Bytes moved per rank: the same as the direct algorithm, `2 (N-1)/N n`, but each rank only
//! talks to its two neighbours (the layout that carries over to networks).

use scalefree_transport::Result;

use crate::comm::{Communicator, Exposed, Header};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};
use crate::reduce::{reduce3, DType, ReduceOp};


/// # Safety
/// `buf` and `mine` valid for `count` elements.
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
    let left = (me + n - 1) % n;
    let right = (me + 1) % n;
    let bounds = |k: u32| {
        let (a, b) = chunk_bounds(count, n, k, ALIGN_ELEMS);
        (a * es, b * es)
    };
    // Progress counts up to 2 (N - 1) rounds of the largest chunk's pieces.
    let largest = (0..n).map(|k| { let (a, b) = bounds(k); b - a }).max().unwrap_or(0);
    let piece = c.piece_len(es, largest, 2 * (n as usize - 1));
    // Pieces per step: the same on every rank (the largest chunk decides).
    let per_step = (0..n).map(|k| { let (a, b) = bounds(k); (b - a).div_ceil(piece) }).max().unwrap_or(0).max(1) as u32;
    let src = exposed[left as usize].as_ref().unwrap();
    c.await_peer_data(headers, left)?;
    let scratch = c.scratch.as_mut_ptr();

    // Reduce-scatter.
    for s in 0..n - 1 {
        let chunk = (me + 2 * n - s - 1) % n;
        let (start, end) = bounds(chunk);
        let mut off = start;
        let mut j = 0u32;
        while off < end {
            let len = piece.min(end - off);
            if s > 0 {
                c.wait_progress(left, (s - 1) * per_step + j + 1)?;
            }
            let b = unsafe { c.peer_bytes(left, src, off, len, scratch)? };
            unsafe { reduce3(dtype, op, mine.add(off), buf.add(off), b, len / es) };
            off += len;
            j += 1;
            c.publish_progress(s * per_step + j);
        }
        c.publish_progress((s + 1) * per_step);
    }
    let own = (me + 1) % n;
    if mine != buf {
        let (a, b) = bounds(own);
        unsafe { std::ptr::copy_nonoverlapping(mine.add(a), buf.add(a), b - a) };
    }

    // Allgather.
    for s in 0..n - 1 {
        let chunk = (me + n - s) % n;
        let (start, end) = bounds(chunk);
        let base = (n - 1 + s) * per_step;
        let mut off = start;
        let mut j = 0u32;
        while off < end {
            let len = piece.min(end - off);
            let need = if s == 0 { (n - 2) * per_step + j + 1 } else { base - per_step + j + 1 };
            c.wait_progress(left, need)?;
            // Right neighbour must have read our copy of this piece (its RS step s).
            c.wait_progress(right, s * per_step + j + 1)?;
            unsafe {
                c.read_peer(left, src, off, mine.add(off), len)?;
                if mine != buf {
                    std::ptr::copy_nonoverlapping(mine.add(off), buf.add(off), len);
                }
            }
            off += len;
            j += 1;
            c.publish_progress(base + j);
        }
        c.publish_progress(base + per_step);
    }
    Ok(())
}
