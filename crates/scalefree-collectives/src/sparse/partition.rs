//! Splitting a node's key range into `k` contiguous sub-ranges, and a sorted key vector
//! into the matching `k` slices, by one streaming pass.

/// Bounds of sub-range `j` of `[lo, hi)` split into `k` near-equal parts.
#[inline]
pub fn sub_range(lo: u64, hi: u64, k: usize, j: usize) -> (u64, u64) {
    let w = (hi - lo) as u128;
    let a = lo + (w * j as u128 / k as u128) as u64;
    let b = lo + (w * (j + 1) as u128 / k as u128) as u64;
    (a, b)
}

/// For sorted `keys` all inside `[lo, hi)`, the `k + 1` slice boundaries: slice `j` is
/// `keys[bounds[j]..bounds[j+1]]`, the keys in sub-range `j`. One linear pass.
pub fn split_sorted(keys: &[u64], lo: u64, hi: u64, k: usize) -> Vec<usize> {
    let mut bounds = Vec::with_capacity(k + 1);
    bounds.push(0);
    let mut i = 0;
    for j in 0..k {
        let (_, end) = sub_range(lo, hi, k, j);
        if j + 1 == k {
            i = keys.len();
        } else {
            while i < keys.len() && keys[i] < end {
                i += 1;
            }
        }
        bounds.push(i);
    }
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_filter() {
        let keys: Vec<u64> = (0..1000u64).map(|x| x * 7 % 1000).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        for k in 1..7 {
            let b = split_sorted(&keys, 0, 1000, k);
            assert_eq!(b.len(), k + 1);
            for j in 0..k {
                let (lo, hi) = sub_range(0, 1000, k, j);
                for &x in &keys[b[j]..b[j + 1]] {
                    assert!(lo <= x && x < hi);
                }
            }
            assert_eq!(b[k], keys.len());
        }
        assert_eq!(split_sorted(&[], 5, 9, 3), vec![0, 0, 0, 0]);
    }
}
