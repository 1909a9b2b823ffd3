//! Scalar reference for the 32-element family (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1): ggml's
//! `quantize_row_*_ref`, `dequantize_row_*` and `ggml_vec_dot_*_generic`, with the same float
//! operations in the same order (no FMA), so results are bit-identical to ggml's.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]

use crate::formats::{
    f32_to_f16, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK,
};

// ---------------------------------------------------------------- quantize

/// Absolute maximum and the signed value that has it (first one wins on ties).
#[inline]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub fn quantize_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (_, max) = signed_absmax(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d).to_le_bytes();
        for j in 0..QK / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK / 2 + j] * id;
            let q0 = ((x0 + 8.5) as i8 as i32).min(15) as u8;
            let q1 = ((x1 + 8.5) as i8 as i32).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn quantize_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d).to_le_bytes();
        b.m = f32_to_f16(min).to_le_bytes();
        for j in 0..QK / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK / 2 + j] - min) * id;
            let q0 = ((x0 + 0.5) as i8 as i32).min(15) as u8;
            let q1 = ((x1 + 0.5) as i8 as i32).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn quantize_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (_, max) = signed_absmax(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d).to_le_bytes();
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK / 2 + j] * id;
            let q0 = ((x0 + 16.5) as i8 as i32).min(31) as u8;
            let q1 = ((x1 + 16.5) as i8 as i32).min(31) as u8;
            b.qs[j] = (q0 & 0xf) | ((q1 & 0xf) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

pub fn quantize_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d).to_le_bytes();
        b.m = f32_to_f16(min).to_le_bytes();
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK / 2 + j] - min) * id;
            let q0 = (x0 + 0.5) as u8;
            let q1 = (x1 + 0.5) as u8;
            b.qs[j] = (q0 & 0xf) | ((q1 & 0xf) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// Scale `amax / 127` and its inverse, as the Q8_0/Q8_1 reference quantizers compute them.
#[inline]
fn q8_scale(xb: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    for &v in xb {
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

#[inline]
pub fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (d, id) = q8_scale(xb);
        b.d = f32_to_f16(d).to_le_bytes();
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

pub fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, b) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (d, id) = q8_scale(xb);
        b.d = f32_to_f16(d).to_le_bytes();
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.s = f32_to_f16(sum as f32 * d).to_le_bytes();
    }
}

// ---------------------------------------------------------------- dequantize

pub fn dequantize_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = b.d();
        for j in 0..QK / 2 {
            yb[j] = ((b.qs[j] & 0xf) as i32 - 8) as f32 * d;
            yb[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub fn dequantize_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (b.d(), b.m());
        for j in 0..QK / 2 {
            yb[j] = (b.qs[j] & 0xf) as f32 * d + m;
            yb[j + QK / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block element pair `(j, j + 16)`, without offset.
#[inline(always)]
fn q5_pair(qs: u8, qh: u32, j: usize) -> (i32, i32) {
    let h0 = ((qh >> j) << 4) & 0x10;
    let h1 = (qh >> (j + 12)) & 0x10;
    (
        ((qs & 0xf) as u32 | h0) as i32,
        ((qs >> 4) as u32 | h1) as i32,
    )
}

pub fn dequantize_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, qh) = (b.d(), b.qh());
        for j in 0..QK / 2 {
            let (x0, x1) = q5_pair(b.qs[j], qh, j);
            yb[j] = (x0 - 16) as f32 * d;
            yb[j + QK / 2] = (x1 - 16) as f32 * d;
        }
    }
}

pub fn dequantize_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m, qh) = (b.d(), b.m(), b.qh());
        for j in 0..QK / 2 {
            let (x0, x1) = q5_pair(b.qs[j], qh, j);
            yb[j] = x0 as f32 * d + m;
            yb[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

#[inline]
pub fn dequantize_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = b.d();
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

pub fn dequantize_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = b.d();
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

// ---------------------------------------------------------------- dot products

/// `sum(lo[j] * xq[j]) + sum(hi[j] * xq[j + 16])` over j in 0..16: the integer part of a
/// 32-element block dot, with the weight quants given as the low and high halves.
#[inline(always)]
fn isum(lo: &[i32; QK / 2], hi: &[i32; QK / 2], xq: &[i8; QK]) -> i32 {
    let mut s0 = 0i32;
    let mut s1 = 0i32;
    for j in 0..QK / 2 {
        s0 += lo[j] * xq[j] as i32;
        s1 += hi[j] * xq[j + QK / 2] as i32;
    }
    s0 + s1
}

/// The two nibbles of every byte of `qs`, minus `offset`.
#[inline(always)]
fn nibbles(qs: &[u8; QK / 2], offset: i32) -> ([i32; QK / 2], [i32; QK / 2]) {
    let mut lo = [0i32; QK / 2];
    let mut hi = [0i32; QK / 2];
    for j in 0..QK / 2 {
        lo[j] = (qs[j] & 0xf) as i32 - offset;
        hi[j] = (qs[j] >> 4) as i32 - offset;
    }
    (lo, hi)
}

/// The 5-bit quants of a Q5_0/Q5_1 block, minus `offset`, as low and high halves.
#[inline(always)]
fn fives(qs: &[u8; QK / 2], qh: u32, offset: i32) -> ([i32; QK / 2], [i32; QK / 2]) {
    let mut lo = [0i32; QK / 2];
    let mut hi = [0i32; QK / 2];
    for j in 0..QK / 2 {
        let (a, b) = q5_pair(qs[j], qh, j);
        lo[j] = a - offset;
        hi[j] = b - offset;
    }
    (lo, hi)
}

/// `ggml_vec_dot_q4_0_q8_0_generic`.
pub fn vec_dot_q4_0(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (lo, hi) = nibbles(&a.qs, 8);
        let sumi = isum(&lo, &hi, &b.qs);
        sumf += sumi as f32 * a.d() * b.d();
    }
    sumf
}

/// `ggml_vec_dot_q4_1_q8_1_generic`.
pub fn vec_dot_q4_1(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (lo, hi) = nibbles(&a.qs, 0);
        let sumi = isum(&lo, &hi, &b.qs);
        sumf += (a.d() * b.d()) * sumi as f32 + a.m() * b.s();
    }
    sumf
}

/// `ggml_vec_dot_q5_0_q8_0_generic`.
pub fn vec_dot_q5_0(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (lo, hi) = fives(&a.qs, a.qh(), 16);
        let sumi = isum(&lo, &hi, &b.qs);
        sumf += (a.d() * b.d()) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1_generic`.
pub fn vec_dot_q5_1(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (lo, hi) = fives(&a.qs, a.qh(), 0);
        let sumi = isum(&lo, &hi, &b.qs);
        sumf += (a.d() * b.d()) * sumi as f32 + a.m() * b.s();
    }
    sumf
}

/// `ggml_vec_dot_q8_0_q8_0_generic`.
#[inline]
pub fn vec_dot_q8_0(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for (&p, &q) in a.qs.iter().zip(&b.qs) {
            sumi += p as i32 * q as i32;
        }
        sumf += sumi as f32 * (a.d() * b.d());
    }
    sumf
}
