//! Scalar reference for Q4_K and Q5_K (same 6-bit scale/min packing): ggml's
//! `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref` (make_qkx2_quants per 32, requantization),
//! `dequantize_row_q4_K` / `_q5_K` and the `_generic` Q8_K dot products, bit for bit.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]

use super::q8_k::{lane_sums, KEpilogue};
use super::search::{make_qkx2_quants, nearest_int, Qkx2};
use crate::formats::{f16_to_f32, f32_to_f16, scale_min_k4, BlockQ4_K, BlockQ5_K, BlockQ8_K, QK_K};

/// The shared part of the Q4_K and Q5_K reference quantizers: per-32 search, 6-bit scale and
/// min codes packed into `scales`, f16 `d`/`dmin`, then requantization into `l` (0..=nmax).
fn quantize_super_block(
    xb: &[f32],
    p: Qkx2,
    l: &mut [u8; QK_K],
    scales_out: &mut [u8; 12],
    d_out: &mut [u8; 2],
    dmin_out: &mut [u8; 2],
) {
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &xb[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(p, xs, &weights, &mut l[32 * j..32 * j + 32], &mut l_aux);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            scales_out[j - 4] |= (ls >> 4) << 6;
            scales_out[j] |= (lm >> 4) << 6;
        }
    }
    *d_out = f32_to_f16(max_scale / 63.0).to_le_bytes();
    *dmin_out = f32_to_f16(max_min / 63.0).to_le_bytes();

    let d_all = f16_to_f32(u16::from_le_bytes(*d_out));
    let dmin_all = f16_to_f32(u16::from_le_bytes(*dmin_out));
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, scales_out);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            let q = nearest_int((xb[32 * j + ii] + dm) / d).clamp(0, p.nmax);
            l[32 * j + ii] = q as u8;
        }
    }
}

pub fn quantize_q4_k(x: &[f32], y: &mut [BlockQ4_K]) {
    let p = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let mut l = [0u8; QK_K];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_super_block(xb, p, &mut l, &mut b.scales, &mut b.d, &mut b.dmin);
        for (j, q) in (0..QK_K).step_by(64).zip(b.qs.chunks_exact_mut(32)) {
            for i in 0..32 {
                q[i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
    }
}

pub fn quantize_q5_k(x: &[f32], y: &mut [BlockQ5_K]) {
    let p = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let mut l = [0u8; QK_K];
    for (xb, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_super_block(xb, p, &mut l, &mut b.scales, &mut b.d, &mut b.dmin);
        b.qh = [0; QK_K / 8];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (n, ql) in (0..QK_K).step_by(64).zip(b.qs.chunks_exact_mut(32)) {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// Q4_K quants in element order (0..=15).
#[inline]
pub fn unpack_q4_k(b: &BlockQ4_K, a: &mut [i8; QK_K]) {
    for (j, q) in b.qs.chunks_exact(32).enumerate() {
        for l in 0..32 {
            a[64 * j + l] = (q[l] & 0xf) as i8;
            a[64 * j + 32 + l] = (q[l] >> 4) as i8;
        }
    }
}

/// Q5_K quants in element order (0..=31).
#[inline]
pub fn unpack_q5_k(b: &BlockQ5_K, a: &mut [i8; QK_K]) {
    for (j, q) in b.qs.chunks_exact(32).enumerate() {
        let m1 = 1u8 << (2 * j);
        let m2 = 2u8 << (2 * j);
        for l in 0..32 {
            a[64 * j + l] = ((q[l] & 0xf) + if b.qh[l] & m1 != 0 { 16 } else { 0 }) as i8;
            a[64 * j + 32 + l] = ((q[l] >> 4) + if b.qh[l] & m2 != 0 { 16 } else { 0 }) as i8;
        }
    }
}

fn dequantize_k4(d: f32, min: f32, scales: &[u8; 12], a: &[i8; QK_K], yb: &mut [f32]) {
    for (j, chunk) in yb.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(j, scales);
        let d1 = d * sc as f32;
        let m1 = min * m as f32;
        for (o, &q) in chunk.iter_mut().zip(&a[32 * j..32 * j + 32]) {
            *o = d1 * q as f32 - m1;
        }
    }
}

pub fn dequantize_q4_k(x: &[BlockQ4_K], y: &mut [f32]) {
    let mut a = [0i8; QK_K];
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        unpack_q4_k(b, &mut a);
        dequantize_k4(b.d(), b.dmin(), &b.scales, &a, yb);
    }
}

pub fn dequantize_q5_k(x: &[BlockQ5_K], y: &mut [f32]) {
    let mut a = [0i8; QK_K];
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        unpack_q5_k(b, &mut a);
        dequantize_k4(b.d(), b.dmin(), &b.scales, &a, yb);
    }
}

/// One super-block of the Q4_K/Q5_K generic dot: lane sums with the per-32 scales, and the min
/// correction `sum(bsums[j] * mins[j / 2])`.
#[inline]
fn block_k4(scales: &[u8; 12], a: &[i8; QK_K], bx: &BlockQ8_K) -> ([i32; 8], i32) {
    let mut scale16 = [0i32; 16];
    let mut sumi = 0i32;
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        scale16[2 * j] = sc as i32;
        scale16[2 * j + 1] = sc as i32;
        sumi += bx.bsum(2 * j) as i32 * m as i32;
        sumi += bx.bsum(2 * j + 1) as i32 * m as i32;
    }
    (lane_sums(&bx.qs, a, &scale16), sumi)
}

/// `ggml_vec_dot_q4_K_q8_K_generic`.
pub fn vec_dot_q4_k(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let mut a = [0i8; QK_K];
    let mut acc = KEpilogue::default();
    for (bw, bx) in w.iter().zip(x) {
        unpack_q4_k(bw, &mut a);
        let (aux32, sumi) = block_k4(&bw.scales, &a, bx);
        acc.add_block(bw.d() * bx.d(), &aux32);
        acc.sub_min(bw.dmin() * bx.d(), sumi);
    }
    acc.finish()
}

/// `ggml_vec_dot_q5_K_q8_K_generic`.
pub fn vec_dot_q5_k(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    let mut a = [0i8; QK_K];
    let mut acc = KEpilogue::default();
    for (bw, bx) in w.iter().zip(x) {
        unpack_q5_k(bw, &mut a);
        let (aux32, sumi) = block_k4(&bw.scales, &a, bx);
        acc.add_block(bw.d() * bx.d(), &aux32);
        acc.sub_min(bw.dmin() * bx.d(), sumi);
    }
    acc.finish()
}
