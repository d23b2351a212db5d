//! Pairwise tree merge of `k` sorted, duplicate-free key vectors.
//!
//! Returns the sorted union and, for each input, where each of its keys landed in the
//! union. Merging in a balanced tree of pairs costs O(n log k) comparisons with sequential
//! memory access (no hash table, no dense scratch array of the range's width); the maps
//! are what `reduce` later uses to combine values without comparing keys again.

/// Merges two sorted unique vectors: (union, map of a, map of b).
fn merge2(a: &[u64], b: &[u64]) -> (Vec<u64>, Vec<usize>, Vec<usize>) {
    let mut u = Vec::with_capacity(a.len() + b.len());
    let mut ma = Vec::with_capacity(a.len());
    let mut mb = Vec::with_capacity(b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        if x < y {
            ma.push(u.len());
            u.push(x);
            i += 1;
        } else if y < x {
            mb.push(u.len());
            u.push(y);
            j += 1;
        } else {
            ma.push(u.len());
            mb.push(u.len());
            u.push(x);
            i += 1;
            j += 1;
        }
    }
    for &x in &a[i..] {
        ma.push(u.len());
        u.push(x);
    }
    for &y in &b[j..] {
        mb.push(u.len());
        u.push(y);
    }
    (u, ma, mb)
}

/// Tree merge of `parts`: (union, maps) with `union[maps[p][i]] == parts[p][i]`.
pub fn tree_merge(parts: &[&[u64]]) -> (Vec<u64>, Vec<Vec<usize>>) {
    // Each level merges neighbours; a node carries its keys and the input parts under it.
    type Node = (Vec<u64>, Vec<(usize, Vec<usize>)>);
    let mut level: Vec<Node> = parts
        .iter()
        .enumerate()
        .map(|(p, s)| (s.to_vec(), vec![(p, (0..s.len()).collect())]))
        .collect();
    if level.is_empty() {
        return (Vec::new(), Vec::new());
    }
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        let mut it = level.into_iter();
        while let Some((ka, pa)) = it.next() {
            match it.next() {
                None => next.push((ka, pa)),
                Some((kb, pb)) => {
                    let (u, ma, mb) = merge2(&ka, &kb);
                    let mut owned = Vec::with_capacity(pa.len() + pb.len());
                    for (p, m) in pa {
                        owned.push((p, m.into_iter().map(|i| ma[i]).collect()));
                    }
                    for (p, m) in pb {
                        owned.push((p, m.into_iter().map(|i| mb[i]).collect()));
                    }
                    next.push((u, owned));
                }
            }
        }
        level = next;
    }
    let (u, owned) = level.pop().unwrap();
    let mut maps = vec![Vec::new(); parts.len()];
    for (p, m) in owned {
        maps[p] = m;
    }
    (u, maps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_matches_btreeset() {
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        for k in 1..8 {
            let parts: Vec<Vec<u64>> = (0..k)
                .map(|_| {
                    let n = rnd() % 50;
                    let s: std::collections::BTreeSet<u64> = (0..n).map(|_| rnd() % 100).collect();
                    s.into_iter().collect()
                })
                .collect();
            let refs: Vec<&[u64]> = parts.iter().map(|p| p.as_slice()).collect();
            let (u, maps) = tree_merge(&refs);
            let want: Vec<u64> = parts.iter().flatten().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            assert_eq!(u, want);
            for (p, m) in parts.iter().zip(&maps) {
                for (i, &x) in p.iter().enumerate() {
                    assert_eq!(u[m[i]], x);
                }
            }
        }
    }
}
