//! The edge exchange of a partitioned load on packed keys: an edge `(s, d)` with both ids
//! below 2^32 is one `u64`, `s << 32 | d` (the readers produce them: `scalefree_io::EdgeKeys`),
//! which sorts as the edge does by (src, dst). Every step works in the buffers it is given,
//! so a load touches each byte of its edges a few times and allocates little:
//!
//! - [`key_owners`], [`scatter_keys`]: the owner rank of every key (the owner is
//!   [`edge_hash`]`(s, d) % size`, the same as [`crate::edges::owner_partition_as`]'s), then
//!   every key written into its owner's piece of an exchange (the receivers' regions): the
//!   grouping by owner and the send in one pass;
//! - [`sort_dedup_keys`]: the received keys sorted and deduplicated, the distinct edges written
//!   back into the same buffer as two u32 columns: one most-significant-digit pass into a
//!   scratch buffer (buckets of about [`BUCKET_KEYS`] keys), then each bucket sorted while it
//!   is in cache (least-significant-digit passes of up to 13 bits over the bits that vary in
//!   it);
//! - [`dedup_sorted_keys`]: the distinct edges of keys already in order (a file written
//!   sorted), or None;
//! - [`pack_keys`]: keys of two id columns, for readers that produce columns; [`id_bound`]:
//!   the id space of keys.

use crate::edges::{edge_hash, radix_sort_u64, FastMod, Pairs};
use crate::Id;

const LOW: u64 = 0xFFFF_FFFF;

/// The owner rank of key `k` among `fm`'s divisor ranks.
#[inline(always)]
fn owner(fm: FastMod, k: u64) -> usize {
    fm.remainder(edge_hash(k >> 32, k & LOW)) as usize
}

/// The owner rank of every key, as a byte when there are at most 256 owners (else empty:
/// [`scatter_keys`] hashes again), and the keys per owner (`size` entries).
///
/// Errors: `size` not in `1..2^32`.
pub fn key_owners(keys: &[u64], size: usize) -> Result<(Vec<u64>, Vec<u8>), String> {
    if size == 0 || size as u64 >= 1 << 32 {
        return Err(format!("key_owners: size must be in 1..2^32, got {size}"));
    }
    let fm = FastMod::new(size as u64);
    let mut counts = vec![0u64; size];
    if size > 256 {
        for &k in keys {
            counts[owner(fm, k)] += 1;
        }
        return Ok((counts, Vec::new()));
    }
    let owners: Vec<u8> = keys
        .iter()
        .map(|&k| {
            let o = owner(fm, k);
            counts[o] += 1;
            o as u8
        })
        .collect();
    Ok((counts, owners))
}

/// Writes every key into the piece of its owner (`owners` from [`key_owners`] over `size =
/// pieces.len()` owners), in key order: the pieces are where the keys go — the receivers'
/// regions of an exchange — so the keys are grouped by owner and sent in one pass.
///
/// Errors: a piece not as long as its owner's keys.
pub fn scatter_keys(keys: &[u64], owners: &[u8], pieces: &mut [&mut [u64]]) -> Result<(), String> {
    let size = pieces.len();
    if size == 0 || size as u64 >= 1 << 32 || (size <= 256 && owners.len() != keys.len()) {
        return Err(format!("scatter_keys: {} keys, {} owners, {size} pieces", keys.len(), owners.len()));
    }
    let mut at = vec![0usize; size];
    let mut put = |o: usize, k: u64| -> Result<(), String> {
        let piece = &mut pieces[o];
        let Some(slot) = piece.get_mut(at[o]) else {
            return Err(format!("scatter_keys: owner {o}'s piece holds {} keys, it has more", piece.len()));
        };
        *slot = k;
        at[o] += 1;
        Ok(())
    };
    if size <= 256 {
        for (&k, &o) in keys.iter().zip(owners) {
            put(o as usize, k)?;
        }
    } else {
        let fm = FastMod::new(size as u64);
        for &k in keys {
            put(owner(fm, k), k)?;
        }
    }
    for (o, piece) in pieces.iter().enumerate() {
        if at[o] != piece.len() {
            return Err(format!("scatter_keys: owner {o}'s piece holds {} keys, it has {}", piece.len(), at[o]));
        }
    }
    Ok(())
}

/// Keys per bucket the most-significant-digit pass aims at: 32 Ki keys (256 KiB) sort in L2.
pub const BUCKET_KEYS: usize = 1 << 15;
/// A bucket larger than this (skewed ids) is sorted by [`radix_sort_u64`] instead.
const BUCKET_MAX: usize = 1 << 18;
/// Most buckets of the first pass (4096: the write fronts stay in L1/L2).
const MAX_TOP_BITS: u32 = 12;
/// Widest digit of the in-cache passes (8192 counters: 32 KiB, in L1).
const MAX_DIGIT_BITS: u32 = 13;

/// Sorts the keys `a` in place by least-significant digits over the bits from the lowest to
/// the highest set in `varying`, in as few passes of at most [`MAX_DIGIT_BITS`] as cover
/// them (equal widths), with `t` (as long as `a`) as scratch and `count` as the counters.
/// Returns whether the result is in `a` (else in `t`).
fn lsd_in_cache(a: &mut [u64], t: &mut [u64], varying: u64, count: &mut [u32]) -> bool {
    if varying == 0 {
        return true;
    }
    let lo = varying.trailing_zeros();
    let bits = 64 - varying.leading_zeros() - lo;
    let passes = bits.div_ceil(MAX_DIGIT_BITS);
    let width = bits.div_ceil(passes);
    let mask = (1u64 << width) - 1;
    let count = &mut count[..1 << width];
    let mut in_a = true;
    for pass in 0..passes {
        let b = lo + pass * width;
        let (from, to): (&[u64], &mut [u64]) = if in_a { (&*a, &mut *t) } else { (&*t, &mut *a) };
        count.fill(0);
        for &k in from {
            count[((k >> b) & mask) as usize] += 1;
        }
        let mut at = 0u32;
        for c in count.iter_mut() {
            let here = *c;
            *c = at;
            at += here;
        }
        for &k in from {
            let p = &mut count[((k >> b) & mask) as usize];
            to[*p as usize] = k;
            *p += 1;
        }
        in_a = !in_a;
    }
    in_a
}

/// Sorts `keys` and drops duplicates; the `m` distinct keys are written back into `keys`'s
/// memory as two u32 columns — the sources in its u32 slots `0..m`, the targets in its u32
/// slots `n..n + m` (`n = keys.len()`) — and `m` is returned. `scratch` must hold at least
/// `n` keys (its contents are overwritten). Linear time: one pass over `keys` for the bits
/// that vary; the keys are narrowed to `src << b | dst` with `b` the bits of the largest
/// target (the same order, no constant bits between the halves); one histogram pass and
/// one scatter of the narrowed keys into `scratch` by their top varying bits (buckets of
/// about [`BUCKET_KEYS`]); then each bucket sorted in cache (digits of up to
/// [`MAX_DIGIT_BITS`] bits) and written out deduplicated.
///
/// Panics if `scratch` is shorter than `keys` (misuse).
pub fn sort_dedup_keys(keys: &mut [u64], scratch: &mut [u64]) -> usize {
    let n = keys.len();
    assert!(scratch.len() >= n, "sort_dedup_keys: scratch holds {} keys, need {n}", scratch.len());
    if n == 0 {
        return 0;
    }
    let scratch = &mut scratch[..n];
    let (mut any_s, mut all_s, mut any_d, mut all_d) = (0u64, u64::MAX, 0u64, u64::MAX);
    for &k in keys.iter() {
        let (s, d) = (k >> 32, k & LOW);
        any_s |= s;
        all_s &= s;
        any_d |= d;
        all_d &= d;
    }
    let dbits = 64 - any_d.leading_zeros(); // <= 32: src << dbits keeps every bit
    let narrow = |k: u64| (k >> 32) << dbits | (k & LOW);
    let varying = (any_s ^ all_s) << dbits | (any_d ^ all_d);
    let span = 64 - varying.leading_zeros(); // bits 0..span may differ
    let mut top = 0u32;
    while top < MAX_TOP_BITS && (n >> top) > BUCKET_KEYS {
        top += 1;
    }
    let top = top.min(span);
    let shift = span - top;
    let buckets = 1usize << top;
    let digit = |c: u64| (c.checked_shr(shift).unwrap_or(0) as usize) & (buckets - 1);
    let mut start = vec![0usize; buckets + 1];
    for &k in keys.iter() {
        start[digit(narrow(k)) + 1] += 1;
    }
    for b in 0..buckets {
        start[b + 1] += start[b];
    }
    let mut next = start[..buckets].to_vec();
    for &k in keys.iter() {
        let c = narrow(k);
        let p = &mut next[digit(c)];
        scratch[*p] = c;
        *p += 1;
    }
    // SAFETY: `keys` is not read again; its memory (n u64, aligned for u32) is reused as
    // 2n u32 for the output columns through this one mutable slice.
    let out: &mut [u32] = unsafe { std::slice::from_raw_parts_mut(keys.as_mut_ptr() as *mut u32, 2 * n) };
    let (src, dst) = out.split_at_mut(n);
    let low = if dbits == 0 { 0 } else { u64::MAX >> (64 - dbits) };
    let mut m = 0usize;
    let mut last: Option<u64> = None;
    let mut emit = |sorted: &[u64]| {
        for &c in sorted {
            if last != Some(c) {
                src[m] = (c >> dbits) as u32;
                dst[m] = (c & low) as u32;
                m += 1;
                last = Some(c);
            }
        }
    };
    let mut small: Vec<u64> = Vec::new();
    let mut big: Vec<u64> = Vec::new();
    let mut count = vec![0u32; 1 << MAX_DIGIT_BITS];
    for b in 0..buckets {
        let bucket = &mut scratch[start[b]..start[b + 1]];
        if bucket.len() > BUCKET_MAX {
            big.clear();
            big.extend_from_slice(bucket);
            radix_sort_u64(&mut big);
            emit(&big);
            continue;
        }
        if bucket.len() < 2 {
            emit(bucket);
            continue;
        }
        let f = bucket[0];
        let v = bucket.iter().fold(0u64, |v, &k| v | (k ^ f));
        small.resize(small.len().max(bucket.len()), 0);
        let t = &mut small[..bucket.len()];
        if lsd_in_cache(bucket, t, v, &mut count) {
            emit(bucket);
        } else {
            emit(t);
        }
    }
    m
}

/// The distinct edges `(src, dst)` of `keys` if they are in non-decreasing order, else None
/// (at the first key below the one before it). One pass to check and count, one to write.
pub fn dedup_sorted_keys(keys: &[u64]) -> Option<Pairs<u32>> {
    let mut distinct = usize::from(!keys.is_empty());
    for w in keys.windows(2) {
        if w[1] < w[0] {
            return None;
        }
        distinct += usize::from(w[1] != w[0]);
    }
    let (mut src, mut dst) = (Vec::with_capacity(distinct), Vec::with_capacity(distinct));
    let mut last: Option<u64> = None;
    for &k in keys {
        if last != Some(k) {
            src.push((k >> 32) as u32);
            dst.push((k & LOW) as u32);
            last = Some(k);
        }
    }
    Some((src, dst))
}

/// One more than the largest id of the keys (0 for none): the id space they need.
pub fn id_bound(keys: &[u64]) -> u64 {
    let (mut src, mut dst) = (None::<u64>, 0u64);
    for &k in keys {
        src = Some(src.map_or(k, |s| s.max(k)));
        dst = dst.max(k & LOW);
    }
    src.map_or(0, |s| (s >> 32).max(dst) + 1)
}

/// The packed keys of the edges `(src[e], dst[e])`, or None when an id is 2^32 or larger.
///
/// Errors: `src`/`dst` lengths differ.
pub fn pack_keys<I: Id>(src: &[I], dst: &[I]) -> Result<Option<Vec<u64>>, String> {
    if src.len() != dst.len() {
        return Err(format!("pack_keys: {} source ids but {} target ids", src.len(), dst.len()));
    }
    let mut keys = Vec::with_capacity(src.len());
    for (&s, &d) in src.iter().zip(dst) {
        let (s, d) = (s.u64(), d.u64());
        if (s | d) >> 32 != 0 {
            return Ok(None);
        }
        keys.push(s << 32 | d);
    }
    Ok(Some(keys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edges::edge_owners;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let x = self.0;
            (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
        }
    }

    /// Keys of `n` edges with ids below `ids` (duplicates likely when `ids` is small).
    fn keys(r: &mut Rng, n: usize, ids: u64) -> Vec<u64> {
        (0..n).map(|_| (r.next() % ids) << 32 | (r.next() % ids)).collect()
    }

    fn reference(keys: &[u64]) -> (Vec<u32>, Vec<u32>) {
        let mut k = keys.to_vec();
        k.sort_unstable();
        k.dedup();
        k.iter().map(|&k| ((k >> 32) as u32, k as u32)).unzip()
    }

    const SIZES: &[usize] = &[0, 1, 2, 3, 255, 256, 257, 1001, 20_011, 70_001, 300_000];

    #[test]
    fn scatter_groups_by_the_owner_partition_owner() {
        let mut r = Rng(3);
        for &n in SIZES {
            for size in [1usize, 2, 3, 4, 7, 300] {
                if size * n > 10_000_000 {
                    continue; // the reference below is O(size * n)
                }
                let orig = keys(&mut r, n, 1 << 20);
                let (counts, owners) = key_owners(&orig, size).unwrap();
                assert_eq!(counts.iter().sum::<u64>() as usize, n);
                let mut out = vec![0u64; n];
                let mut pieces: Vec<&mut [u64]> = Vec::new();
                let mut rest = out.as_mut_slice();
                for &c in &counts {
                    let (a, b) = rest.split_at_mut(c as usize);
                    pieces.push(a);
                    rest = b;
                }
                scatter_keys(&orig, &owners, &mut pieces).unwrap();
                let (s, d): (Vec<u32>, Vec<u32>) = orig.iter().map(|&k| ((k >> 32) as u32, k as u32)).unzip();
                let want = edge_owners(&s, &d, size);
                // Each owner's piece: its keys, in input order.
                let mut at = 0;
                for (o, &c) in counts.iter().enumerate() {
                    let mine: Vec<u64> = orig.iter().zip(&want).filter(|(_, &w)| w as usize == o).map(|(&k, _)| k).collect();
                    assert_eq!(&out[at..at + c as usize], &mine[..], "n {n} size {size} owner {o}");
                    at += c as usize;
                }
            }
        }
        assert!(key_owners(&[], 0).is_err());
        let (counts, owners) = key_owners(&[1, 2, 3], 2).unwrap();
        let mut short = vec![0u64; counts[0] as usize + 1];
        let mut other = vec![0u64; (counts[1] as usize).saturating_sub(1)];
        assert!(scatter_keys(&[1, 2, 3], &owners, &mut [&mut short[..], &mut other[..]]).is_err());
    }

    #[test]
    fn sort_dedup_matches_a_sorted_reference() {
        let mut r = Rng(5);
        for &n in SIZES {
            // Dense ids (many duplicates), sparse ids, full 32-bit ids, one id.
            for ids in [1u64, 7, 1 << 10, 1 << 24, 1 << 32] {
                let orig = keys(&mut r, n, ids);
                let want = reference(&orig);
                let mut k = orig.clone();
                let mut scratch = vec![0u64; n + 3];
                let m = sort_dedup_keys(&mut k, &mut scratch);
                let out: Vec<u32> = k.iter().flat_map(|&x| [x as u32, (x >> 32) as u32]).collect();
                assert_eq!(m, want.0.len(), "n {n} ids {ids}");
                assert_eq!(&out[..m], &want.0[..], "sources, n {n} ids {ids}");
                assert_eq!(&out[n..n + m], &want.1[..], "targets, n {n} ids {ids}");
            }
        }
    }

    #[test]
    fn sort_dedup_handles_skewed_buckets() {
        // Most keys in one top bucket (larger than BUCKET_MAX), a few spread wide.
        let mut r = Rng(9);
        let n = 3 * BUCKET_MAX;
        let mut orig: Vec<u64> = (0..n).map(|_| (r.next() % 64) << 32 | (r.next() % 100_000)).collect();
        orig.extend((0..1000).map(|_| (r.next() % (1 << 30)) << 32 | r.next() % 5));
        let want = reference(&orig);
        let mut k = orig.clone();
        let mut scratch = vec![0u64; k.len()];
        let m = sort_dedup_keys(&mut k, &mut scratch);
        let len = k.len();
        let out: Vec<u32> = k.iter().flat_map(|&x| [x as u32, (x >> 32) as u32]).collect();
        assert_eq!((&out[..m], &out[len..len + m]), (&want.0[..], &want.1[..]));
    }

    #[test]
    fn dedup_sorted_and_pack() {
        assert_eq!(dedup_sorted_keys(&[]), Some((vec![], vec![])));
        assert_eq!(dedup_sorted_keys(&[1 << 32 | 2, 1 << 32 | 2, 3 << 32]), Some((vec![1, 3], vec![2, 0])));
        assert_eq!(dedup_sorted_keys(&[5, 4]), None);
        assert_eq!(pack_keys(&[1u64, 0], &[2u64, 7]).unwrap(), Some(vec![1 << 32 | 2, 7]));
        assert_eq!(pack_keys(&[1u64 << 32], &[0u64]).unwrap(), None);
        assert!(pack_keys(&[1u32], &[]).is_err());
        assert_eq!(id_bound(&[]), 0);
        assert_eq!(id_bound(&[0]), 1);
        assert_eq!(id_bound(&[3 << 32 | 9, 5 << 32 | 1]), 10);
        assert_eq!(id_bound(&[7 << 32 | 2]), 8);
    }
}
