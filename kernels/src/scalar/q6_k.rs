//! Scalar reference for Q6_K: ggml's `quantize_row_q6_K_ref` (make_qx_quants per 16, signed 8-bit
//! scales, requantization), `dequantize_row_q6_K` and `ggml_vec_dot_q6_K_q8_K_generic`, bit for
//! bit.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]

use super::q8_k::{lane_sums, KEpilogue};
use super::search::{make_qx_quants, nearest_int};
use crate::formats::{f16_to_f32, f32_to_f16, BlockQ6_K, BlockQ8_K, QK_K};

const GROUP_MAX_EPS: f32 = 1e-15;

pub fn quantize(x: &[f32], y: &mut [BlockQ6_K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(16, 32, &xb[16 * ib..], &mut l[16 * ib..], 1, None);
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }

        if max_abs_scale < GROUP_MAX_EPS {
            b.ql = [0; QK_K / 2];
            b.qh = [0; QK_K / 4];
            b.scales = [0; QK_K / 16];
            b.d = f32_to_f16(0.0).to_le_bytes();
            continue;
        }

        let iscale = -128.0f32 / max_scale;
        b.d = f32_to_f16(1.0 / iscale).to_le_bytes();
        for ib in 0..QK_K / 16 {
            b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }

        let d_all = f16_to_f32(u16::from_le_bytes(b.d));
        for j in 0..QK_K / 16 {
            let d = d_all * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }

        for half in 0..2 {
            let lh = &l[128 * half..128 * half + 128];
            let ql = &mut b.ql[64 * half..64 * half + 64];
            let qh = &mut b.qh[32 * half..32 * half + 32];
            for i in 0..32 {
                let q1 = lh[i] as u8;
                let q2 = lh[i + 32] as u8;
                let q3 = lh[i + 64] as u8;
                let q4 = lh[i + 96] as u8;
                ql[i] = (q1 & 0xf) | ((q3 & 0xf) << 4);
                ql[i + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
                qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

/// The signed 6-bit quants of a block in element order (`q - 32`, in -32..=31).
#[inline]
pub fn unpack_quants(b: &BlockQ6_K, a: &mut [i8; QK_K]) {
    for half in 0..2 {
        let ql = &b.ql[64 * half..64 * half + 64];
        let qh = &b.qh[32 * half..32 * half + 32];
        let out = &mut a[128 * half..128 * half + 128];
        for l in 0..32 {
            out[l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

pub fn dequantize(x: &[BlockQ6_K], y: &mut [f32]) {
    let mut a = [0i8; QK_K];
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        unpack_quants(b, &mut a);
        for (g, chunk) in yb.chunks_exact_mut(16).enumerate() {
            let ds = d * b.scales[g] as f32;
            for (o, &q) in chunk.iter_mut().zip(&a[16 * g..16 * g + 16]) {
                *o = ds * q as f32;
            }
        }
    }
}

/// `ggml_vec_dot_q6_K_q8_K_generic`.
pub fn vec_dot(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    let mut a = [0i8; QK_K];
    let mut acc = KEpilogue::default();
    for (bw, bx) in w.iter().zip(x) {
        unpack_quants(bw, &mut a);
        let mut scale16 = [0i32; 16];
        for (s, &v) in scale16.iter_mut().zip(&bw.scales) {
            *s = v as i32;
        }
        let aux32 = lane_sums(&bx.qs, &a, &scale16);
        acc.add_block(bw.d() * bx.d(), &aux32);
    }
    acc.finish()
}
