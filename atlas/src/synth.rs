//! Synthetic atlases for simulations and tests: per MoE layer, expert popularity follows Zipf(s)
//! (the expert of rank r gets activations ∝ 1/r^s) over a per-layer random permutation of expert
//! ids, so every layer has different hot experts, as real routers do. Deterministic per seed.

use crate::placement::ModelShape;
use crate::trace::{Atlas, Counts};

/// SplitMix64: tiny, deterministic, good enough to shuffle expert ids.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by rejection-free multiply-shift (bias < 2^-32 for small n).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
}

/// Activation counts for `shape`: `per_layer` activations per layer split as Zipf(`s`).
pub fn zipf_counts(shape: &ModelShape, s: f64, per_layer: u64, seed: u64) -> Counts {
    let e = shape.n_experts;
    let mut rng = SplitMix(seed);
    let weights: Vec<f64> = (1..=e).map(|r| 1.0 / (r as f64).powf(s)).collect();
    let sum: f64 = weights.iter().sum();
    let mut counts = Counts::zeros(shape.moe_layers.len(), e);
    for slot in 0..shape.moe_layers.len() {
        let mut perm: Vec<usize> = (0..e).collect();
        for i in (1..e).rev() {
            let j = rng.below(i + 1);
            perm.swap(i, j);
        }
        for (rank, &x) in perm.iter().enumerate() {
            let c = (weights[rank] / sum * per_layer as f64).round() as u64;
            counts.activations[slot][x] = c;
            counts.weight_sums[slot][x] = c as f64 / 8.0;
        }
    }
    counts
}

/// A whole atlas (all-time counts only) with Zipf(`s`) popularity.
pub fn zipf_atlas(shape: ModelShape, top_k: usize, s: f64, tokens: u64, seed: u64) -> Atlas {
    let mut atlas = Atlas::empty(format!("synthetic zipf({s})"), shape, top_k, 0);
    atlas.all_time = zipf_counts(&atlas.shape, s, tokens * top_k as u64, seed);
    atlas.all_time.tokens = tokens;
    atlas
}

/// Kimi K2's MoE shape: 61 layers, the first dense, 384 experts, ~24.8 MB per Q4_K expert
/// (3 × 7168 × 2048 weights at 4.5 bits).
pub fn kimi_k2_shape() -> ModelShape {
    ModelShape {
        moe_layers: (1..=60).collect(),
        n_experts: 384,
        expert_bytes: 3 * 7168 * 2048 * 9 / 16,
    }
}
