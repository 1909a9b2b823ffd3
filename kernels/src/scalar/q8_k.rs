//! Scalar reference for Q8_K, the activation format of every K-quant dot product
//! (`quantize_row_q8_K_ref` with its per-16 `bsums`, and dequantization), plus the integer core
//! and float epilogue that ggml's generic Q3_K/Q4_K/Q5_K/Q6_K dot products share.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]

use super::search::nearest_int;
use crate::formats::{BlockQ8_K, QK_K};

/// `quantize_row_q8_K_ref`: `d = max / -127` style scale (sign of the largest magnitude), quants
/// clamped to 127, `bsums[j]` the sum of quants `16j..16j+16`. An all-zero block gets d = 0 and
/// zero quants and sums.
pub fn quantize(x: &[f32], y: &mut [BlockQ8_K]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0f32.to_le_bytes();
            b.qs = [0; QK_K];
            b.bsums = [[0; 2]; QK_K / 16];
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let sum: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            b.bsums[j] = (sum as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

pub fn dequantize(x: &[BlockQ8_K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    }
}

/// The integer core of ggml's generic K-quant dots: `aux32[l] = sum over positions p with
/// p % 8 == l of scale16[p / 16] * q8[p] * a[p]` (integer, so any summation order gives the same
/// value; SIMD tiers may compute it however they like).
#[inline]
pub fn lane_sums(q8: &[i8; QK_K], a: &[i8; QK_K], scale16: &[i32; 16]) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for (g, sc) in scale16.iter().enumerate() {
        for half in 0..2 {
            let base = 16 * g + 8 * half;
            for l in 0..8 {
                let prod = q8[base + l] as i16 as i32 * a[base + l] as i32;
                aux32[l] += sc * prod;
            }
        }
    }
    aux32
}

/// The float epilogue state of ggml's generic Q3_K/Q4_K/Q5_K/Q6_K dots: eight per-lane float
/// sums (`sums[8]`) plus the running `sumf` that collects the min corrections.
#[derive(Clone, Copy, Debug, Default)]
pub struct KEpilogue {
    pub sums: [f32; 8],
    pub sumf: f32,
}

impl KEpilogue {
    /// `sums[l] += d * aux32[l]` for one super-block.
    #[inline(always)]
    pub fn add_block(&mut self, d: f32, aux32: &[i32; 8]) {
        for (s, &a) in self.sums.iter_mut().zip(aux32) {
            *s += d * a as f32;
        }
    }

    /// `sumf -= dmin * sumi` for one super-block (Q4_K, Q5_K).
    #[inline(always)]
    pub fn sub_min(&mut self, dmin: f32, sumi: i32) {
        self.sumf -= dmin * sumi as f32;
    }

    /// `for l in 0..8: sumf += sums[l]`.
    #[inline(always)]
    pub fn finish(self) -> f32 {
        let mut sumf = self.sumf;
        for s in self.sums {
            sumf += s;
        }
        sumf
    }
}
