//! Scalar reference for Q2_K: ggml's `quantize_row_q2_K_ref` (make_qkx2_quants per 16, 4-bit
//! scale and min codes, requantization), `dequantize_row_q2_K` and
//! `ggml_vec_dot_q2_K_q8_K_generic`, bit for bit.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]

use super::search::{make_qkx2_quants, nearest_int, Qkx2};
use crate::formats::{f16_to_f32, f32_to_f16, BlockQ2_K, BlockQ8_K, QK_K};

/// Packs four 2-bit planes of 128 quants into 32 bytes per half block (Q2_K and Q3_K layout).
pub(super) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

pub fn quantize(x: &[f32], y: &mut [BlockQ2_K]) {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    let q4scale = 15.0f32;
    let params = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };

    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &xb[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                params,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut l_aux,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }

        if max_scale > 0.0 {
            let iscale = q4scale / max_scale;
            for j in 0..QK_K / 16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f32_to_f16(max_scale / q4scale).to_le_bytes();
        } else {
            b.scales = [0; QK_K / 16];
            b.d = f32_to_f16(0.0).to_le_bytes();
        }
        if max_min > 0.0 {
            let iscale = q4scale / max_min;
            for j in 0..QK_K / 16 {
                let q = nearest_int(iscale * mins[j]);
                b.scales[j] |= (q << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / q4scale).to_le_bytes();
        } else {
            b.dmin = f32_to_f16(0.0).to_le_bytes();
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(u16::from_le_bytes(b.d)) * (b.scales[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(u16::from_le_bytes(b.dmin)) * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((xb[16 * j + ii] + dm) / d).clamp(0, 3);
                l[16 * j + ii] = q as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
    }
}

pub fn dequantize(x: &[BlockQ2_K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        let min = b.dmin();
        let mut out = yb.iter_mut();
        let mut is = 0;
        for half in 0..2 {
            let q = &b.qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xf) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &qb in &q[16 * part..16 * part + 16] {
                        if let Some(o) = out.next() {
                            *o = dl * ((qb >> shift) & 3) as f32 - ml;
                        }
                    }
                }
            }
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K_generic`.
pub fn vec_dot(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let mut summs = 0i32;
        for j in 0..16 {
            summs += b.bsum(j) as i32 * (a.scales[j] >> 4) as i32;
        }
        let dall = b.d() * a.d();
        let dmin = b.d() * a.dmin();

        let mut isum = 0i32;
        let mut is = 0;
        for half in 0..2 {
            let q2 = &a.qs[32 * half..32 * half + 32];
            for (step, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
                let q8 = &b.qs[128 * half + 32 * step..128 * half + 32 * step + 32];
                for part in 0..2 {
                    let d = (a.scales[is] & 0xf) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in 16 * part..16 * part + 16 {
                        isuml += q8[l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}
