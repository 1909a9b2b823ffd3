//! Scalar reference for the 1-bit grid i-quants IQ1_S and IQ1_M: ggml's `dequantize_row_iq1_*`
//! and `ggml_vec_dot_iq1_*_q8_K_generic`, bit for bit. Every 8 weights are one point of
//! `IQ1S_GRID` (values -1, 0, 1) shifted by ±1/8; the dot products fold the shift in through the
//! activations' 16-element sums (IQ1_S) or sums of 8 (IQ1_M), as ggml does.

use crate::formats::{BlockIq1M, BlockIq1S, BlockQ8_K, IQ1S_GRID, QK_K};

/// ggml's `IQ1S_DELTA` (= `IQ1M_DELTA`).
pub const IQ1_DELTA: f32 = 0.125;

#[inline(always)]
fn grid(i: usize) -> [i8; 8] {
    IQ1S_GRID[i].to_le_bytes().map(|b| b as i8)
}

#[inline(always)]
fn dot8(i: usize, q8: &[i8]) -> i32 {
    grid(i)
        .iter()
        .zip(q8)
        .map(|(&g, &a)| g as i32 * a as i32)
        .sum()
}

/// IQ1_S grid index of 8-element group `l` (0..4) of 32-element group `ib`.
#[inline(always)]
pub fn iq1_s_index(b: &BlockIq1S, ib: usize, l: usize) -> usize {
    b.qs[4 * ib + l] as usize | ((((b.qh(ib) >> (3 * l)) & 7) as usize) << 8)
}

pub fn dequantize_iq1_s(x: &[BlockIq1S], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let qh = b.qh(ib);
            let dl = d * (2 * ((qh >> 12) & 7) as i32 + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                for (o, g) in y8.iter_mut().zip(grid(iq1_s_index(b, ib, l))) {
                    *o = dl * (g as f32 + delta);
                }
            }
        }
    }
}

/// `ggml_vec_dot_iq1_s_q8_K_generic`.
pub fn vec_dot_iq1_s(w: &[BlockIq1S], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            let qh = a.qh(ib);
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                lsum += dot8(iq1_s_index(a, ib, l), &b.qs[32 * ib + 8 * l..]);
            }
            sumi += ls * lsum;
            sumi1 += ls * delta * (b.bsum(2 * ib) as i32 + b.bsum(2 * ib + 1) as i32);
        }
        sumf += a.d() * b.d() * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

/// IQ1_M grid index of 8-element group `l` (0..4) of 32-element group `ib`.
#[inline(always)]
pub fn iq1_m_index(b: &BlockIq1M, ib: usize, l: usize) -> usize {
    let qh = b.qh[2 * ib + l / 2] as usize;
    b.qs[4 * ib + l] as usize | ((qh << (8 - 4 * (l % 2))) & 0x700)
}

/// Whether the shift of IQ1_M group `l` of `ib` is negative.
#[inline(always)]
pub fn iq1_m_negative(b: &BlockIq1M, ib: usize, l: usize) -> bool {
    b.qh[2 * ib + l / 2] & (0x08 << (4 * (l % 2))) != 0
}

/// The two odd scales (for weights 0..16 and 16..32) of IQ1_M group `ib`.
#[inline(always)]
pub fn iq1_m_scales(b: &BlockIq1M, ib: usize) -> [i32; 2] {
    let sc = b.sc(ib / 2);
    let sh = 6 * (ib % 2);
    [
        2 * ((sc >> sh) & 7) as i32 + 1,
        2 * ((sc >> (sh + 3)) & 7) as i32 + 1,
    ]
}

pub fn dequantize_iq1_m(x: &[BlockIq1M], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let ls = iq1_m_scales(b, ib);
            let dl = [d * ls[0] as f32, d * ls[1] as f32];
            for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
                let delta = if iq1_m_negative(b, ib, l) {
                    -IQ1_DELTA
                } else {
                    IQ1_DELTA
                };
                for (o, g) in y8.iter_mut().zip(grid(iq1_m_index(b, ib, l))) {
                    *o = dl[l / 2] * (g as f32 + delta);
                }
            }
        }
    }
}

/// `ggml_vec_dot_iq1_m_q8_K_generic`.
pub fn vec_dot_iq1_m(w: &[BlockIq1M], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let q8 = &b.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                let lsum2: i32 = q8.iter().map(|&v| v as i32).sum();
                let delta = if iq1_m_negative(a, ib, l) { -1 } else { 1 };
                sum1[l / 2] += dot8(iq1_m_index(a, ib, l), q8);
                sum2[l / 2] += lsum2 * delta;
            }
            let ls = iq1_m_scales(a, ib);
            sumi1 += sum1[0] * ls[0] + sum1[1] * ls[1];
            sumi2 += sum2[0] * ls[0] + sum2[1] * ls[1];
        }
        sumf += a.d() * b.d() * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}
