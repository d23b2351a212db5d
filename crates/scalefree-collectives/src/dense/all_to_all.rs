//! The put-based all-to-all, for peers on other hosts: allreduce is reduce-scatter then
//! allgather, written all-to-all (each rank sends chunk `q` of its buffer to rank `q`, which
//! owns it), pipelined in pieces: a rank reduces a piece of its chunk as soon as every peer's
//! copy of it has landed (in its landing region, see [`super::landing`]), and forwards the
//! result to every peer at once. Bytes sent per rank: `2 (N-1)/N · n`, as a ring, in two
//! steps instead of `2 (N-1)`, which matters when every step pays a network latency.
//! Reduce-scatter, allgather and broadcast are the same pieces, one phase each.

use scalefree_transport::Result;

use crate::comm::Communicator;
use crate::dense::landing::{largest_chunk, pieces, wait_all, Reducing};
use crate::dense::{chunk_bounds, share_bounds, ALIGN_ELEMS};
use crate::reduce::{reduce_into, DType, ReduceOp};

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

/// Reduce-scatter (then, unless `scatter_only`, allgather) of elements `a..b` of `buf` among
/// `group` (which holds this rank), through landing areas `areas` (reduce-scatter, allgather),
/// pipelined in pieces: every group member gets its part of our elements; we reduce each piece
/// of our part as its copies land (unless it was reduced as it arrived) and pass it on at once.
/// The landing region must hold the largest part already ([`Communicator::landing`]).
/// Returns the bounds of this rank's share.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn group_allreduce(
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
