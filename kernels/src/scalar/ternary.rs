//! Scalar reference for ggml's ternary types TQ1_0 and TQ2_0: `dequantize_row_tq*_0` and
//! `ggml_vec_dot_tq*_0_q8_K_generic`, bit for bit. Weights are `d * (t - 1)` with `t` in
//! {0, 1, 2}: TQ2_0 stores `t` in 2 bits, TQ1_0 packs five base-3 digits per byte as a fraction
//! of 243 (digit `n` is the top of `(q * 3^n) * 3` in 8 bits) and four per byte of `qh`.

use crate::formats::{BlockQ8_K, BlockTq1_0, BlockTq2_0, QK_K};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Base-3 digit `n` of a TQ1_0 byte, as `t - 1` in {-1, 0, 1}.
#[inline(always)]
pub fn tq1_digit(q: u8, n: usize) -> i32 {
    let q = q.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i32 - 1
}

/// The 256 ternary values (`t - 1`) of a TQ1_0 block in element order.
pub fn tq1_values(b: &BlockTq1_0) -> [i8; QK_K] {
    let mut out = [0i8; QK_K];
    let mut o = 0;
    // 32 bytes x 5 digits, then 16 bytes x 5 digits, then qh's 4 bytes x 4 digits.
    for (start, len) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for &q in &b.qs[start..start + len] {
                out[o] = tq1_digit(q, n) as i8;
                o += 1;
            }
        }
    }
    for n in 0..4 {
        for &q in &b.qh {
            out[o] = tq1_digit(q, n) as i8;
            o += 1;
        }
    }
    out
}

/// The 256 ternary values (`t - 1`) of a TQ2_0 block in element order.
pub fn tq2_values(b: &BlockTq2_0) -> [i8; QK_K] {
    let mut out = [0i8; QK_K];
    for (j, qs) in b.qs.chunks_exact(32).enumerate() {
        for l in 0..4 {
            for (m, &q) in qs.iter().enumerate() {
                out[128 * j + 32 * l + m] = ((q >> (2 * l)) & 3) as i8 - 1;
            }
        }
    }
    out
}

pub fn dequantize_tq1_0(x: &[BlockTq1_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, t) in yb.iter_mut().zip(tq1_values(b)) {
            *o = t as f32 * d;
        }
    }
}

pub fn dequantize_tq2_0(x: &[BlockTq2_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, t) in yb.iter_mut().zip(tq2_values(b)) {
            *o = t as f32 * d;
        }
    }
}

fn idot(t: &[i8; QK_K], q8: &[i8; QK_K]) -> i32 {
    t.iter().zip(q8).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// `ggml_vec_dot_tq1_0_q8_K_generic`.
pub fn vec_dot_tq1_0(w: &[BlockTq1_0], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let sum = idot(&tq1_values(a), &b.qs);
        sumf += sum as f32 * (a.d() * b.d());
    }
    sumf
}

/// `ggml_vec_dot_tq2_0_q8_K_generic`.
pub fn vec_dot_tq2_0(w: &[BlockTq2_0], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let sumi = idot(&tq2_values(a), &b.qs);
        sumf += sumi as f32 * (b.d() * a.d());
    }
    sumf
}
