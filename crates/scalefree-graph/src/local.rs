//! A rank's local PageRank state from its distinct edges in one native pass (the middle
//! of `SparsePageRank.__init__` in `python/scalefree/graph/pagerank.py`).
//!
//! Every vertex id `v` has a key `key[v]` (from `vertex_keys`, all `< flow_key`); one more
//! key, `flow_key`, carries the rank's total flow. The rank's out vector has a slot per
//! distinct key of its edge targets plus the flow key, its in vector a slot per distinct
//! key of its edge sources, of the keys it owns (`own_lo_key .. own_lo_key + n_own`) and
//! the flow key, both in key order (the sparse allreduce's order). The matrix is the CSR
//! of its edges, row = out slot of the target, column = in slot of the source, exactly as
//! [`crate::pagerank::csr_pattern`] builds it (columns ascending within a row).
//!
//! Bitmaps over the key space with a count per word (`O(keys)` memory and time, small
//! enough to stay in cache) give every key its slot; then linear passes over the edges:
//! no sort. When each source's edges are contiguous (sorted, as
//! [`crate::edges::sort_dedup_pairs`] leaves them) each source is one run of edges, and visiting the runs in key order places
//! every row's columns ascending with one scatter; otherwise two counting passes.

use crate::pagerank::csr_pattern;
use crate::{prefetch, Id};

/// The out and in key sets and the CSR of a rank's edges (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCsr {
    /// Sorted distinct keys of the edge targets, then `flow_key` (int64: what the sparse
    /// allreduce's config takes).
    pub out_keys: Vec<i64>,
    /// Sorted distinct keys of the edge sources and the owned range, then `flow_key`.
    pub in_keys: Vec<i64>,
    /// Row starts, `out_keys.len()` entries (`nrows = out_keys.len() - 1`: the flow slot
    /// is not a row), `indptr[nrows]` = edges.
    pub indptr: Vec<u64>,
    /// In slot of every edge's source, row by row, ascending within a row.
    pub cols: Vec<u32>,
    /// In slot of `own_lo_key` (0 when nothing is owned).
    pub own_lo: usize,
}

/// How far ahead (in edges) the passes over the edges prefetch what they gather.
const PREFETCH_AHEAD: usize = 32;
/// How far ahead (in sources) the scatter prefetches a run's rows and write fronts.
const PREFETCH_RUNS: usize = 8;

/// A set of keys as a bitmap with the number of keys before every 64-bit word: marking and
/// "slot of key k" (its rank in the set) touch one bit and one counter, so the tables of a
/// 4M-key space (512 KiB + 256 KiB) stay in L2 where a slot table would take 16 MiB.
struct RankBitmap {
    bits: Vec<u64>,
    before: Vec<u32>,
}

impl RankBitmap {
    fn new(nkeys: usize) -> Self {
        RankBitmap { bits: vec![0; nkeys.div_ceil(64)], before: Vec::new() }
    }

    #[inline(always)]
    fn set(&mut self, k: usize) {
        self.bits[k >> 6] |= 1 << (k & 63);
    }

    fn set_range(&mut self, lo: usize, hi: usize) {
        for k in lo..hi {
            self.set(k);
        }
    }

    /// Fills the counters; returns the keys in the set, ascending.
    fn finish(&mut self) -> Vec<i64> {
        let total: usize = self.bits.iter().map(|w| w.count_ones() as usize).sum();
        let mut keys = Vec::with_capacity(total);
        self.before = Vec::with_capacity(self.bits.len());
        for (w, &word) in self.bits.iter().enumerate() {
            self.before.push(keys.len() as u32);
            let mut b = word;
            while b != 0 {
                keys.push((w * 64) as i64 + b.trailing_zeros() as i64);
                b &= b - 1;
            }
        }
        keys
    }

    /// The slot of key `k` (which must be in the set).
    #[inline(always)]
    fn rank(&self, k: usize) -> u32 {
        let (w, b) = (k >> 6, k & 63);
        self.before[w] + (self.bits[w] & ((1u64 << b) - 1)).count_ones()
    }
}

/// Builds [`LocalCsr`] from this rank's edges `(src[e], dst[e])` (global ids, distinct
/// edges), the key of every id (`key`, all `< flow_key`), and the owned key range.
///
/// Errors (one line, naming the first bad edge or value): lengths differ, an id `>=
/// key.len()`, a touched key `>= flow_key`, the owned range past `flow_key`.
pub fn local_csr<I: Id>(src: &[I], dst: &[I], key: &[u32], flow_key: u32, own_lo_key: u32, n_own: usize) -> Result<LocalCsr, String> {
    if src.len() != dst.len() {
        return Err(format!("local_csr: {} source ids but {} target ids", src.len(), dst.len()));
    }
    if own_lo_key as u64 + n_own as u64 > flow_key as u64 {
        return Err(format!("local_csr: owned keys {own_lo_key}..{} reach past flow_key {flow_key}", own_lo_key as u64 + n_own as u64));
    }
    let ne = src.len();
    let nkeys = flow_key as usize + 1;
    let nids = key.len() as u64;
    // Pass 1: mark the keys; keep the target keys (turned into rows below).
    let mut outs = RankBitmap::new(nkeys);
    let mut ins = RankBitmap::new(nkeys);
    let mut rows = vec![0u32; ne];
    for (e, ((&s, &d), r)) in src.iter().zip(dst).zip(rows.iter_mut()).enumerate() {
        if let Some(&ahead) = dst.get(e + PREFETCH_AHEAD) {
            prefetch(key.as_ptr().wrapping_add(ahead.u64() as usize));
        }
        let (s, d) = (s.u64(), d.u64());
        if s >= nids || d >= nids {
            return Err(format!("local_csr: edge {e} ({s}, {d}) has an id >= len(key) = {nids}"));
        }
        let (ks, kd) = (key[s as usize], key[d as usize]);
        if ks >= flow_key || kd >= flow_key {
            return Err(format!("local_csr: edge {e} ({s}, {d}) has key {} not below flow_key {flow_key}", ks.max(kd)));
        }
        outs.set(kd as usize);
        ins.set(ks as usize);
        *r = kd;
    }
    ins.set_range(own_lo_key as usize, own_lo_key as usize + n_own);
    outs.set(flow_key as usize);
    ins.set(flow_key as usize);
    let out_keys = outs.finish();
    let in_keys = ins.finish();
    let own_lo = if n_own > 0 { ins.rank(own_lo_key as usize) as usize } else { 0 };
    let (nrows, ncols) = (out_keys.len() - 1, in_keys.len());
    let col_of = |s: I| ins.rank(key[s.u64() as usize] as usize);
    // Pass 2: target keys to rows, counted per row.
    for r in rows.iter_mut() {
        *r = outs.rank(*r as usize);
    }
    drop(outs);
    let mut indptr = vec![0u64; nrows + 1];
    for (e, &r) in rows.iter().enumerate() {
        if let Some(&ahead) = rows.get(e + PREFETCH_AHEAD) {
            prefetch(indptr.as_ptr().wrapping_add(ahead as usize + 1));
        }
        indptr[r as usize + 1] += 1;
    }
    for i in 0..nrows {
        indptr[i + 1] += indptr[i];
    }
    // Grouped sources (sorted, as `sort_dedup_pairs` leaves them): each source's edges are
    // one run, its column the source's slot; visiting the runs by column and placing each
    // edge at its row's front puts every row's columns in ascending order. When a column
    // meets a second run (sources not grouped, or two ids with one key), the two counting
    // passes of `csr_pattern` instead. Runs are u32 edge numbers: more edges, general path.
    let mut grouped = ne < u32::MAX as usize;
    let mut run_of_col = if grouped { vec![(0u32, 0u32); ncols] } else { Vec::new() };
    let mut a = 0usize;
    while grouped && a < ne {
        let s = src[a];
        let mut b = a + 1;
        while b < ne && src[b] == s {
            b += 1;
        }
        let run = &mut run_of_col[col_of(s) as usize];
        if run.1 > run.0 {
            grouped = false;
        }
        *run = (a as u32, b as u32);
        a = b;
    }
    if !grouped {
        let cols: Vec<u32> = src.iter().map(|&s| col_of(s)).collect();
        let (indptr, cols) = csr_pattern(&rows, &cols, nrows, ncols)?;
        return Ok(LocalCsr { out_keys, in_keys, indptr, cols, own_lo });
    }
    let mut next: Vec<u32> = indptr[..nrows].iter().map(|&p| p as u32).collect();
    let mut cols = vec![0u32; ne];
    for (c, &(a, b)) in run_of_col.iter().enumerate() {
        let (a, b) = (a as usize, b as usize);
        // The rows of a run a few columns ahead, then their write fronts.
        if let Some(&(a2, _)) = run_of_col.get(c + 2 * PREFETCH_RUNS) {
            prefetch(rows.as_ptr().wrapping_add(a2 as usize));
        }
        if let Some(&(a1, b1)) = run_of_col.get(c + PREFETCH_RUNS) {
            for &r in &rows[a1 as usize..b1 as usize] {
                prefetch(next.as_ptr().wrapping_add(r as usize));
            }
        }
        for &r in &rows[a..b] {
            let p = &mut next[r as usize];
            cols[*p as usize] = c as u32;
            *p += 1;
        }
    }
    Ok(LocalCsr { out_keys, in_keys, indptr, cols, own_lo })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 24) % n.max(1)
        }
    }

    /// The numpy code's steps, with sets and a sort.
    fn reference(src: &[u32], dst: &[u32], key: &[u32], flow_key: u32, own_lo_key: u32, n_own: usize) -> LocalCsr {
        let mut outs: BTreeSet<u32> = dst.iter().map(|&d| key[d as usize]).collect();
        outs.insert(flow_key);
        let mut ins: BTreeSet<u32> = src.iter().map(|&s| key[s as usize]).collect();
        ins.extend(own_lo_key..own_lo_key + n_own as u32);
        ins.insert(flow_key);
        let out_keys: Vec<u32> = outs.into_iter().collect();
        let in_keys: Vec<u32> = ins.into_iter().collect();
        let slot = |ks: &[u32], k: u32| ks.binary_search(&k).unwrap();
        let mut edges: Vec<(usize, usize)> = src.iter().zip(dst).map(|(&s, &d)| (slot(&out_keys, key[d as usize]), slot(&in_keys, key[s as usize]))).collect();
        edges.sort();
        let nrows = out_keys.len() - 1;
        let mut indptr = vec![0u64; nrows + 1];
        for &(r, _) in &edges {
            indptr[r + 1] += 1;
        }
        for i in 0..nrows {
            indptr[i + 1] += indptr[i];
        }
        LocalCsr {
            own_lo: if n_own > 0 { slot(&in_keys, own_lo_key) } else { 0 },
            out_keys: out_keys.iter().map(|&k| k as i64).collect(),
            in_keys: in_keys.iter().map(|&k| k as i64).collect(),
            indptr,
            cols: edges.iter().map(|&(_, c)| c as u32).collect(),
        }
    }

    #[test]
    fn local_csr_matches_a_reference() {
        let mut r = Rng(9);
        for &ne in &[0usize, 1, 2, 7, 999, 20_000] {
            for &n in &[1usize, 2, 5, 300, 50_000] {
                // Keys: a random permutation of 0..n spread over a key space with gaps.
                let nkeys = (n + n / 3 + 1) as u32;
                let mut key: Vec<u32> = (0..n as u32).map(|i| i + i / 3).collect();
                for i in (1..n).rev() {
                    key.swap(i, r.below(i as u64 + 1) as usize);
                }
                let mut edges: Vec<(u32, u32)> = (0..ne).map(|_| (r.below(n as u64) as u32, r.below(n as u64) as u32)).collect();
                let (lo, n_own) = ((r.below(nkeys as u64)) as u32, 0usize);
                let n_own = n_own.max(r.below((nkeys - lo) as u64 + 1) as usize);
                // Unsorted, then sorted and distinct (the fast path).
                for pass in 0..2 {
                    if pass == 1 {
                        edges.sort();
                        edges.dedup();
                    }
                    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
                    let got = local_csr(&src, &dst, &key, nkeys, lo, n_own).unwrap();
                    let want = reference(&src, &dst, &key, nkeys, lo, n_own);
                    assert_eq!(got, want, "edges {ne} ids {n} pass {pass}");
                    let s64: Vec<u64> = src.iter().map(|&x| x as u64).collect();
                    let d64: Vec<u64> = dst.iter().map(|&x| x as u64).collect();
                    assert_eq!(local_csr(&s64, &d64, &key, nkeys, lo, n_own).unwrap(), want);
                    // Same as csr_pattern over the slots, as PageRankCsr built it.
                    if ne > 0 {
                        let rows: Vec<u32> = dst.iter().map(|&d| want.out_keys.binary_search(&(key[d as usize] as i64)).unwrap() as u32).collect();
                        let cols: Vec<u32> = src.iter().map(|&s| want.in_keys.binary_search(&(key[s as usize] as i64)).unwrap() as u32).collect();
                        let (ip, cs) = csr_pattern(&rows, &cols, want.out_keys.len() - 1, want.in_keys.len()).unwrap();
                        assert_eq!((ip, cs), (got.indptr.clone(), got.cols.clone()));
                    }
                }
            }
        }
    }

    #[test]
    fn local_csr_with_shared_keys_matches_the_reference() {
        // Not what vertex_keys makes, but allowed: ids 2k and 2k+1 share a key.
        let mut r = Rng(10);
        let key: Vec<u32> = (0..1000u32).map(|i| i / 2).collect();
        let mut edges: Vec<(u32, u32)> = (0..5000).map(|_| (r.below(1000) as u32, r.below(1000) as u32)).collect();
        edges.sort();
        edges.dedup();
        let (src, dst): (Vec<u32>, Vec<u32>) = edges.into_iter().unzip();
        let got = local_csr(&src, &dst, &key, 600, 100, 50).unwrap();
        assert_eq!(got, reference(&src, &dst, &key, 600, 100, 50));
    }

    #[test]
    fn local_csr_rejects_bad_input() {
        let key = [0u32, 2, 1];
        assert!(local_csr(&[0u32, 3], &[1, 1], &key, 3, 0, 1).unwrap_err().contains("edge 1"));
        assert!(local_csr(&[0u32], &[1], &key, 2, 0, 1).unwrap_err().contains("flow_key 2"));
        assert!(local_csr(&[0u32], &[1], &key, 3, 2, 2).unwrap_err().contains("past flow_key"));
        assert!(local_csr(&[0u32], &[], &key, 3, 0, 1).is_err());
        let ok = local_csr::<u32>(&[], &[], &key, 3, 1, 2).unwrap();
        assert_eq!((ok.out_keys, ok.in_keys, ok.indptr, ok.own_lo), (vec![3], vec![1, 2, 3], vec![0], 0));
    }
}
