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
