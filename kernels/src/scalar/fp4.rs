//! Scalar reference for the FP4 types: ggml's `quantize_row_mxfp4_ref`,
//! `quantize_row_nvfp4_ref`, `dequantize_row_mxfp4`, `dequantize_row_nvfp4`,
//! `ggml_vec_dot_mxfp4_q8_0_generic` and `ggml_vec_dot_nvfp4_q8_0_generic`, bit for bit. Codes
//! index `KVALUES_FP4` (E2M1 doubled); the block scales are stored halved (`formats::fp4`).
//! MXFP4 is summed like IQ4_NL (one float step per 32 elements), NVFP4 one float step per
//! 16-element sub-block, `dy * d * sumi` in that order.

use crate::formats::{
    e8m0_to_f32_half, f32_to_ue4m3, ue4m3_to_f32_half, BlockMxfp4, BlockNvfp4, BlockQ8_0,
    KVALUES_FP4, QK_MXFP4, QK_NVFP4, QK_NVFP4_SUB,
};

#[inline(always)]
fn kv(q: u8) -> i32 {
    KVALUES_FP4[(q & 0xf) as usize] as i32
}

/// ggml's `best_index_mxfp4`: the first code whose value times `e` is nearest to `x`.
#[inline]
fn best_index(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_FP4[0] as f32 * e - x).abs();
    for (i, &v) in KVALUES_FP4.iter().enumerate().skip(1) {
        let err = (v as f32 * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// Codes of `x` (2 n values) at scale `d` into `n` bytes: `x[j]` low nibble, `x[n + j]` high.
#[inline]
fn pack_codes(x: &[f32], d: f32, qs: &mut [u8]) {
    let n = qs.len();
    for (j, q) in qs.iter_mut().enumerate() {
        *q = best_index(x[j], d) | (best_index(x[n + j], d) << 4);
    }
}

/// The absolute maximum (NaN never wins: `amax < |v|` is false for it).
#[inline]
fn absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m })
}

pub fn quantize_mxfp4(x: &[f32], y: &mut [BlockMxfp4]) {
    for (xb, b) in x.chunks_exact(QK_MXFP4).zip(y.iter_mut()) {
        let amax = absmax(xb);
        // ggml converts the float to uint8_t; through i32 as x86 code does for values below 0
        b.e = if amax > 0.0 {
            ((amax.log2().floor() - 2.0 + 127.0) as i32) as u8
        } else {
            0
        };
        pack_codes(xb, e8m0_to_f32_half(b.e), &mut b.qs);
    }
}

pub fn quantize_nvfp4(x: &[f32], y: &mut [BlockNvfp4]) {
    for (xb, b) in x.chunks_exact(QK_NVFP4).zip(y.iter_mut()) {
        for (s, xs) in xb.chunks_exact(QK_NVFP4_SUB).enumerate() {
            b.d[s] = f32_to_ue4m3(absmax(xs) / 6.0);
            let d = ue4m3_to_f32_half(b.d[s]);
            let half = QK_NVFP4_SUB / 2;
            pack_codes(xs, d, &mut b.qs[s * half..(s + 1) * half]);
        }
    }
}

pub fn dequantize_mxfp4(x: &[BlockMxfp4], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_MXFP4)) {
        let d = b.d();
        for (j, &q) in b.qs.iter().enumerate() {
            yb[j] = kv(q) as f32 * d;
            yb[j + QK_MXFP4 / 2] = kv(q >> 4) as f32 * d;
        }
    }
}

pub fn dequantize_nvfp4(x: &[BlockNvfp4], y: &mut [f32]) {
    let half = QK_NVFP4_SUB / 2;
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_NVFP4)) {
        for (s, ys) in yb.chunks_exact_mut(QK_NVFP4_SUB).enumerate() {
            let d = b.d(s);
            for (j, &q) in b.qs[s * half..(s + 1) * half].iter().enumerate() {
                ys[j] = kv(q) as f32 * d;
                ys[j + half] = kv(q >> 4) as f32 * d;
            }
        }
    }
}

/// The integer dot product of `qs.len()` packed codes (2 `qs.len()` values) with as many
/// activations (low nibbles against the first half).
#[inline(always)]
pub fn dot_codes(qs: &[u8], q8: &[i8]) -> i32 {
    let n = qs.len();
    let (mut lo, mut hi) = (0i32, 0i32);
    for (j, &q) in qs.iter().enumerate() {
        lo += q8[j] as i32 * kv(q);
        hi += q8[j + n] as i32 * kv(q >> 4);
    }
    lo + hi
}

/// `ggml_vec_dot_mxfp4_q8_0_generic`.
pub fn vec_dot_mxfp4(w: &[BlockMxfp4], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * a.d();
        sumf += d * dot_codes(&a.qs, &b.qs) as f32;
    }
    sumf
}

/// `ggml_vec_dot_nvfp4_q8_0_generic`: two Q8_0 blocks per NVFP4 block.
pub fn vec_dot_nvfp4(w: &[BlockNvfp4], x: &[BlockQ8_0]) -> f32 {
    let half = QK_NVFP4_SUB / 2;
    let mut sumf = 0.0f32;
    for (a, y) in w.iter().zip(x.chunks_exact(2)) {
        for s in 0..4 {
            let yb = &y[s / 2];
            let off = (s % 2) * QK_NVFP4_SUB;
            let sumi = dot_codes(&a.qs[s * half..(s + 1) * half], &yb.qs[off..off + 16]);
            sumf += yb.d() * a.d(s) * sumi as f32;
        }
    }
    sumf
}
