//! The edge exchange of a partitioned load, done natively: every edge goes to the rank that
//! owns it ([`owner_partition`]: one counting sort by owner), and there the received edges
//! are sorted with duplicates dropped ([`sort_dedup_pairs`]: an LSD radix sort of packed
//! keys, then a linear dedup).
//!
//! The owner of edge `(s, d)` is [`edge_hash`]`(s, d) % size`, with the ids read as u64 —
//! the same function as `scalefree.graph.io.edge_owner` (numpy), so ranks that mix the two
//! agree, and every id width gives the same owner for the same edge.

use crate::{prefetch, Id};

const MIX_SRC: u64 = 0x9E37_79B9_7F4A_7C15; // 2^64 / golden ratio, odd
const MIX_EDGE: u64 = 0xBF58_476D_1CE4_E5B9; // the first multiplier of splitmix64's finalizer

/// The 64-bit hash that picks an edge's owner: `h = (src * A) ^ dst`, `h *= B`,
/// `h ^= h >> 31` (wrapping; `A = 0x9E3779B97F4A7C15`, `B = 0xBF58476D1CE4E5B9`). The two
/// odd multipliers spread every input bit upward, the final shift folds the high bits into
/// the low ones that `% size` reads.
#[inline(always)]
pub fn edge_hash(src: u64, dst: u64) -> u64 {
    let h = (src.wrapping_mul(MIX_SRC) ^ dst).wrapping_mul(MIX_EDGE);
    h ^ (h >> 31)
}

/// `a % d` for a fixed `d < 2^32` without a division (Lemire, Kaser and Kurz, "Faster
/// remainder by direct computation", 2019: `M = ceil(2^128 / d)`; the remainder is the
/// high 64 bits of `(M * a mod 2^128) * d`).
#[derive(Clone, Copy, Debug)]
pub struct FastMod {
    m: u128,
    d: u64,
}

impl FastMod {
    /// Panics if `d == 0` or `d >= 2^32` (misuse: checked by the callers).
    pub fn new(d: u64) -> FastMod {
        assert!(d > 0 && d < 1 << 32, "FastMod: divisor {d} must be in 1..2^32");
        // d == 1: M wraps to 0 and every remainder is 0, as it must be.
        FastMod { m: (u128::MAX / d as u128).wrapping_add(1), d }
    }

    #[inline(always)]
    pub fn remainder(self, a: u64) -> u64 {
        let low = self.m.wrapping_mul(a as u128);
        let d = self.d as u128;
        let bottom = ((low as u64 as u128) * d) >> 64;
        let top = (low >> 64) * d;
        ((top + bottom) >> 64) as u64
    }
}

/// The owner rank of every edge, as [`owner_partition`] computes it (for references and
/// tests).
pub fn edge_owners<I: Id>(src: &[I], dst: &[I], size: usize) -> Vec<u32> {
    let fm = FastMod::new(size as u64);
    src.iter().zip(dst).map(|(&s, &d)| fm.remainder(edge_hash(s.u64(), d.u64())) as u32).collect()
}

/// Groups the edges `(src[e], dst[e])` by owner rank (see the module docs), stably: returns
/// the pairs interleaved (`s0, d0, s1, d1, ...`, owner 0's edges first, each owner's in
/// input order) as ids of type `O`, and the number of edges per owner (`size` entries).
/// Two passes over the edges (count, scatter), no sort.
///
/// Errors: `src`/`dst` lengths differ, `size` not in `1..2^32`, or an id too large for `O`.
pub fn owner_partition_as<I: Id, O: Id>(src: &[I], dst: &[I], size: usize) -> Result<(Vec<O>, Vec<u64>), String> {
    if src.len() != dst.len() {
        return Err(format!("owner_partition: {} source ids but {} target ids", src.len(), dst.len()));
    }
    if size == 0 || size as u64 >= 1 << 32 {
        return Err(format!("owner_partition: size must be in 1..2^32, got {size}"));
    }
    let fm = FastMod::new(size as u64);
    let owner = |s: u64, d: u64| fm.remainder(edge_hash(s, d)) as usize;
    let mut counts = vec![0u64; size];
    let mut top = 0u64;
    // Up to 256 owners the count pass keeps every edge's owner (a byte) for the scatter
    // pass, which then reads one byte instead of hashing again.
    let keep = size <= 256;
    let mut owners: Vec<u8> = Vec::with_capacity(if keep { src.len() } else { 0 });
    for (&s, &d) in src.iter().zip(dst) {
        let (s, d) = (s.u64(), d.u64());
        top = top.max(s.max(d));
        let o = owner(s, d);
        counts[o] += 1;
        if keep {
            owners.push(o as u8);
        }
    }
    if top > O::MAX_U64 {
        return Err(format!("owner_partition: id {top} does not fit the output id type (ids up to {})", O::MAX_U64));
    }
    let mut next = Vec::with_capacity(size);
    let mut at = 0usize;
    for &c in &counts {
        next.push(at);
        at += 2 * c as usize;
    }
    let mut out = vec![O::default(); 2 * src.len()];
    let mut place = |o: usize, s: u64, d: u64| {
        let p = &mut next[o];
        out[*p] = O::of_u64(s);
        out[*p + 1] = O::of_u64(d);
        *p += 2;
    };
    if keep {
        for ((&s, &d), &o) in src.iter().zip(dst).zip(&owners) {
            place(o as usize, s.u64(), d.u64());
        }
    } else {
        for (&s, &d) in src.iter().zip(dst) {
            let (s, d) = (s.u64(), d.u64());
            place(owner(s, d), s, d);
        }
    }
    Ok((out, counts))
}

/// [`owner_partition_as`] for u32 ids in and out.
pub fn owner_partition(src: &[u32], dst: &[u32], size: usize) -> Result<(Vec<u32>, Vec<u64>), String> {
    owner_partition_as::<u32, u32>(src, dst, size)
}

/// Bits per radix digit (2048 buckets: the counters and the write fronts stay in L2).
const DIGIT_BITS: u32 = 11;
/// Below this many keys, `sort_unstable` beats the radix passes' fixed costs.
const RADIX_MIN_KEYS: usize = 1 << 10;

/// Sorts `keys` ascending: an LSD radix sort with [`DIGIT_BITS`]-bit digits placed only
/// over the bits that differ between keys (ids below 2^22 packed into `src << 32 | dst`
/// take four passes, not six), all digit histograms in one pass, then one stable scatter
/// pass per digit. Linear time; a scratch vector as large as `keys`.
pub fn radix_sort_u64(keys: &mut Vec<u64>) {
    let n = keys.len();
    if n < RADIX_MIN_KEYS {
        keys.sort_unstable();
        return;
    }
    let first = keys[0];
    let varying = keys.iter().fold(0u64, |v, &k| v | (k ^ first));
    // Digit shifts: each digit starts at the lowest differing bit not yet covered.
    let mut shifts = Vec::new();
    let mut b = 0u32;
    while b < 64 && varying >> b != 0 {
        b += (varying >> b).trailing_zeros();
        shifts.push(b);
        b += DIGIT_BITS;
    }
    let mask = (1u64 << DIGIT_BITS) - 1;
    let buckets = 1usize << DIGIT_BITS;
    let mut hist = vec![0usize; shifts.len() * buckets];
    for &k in keys.iter() {
        for (h, &s) in hist.chunks_exact_mut(buckets).zip(&shifts) {
            h[((k >> s) & mask) as usize] += 1;
        }
    }
    let mut tmp = vec![0u64; n];
    for (h, &s) in hist.chunks_exact_mut(buckets).zip(&shifts) {
        let mut at = 0usize;
        for c in h.iter_mut() {
            let here = *c;
            *c = at;
            at += here;
        }
        for &k in keys.iter() {
            let p = &mut h[((k >> s) & mask) as usize];
            // SAFETY: the write fronts start at the exclusive prefix sums of this digit's
            // histogram over these very keys, so every front stays below its bucket's end
            // and the largest is < n = tmp.len().
            unsafe { *tmp.get_unchecked_mut(*p) = k };
            *p += 1;
        }
        std::mem::swap(keys, &mut tmp);
    }
}

/// The distinct edges of interleaved `pairs` (`s0, d0, s1, d1, ...`), sorted by (src, dst)
/// as u64 values: `(src, dst)`. When the bits of the largest source and target fit 64
/// together (always for u32 ids) the pairs are packed into u64 keys and radix sorted
/// ([`radix_sort_u64`]); otherwise they are sorted as pairs (`sort_unstable`). Then one
/// linear pass drops duplicates.
///
/// Errors: an odd number of ids.
pub fn sort_dedup_pairs_as<I: Id>(pairs: &[I]) -> Result<(Vec<I>, Vec<I>), String> {
    if !pairs.len().is_multiple_of(2) {
        return Err(format!("sort_dedup_pairs: {} ids is not a whole number of (src, dst) pairs", pairs.len()));
    }
    let (mut any_s, mut any_d) = (0u64, 0u64);
    for p in pairs.chunks_exact(2) {
        any_s |= p[0].u64();
        any_d |= p[1].u64();
    }
    let (sbits, dbits) = (64 - any_s.leading_zeros(), 64 - any_d.leading_zeros());
    if sbits + dbits > 64 {
        let mut v: Vec<(u64, u64)> = pairs.chunks_exact(2).map(|p| (p[0].u64(), p[1].u64())).collect();
        v.sort_unstable();
        v.dedup();
        return Ok(v.iter().map(|&(s, d)| (I::of_u64(s), I::of_u64(d))).unzip());
    }
    // Targets in the low `shift` bits; `src << shift` never loses bits (sbits + shift <= 64;
    // shift == 64 only when every source is 0, and wrapping_shl(64) shifts by 0).
    let shift = if std::mem::size_of::<I>() == 4 { 32 } else { dbits };
    let mut keys: Vec<u64> = pairs.chunks_exact(2).map(|p| p[0].u64().wrapping_shl(shift) | p[1].u64()).collect();
    radix_sort_u64(&mut keys);
    keys.dedup();
    let low = if shift >= 64 { u64::MAX } else { (1u64 << shift) - 1 };
    let src = keys.iter().map(|&k| I::of_u64(k.checked_shr(shift).unwrap_or(0))).collect();
    let dst = keys.iter().map(|&k| I::of_u64(k & low)).collect();
    Ok((src, dst))
}

/// [`sort_dedup_pairs_as`] for u32 ids.
pub fn sort_dedup_pairs(pairs: &[u32]) -> Result<(Vec<u32>, Vec<u32>), String> {
    sort_dedup_pairs_as(pairs)
}

/// Edges as two id columns, `(src, dst)`.
pub type Pairs<O> = (Vec<O>, Vec<O>);

/// The distinct edges of `(src, dst)` if the edges are already in non-decreasing (src, dst)
/// order (as u64 values), as ids of type `O`; None as soon as one edge is below the one
/// before it (the caller then sorts: [`sort_dedup_pairs_as`]). One pass to check and count,
/// one to copy the distinct edges out. What a file written sorted (`distinct().sort()`)
/// gives each rank of a load: its share, a run of the sorted edges.
///
/// Errors: `src`/`dst` lengths differ, or an id too large for `O`.
pub fn dedup_sorted_as<I: Id, O: Id>(src: &[I], dst: &[I]) -> Result<Option<Pairs<O>>, String> {
    if src.len() != dst.len() {
        return Err(format!("dedup_sorted: {} source ids but {} target ids", src.len(), dst.len()));
    }
    let mut distinct = usize::from(!src.is_empty());
    let mut top = src.first().map_or(0, |s| s.u64()).max(dst.first().map_or(0, |d| d.u64()));
    for e in 1..src.len() {
        let (a, b) = ((src[e - 1].u64(), dst[e - 1].u64()), (src[e].u64(), dst[e].u64()));
        if b < a {
            return Ok(None);
        }
        distinct += usize::from(b != a);
        top = top.max(b.1);
    }
    // Sorted: the largest source is the last one.
    top = top.max(src.last().map_or(0, |s| s.u64()));
    if top > O::MAX_U64 {
        return Err(format!("dedup_sorted: id {top} does not fit the output id type (ids up to {})", O::MAX_U64));
    }
    let (mut s_out, mut d_out) = (Vec::with_capacity(distinct), Vec::with_capacity(distinct));
    let mut last: Option<(I, I)> = None;
    for (&s, &d) in src.iter().zip(dst) {
        if last != Some((s, d)) {
            s_out.push(O::of_u64(s.u64()));
            d_out.push(O::of_u64(d.u64()));
            last = Some((s, d));
        }
    }
    Ok(Some((s_out, d_out)))
}

/// Out- and in-degree of every id below `n` over the edges: `2n` values, out-degrees
/// (counts of `src`) then in-degrees (counts of `dst`), as f64 (what the degree allreduce
/// sums). Counted in u32 (half the cache footprint of f64 counters, integer adds) and
/// converted once. Errors name the first edge with an id `>= n`.
pub fn degree_counts<I: Id>(src: &[I], dst: &[I], n: usize) -> Result<Vec<f64>, String> {
    if src.len() != dst.len() {
        return Err(format!("degree_counts: {} source ids but {} target ids", src.len(), dst.len()));
    }
    if src.len() < u32::MAX as usize {
        Ok(count_degrees::<I, u32>(src, dst, n, 1)?.into_iter().map(|c| c as f64).collect())
    } else {
        count_degrees::<I, f64>(src, dst, n, 1.0)
    }
}

fn count_degrees<I: Id, C: Copy + Default + std::ops::AddAssign>(src: &[I], dst: &[I], n: usize, one: C) -> Result<Vec<C>, String> {
    let mut deg = vec![C::default(); 2 * n];
    let (out, inn) = deg.split_at_mut(n);
    for (e, (&s, &d)) in src.iter().zip(dst).enumerate() {
        if let (Some(&s2), Some(&d2)) = (src.get(e + 32), dst.get(e + 32)) {
            prefetch(out.as_ptr().wrapping_add(s2.u64() as usize));
            prefetch(inn.as_ptr().wrapping_add(d2.u64() as usize));
        }
        let (s, d) = (s.u64(), d.u64());
        if s.max(d) >= n as u64 {
            return Err(format!("degree_counts: edge {e} ({s}, {d}) has an id >= n = {n}"));
        }
        out[s as usize] += one;
        inn[d as usize] += one;
    }
    Ok(deg)
}

/// Every id ordered by falling `total` (degree), ties by id: the same order as numpy's
/// `np.argsort(-total, kind="stable")`. Integral totals in `0..2^32` (what summed edge
/// counts are) with fewer than 2^32 ids sort as packed keys `(!total) << 32 | id` with
/// [`radix_sort_u64`]; anything else (fractions, negatives, NaN) with a comparison sort.
pub fn degree_order(total: &[f64]) -> Vec<i64> {
    let n = total.len();
    let integral = n < u32::MAX as usize && total.iter().all(|&t| (0.0..4_294_967_296.0).contains(&t) && t.fract() == 0.0);
    if integral {
        let mut keys: Vec<u64> = total.iter().enumerate().map(|(i, &t)| (!(t as u32) as u64) << 32 | i as u64).collect();
        radix_sort_u64(&mut keys);
        return keys.iter().map(|&k| (k & 0xFFFF_FFFF) as i64).collect();
    }
    let mut order: Vec<i64> = (0..n as i64).collect();
    // NaN sorts last among equals as numpy puts it (after every number, ties by id).
    let fall = |a: f64, b: f64| match (a.is_nan(), b.is_nan()) {
        (false, false) => b.partial_cmp(&a).unwrap(),
        (x, y) => x.cmp(&y),
    };
    order.sort_by(|&i, &j| fall(total[i as usize], total[j as usize]).then(i.cmp(&j)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) struct Rng(u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let x = self.0;
            (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    const SIZES: &[usize] = &[0, 1, 2, 7, 1001, 1023, 1024, 1025, 20_011, 300_000];

    #[test]
    fn fastmod_matches_the_remainder() {
        let mut r = Rng(1);
        let divisors = [1u64, 2, 3, 5, 7, 10, 255, 256, 257, 65_535, 65_537, 1_000_003, (1 << 31) - 1, (1 << 32) - 1];
        for &d in &divisors {
            let fm = FastMod::new(d);
            let edge = [0u64, 1, d - 1, d, d + 1, u64::MAX, u64::MAX - 1, u64::MAX / d * d, 1 << 63, (1 << 32) - 1];
            for a in edge.into_iter().chain((0..20_000).map(|_| r.next())) {
                assert_eq!(fm.remainder(a), a % d, "{a} % {d}");
            }
        }
    }

    #[test]
    fn edge_hash_is_the_numpy_edge_owner_hash() {
        // Values from `scalefree.graph.io.edge_owner`'s formula, written out by hand.
        let h = |s: u64, d: u64| {
            let mut h = s.wrapping_mul(0x9E3779B97F4A7C15) ^ d;
            h = h.wrapping_mul(0xBF58476D1CE4E5B9);
            h ^ (h >> 31)
        };
        for (s, d) in [(0u64, 0u64), (1, 2), (4_000_000, 17), (u32::MAX as u64, 5), (1 << 40, 1 << 41)] {
            assert_eq!(edge_hash(s, d), h(s, d));
        }
        // Spread: every owner of 5 gets 20% +- 1% of 100k distinct edges.
        let src: Vec<u32> = (0..100_000).map(|i| i / 300).collect();
        let dst: Vec<u32> = (0..100_000).map(|i| i % 300).collect();
        let (_, counts) = owner_partition(&src, &dst, 5).unwrap();
        for c in counts {
            assert!((19_000..21_000).contains(&c), "{c}");
        }
    }

    fn reference_partition(src: &[u64], dst: &[u64], size: usize) -> (Vec<u64>, Vec<u64>) {
        let mut out = Vec::new();
        let mut counts = vec![0u64; size];
        for (o, count) in counts.iter_mut().enumerate() {
            for (&s, &d) in src.iter().zip(dst) {
                if (edge_hash(s, d) % size as u64) as usize == o {
                    out.extend([s, d]);
                    *count += 1;
                }
            }
        }
        (out, counts)
    }

    #[test]
    fn owner_partition_matches_a_reference() {
        let mut r = Rng(2);
        for &n in SIZES {
            for size in [1usize, 2, 3, 5, 64, 256, 257, 1000] {
                let top = if n % 2 == 0 { 1 << 22 } else { 40 };
                let src: Vec<u32> = (0..n).map(|_| r.below(top) as u32).collect();
                let dst: Vec<u32> = (0..n).map(|_| r.below(top) as u32).collect();
                let (s64, d64): (Vec<u64>, Vec<u64>) = (src.iter().map(|&x| x as u64).collect(), dst.iter().map(|&x| x as u64).collect());
                let (want, want_counts) = reference_partition(&s64, &d64, size);
                let (got, counts) = owner_partition(&src, &dst, size).unwrap();
                assert_eq!(counts, want_counts, "n {n} size {size}");
                assert_eq!(got.iter().map(|&x| x as u64).collect::<Vec<_>>(), want, "n {n} size {size}");
                // Wide ids and other widths give the same owners.
                let (got64, c64) = owner_partition_as::<u64, u64>(&s64, &d64, size).unwrap();
                assert_eq!((got64, c64), (want, want_counts));
                let owners = edge_owners(&src, &dst, size);
                assert_eq!(owners.len(), n);
            }
        }
        let big = [1u64 << 40, 3];
        let (got, counts) = owner_partition_as::<u64, i64>(&big, &[7, 1 << 33], 3).unwrap();
        assert_eq!(counts.iter().sum::<u64>(), 2);
        assert!(got.contains(&(1i64 << 40)) && got.contains(&(1i64 << 33)));
        assert!(owner_partition_as::<u64, u32>(&big, &[7, 1 << 33], 3).unwrap_err().contains("does not fit"));
        assert!(owner_partition(&[1], &[], 3).is_err());
        assert!(owner_partition(&[1], &[2], 0).is_err());
    }

    fn reference_dedup(pairs: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let set: std::collections::BTreeSet<(u64, u64)> = pairs.chunks(2).map(|p| (p[0], p[1])).collect();
        set.into_iter().unzip()
    }

    #[test]
    fn radix_sort_sorts() {
        let mut r = Rng(3);
        for &n in SIZES {
            for bits in [1u32, 5, 22, 44, 54, 64] {
                let mut keys: Vec<u64> = (0..n).map(|_| r.next() >> (64 - bits)).collect();
                let mut want = keys.clone();
                want.sort_unstable();
                radix_sort_u64(&mut keys);
                assert_eq!(keys, want, "n {n} bits {bits}");
            }
            // Differing bits only high up, and only in the middle.
            let mut keys: Vec<u64> = (0..n).map(|_| (r.below(3) << 61) | 12345).collect();
            let mut want = keys.clone();
            want.sort_unstable();
            radix_sort_u64(&mut keys);
            assert_eq!(keys, want);
            let mut keys: Vec<u64> = (0..n).map(|_| (r.below(1 << 14) << 25) | (1 << 63)).collect();
            let mut want = keys.clone();
            want.sort_unstable();
            radix_sort_u64(&mut keys);
            assert_eq!(keys, want);
        }
    }

    #[test]
    fn sort_dedup_pairs_matches_a_reference() {
        let mut r = Rng(4);
        for &n in SIZES {
            for top in [1u64, 3, 1000, 1 << 22, 1 << 32] {
                let pairs: Vec<u32> = (0..2 * n).map(|_| r.below(top) as u32).collect();
                let p64: Vec<u64> = pairs.iter().map(|&x| x as u64).collect();
                let want = reference_dedup(&p64);
                let (s, d) = sort_dedup_pairs(&pairs).unwrap();
                assert_eq!(s.iter().map(|&x| x as u64).collect::<Vec<_>>(), want.0, "n {n} top {top}");
                assert_eq!(d.iter().map(|&x| x as u64).collect::<Vec<_>>(), want.1, "n {n} top {top}");
                assert_eq!(sort_dedup_pairs_as(&p64).unwrap(), want);
            }
            // Wide ids: packed when they fit 64 bits together, sorted as pairs otherwise.
            for (ts, td) in [(1u64 << 40, 1u64 << 20), (1 << 40, 1 << 40), (u64::MAX, 2), (1, u64::MAX)] {
                let pairs: Vec<u64> = (0..n).flat_map(|_| [r.below(ts), r.below(td)]).collect();
                let pairs: Vec<u64> = pairs.iter().chain(&pairs[..pairs.len() / 3 * 2]).copied().collect();
                assert_eq!(sort_dedup_pairs_as(&pairs).unwrap(), reference_dedup(&pairs), "n {n}");
                let p: Vec<i64> = pairs.iter().map(|&x| (x >> 1) as i64).collect();
                let (s, d) = sort_dedup_pairs_as(&p).unwrap();
                let want = reference_dedup(&p.iter().map(|&x| x as u64).collect::<Vec<_>>());
                assert_eq!((s.iter().map(|&x| x as u64).collect::<Vec<_>>(), d.iter().map(|&x| x as u64).collect::<Vec<_>>()), want);
            }
        }
        // Many duplicates of few edges.
        let pairs: Vec<u32> = (0..100_000u32).flat_map(|i| [i % 3, i % 5]).collect();
        let (s, d) = sort_dedup_pairs(&pairs).unwrap();
        assert_eq!(s.len(), 15);
        assert_eq!((s[0], d[0], s[14], d[14]), (0, 0, 2, 4));
        assert!(sort_dedup_pairs(&[1, 2, 3]).is_err());
    }

    #[test]
    fn dedup_sorted_matches_a_reference_or_refuses() {
        let mut r = Rng(7);
        for &n in SIZES {
            let mut pairs: Vec<(u64, u64)> = (0..n).map(|_| (r.below(50), r.below(1 << 33))).collect();
            pairs.sort_unstable();
            let (src, dst): (Vec<u64>, Vec<u64>) = pairs.iter().copied().unzip();
            let mut want = pairs.clone();
            want.dedup();
            let (ws, wd): (Vec<u64>, Vec<u64>) = want.into_iter().unzip();
            assert_eq!(dedup_sorted_as::<u64, u64>(&src, &dst).unwrap(), Some((ws, wd)), "{n}");
            if n > 1 && pairs[0] != pairs[n - 1] {
                // One edge out of order anywhere: refused.
                let (mut s2, mut d2) = (src.clone(), dst.clone());
                let k = (r.below(n as u64 - 1)) as usize;
                if (s2[k], d2[k]) != (s2[k + 1], d2[k + 1]) {
                    s2.swap(k, k + 1);
                    d2.swap(k, k + 1);
                    assert_eq!(dedup_sorted_as::<u64, u64>(&s2, &d2).unwrap(), None, "{n} {k}");
                }
            }
        }
        // Equal sources, falling targets: not sorted.
        assert_eq!(dedup_sorted_as::<u32, u32>(&[1, 1], &[5, 4]).unwrap(), None);
        assert_eq!(dedup_sorted_as::<u32, u32>(&[1, 1, 2], &[4, 4, 0]).unwrap(), Some((vec![1, 2], vec![4, 0])));
        assert!(dedup_sorted_as::<u64, u32>(&[1], &[1 << 40]).is_err());
        assert!(dedup_sorted_as::<u32, u32>(&[1], &[]).is_err());
    }

    #[test]
    fn degree_order_matches_a_stable_sort() {
        let mut r = Rng(6);
        for &n in SIZES {
            let ints: Vec<f64> = (0..n)
                .map(|_| {
                    let bits = r.below(20);
                    (r.below(8) * r.below(1 << bits)) as f64
                })
                .collect();
            let mut fracs = ints.clone();
            if n > 0 {
                fracs[n / 2] += 0.5;
            }
            let mut big = ints.clone();
            if n > 1 {
                big[1] = 1e12;
            }
            for t in [&ints, &fracs, &big] {
                let mut want: Vec<i64> = (0..n as i64).collect();
                want.sort_by(|&i, &j| t[j as usize].partial_cmp(&t[i as usize]).unwrap());
                assert_eq!(degree_order(t), want, "n {n}");
            }
        }
        assert_eq!(degree_order(&[1.0, f64::NAN, 3.0, 1.0, -2.0]), vec![2, 0, 3, 4, 1]);
    }

    #[test]
    fn degree_counts_match_a_reference() {
        let mut r = Rng(5);
        for &n in SIZES {
            let nv = 1 + n / 3;
            let src: Vec<u32> = (0..n).map(|_| r.below(nv as u64) as u32).collect();
            let dst: Vec<u32> = (0..n).map(|_| r.below(nv as u64) as u32).collect();
            let got = degree_counts(&src, &dst, nv).unwrap();
            let mut want = vec![0.0; 2 * nv];
            for e in 0..n {
                want[src[e] as usize] += 1.0;
                want[nv + dst[e] as usize] += 1.0;
            }
            assert_eq!(got, want);
        }
        assert!(degree_counts(&[0u32, 3], &[1, 1], 3).unwrap_err().contains("edge 1"));
    }
}

/// The distinct ids of the edges, sorted, and the edges as indices into them (`u32`), by a
/// bitmap over `[0, n)`: one pass marks, a prefix count of the words numbers the ids, and
/// an id's index is its word's prefix plus the set bits below it (bitmap and prefixes,
/// `n / 8 + n / 16` bytes, stay in cache where a `u32` per id would not). For callers whose
/// id space is no larger than the edges' endpoints; others sort. Errors name an id `>= n`
/// or more than `u32::MAX` distinct ids.
pub fn local_ids<I: Id>(src: &[I], dst: &[I], n: usize) -> Result<(Vec<u64>, Vec<u32>, Vec<u32>), String> {
    if src.len() != dst.len() {
        return Err(format!("local_ids: {} source ids but {} target ids", src.len(), dst.len()));
    }
    let words = n.div_ceil(64);
    let mut bits = vec![0u64; words];
    for (e, (&s, &d)) in src.iter().zip(dst).enumerate() {
        let (s, d) = (s.u64(), d.u64());
        if s.max(d) >= n as u64 {
            return Err(format!("local_ids: edge {e} ({s}, {d}) has an id >= n = {n}"));
        }
        bits[(s >> 6) as usize] |= 1 << (s & 63);
        bits[(d >> 6) as usize] |= 1 << (d & 63);
    }
    let mut before = Vec::with_capacity(words);
    let mut total = 0u64;
    for w in &bits {
        before.push(total as u32);
        total += w.count_ones() as u64;
    }
    if total > u32::MAX as u64 {
        return Err("local_ids: 2**32 or more distinct ids".into());
    }
    let mut ids = Vec::with_capacity(total as usize);
    for (i, &w) in bits.iter().enumerate() {
        let mut w = w;
        while w != 0 {
            ids.push((i as u64) * 64 + w.trailing_zeros() as u64);
            w &= w - 1;
        }
    }
    let index = |x: u64| before[(x >> 6) as usize] + (bits[(x >> 6) as usize] & ((1u64 << (x & 63)) - 1)).count_ones();
    let map = |a: &[I]| a.iter().map(|&x| index(x.u64())).collect::<Vec<u32>>();
    Ok((ids, map(src), map(dst)))
}

#[cfg(test)]
mod local_ids_tests {
    use super::local_ids;

    #[test]
    fn matches_a_sorted_reference() {
        for (m, n, seed) in [(0usize, 5usize, 1u64), (1, 1, 2), (7, 20, 3), (5000, 300, 4)] {
            let mut x = seed;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % n as u64) as u32
            };
            let src: Vec<u32> = (0..m).map(|_| next()).collect();
            let dst: Vec<u32> = (0..m).map(|_| next()).collect();
            let (ids, s, d) = local_ids(&src, &dst, n).unwrap();
            let mut want: Vec<u64> = src.iter().chain(&dst).map(|&v| v as u64).collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(ids, want);
            for e in 0..m {
                assert_eq!(ids[s[e] as usize], src[e] as u64);
                assert_eq!(ids[d[e] as usize], dst[e] as u64);
            }
        }
        assert!(local_ids(&[3u32], &[0u32], 3).unwrap_err().contains(">= n"));
    }
}
