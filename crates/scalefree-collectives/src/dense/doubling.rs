//! Recursive-doubling allreduce for small messages between hosts, and the small allgather,
//! broadcast and reduce-scatter built on it.
//!
//! With several ranks per host (equal counts), each host's first rank leads the others
//! ([`Layout`]): they hand it their message over shared memory, it reduces them in rank
//! order and takes part in the rounds below among leaders, then hands the result back.
//!
//! Over the network the one-shot exchange costs `N-1` messages per rank per call, and on a
//! machine whose ranks outnumber its cores most of them find their receiver parked. Here
//! each rank sends one message per round, `log2 N` rounds: in round `k` rank `r` swaps its
//! partial result with rank `r ^ 2^k` and both reduce. With `p` the largest power of two
//! not above `N`, ranks `p..N` first hand their data to rank `r - p` and get the result back
//! at the end (the usual fold): `2 * (N - p)` more messages.
//!
//! Every message is the call's header (the sender's own), a [`Summary`] of the headers the
//! sender has seen so far, and the sender's partial result. Summaries merge associatively:
//! at the end every rank knows rank 0's call and the lowest rank whose call differs from it,
//! so every rank raises the same `Mismatch` error as [`Communicator::post`] would. A rank of
//! the same call that took another path (a large call, or another collective: those start
//! with `post`, which writes to every peer) is seen as a mismatch too, by whichever rank
//! waits for it; a rank that ends in a mismatch then writes its header to every peer it has
//! not written to in this call, so that such a rank's `post` completes instead of hanging.
//!
//! Messages per call: `N log2 N` (`p log2 p + 2 (N - p)`), against `N (N - 1)` for the
//! one-shot exchange; bytes per rank per round: header, summary and `n` bytes of data.
//! Every rank computes bit-identical results: the two ranks of a pair reduce the same two
//! operands (in either order; every supported op is commutative).
//!
//! Allgather and broadcast travel the same rounds with [`Combine::Or`]: each rank starts from
//! a zeroed buffer holding only what it contributes (its slot; the root's data), and partial
//! results merge by bitwise OR, which copies every slot exactly (any dtype, bit for bit)
//! because no two ranks fill the same bytes. Reduce-scatter is the allreduce of the whole
//! vector, each rank keeping its share: at these sizes a message costs its latency, not its
//! bytes.

use scalefree_transport::{Error, Result};

use crate::comm::{Communicator, Header, HEADER_BYTES};
use crate::reduce::{reduce_into, DType, ReduceOp};

/// Bytes reserved after the header of a doubling message for its [`Summary`].
pub(crate) const SUMMARY_BYTES: usize = 128;

/// What of a header must agree across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
struct Key {
    kind: u32,
    dtype: u32,
    op: u32,
    root: u32,
    algo: u32,
    /// 0: the rank started the call with a doubling message; 1: with `post` (another path).
    path: u32,
    count: u64,
}

impl Key {
    fn of(h: &Header) -> Key {
        Key { kind: h.kind, dtype: h.dtype, op: h.op, root: h.root, algo: h.algo, path: (h.follows != FOLLOWS_SUMMARY) as u32, count: h.count }
    }
    fn header(&self) -> Header {
        let mut h = Header::zeroed();
        (h.kind, h.dtype, h.op, h.root, h.algo, h.count) = (self.kind, self.dtype, self.op, self.root, self.algo, self.count);
        h
    }
}

const NONE: u32 = u32::MAX;

/// The headers of a set of ranks, in brief: the call of the lowest rank in the set, and the
/// lowest rank whose call differs from it (with its call), if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct Summary {
    low: u32,
    bad: u32,
    key0: Key,
    bad_key: Key,
}

const _: () = assert!(std::mem::size_of::<Summary>() <= SUMMARY_BYTES);

impl Summary {
    fn one(rank: u32, key: Key) -> Summary {
        Summary { low: rank, bad: NONE, key0: key, bad_key: Key::default() }
    }

    /// The summary of the union of two disjoint sets.
    fn merge(a: Summary, b: Summary) -> Summary {
        let (a, b) = if a.low <= b.low { (a, b) } else { (b, a) };
        // The lowest rank of `b` that differs from `a.key0`: `b.low` itself if `b`'s first
        // call differs, else `b`'s own first difference.
        let from_b = if b.key0 != a.key0 { Some((b.low, b.key0)) } else { (b.bad != NONE).then_some((b.bad, b.bad_key)) };
        let from_a = (a.bad != NONE).then_some((a.bad, a.bad_key));
        let bad = match (from_a, from_b) {
            (Some(x), Some(y)) => Some(if x.0 <= y.0 { x } else { y }),
            (x, y) => x.or(y),
        };
        match bad {
            Some((r, k)) => Summary { low: a.low, bad: r, key0: a.key0, bad_key: k },
            None => Summary { low: a.low, bad: NONE, key0: a.key0, bad_key: Key::default() },
        }
    }

    fn agrees(&self) -> bool {
        self.bad == NONE
    }

    fn error(&self) -> Error {
        let (a, b) = (self.key0.header().describe(), self.bad_key.header().describe());
        let why = if a == b { " (SCALEFREE_SMALL_NET differs between them)" } else { "" };
        Error::Mismatch(format!("rank {} called {a} but rank {} called {b}{why}", self.low, self.bad))
    }
}

/// How two partial results combine.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Combine {
    /// Elementwise reduction.
    Reduce(DType, ReduceOp),
    /// Bitwise OR of the bytes: for slots that one side has filled and the other left zero.
    Or,
}

impl Combine {
    /// `dst = dst ∘ src` over `nbytes` bytes.
    ///
    /// # Safety
    /// Both valid for `nbytes` bytes (whole elements for `Reduce`), not overlapping.
    unsafe fn apply(self, dst: *mut u8, src: *const u8, nbytes: usize) {
        if nbytes == 0 {
            return;
        }
        match self {
            Combine::Reduce(dtype, op) => unsafe { reduce_into(dtype, op, dst, src, nbytes / dtype.size_bytes()) },
            Combine::Or => {
                let (d, s) = unsafe { (std::slice::from_raw_parts_mut(dst, nbytes), std::slice::from_raw_parts(src, nbytes)) };
                // The compiler vectorizes this byte loop.
                d.iter_mut().zip(s).for_each(|(a, b)| *a |= b);
            }
        }
    }
}

/// Marks a header as the start of a doubling message (`Header::follows`).
pub(crate) const FOLLOWS_SUMMARY: u32 = 0x5346_5244; // "SFRD"

/// The rounds this rank takes part in: `(fold, partners)`. `fold`: the rank it folds with
/// (`Some(r - p)` for an extra rank, `Some(r + p)` for a rank that takes one in).
fn schedule(rank: u32, size: u32) -> (Option<u32>, Vec<u32>) {
    let p = 1u32 << (31 - size.leading_zeros());
    let extra = size - p;
    if rank >= p {
        return (Some(rank - p), Vec::new());
    }
    let fold = (rank < extra).then_some(rank + p);
    let mut partners = Vec::new();
    let mut mask = 1;
    while mask < p {
        partners.push(rank ^ mask);
        mask <<= 1;
    }
    (fold, partners)
}

/// Who takes part in the doubling rounds, and how this rank joins them.
///
/// With one rank per host every rank is a member. With several ranks on each host (equal
/// counts) each host's first rank (its *leader*) gathers the others' messages over shared
/// memory, reduces them in rank order, takes part in the rounds between leaders, and hands
/// the result (with the merged summary) back to them: `H log2 H` network messages per call
/// between `H` hosts instead of `N (N - 1)` for the one-shot exchange.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    /// This rank's leader when it is not one itself: it hands its message up and waits.
    leader: Option<u32>,
    /// The ranks this leader gathers from and hands the result back to (in rank order).
    below: Vec<u32>,
    /// The ranks of the doubling rounds (for a rank under a leader: none).
    members: Vec<u32>,
    /// How many ranks take part in the rounds (every rank knows it).
    rounds_of: u32,
}

impl Layout {
    /// Every rank a member (one rank per host).
    pub(crate) fn flat(size: u32) -> Layout {
        Layout { leader: None, below: Vec::new(), members: (0..size).collect(), rounds_of: size }
    }

    /// Each host's first rank leads the others on it. `(local, cross)` are this rank's
    /// [`host_groups`](crate::dense::hierarchical::host_groups): its host's ranks, and the ranks of
    /// its local index on every host (for a leader: the leaders).
    pub(crate) fn by_host(me: u32, (local, cross): &(Vec<u32>, Vec<u32>)) -> Layout {
        let rounds_of = cross.len() as u32;
        if me != local[0] {
            return Layout { leader: Some(local[0]), below: Vec::new(), members: Vec::new(), rounds_of };
        }
        // In rank order (a fold's direction follows rank order).
        let mut members = cross.clone();
        members.sort_unstable();
        Layout { leader: None, below: local[1..].to_vec(), members, rounds_of }
    }

    /// How many ranks (hosts' leaders, or every rank) take part in the rounds.
    pub(crate) fn rounds_of(&self) -> u32 {
        self.rounds_of
    }
}

/// One call's state: who has been written to, and the sends in flight.
struct Call<'a> {
    c: &'a mut Communicator,
    hdr: Header,
    written: Vec<bool>,
    sends: Vec<scalefree_transport::Completion>,
}

impl Call<'_> {
    /// Sends header, `summary` and `n` bytes at `data` to `peer` (copied: `data` may change
    /// before the write completes).
    unsafe fn send(&mut self, peer: u32, summary: &Summary, data: *const u8, n: usize) -> Result<()> {
        let seq = self.c.seq;
        let mut s = [0u8; SUMMARY_BYTES];
        unsafe { std::ptr::copy_nonoverlapping(summary as *const Summary as *const u8, s.as_mut_ptr(), std::mem::size_of::<Summary>()) };
        let data = if n > 0 { unsafe { std::slice::from_raw_parts(data, n) } } else { &[][..] };
        self.c.count_staged(n);
        let r = unsafe { self.c.send_inbox(peer, seq, &[self.hdr.as_bytes(), &s, data]) };
        self.sends.push(r?);
        self.written[peer as usize] = true;
        Ok(())
    }

    /// Waits for `peer`'s message of this call: its summary and a pointer to its data
    /// (`None` when `peer` started this call some other way: then only its header counts).
    fn receive(&self, peer: u32) -> Result<(Summary, Option<*const u8>)> {
        let h = self.c.await_small(peer)?;
        let at = self.c.inbox_ptr(peer);
        if h.follows != FOLLOWS_SUMMARY {
            return Ok((Summary::one(peer, Key::of(&h)), None));
        }
        let s = unsafe { std::ptr::read_unaligned(at.add(HEADER_BYTES) as *const Summary) };
        Ok((s, Some(unsafe { at.add(HEADER_BYTES + SUMMARY_BYTES) })))
    }

    /// Ends the call: after a mismatch, a header to every peer not written to yet (a peer
    /// that started with `post` waits for one from everybody); then every send completes.
    fn finish(mut self, summary: &Summary) -> Result<()> {
        if !summary.agrees() {
            for p in self.c.peers().collect::<Vec<_>>() {
                if !self.written[p as usize] {
                    unsafe { self.send(p, summary, std::ptr::null(), 0)? };
                }
            }
        }
        for s in self.sends.drain(..) {
            s.wait()?;
        }
        if summary.agrees() {
            Ok(())
        } else {
            Err(summary.error())
        }
    }
}

/// Combines the `nbytes` at `buf` of every rank, in place, by recursive doubling; starts the
/// call itself (no `post` before it). With `nbytes == 0` it is only the agreement on `hdr`
/// (and a barrier: no rank returns before every rank has started the call).
///
/// # Safety
/// `buf` valid for reads and writes of `nbytes` bytes (whole elements for `Combine::Reduce`),
/// and `nbytes` at most the inbox payload (`CommOptions::inline_bytes`).
pub(crate) unsafe fn allreduce(c: &mut Communicator, mut hdr: Header, buf: *mut u8, nbytes: usize, how: Combine) -> Result<()> {
    let combine = |dst, src| unsafe { how.apply(dst, src, nbytes) };
    let seq = c.next_seq();
    hdr.seq = seq;
    hdr.follows = FOLLOWS_SUMMARY;
    let (me, size) = (c.rank, c.size);
    let mine = Key::of(&hdr);
    let layout = c.small.clone().expect("checked by Communicator::doubling");
    let mut call = Call { written: vec![false; size as usize], sends: Vec::new(), hdr, c };
    let mut summary = Summary::one(me, mine);
    // Hands this rank's data to `to` and takes the result back (a rank under a host
    // leader, or an extra member folded into another).
    let hand_up = |call: &mut Call, to: u32, summary: Summary| -> Result<Summary> {
        unsafe { call.send(to, &summary, buf, nbytes)? };
        let (s, data) = call.receive(to)?;
        // Normally `s` covers every rank already; merging this rank again changes nothing.
        let summary = Summary::merge(summary, s);
        if summary.agrees() && nbytes > 0 {
            let data = data.expect("an agreeing summary comes with data");
            unsafe { std::ptr::copy_nonoverlapping(data, buf, nbytes) };
        }
        Ok(summary)
    };
    if let Some(l) = layout.leader {
        let summary = hand_up(&mut call, l, summary)?;
        return call.finish(&summary);
    }
    // A host leader first gathers the other ranks of its host, in rank order.
    for &q in &layout.below {
        let (s, data) = call.receive(q)?;
        summary = Summary::merge(summary, s);
        if let (true, Some(d)) = (summary.agrees(), data) {
            combine(buf, d);
        }
    }
    // The rounds between members (ascending ranks, so a fold's direction is kept).
    let idx = layout.members.iter().position(|&r| r == me).expect("a leader is a member") as u32;
    let (fold, partners) = schedule(idx, layout.members.len() as u32);
    let fold = fold.map(|i| layout.members[i as usize]);
    if let Some(f) = fold.filter(|&f| f < me) {
        summary = hand_up(&mut call, f, summary)?;
    } else {
        if let Some(f) = fold {
            let (s, data) = call.receive(f)?;
            summary = Summary::merge(summary, s);
            if let (true, Some(d)) = (summary.agrees(), data) {
                combine(buf, d);
            }
        }
        for q in partners.into_iter().map(|i| layout.members[i as usize]) {
            unsafe { call.send(q, &summary, buf, nbytes)? };
            let (s, data) = call.receive(q)?;
            summary = Summary::merge(summary, s);
            if let (true, Some(d)) = (summary.agrees(), data) {
                combine(buf, d);
            }
        }
        if let Some(f) = fold {
            unsafe { call.send(f, &summary, buf, if summary.agrees() { nbytes } else { 0 })? };
        }
    }
    // And hands the result back down.
    for &q in &layout.below {
        unsafe { call.send(q, &summary, buf, if summary.agrees() { nbytes } else { 0 })? };
    }
    call.finish(&summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(count: u64) -> Key {
        Key { kind: 1, dtype: 1, op: 1, root: 0, algo: 1, path: 0, count }
    }

    /// The reference: rank 0's key and the lowest rank that differs from it.
    fn reference(keys: &[Key]) -> (Key, Option<(u32, Key)>) {
        let bad = keys.iter().position(|k| *k != keys[0]).map(|r| (r as u32, keys[r]));
        (keys[0], bad)
    }

    #[test]
    fn summaries_merge_to_the_first_difference_in_any_order() {
        // Every assignment of 3 distinct keys to up to 6 ranks, merged along the doubling
        // schedule and along an arbitrary (reversed) order.
        for n in 1..=6u32 {
            let mut codes = vec![0u64; n as usize];
            loop {
                let keys: Vec<Key> = codes.iter().map(|&c| key(c)).collect();
                let (k0, bad) = reference(&keys);
                let mut s = Summary::one(n - 1, keys[n as usize - 1]);
                for r in (0..n - 1).rev() {
                    s = Summary::merge(Summary::one(r, keys[r as usize]), s);
                }
                assert_eq!((s.low, s.key0), (0, k0));
                assert_eq!(if s.agrees() { None } else { Some((s.bad, s.bad_key)) }, bad, "{codes:?}");
                // Pairwise, as the butterfly does it.
                let mut parts: Vec<Summary> = (0..n).map(|r| Summary::one(r, keys[r as usize])).collect();
                while parts.len() > 1 {
                    let b = parts.pop().unwrap();
                    let a = parts.remove(0);
                    parts.push(Summary::merge(b, a));
                }
                assert_eq!(parts[0], s, "{codes:?}");
                // next assignment
                let mut i = 0;
                while i < codes.len() && codes[i] == 2 {
                    codes[i] = 0;
                    i += 1;
                }
                if i == codes.len() {
                    break;
                }
                codes[i] += 1;
            }
        }
    }

    #[test]
    fn or_merges_disjoint_slots_bit_for_bit() {
        // Slots of odd lengths around the 8-byte words, values that OR would garble if two
        // sides filled the same bytes: each side's slots come through exactly.
        for n in [0usize, 1, 7, 8, 9, 63, 1001] {
            let full: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(37) | 0x81).collect();
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            for i in 0..n {
                if (i / 3) % 2 == 0 { a[i] = full[i] } else { b[i] = full[i] }
            }
            unsafe { Combine::Or.apply(a.as_mut_ptr(), b.as_ptr(), n) };
            assert_eq!(a, full, "n {n}");
        }
        let mut x = [1.5f64, -0.0, f64::NAN];
        let y = [0f64; 3];
        unsafe { Combine::Or.apply(x.as_mut_ptr() as *mut u8, y.as_ptr() as *const u8, 24) };
        assert_eq!(x[1].to_bits(), (-0.0f64).to_bits(), "the sign of zero survives");
        assert!(x[2].is_nan() && x[0] == 1.5);
    }

    #[test]
    fn schedules_pair_up_and_fold_every_rank() {
        for size in 1..=17u32 {
            let p = 1u32 << (31 - size.leading_zeros());
            for r in 0..size {
                let (fold, partners) = schedule(r, size);
                for (k, &q) in partners.iter().enumerate() {
                    assert!(q < p);
                    assert_eq!(schedule(q, size).1[k], r, "partners are mutual");
                }
                if let Some(f) = fold {
                    assert_eq!(schedule(f, size).0, Some(r), "folds are mutual");
                }
                assert_eq!(fold.is_some(), r >= p || r < size - p);
            }
        }
    }
}
