//! Allreduce between hosts by recursive halving and doubling, for a power-of-two number of
//! ranks (4 or more), on the landing regions of [`landing`](super::landing).
//!
//! Reduce-scatter by recursive halving: in step `s` (distance `d = N/2, N/4, …, 1`) a rank
//! and its partner `rank ^ d` split the chunks they still hold in two; each sends the half
//! the other keeps and reduces the partner's copy of its own half, as it arrives (reduction
//! on arrival: the partner is the only sender of the step). After `log2 N` steps rank `q`
//! holds chunk `q` reduced. Allgather by recursive doubling: in step `t` (`d = 1, 2, …, N/2`)
//! partners swap what they hold, straight into the caller's buffer (direct landing). Bytes
//! sent per rank: `2 (N-1)/N · n`, as the all-to-all of [`all_to_all::allreduce`](super::all_to_all::allreduce),
//! but each step has a single peer: with four hosts on two cores that is fewer flows at once,
//! fewer threads woken and no landing-region copies, at `2 log2 N` steps instead of 2.
//!
//! Landing: step `s` of the reduce-scatter lands in area 0 at `(N - N/2^s) · cap` (`cap` the
//! largest chunk), the allgather in area 1 at the received range's own offset in the
//! buffer; each step's partner is a different rank, so (area, sender, piece) words never
//! repeat within a call. Results are deterministic: each step reduces `mine ⊕ partner's`.
//! Only the current step's partner is reduced on arrival (its window is set per step), so a
//! partner that runs ahead lands its next step in the region, reduced once this step is done.

use scalefree_transport::Window;
use scalefree_transport::Result;

use crate::comm::Communicator;
use crate::dense::landing::{direct_landing_on, largest_chunk, pieces, reduce_on_arrival_on, reducer, wait_all};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};
use crate::reduce::{reduce_into, DType, ReduceOp};

/// Allreduces of `SCALEFREE_NET_HALVING_MIN ..= SCALEFREE_NET_HALVING_MAX` bytes (512 KiB and
/// 4 MiB by default; a maximum of 0 turns it off) go by halving and doubling when the rank
/// count allows. Measured on 4 simulated hosts (A/B in the git history of `docs/benchmarks.md`): 8–12 % faster at
/// 1 MiB, even at 512 KiB to 4 MiB and at 16 MiB, about 8 % slower at 256 KiB, where the
/// extra steps' waits cost more than the fewer flows save.
fn window() -> (usize, usize) {
    static W: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        use scalefree_transport::config::env_bytes;
        (env_bytes("SCALEFREE_NET_HALVING_MIN", 512 << 10), env_bytes("SCALEFREE_NET_HALVING_MAX", 4 << 20))
    })
}

/// Whether an allreduce of `nbytes` among `n` ranks between hosts goes by halving and doubling.
pub(crate) fn suits(n: u32, nbytes: usize) -> bool {
    let (min, max) = window();
    n >= 4 && n.is_power_of_two() && (min..=max).contains(&nbytes)
}

/// Allreduce of `count` elements at `buf` after the header exchange of this call.
///
/// # Safety
/// `buf` valid for `count` elements of `dtype`.
pub(crate) unsafe fn allreduce(c: &mut Communicator, buf: *mut u8, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
    let es = dtype.size_bytes();
    let n = c.size;
    let me = c.rank;
    debug_assert!(n.is_power_of_two());
    // Element bounds of chunks `lo..hi`.
    let span = |lo: u32, hi: u32| (chunk_bounds(count, n, lo, ALIGN_ELEMS).0, chunk_bounds(count, n, hi - 1, ALIGN_ELEMS).1);
    let cap = largest_chunk(count, n, es);
    c.landing(cap)?;
    let piece = c.net_piece_bytes();
    let gather = direct_landing_on().then(|| Window { offset: c.area_base(1), len: count * es, dst: buf, reduce: None });
    let mut sent = Vec::new();
    // Direct landing for the whole call; each step replaces the windows, dropping it ends them.
    let mut direct = None;

    // Reduce-scatter by recursive halving.
    let (mut lo, mut hi) = (0u32, n);
    let (mut d, mut at) = (n / 2, 0usize);
    while d >= 1 {
        let p = me ^ d;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if me & d == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let (ka, kb) = span(keep.0, keep.1);
        let (ga, gb) = span(give.0, give.1);
        let mut windows: Vec<Window> = gather.iter().cloned().collect();
        if reduce_on_arrival_on() {
            windows.push(Window { offset: c.area_base(0) + at, len: (kb - ka) * es, dst: unsafe { buf.add(ka * es) }, reduce: Some(reducer(dtype, op)) });
        }
        unsafe { c.set_windows(&windows, Some(0), &mut direct) };
        sent.extend(unsafe { c.send_pieces(p, buf.add(ga * es), (gb - ga) * es, 0, at, es)? });
        let kbytes = (kb - ka) * es;
        let (kp, knp) = pieces(kbytes, piece, es);
        for k in 0..knp {
            let off = k * kp;
            let seq = c.seq;
            c.wait_landed(c.landed_word(0, p, k), &|| format!("rank {p}'s piece {k} of allreduce call #{seq}"))?;
            if !c.reduced_on_arrival(&direct, p, k) {
                unsafe { reduce_into(dtype, op, buf.add(ka * es + off), c.landed_at(0, at + off), kp.min(kbytes - off) / es) };
            }
        }
        at += (hi - lo) as usize / 2 * cap;
        (lo, hi) = keep;
        d /= 2;
    }
    debug_assert_eq!((lo, hi), (me, me + 1));

    // Allgather by recursive doubling: swap what we hold with rank ^ d.
    unsafe { c.set_windows(gather.as_slice(), None, &mut direct) };
    let mut d = 1;
    while d < n {
        let p = me ^ d;
        let len = hi - lo;
        let theirs = if me & d == 0 { (hi, hi + len) } else { (lo - len, lo) };
        let (oa, ob) = span(lo, hi);
        sent.extend(unsafe { c.send_pieces(p, buf.add(oa * es), (ob - oa) * es, 1, oa * es, es)? });
        let (ta, tb) = span(theirs.0, theirs.1);
        let tbytes = (tb - ta) * es;
        let (tp, tnp) = pieces(tbytes, piece, es);
        for k in 0..tnp {
            let off = k * tp;
            let seq = c.seq;
            c.wait_landed(c.landed_word(1, p, k), &|| format!("rank {p}'s reduced piece {k} of allreduce call #{seq}"))?;
            if !(direct.is_some() && c.landed_direct(1, p, k)) {
                unsafe { std::ptr::copy_nonoverlapping(c.landed_at(1, ta * es + off), buf.add(ta * es + off), tp.min(tbytes - off)) };
            }
        }
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
        d *= 2;
    }
    drop(direct);
    wait_all(sent)
}
