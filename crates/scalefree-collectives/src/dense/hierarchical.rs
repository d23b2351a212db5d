//! Hierarchical allreduce, with several ranks per host on several hosts: reduce-scatter
//! within the host over shared memory, an allreduce of each rank's share with the ranks of the
//! same local index on the other hosts (the put-based all-to-all, [`super::all_to_all`]), and
//! an allgather within the host. Every rank carries `1/L` of the traffic between hosts, so
//! each host sends its data once.

use scalefree_transport::Result;

use crate::comm::Communicator;
use crate::dense::all_to_all::group_allreduce;
use crate::dense::landing::{largest_chunk, pieces, wait_all};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};
use crate::reduce::{DType, ReduceOp};

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
