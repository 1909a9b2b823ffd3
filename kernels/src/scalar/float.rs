//! Scalar F32, F16 and BF16 rows: conversions and ggml's generic (non-SIMD) dot products
//! `ggml_vec_dot_f32/f16/bf16`, which multiply in f32 and accumulate in f64 (`ggml_float`).
//! Rows are little-endian byte slices, so any alignment works.

use crate::formats::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

#[inline(always)]
fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

#[inline(always)]
fn u16s(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

pub fn quantize_f32(x: &[f32], y: &mut [u8]) {
    for (o, &v) in y.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn quantize_f16(x: &[f32], y: &mut [u8]) {
    for (o, &v) in y.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
    }
}

pub fn quantize_bf16(x: &[f32], y: &mut [u8]) {
    for (o, &v) in y.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

pub fn dequantize_f32(x: &[u8], y: &mut [f32]) {
    for (o, v) in y.iter_mut().zip(f32s(x)) {
        *o = v;
    }
}

pub fn dequantize_f16(x: &[u8], y: &mut [f32]) {
    for (o, h) in y.iter_mut().zip(u16s(x)) {
        *o = f16_to_f32(h);
    }
}

pub fn dequantize_bf16(x: &[u8], y: &mut [f32]) {
    for (o, h) in y.iter_mut().zip(u16s(x)) {
        *o = bf16_to_f32(h);
    }
}

/// `ggml_vec_dot_f32` (generic): f32 products summed in f64.
pub fn vec_dot_f32(w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in f32s(w).zip(f32s(x)) {
        sum += (a * b) as f64;
    }
    sum as f32
}

/// `ggml_vec_dot_f16` (generic): both rows f16, f32 products summed in f64.
pub fn vec_dot_f16(w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in u16s(w).zip(u16s(x)) {
        sum += (f16_to_f32(a) * f16_to_f32(b)) as f64;
    }
    sum as f32
}

/// `ggml_vec_dot_bf16` (generic): both rows bf16, f32 products summed in f64.
pub fn vec_dot_bf16(w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in u16s(w).zip(u16s(x)) {
        sum += (bf16_to_f32(a) * bf16_to_f32(b)) as f64;
    }
    sum as f32
}
