//! Scalar F32, F16 and BF16 rows: conversions and ggml's generic (non-SIMD) dot products
//! `ggml_vec_dot_f32/f16/bf16`, which multiply in f32 and accumulate in f64 (`ggml_float`).
//! Rows are little-endian byte slices, so any alignment works.
//!
//! Each (weight row, activation row) sum is one sequential f64 chain, exactly as the generic C
//! loop. The GEMM tile runs four weight rows in lockstep so that four independent chains hide
//! the add latency — each chain keeps its own order, so the bits do not change. f16 values are
//! converted through a 64K-entry table, as ggml's `ggml_table_f32_f16`.

use std::sync::OnceLock;

use crate::formats::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::Tile;

/// f16 bits -> f32 for every pattern, built once.
fn f16_table() -> &'static [f32; 65536] {
    static TABLE: OnceLock<Box<[f32; 65536]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 65536]);
        for (h, v) in t.iter_mut().enumerate() {
            *v = f16_to_f32(h as u16);
        }
        t
    })
}

/// Element `i` of a little-endian row of the given float type.
#[inline(always)]
fn load_f32(row: &[u8], i: usize) -> f32 {
    let b = &row[4 * i..4 * i + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[inline(always)]
fn load_u16(row: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([row[2 * i], row[2 * i + 1]])
}

/// `R` generic dot products of weight rows `w[t]` with one activation row, each an f64 chain in
/// element order.
#[inline(always)]
fn dot_chains<const R: usize>(
    load: impl Fn(&[u8], usize) -> f32,
    w: [&[u8]; R],
    x: &[u8],
    k: usize,
) -> [f32; R] {
    let mut acc = [0f64; R];
    for i in 0..k {
        let xv = load(x, i);
        for t in 0..R {
            acc[t] += (load(w[t], i) * xv) as f64;
        }
    }
    acc.map(|a| a as f32)
}

/// `out[r * n + j] = W[r] . x[j]` over a tile of F32, F16 or BF16 rows (weights and
/// activations of the same type; `load(row, i)` reads element `i`).
pub fn gemm_tile(tile: &mut Tile<'_>, load: impl Fn(&[u8], usize) -> f32 + Copy) {
    let (k, rows, n) = (tile.k(), tile.rows(), tile.n());
    let (w, x, rb) = (tile.w().bytes(), tile.x().bytes(), tile.w().row_bytes());
    let out = tile.out();
    if rb == 0 {
        out.fill(0.0);
        return;
    }
    let mut r = 0;
    while r + 4 <= rows {
        let wr = [0, 1, 2, 3].map(|t| &w[(r + t) * rb..(r + t + 1) * rb]);
        for (j, xr) in x.chunks_exact(rb).take(n).enumerate() {
            let d = dot_chains(load, wr, xr, k);
            for t in 0..4 {
                out[(r + t) * n + j] = d[t];
            }
        }
        r += 4;
    }
    while r < rows {
        let wr = [&w[r * rb..(r + 1) * rb]];
        for (j, xr) in x.chunks_exact(rb).take(n).enumerate() {
            out[r * n + j] = dot_chains(load, wr, xr, k)[0];
        }
        r += 1;
    }
}

/// [`gemm_tile`] for F32 rows.
pub fn gemm_f32(tile: &mut Tile<'_>) {
    gemm_tile(tile, load_f32);
}

/// [`gemm_tile`] for F16 rows.
pub fn gemm_f16(tile: &mut Tile<'_>) {
    let t = f16_table();
    gemm_tile(tile, |row: &[u8], i| t[load_u16(row, i) as usize]);
}

/// [`gemm_tile`] for BF16 rows.
pub fn gemm_bf16(tile: &mut Tile<'_>) {
    gemm_tile(tile, |row: &[u8], i| bf16_to_f32(load_u16(row, i)));
}

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
    let t = f16_table();
    for (o, h) in y.iter_mut().zip(u16s(x)) {
        *o = t[h as usize];
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
    let t = f16_table();
    let mut sum = 0.0f64;
    for (a, b) in u16s(w).zip(u16s(x)) {
        sum += (t[a as usize] * t[b as usize]) as f64;
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
