//! SplitMix64: a tiny seeded generator so splits, shuffles and inits are reproducible
//! across platforms without a dependency.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    /// The generator `Rng::new(seed)` becomes after `draws` calls of `next_u64` (SplitMix64
    /// is a counter: any draw is reachable in O(1)).
    pub fn after(seed: u64, draws: u64) -> Self {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15).wrapping_add(draws.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
    /// Uniform in [0, 1).
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.swap_index(i);
            v.swap(i, j);
        }
    }
    /// A uniformly random order of `src` written into `dst` in one pass, each record passed
    /// through `f` (the "inside-out" Fisher–Yates: `dst[i] = dst[j]; dst[j] = f(src[i])` with
    /// j uniform in [0, i]). Reads `src` in order, so copying and shuffling cost one pass, not
    /// a copy and then a shuffle. [`Rng::shuffle_forward`] on a copy of `src` gives the same
    /// order from the same generator state.
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn shuffled_copy<T: Copy>(&mut self, src: &[T], dst: &mut [T], mut f: impl FnMut(T) -> T) {
        assert_eq!(src.len(), dst.len(), "shuffled_copy: source and destination lengths differ");
        for (i, &x) in src.iter().enumerate() {
            let j = if i == 0 { 0 } else { self.swap_index(i) };
            dst[i] = dst[j];
            dst[j] = f(x);
        }
    }
    /// [`Rng::shuffled_copy`] in place: the same order for the same generator state (step `i`
    /// swaps position `i` with a uniform j in [0, i], ascending; [`Rng::shuffle`] descends).
    pub fn shuffle_forward<T>(&mut self, v: &mut [T]) {
        for i in 1..v.len() {
            let j = self.swap_index(i);
            v.swap(i, j);
        }
    }
    /// The position step `i` of [`Rng::shuffle`] swaps with, uniform in [0, i]: the 32-bit
    /// multiply-shift below 2^32 − 1 (what every split so far drew), a full 64-bit draw
    /// modulo i + 1 past it (the multiply-shift reaches only 2^32 values).
    #[inline]
    pub fn swap_index(&mut self, i: usize) -> usize {
        if i < u32::MAX as usize {
            self.below(i + 1)
        } else {
            (self.next_u64() % (i as u64 + 1)) as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn shuffled_copy_equals_forward_shuffle_of_a_copy_and_is_a_permutation() {
        for n in [0usize, 1, 2, 7, 1000] {
            let src: Vec<u32> = (0..n as u32).collect();
            let mut dst = vec![0u32; n];
            Rng::new(42).shuffled_copy(&src, &mut dst, |x| x);
            let mut inplace = src.clone();
            Rng::new(42).shuffle_forward(&mut inplace);
            assert_eq!(dst, inplace);
            let mut sorted = dst.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, src);
            if n >= 7 {
                assert_ne!(dst, src, "n = {n}: not shuffled");
            }
        }
    }

    #[test]
    fn shuffled_copy_applies_the_map_once_per_record() {
        let src: Vec<u32> = (0..100).collect();
        let mut dst = vec![0u32; 100];
        Rng::new(7).shuffled_copy(&src, &mut dst, |x| x + 1000);
        let mut sorted = dst.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1000..1100).collect::<Vec<u32>>());
    }

    #[test]
    fn forward_shuffle_positions_are_uniform() {
        // Where element 0 ends up over many seeds: every position about equally often.
        let n = 5;
        let mut hits = [0u32; 5];
        for seed in 0..20_000u64 {
            let mut v: Vec<usize> = (0..n).collect();
            Rng::new(seed).shuffle_forward(&mut v);
            hits[v.iter().position(|&x| x == 0).unwrap()] += 1;
        }
        for h in hits {
            assert!((3_600..4_400).contains(&h), "{hits:?}");
        }
    }
}
