//! Deterministic random numbers for generated weights: splitmix64 streams and a cheap
//! gaussian-ish sample (Irwin–Hall sum of four 16-bit uniforms, rescaled to unit variance).
//!
//! Every row of every tensor gets its own stream derived from (seed, tensor name, row), so
//! rows can be generated in parallel, in any order, and the file is still byte-identical.

/// A splitmix64 generator: tiny state, good enough statistics for random weights, fast.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// A sample with mean 0 and variance 1, bounded by ±2·√3 (sum of four uniforms).
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

/// The seed of one tensor: FNV-1a of its name, mixed with the model seed.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(h ^ mix(seed))
}

/// The generator for one row of a tensor.
pub fn row_rng(tensor_seed: u64, row: u64) -> SplitMix64 {
    SplitMix64::new(mix(tensor_seed ^ row.wrapping_mul(0xD6E8_FEB8_6659_FD93)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_has_unit_moments() {
        let mut r = SplitMix64::new(1);
        let n = 200_000;
        let (mut s1, mut s2) = (0f64, 0f64);
        for _ in 0..n {
            let x = f64::from(r.gaussian());
            s1 += x;
            s2 += x * x;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
    }

    #[test]
    fn rows_are_independent_and_repeatable() {
        let t = tensor_seed(7, "blk.0.attn_q.weight");
        assert_eq!(row_rng(t, 3).next_u64(), row_rng(t, 3).next_u64());
        assert_ne!(row_rng(t, 3).next_u64(), row_rng(t, 4).next_u64());
        assert_ne!(tensor_seed(7, "a"), tensor_seed(8, "a"));
    }
}
