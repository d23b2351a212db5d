//! Seeded bijective hash of the index space `[0, dim)`.
//!
//! `key(x) = (a*x + b) mod dim` with `gcd(a, dim) = 1` is a bijection of `[0, dim)`, so
//! distinct indices keep distinct keys and the keys of one rank's sorted vector stay a
//! permutation of its indices. `a` is near `dim / φ`, which sends consecutive ids (the
//! high-degree vertices of many real graphs sit at small ids) far apart, so each layer's
//! equal-width key ranges receive equal shares of a power-law index set.

/// The hash of one sparse allreduce (all ranks build the same one from `dim` and `seed`).
#[derive(Clone, Copy, Debug)]
pub struct IndexHash {
    dim: u64,
    a: u64,
    b: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl IndexHash {
    pub fn new(dim: u64, seed: u64) -> Self {
        if dim <= 1 {
            return IndexHash { dim, a: 1, b: 0 };
        }
        let golden = ((dim as u128 * 0x9e37_79b9_7f4a_7c15u128) >> 64) as u64;
        let jitter = splitmix(seed) % (dim / 64 + 1);
        let mut a = (golden + jitter) % dim;
        if a == 0 {
            a = 1;
        }
        while gcd(a, dim) != 1 {
            a = a % (dim - 1) + 1;
        }
        IndexHash { dim, a, b: splitmix(seed ^ 0x5eed) % dim }
    }

    /// No hashing: keys are the indices (for callers whose index numbering already
    /// spreads their heavy indices over the key ranges, so that their vectors, sorted by
    /// index, need no permutation into key order).
    pub fn identity(dim: u64) -> Self {
        IndexHash { dim, a: 1, b: 0 }
    }

    #[inline(always)]
    pub fn key(&self, x: u64) -> u64 {
        ((self.a as u128 * x as u128 + self.b as u128) % self.dim as u128) as u64
    }

    pub fn dim(&self) -> u64 {
        self.dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bijective_for_many_dims() {
        for dim in [1u64, 2, 3, 7, 10, 64, 97, 1000, 4096, 65537] {
            for seed in [0u64, 1, 42] {
                let h = IndexHash::new(dim, seed);
                let mut seen = vec![false; dim as usize];
                for x in 0..dim {
                    let k = h.key(x);
                    assert!(k < dim);
                    assert!(!seen[k as usize], "dim {dim} seed {seed}: collision at {x}");
                    seen[k as usize] = true;
                }
            }
        }
    }

    #[test]
    fn spreads_small_ids() {
        let dim = 10_000_000u64;
        let h = IndexHash::new(dim, 7);
        let mut counts = [0usize; 4];
        for x in 0..1000 {
            counts[(h.key(x) * 4 / dim) as usize] += 1;
        }
        for c in counts {
            assert!((200..300).contains(&c), "{counts:?}");
        }
    }
}
