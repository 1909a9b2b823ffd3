//! Scalar reference for the non-linear 4-bit i-quants: `dequantize_row_iq4_nl`,
//! `dequantize_row_iq4_xs`, `ggml_vec_dot_iq4_nl_q8_0_generic` and
//! `ggml_vec_dot_iq4_xs_q8_K_generic`, bit for bit. Each 4-bit code indexes `KVALUES_IQ4NL`;
//! IQ4_XS adds a 6-bit scale (offset by 32) per 32 elements.

use crate::formats::{BlockIq4Nl, BlockIq4Xs, BlockQ8_0, BlockQ8_K, KVALUES_IQ4NL, QK4_NL, QK_K};

#[inline(always)]
fn kv(q: u8) -> i32 {
    KVALUES_IQ4NL[(q & 0xf) as usize] as i32
}

pub fn dequantize_iq4_nl(x: &[BlockIq4Nl], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = b.d();
        for (j, &q) in b.qs.iter().enumerate() {
            yb[j] = d * kv(q) as f32;
            yb[j + QK4_NL / 2] = d * kv(q >> 4) as f32;
        }
    }
}

pub fn dequantize_iq4_xs(x: &[BlockIq4Xs], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, (qs, ys)) in
            b.qs.chunks_exact(16)
                .zip(yb.chunks_exact_mut(32))
                .enumerate()
        {
            let dl = d * (b.scale(ib) as i32 - 32) as f32;
            for (j, &q) in qs.iter().enumerate() {
                ys[j] = dl * kv(q) as f32;
                ys[j + 16] = dl * kv(q >> 4) as f32;
            }
        }
    }
}

/// The integer dot product of 16 packed codes (32 values) with 32 activations.
#[inline(always)]
fn dot32(qs: &[u8], q8: &[i8]) -> i32 {
    let (mut lo, mut hi) = (0i32, 0i32);
    for (j, &q) in qs.iter().enumerate() {
        lo += q8[j] as i32 * kv(q);
        hi += q8[j + 16] as i32 * kv(q >> 4);
    }
    lo + hi
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub fn vec_dot_iq4_nl(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * a.d();
        sumf += d * dot32(&a.qs, &b.qs) as f32;
    }
    sumf
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`.
pub fn vec_dot_iq4_xs(w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d4d8 = a.d() * b.d();
        for ib in 0..QK_K / 32 {
            let dl = d4d8 * (a.scale(ib) as i32 - 32) as f32;
            let sumi = dot32(&a.qs[16 * ib..16 * ib + 16], &b.qs[32 * ib..32 * ib + 32]);
            sumf += dl * sumi as f32;
        }
    }
    sumf
}
