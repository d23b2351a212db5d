//! Layer degrees of the butterfly: validation of explicit lists and the automatic choice.

use scalefree_transport::{Error, Result};

/// Prime factors of `n`, largest first.
pub fn factorize(mut n: usize) -> Vec<usize> {
    let mut f = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            f.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        f.push(n);
    }
    f.sort_unstable_by(|a, b| b.cmp(a));
    f
}

/// Checks an explicit degree list: every degree ≥ 1 and product = `ranks`. Degrees of 1
/// are dropped (a layer of one node moves nothing).
pub fn check_degrees(degrees: &[usize], ranks: usize) -> Result<Vec<usize>> {
    if degrees.contains(&0) {
        return Err(Error::InvalidArgument(format!("degrees {degrees:?}: every degree must be at least 1")));
    }
    let prod: u128 = degrees.iter().map(|&d| d as u128).product();
    if prod != ranks as u128 {
        return Err(Error::InvalidArgument(format!(
            "degrees {degrees:?} multiply to {prod}, but the group has {ranks} ranks"
        )));
    }
    Ok(degrees.iter().copied().filter(|&d| d > 1).collect())
}

/// Packets below this many bytes cost about as much as an empty one on this transport
/// (shared memory: a header exchange is a few microseconds, ~64 KiB moves in that time).
pub const PACKET_FLOOR_BYTES: f64 = 64.0 * 1024.0;

/// Degrees for `ranks` ranks when each contributes `bytes_per_rank` bytes: the fewest
/// layers (one direct layer) while the per-peer packet `bytes_per_rank / k` stays above
/// the packet floor; otherwise the prime factors greedily grouped so each layer's packets
/// stay above it (section IV of the paper: packets shrink by `k` per layer only while the
/// data is unmerged, so small degrees near the top keep them large).
pub fn auto_degrees(ranks: usize, bytes_per_rank: f64, floor: f64) -> Vec<usize> {
    if ranks <= 1 {
        return Vec::new();
    }
    if bytes_per_rank / ranks as f64 >= floor || factorize(ranks).len() == 1 {
        return vec![ranks];
    }
    let mut out = Vec::new();
    let mut cur = 1usize;
    for p in factorize(ranks) {
        if cur > 1 && bytes_per_rank / ((cur * p) as f64) < floor {
            out.push(cur);
            cur = 1;
        }
        cur *= p;
    }
    if cur > 1 {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_multiply_to_ranks() {
        for n in 1..200 {
            for bytes in [1e3, 1e5, 1e7] {
                let d = auto_degrees(n, bytes, PACKET_FLOOR_BYTES);
                assert_eq!(d.iter().product::<usize>().max(1), n.max(1), "{n} {d:?}");
            }
        }
        assert_eq!(factorize(12), vec![3, 2, 2]);
        assert_eq!(check_degrees(&[2, 1, 3], 6).unwrap(), vec![2, 3]);
        assert!(check_degrees(&[2, 2], 6).is_err());
    }
}
