//! `SplitMix64`, the one seeded generator of the workspace: the sampler's draws, generated
//! model weights, and the deterministic inputs of tests and benches all come from it. It lives in
//! the bottom crate so every other crate (and the kernels' own tests) can share it. Tiny state,
//! statistics good enough for sampling and random weights, and reproducible from one `u64`.

/// splitmix64 (Steele, Lea and Flood): a 64-bit counter stepped by the golden ratio, hashed by
/// [`mix`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [0, 1), 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (modulo; `n` must not be 0). Slightly biased for huge `n`, which test
    /// inputs do not care about.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `len` values uniform in [-1, 1) (test and bench inputs).
    pub fn signed_units(&mut self, len: usize) -> Vec<f32> {
        (0..len)
            .map(|_| (self.next_f64() * 2.0 - 1.0) as f32)
            .collect()
    }

    /// A sample with mean 0 and variance 1, bounded by ±2·√3 (Irwin–Hall: the sum of the four
    /// 16-bit uniforms of one draw, rescaled).
    #[inline]
    pub fn gaussian(&mut self) -> f32 {
        let r = self.next_u64();
        let s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
        // four uniforms on [0, 65535]: mean 131070, variance 4 * (65536^2 - 1) / 12
        const MEAN: f32 = 131_070.0;
        const INV_STD: f32 = 1.0 / 37_837.23; // sqrt(4 * (65536^2 - 1) / 12)
        (s as f32 - MEAN) * INV_STD
    }
}

/// splitmix64's output function (also a decent 64-bit hash finaliser).
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published splitmix64 sequence for seed 1234567 (first values of the reference C).
    #[test]
    fn matches_the_reference_sequence() {
        let mut r = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
    }

    #[test]
    fn unit_draws_are_in_range() {
        let mut r = SplitMix64::new(3);
        for _ in 0..10_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            assert!(r.below(7) < 7);
        }
    }
}
