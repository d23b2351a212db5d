//! Hierarchical allreduce, across hosts with one or more ranks each (not necessarily as many
//! on every host). With `m` the fewest ranks any host has, the buffer is cut into `m` shares
//! and the first `m` ranks of every host own one each:
//! 1. within the host (shared memory) every rank sends each share to its owner, which reduces
//!    it (with as many ranks as owners, a reduce-scatter);
//! 2. between hosts the owners of share `i` (one per host) allreduce it with the put-based
//!    all-to-all ([`super::all_to_all`]), or with 16-bit values on the wire ([`super::wire`]);
//! 3. within the host every owner sends its reduced share to the host's other ranks.
//!
//! Each host sends its data across once, split over its `m` owners: `2 (H-1)/H · n` bytes
//! per host against `2 L (N-L)/N · n` for the flat all-to-all on a host of `L` of the `N`
//! ranks. [`pays`] weighs the two (the cost model of `auto`).

use scalefree_transport::Result;

use crate::comm::Communicator;
use crate::dense::all_to_all::group_allreduce;
use crate::dense::landing::{largest_chunk, pieces, wait_all};
use crate::dense::wire::{self, Wire};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};
use crate::reduce::{reduce_into, DType, ReduceOp};

/// The hierarchical plan of this job, if it has one: (ranks of this host, ranks with this
/// rank's local index on every host), both in rank order. Needs more than one host and the
/// same number (more than one) of ranks on each (the shape `dense::doubling` leads by host).
pub(crate) fn host_groups(c: &Communicator) -> Option<(Vec<u32>, Vec<u32>)> {
    let p = Plan::of(c)?;
    let l = p.local.len();
    (p.hosts >= 2 && l >= 2 && p.owners as usize == l && p.even).then(|| (p.local, p.cross.unwrap()))
}

/// Who does what in [`hierarchical`] (the same on every rank but for `local` and `cross`).
pub(crate) struct Plan {
    /// Ranks of this host, in rank order.
    pub(crate) local: Vec<u32>,
    /// Shares of the buffer: the fewest ranks of any host.
    pub(crate) owners: u32,
    /// When this rank owns a share (local index < `owners`): the owners of that share on
    /// every host, in host order.
    pub(crate) cross: Option<Vec<u32>>,
    /// Number of hosts.
    pub(crate) hosts: usize,
    /// Every host has as many ranks.
    pub(crate) even: bool,
    /// Ranks on the host with the most.
    pub(crate) most: usize,
}

impl Plan {
    /// The plan for this job: None on one host.
    pub(crate) fn of(c: &Communicator) -> Option<Plan> {
        let dev = c.device();
        let n = c.size;
        let of: Vec<u32> = (0..n).map(|r| dev.host_of(r)).collect();
        let mut hosts = of.clone();
        hosts.sort_unstable();
        hosts.dedup();
        if hosts.len() < 2 {
            return None;
        }
        let of = &of;
        let members = |h: u32| (0..n).filter(move |&r| of[r as usize] == h);
        let counts: Vec<usize> = hosts.iter().map(|&h| members(h).count()).collect();
        let owners = *counts.iter().min().unwrap() as u32;
        let local: Vec<u32> = members(of[c.rank as usize]).collect();
        let idx = local.iter().position(|&r| r == c.rank).unwrap();
        let cross = (idx < owners as usize).then(|| hosts.iter().map(|&h| members(h).nth(idx).unwrap()).collect());
        Some(Plan {
            local,
            owners,
            cross,
            hosts: hosts.len(),
            even: counts.iter().all(|&k| k == counts[0]),
            most: *counts.iter().max().unwrap(),
        })
    }

    /// Some host holds more than one rank (else the plan is the flat all-to-all).
    pub(crate) fn has_hierarchy(&self) -> bool {
        self.most > 1
    }
}

/// The cost model of `auto`: whether the hierarchical allreduce beats the flat all-to-all on
/// a job of `size` ranks laid out as `plan` says. Bytes each host sends over the network
/// (the busiest host's): `2 (H-1)/H` against `2 L (N-L)/N` buffers for the flat one (`L`
/// the host's ranks); within the host it adds about two buffers per rank over shared memory,
/// counted at `1/SHM_SPEEDUP` of a network byte.
pub(crate) fn pays(plan: &Plan, size: u32, counts: &[usize]) -> bool {
    const SHM_SPEEDUP: f64 = 4.0;
    if !plan.has_hierarchy() {
        return false;
    }
    let n = size as f64;
    let h = plan.hosts as f64;
    let flat = counts.iter().map(|&l| 2.0 * l as f64 * (n - l as f64) / n).fold(0.0, f64::max);
    let hier = 2.0 * (h - 1.0) / h + 2.0 * (plan.most as f64 - 1.0) / plan.most as f64 * 2.0 / SHM_SPEEDUP;
    hier < flat
}

/// Ranks per host of the job, in host order.
pub(crate) fn host_counts(c: &Communicator) -> Vec<usize> {
    let dev = c.device();
    let mut counts = std::collections::BTreeMap::new();
    for r in 0..c.size {
        *counts.entry(dev.host_of(r)).or_insert(0usize) += 1;
    }
    counts.into_values().collect()
}

/// Hierarchical allreduce (see the module comment); `wire` compresses the step between hosts
/// (float32 sums only, checked by the caller).
///
/// Landing: within the host a sender's pieces go at its local index (area 0: every rank to
/// each owner) or its share's index (area 1: owners to the others) times the largest share,
/// so the region holds `size` chunks of `max(most · share / size, cross part)` per area
/// rather than a whole share per rank of the job.
///
/// # Safety
/// `buf` valid for `count` elements of `dtype`.
pub(crate) unsafe fn hierarchical(c: &mut Communicator, plan: &Plan, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp, wire: Wire) -> Result<()> {
    let es = dtype.size_bytes();
    let local = &plan.local;
    let m = plan.owners;
    let idx = local.iter().position(|&r| r == c.rank).unwrap() as u32;
    let share = |i: u32| chunk_bounds(count, m, i, ALIGN_ELEMS);
    let share_cap = largest_chunk(count, m, es);
    let part_cap = (0..m).map(|i| share(i)).map(|(x, y)| largest_chunk(y - x, plan.hosts as u32, es)).max().unwrap_or(0);
    c.landing(part_cap.max((plan.most * share_cap).div_ceil(c.size as usize)))?;
    unsafe {
        // 1. Within the host: each share reduced at its owner.
        reduce_to_owners(c, local, m, idx, buf, count, dtype, op, share_cap)?;
        // 2. Between hosts: owners of the same share reduce it and spread it among them.
        if let Some(cross) = &plan.cross {
            let (x, y) = share(idx);
            if wire == Wire::Exact {
                group_allreduce(c, cross, buf, x, y, dtype, op, (2, 3), false)?;
            } else {
                wire::group_allreduce(c, cross, buf as *mut f32, x, y, wire, (2, 3))?;
            }
        }
        // 3. Within the host: every owner's share to the others.
        let piece = c.net_piece_bytes();
        let me = c.rank;
        let mut sent = Vec::new();
        if idx < m {
            let (x, y) = share(idx);
            let bytes = (y - x) * es;
            let (p, np) = pieces(bytes, piece, es);
            for k in 0..np {
                let off = k * p;
                for &q in local.iter().filter(|&&r| r != me) {
                    sent.push(c.send_at(q, buf.add(x * es + off), p.min(bytes - off), 1, idx as usize * share_cap + off, k)?);
                }
            }
        }
        for (qi, &q) in local.iter().enumerate().take(m as usize) {
            if q == me {
                continue;
            }
            let (qx, qy) = share(qi as u32);
            let qbytes = (qy - qx) * es;
            let (qp, qnp) = pieces(qbytes, piece, es);
            for k in 0..qnp {
                let off = k * qp;
                let seq = c.seq;
                c.wait_landed(c.landed_word(1, q, k), &|| format!("rank {q}'s share piece {k} of allreduce call #{seq}"))?;
                std::ptr::copy_nonoverlapping(c.landed_at(1, qi * share_cap + off), buf.add(qx * es + off), qp.min(qbytes - off));
            }
        }
        wait_all(sent)
    }
}

/// Step 1: every rank of the host sends share `i` to the host's rank `i` (for `i < m`), at
/// its local index times `share_cap` in the owner's area 0; each owner reduces its share, in
/// local rank order, as the pieces land.
#[allow(clippy::too_many_arguments)]
unsafe fn reduce_to_owners(c: &mut Communicator, local: &[u32], m: u32, idx: u32, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp, share_cap: usize) -> Result<()> {
    let es = dtype.size_bytes();
    let me = c.rank;
    let mut sent = Vec::new();
    for (i, &q) in local.iter().enumerate().take(m as usize) {
        if i as u32 == idx {
            continue;
        }
        let (x, y) = chunk_bounds(count, m, i as u32, ALIGN_ELEMS);
        sent.extend(unsafe { c.send_pieces(q, buf.add(x * es), (y - x) * es, 0, idx as usize * share_cap, es)? });
    }
    if idx < m {
        let (x, y) = chunk_bounds(count, m, idx, ALIGN_ELEMS);
        let bytes = (y - x) * es;
        let (p, np) = pieces(bytes, c.net_piece_bytes(), es);
        for k in 0..np {
            let off = k * p;
            let len = p.min(bytes - off);
            for (j, &q) in local.iter().enumerate().filter(|&(_, &r)| r != me) {
                let seq = c.seq;
                c.wait_landed(c.landed_word(0, q, k), &|| format!("rank {q}'s piece {k} of allreduce call #{seq}"))?;
                unsafe { reduce_into(dtype, op, buf.add(x * es + off), c.landed_at(0, j * share_cap + off), len / es) };
            }
        }
    }
    // Our buffer's shares are overwritten in step 3: their sends must be done first.
    wait_all(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(counts: &[usize]) -> Plan {
        let min = *counts.iter().min().unwrap();
        Plan { local: vec![0], owners: min as u32, cross: None, hosts: counts.len(), even: counts.iter().all(|&k| k == counts[0]), most: *counts.iter().max().unwrap() }
    }

    #[test]
    fn cost_model_picks_the_hierarchy_where_it_saves_network_bytes() {
        for (counts, want) in [(&[1usize, 2, 3][..], true), (&[2, 2][..], true), (&[4, 4, 4][..], true), (&[2, 1][..], false), (&[1, 1, 1][..], false)] {
            let size: usize = counts.iter().sum();
            assert_eq!(pays(&plan(counts), size as u32, counts), want, "{counts:?}");
        }
    }
}
