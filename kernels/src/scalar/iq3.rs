//! Scalar reference for the 3-bit grid i-quants IQ3_XXS and IQ3_S: ggml's
//! `dequantize_row_iq3_*` and `ggml_vec_dot_iq3_*_q8_K_generic`, bit for bit. Every 4 weights
//! are one grid point; 8 sign bits cover two points. IQ3_XXS packs its signs as 7-bit indices
//! with a 4-bit scale per 32 weights (the block scaled by `d / 4`); IQ3_S stores 9-bit indices
//! and explicit sign bytes with an odd scale `2 * s + 1` per 32 weights.

use super::iq2::{sign_f, signed8};
use crate::formats::{
    BlockIq3S, BlockIq3Xxs, BlockQ8_K, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, QK_K,
};

/// Two 4-weight grid points as one 8-byte point (low half first).
#[inline(always)]
fn pair(g1: u32, g2: u32) -> u64 {
    g1 as u64 | ((g2 as u64) << 32)
}

#[inline(always)]
fn dot8(grid: u64, signs: u8, q8: &[i8]) -> i32 {
    signed8(grid, signs)
        .iter()
        .zip(q8)
        .map(|(&w, &a)| w * a as i32)
        .sum()
}

#[inline(always)]
fn put8(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    for (j, (o, g)) in y.iter_mut().zip(grid.to_le_bytes()).enumerate() {
        *o = db * g as f32 * sign_f(signs, j);
    }
}

/// The 8-weight grid point `l` (0..4) of IQ3_XXS group `ib`.
#[inline(always)]
pub fn iq3_xxs_point(b: &BlockIq3Xxs, ib: usize, l: usize) -> u64 {
    let q = &b.qs[8 * ib + 2 * l..];
    pair(IQ3XXS_GRID[q[0] as usize], IQ3XXS_GRID[q[1] as usize])
}

pub fn dequantize_iq3_xxs(x: &[BlockIq3Xxs], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let aux = b.signs_scale(ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127];
                put8(y8, db, iq3_xxs_point(b, ib, l), signs);
            }
        }
    }
}

/// `ggml_vec_dot_iq3_xxs_q8_K_generic`.
pub fn vec_dot_iq3_xxs(w: &[BlockIq3Xxs], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = a.d() * b.d();
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let aux = a.signs_scale(ib);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127];
                sumi += dot8(iq3_xxs_point(a, ib, l), signs, &b.qs[32 * ib + 8 * l..]);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.25 * sumf
}

/// The 8-weight grid point `l` (0..4) of IQ3_S group `ib`.
#[inline(always)]
pub fn iq3_s_point(b: &BlockIq3S, ib: usize, l: usize) -> u64 {
    let qs = &b.qs[8 * ib + 2 * l..];
    let qh = b.qh[ib] as usize;
    let i1 = qs[0] as usize | ((qh << (8 - 2 * l)) & 256);
    let i2 = qs[1] as usize | ((qh << (7 - 2 * l)) & 256);
    pair(IQ3S_GRID[i1], IQ3S_GRID[i2])
}

/// The odd scale `2 * s + 1` of IQ3_S group `ib`.
#[inline(always)]
pub fn iq3_s_scale(b: &BlockIq3S, ib: usize) -> i32 {
    2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32 + 1
}

pub fn dequantize_iq3_s(x: &[BlockIq3S], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let db = d * iq3_s_scale(b, ib) as f32;
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                put8(y8, db, iq3_s_point(b, ib, l), b.signs[4 * ib + l]);
            }
        }
    }
}

/// `ggml_vec_dot_iq3_s_q8_K_generic`.
pub fn vec_dot_iq3_s(w: &[BlockIq3S], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = a.d() * b.d();
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let mut sumi = 0i32;
            for l in 0..4 {
                sumi += dot8(
                    iq3_s_point(a, ib, l),
                    a.signs[4 * ib + l],
                    &b.qs[32 * ib + 8 * l..],
                );
            }
            bsum += sumi * iq3_s_scale(a, ib);
        }
        sumf += d * bsum as f32;
    }
    sumf
}
