//! Scalar reference for Q3_K: ggml's `quantize_row_q3_K_ref` (make_q3_quants per 16, signed 6-bit
//! scales, requantization, high-bit mask), `dequantize_row_q3_K` and
//! `ggml_vec_dot_q3_K_q8_K_generic`, bit for bit.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]

use super::q2_k::pack_2bit;
use super::q8_k::{lane_sums, KEpilogue};
use super::search::{make_q3_quants, nearest_int};
use crate::formats::{f16_to_f32, f32_to_f16, BlockQ3_K, BlockQ8_K, QK_K};

pub fn quantize(x: &[f32], y: &mut [BlockQ3_K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(16, 4, &xb[16 * j..], &mut l[16 * j..], true);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }

        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for j in 0..QK_K / 16 {
                let q = nearest_int(iscale * scales[j]) as i8 as i32;
                let q = (q.clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = q & 0xf;
                } else {
                    b.scales[j - 8] |= (q & 0xf) << 4;
                }
                b.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            b.d = f32_to_f16(1.0 / iscale).to_le_bytes();
        } else {
            b.d = f32_to_f16(0.0).to_le_bytes();
        }

        let sc = b.unpacked_scales();
        let dall = f16_to_f32(u16::from_le_bytes(b.d));
        for j in 0..QK_K / 16 {
            let d = dall * (sc[j] as i32 - 32) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }

        b.hmask = [0; QK_K / 8];
        let mut m = 0;
        let mut hm = 1u8;
        for v in l.iter_mut() {
            if *v > 3 {
                b.hmask[m] |= hm;
                *v -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        let mut lu = [0u8; QK_K];
        for (o, &v) in lu.iter_mut().zip(&l) {
            *o = v as u8;
        }
        pack_2bit(&lu, &mut b.qs);
    }
}

/// The signed 3-bit quants of a block in element order (`q - 4` when the high bit is clear).
#[inline]
pub fn unpack_quants(b: &BlockQ3_K, a: &mut [i8; QK_K]) {
    for half in 0..2 {
        let q3 = &b.qs[32 * half..32 * half + 32];
        for plane in 0..4 {
            let m = 1u8 << (4 * half + plane);
            let out = &mut a[128 * half + 32 * plane..128 * half + 32 * plane + 32];
            for l in 0..32 {
                let lo = ((q3[l] >> (2 * plane)) & 3) as i8;
                out[l] = lo - if b.hmask[l] & m != 0 { 0 } else { 4 };
            }
        }
    }
}

pub fn dequantize(x: &[BlockQ3_K], y: &mut [f32]) {
    let mut a = [0i8; QK_K];
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = b.d();
        let sc = b.unpacked_scales();
        unpack_quants(b, &mut a);
        for (g, chunk) in yb.chunks_exact_mut(16).enumerate() {
            let dl = d_all * (sc[g] as i32 - 32) as f32;
            for (o, &q) in chunk.iter_mut().zip(&a[16 * g..16 * g + 16]) {
                *o = dl * q as f32;
            }
        }
    }
}

/// `ggml_vec_dot_q3_K_q8_K_generic`.
pub fn vec_dot(w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
    let mut a = [0i8; QK_K];
    let mut acc = KEpilogue::default();
    for (bw, bx) in w.iter().zip(x) {
        unpack_quants(bw, &mut a);
        let sc = bw.unpacked_scales();
        let mut scale16 = [0i32; 16];
        for (s, &v) in scale16.iter_mut().zip(&sc) {
            *s = v as i32 - 32;
        }
        let aux32 = lane_sums(&bx.qs, &a, &scale16);
        acc.add_block(bw.d() * bx.d(), &aux32);
    }
    acc.finish()
}
