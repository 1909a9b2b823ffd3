//! Deterministic random numbers for generated weights: one splitmix64 stream per row (the
//! generator and its gaussian-ish sample are `nightshift_kernels::rng`'s).
//!
//! Every row of every tensor gets its own stream derived from (seed, tensor name, row), so
//! rows can be generated in parallel, in any order, and the file is still byte-identical.

pub use nightshift_kernels::rng::{mix, SplitMix64};

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
