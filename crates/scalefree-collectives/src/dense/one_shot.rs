//! One-shot collectives for small messages: the data travels inside the call's header
//! message (one step, no extra synchronisation), and every rank reduces all contributions
//! in rank order, so every rank computes bit-identical results.
//!
//! Bytes moved per rank: `(N-1) * n` written into peers' inboxes, `(N-1) * n` read.

use crate::comm::Communicator;
use crate::reduce::{reduce3, reduce_into, DType, ReduceOp};

/// Finishes an allreduce whose payloads are in this rank's inboxes: `buf` becomes
/// `x_0 op x_1 op ... op x_{N-1}` (left to right), `buf` holding `x_rank` on entry.
///
/// # Safety
/// `buf` valid for `count` elements; called right after `post` of this call.
pub(crate) unsafe fn allreduce(c: &mut Communicator, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp) {
    let me = c.rank;
    let n = c.size;
    unsafe {
        if me <= 1 {
            // x_0 op x_1 == x_1 op x_0 for every supported op, so fold from here.
            reduce_into(dtype, op, buf, c.inbox_payload(1 - me), count);
            for k in 2..n {
                reduce_into(dtype, op, buf, c.inbox_payload(k), count);
            }
        } else {
            let acc = c.scratch.as_mut_ptr();
            reduce3(dtype, op, acc, c.inbox_payload(0), c.inbox_payload(1), count);
            for k in 2..me {
                reduce_into(dtype, op, acc, c.inbox_payload(k), count);
            }
            reduce3(dtype, op, buf, acc, buf, count);
            for k in me + 1..n {
                reduce_into(dtype, op, buf, c.inbox_payload(k), count);
            }
        }
    }
}

/// Finishes a small reduce-scatter: `out = x_0[share] op ... op x_{N-1}[share]`, where this
/// rank's own share is at `mine` and the others' arrived inline.
///
/// # Safety
/// `mine` and `out` valid for `count` elements and not overlapping.
pub(crate) unsafe fn fold_share(c: &mut Communicator, mine: *const u8, out: *mut u8, count: usize, dtype: DType, op: ReduceOp) {
    let me = c.rank;
    let src = |k: u32| if k == me { mine } else { c.inbox_payload(k) };
    unsafe {
        reduce3(dtype, op, out, src(0), src(1), count);
        for k in 2..c.size {
            reduce_into(dtype, op, out, src(k), count);
        }
    }
}
