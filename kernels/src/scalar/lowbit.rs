//! Scalar reference for the scale-and-bits types Q1_0 (128 elements, `±d`) and Q2_0 (64
//! elements, `d * {-1, 0, 1, 2}`): ggml's `quantize_row_q1_0_ref`, `quantize_row_q2_0_ref`,
//! `dequantize_row_q1_0`, `dequantize_row_q2_0`, `ggml_vec_dot_q1_0_q8_0_generic` and
//! `ggml_vec_dot_q2_0_q8_0_generic`, bit for bit. Both dot products span several Q8_0 blocks per
//! weight block: per Q8_0 block an integer sum scaled by the activation scale and added to a
//! float sum of the weight block (in block order), which the weight scale then multiplies.

use crate::formats::{f32_to_f16, BlockQ1_0, BlockQ2_0, BlockQ8_0, QK, QK1_0, QK2_0};

pub fn quantize_q1_0(x: &[f32], y: &mut [BlockQ1_0]) {
    for (xb, b) in x.chunks_exact(QK1_0).zip(y.iter_mut()) {
        let mut sum_abs = 0.0f32;
        for &v in xb {
            sum_abs += v.abs();
        }
        b.d = f32_to_f16(sum_abs / QK1_0 as f32).to_le_bytes();
        b.qs = [0; QK1_0 / 8];
        for (j, &v) in xb.iter().enumerate() {
            if v >= 0.0 {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

pub fn quantize_q2_0(x: &[f32], y: &mut [BlockQ2_0]) {
    for (xb, b) in x.chunks_exact(QK2_0).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
            }
        }
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        b.d = f32_to_f16(amax).to_le_bytes();
        b.qs = [0; QK2_0 / 4];
        for (j, &v) in xb.iter().enumerate() {
            let q = ((v * id).round() as i32 + 1).clamp(0, 3);
            b.qs[j / 4] |= (q as u8) << (2 * (j % 4));
        }
    }
}

pub fn dequantize_q1_0(x: &[BlockQ1_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK1_0)) {
        let d = b.d();
        for (j, v) in yb.iter_mut().enumerate() {
            *v = if b.bit(j) != 0 { d } else { -d };
        }
    }
}

pub fn dequantize_q2_0(x: &[BlockQ2_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK2_0)) {
        let d = b.d();
        for (j, v) in yb.iter_mut().enumerate() {
            *v = (b.code(j) as i32 - 1) as f32 * d;
        }
    }
}

/// The weight block's float sum: `sum over its Q8_0 blocks of d8 * sumi`, in block order, from
/// the integer sums `sumi` (one per Q8_0 block).
#[inline(always)]
pub fn block_sum(x: &[BlockQ8_0], sumi: impl Iterator<Item = i32>) -> f32 {
    let mut s = 0.0f32;
    for (yb, si) in x.iter().zip(sumi) {
        s += yb.d() * si as f32;
    }
    s
}

/// `ggml_vec_dot_q1_0_q8_0_generic`: four Q8_0 blocks per Q1_0 block.
pub fn vec_dot_q1_0(w: &[BlockQ1_0], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, y) in w.iter().zip(x.chunks_exact(QK1_0 / QK)) {
        let sumi = y.iter().enumerate().map(|(k, yb)| {
            let mut s = 0i32;
            for (i, &q) in yb.qs.iter().enumerate() {
                let q = q as i32;
                s += if a.bit(QK * k + i) != 0 { q } else { -q };
            }
            s
        });
        sumf += a.d() * block_sum(y, sumi);
    }
    sumf
}

/// `ggml_vec_dot_q2_0_q8_0_generic`: two Q8_0 blocks per Q2_0 block.
pub fn vec_dot_q2_0(w: &[BlockQ2_0], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, y) in w.iter().zip(x.chunks_exact(QK2_0 / QK)) {
        let sumi = y.iter().enumerate().map(|(k, yb)| {
            let mut s = 0i32;
            for (i, &q) in yb.qs.iter().enumerate() {
                s += (a.code(QK * k + i) as i32 - 1) * q as i32;
            }
            s
        });
        sumf += a.d() * block_sum(y, sumi);
    }
    sumf
}
