//! Scalar reference for the 2-bit grid i-quants IQ2_XXS, IQ2_XS and IQ2_S: ggml's
//! `dequantize_row_iq2_*` and `ggml_vec_dot_iq2_*_q8_K_generic`, bit for bit. Every 8 weights
//! are one grid point (8 magnitudes in {8, 25, 43}) with 8 sign bits; the odd scale
//! `2 * s + 1` applies per 32 (IQ2_XXS) or 16 (IQ2_XS, IQ2_S) weights, and the whole block is
//! scaled by `d / 8` (the dot products' final `0.125 *`, the dequantizers' `(0.5 + s) * 0.25`).

use crate::formats::{
    BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockQ8_K, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID,
    KSIGNS_IQ2XS, QK_K,
};

/// `grid * sign` for 8 weights: `signs` bit j negates weight j.
#[inline(always)]
pub fn signed8(grid: u64, signs: u8) -> [i32; 8] {
    let g = grid.to_le_bytes();
    std::array::from_fn(|j| {
        let v = g[j] as i32;
        if signs & (1 << j) != 0 {
            -v
        } else {
            v
        }
    })
}

/// ggml's `(signs & kmask_iq2xs[j] ? -1.f : 1.f)`.
#[inline(always)]
pub(crate) fn sign_f(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 {
        -1.0
    } else {
        1.0
    }
}

/// Writes `db * grid[j] * sign_j` for 8 weights.
#[inline(always)]
fn put8(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    for (j, (o, g)) in y.iter_mut().zip(grid.to_le_bytes()).enumerate() {
        *o = db * g as f32 * sign_f(signs, j);
    }
}

#[inline(always)]
fn dot8(grid: u64, signs: u8, q8: &[i8]) -> i32 {
    signed8(grid, signs)
        .iter()
        .zip(q8)
        .map(|(&w, &a)| w * a as i32)
        .sum()
}

pub fn dequantize_iq2_xxs(x: &[BlockIq2Xxs], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let (idx, sg) = b.words(ib);
            let db = d * (0.5 + (sg >> 28) as f32) * 0.25;
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                let grid = IQ2XXS_GRID[(idx >> (8 * l)) as usize & 255];
                put8(y8, db, grid, KSIGNS_IQ2XS[(sg >> (7 * l)) as usize & 127]);
            }
        }
    }
}

/// `ggml_vec_dot_iq2_xxs_q8_K_generic`.
pub fn vec_dot_iq2_xxs(w: &[BlockIq2Xxs], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = a.d() * b.d();
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let (idx, sg) = a.words(ib);
            let ls = 2 * (sg >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[(idx >> (8 * l)) as usize & 255];
                let signs = KSIGNS_IQ2XS[(sg >> (7 * l)) as usize & 127];
                sumi += dot8(grid, signs, &b.qs[32 * ib + 8 * l..]);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub fn dequantize_iq2_xs(x: &[BlockIq2Xs], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let sc = b.scales[ib];
            let db = [
                d * (0.5 + (sc & 0xf) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                let q = b.q(4 * ib + l);
                let grid = IQ2XS_GRID[(q & 511) as usize];
                put8(y8, db[l / 2], grid, KSIGNS_IQ2XS[(q >> 9) as usize]);
            }
        }
    }
}

/// `ggml_vec_dot_iq2_xs_q8_K_generic`.
pub fn vec_dot_iq2_xs(w: &[BlockIq2Xs], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = a.d() * b.d();
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let sc = a.scales[ib];
            let ls = [2 * (sc & 0xf) as i32 + 1, 2 * (sc >> 4) as i32 + 1];
            for (half, ls) in ls.into_iter().enumerate() {
                let mut sumi = 0i32;
                for l in 2 * half..2 * half + 2 {
                    let q = a.q(4 * ib + l);
                    let grid = IQ2XS_GRID[(q & 511) as usize];
                    let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                    sumi += dot8(grid, signs, &b.qs[32 * ib + 8 * l..]);
                }
                bsum += sumi * ls;
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// IQ2_S grid index of 8-element group `l` (0..4) of 32-element group `ib`.
#[inline(always)]
pub fn iq2_s_index(b: &BlockIq2S, ib: usize, l: usize) -> usize {
    b.qs[4 * ib + l] as usize | (((b.qh[ib] as usize) << (8 - 2 * l)) & 0x300)
}

pub fn dequantize_iq2_s(x: &[BlockIq2S], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let sc = b.scales[ib];
            let db = [
                d * (0.5 + (sc & 0xf) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                let grid = IQ2S_GRID[iq2_s_index(b, ib, l)];
                put8(y8, db[l / 2], grid, b.qs[QK_K / 8 + 4 * ib + l]);
            }
        }
    }
}

/// `ggml_vec_dot_iq2_s_q8_K_generic`.
pub fn vec_dot_iq2_s(w: &[BlockIq2S], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = a.d() * b.d();
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let sc = a.scales[ib];
            let ls1 = 1 + 2 * (sc & 0xf) as i32;
            let ls2 = 1 + 2 * (sc >> 4) as i32;
            let mut sumi = [0i32; 2];
            for l in 0..4 {
                let grid = IQ2S_GRID[iq2_s_index(a, ib, l)];
                let signs = a.qs[QK_K / 8 + 4 * ib + l];
                sumi[l / 2] += dot8(grid, signs, &b.qs[32 * ib + 8 * l..]);
            }
            bsum += ls1 * sumi[0] + ls2 * sumi[1];
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}
