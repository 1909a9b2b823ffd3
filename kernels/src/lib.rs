//! nightshift-kernels: ggml's block formats, exact scalar reference kernels, and SIMD tiers
//! (AVX2, AVX-512-VNNI, NEON, dotprod, i8mm) that reproduce the scalar path bit for bit.
//!
//! Everything above this crate (model, expert nodes, benches) only sees [`GgmlType`], the
//! row-level functions and [`gemm`]; which SIMD tier runs is decided once in [`dispatch`].
//! The scalar reference ([`scalar`]) reproduces ggml's reference quantizers and generic dot
//! products bit for bit (checked against golden vectors made by ggml in `tests/`).

pub mod arch;
pub mod attn;
pub mod dispatch;
mod error;
pub mod formats;
mod matrix;
pub mod packed_f32;
pub mod rng;
pub mod scalar;

pub use error::KernelError;
pub use formats::GgmlType;
pub use matrix::{QMatrix, Tile};
pub use packed_f32::PackedF32;

/// Any type -> f32 (F32, F16, BF16, every quant). `src.len()` must be `ty.row_bytes(dst.len())`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    scalar::dequantize_row(ty, src, dst)
}

/// f32 -> `ty`, exactly as ggml's `*_ref` quantizers: activation types Q8_K, Q8_0, Q8_1, F16,
/// BF16, F32 and weight types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K … Q6_K (no importance matrix).
/// `dst.len()` must be `ty.row_bytes(src.len())`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    scalar::quantize_row(ty, src, dst)
}

/// One dot product of a weight row (`ty`) with an activation row (`ty.vec_dot_type()`) of `k`
/// elements; bit-identical to ggml's generic `ggml_vec_dot_*`.
pub fn vec_dot(ty: GgmlType, k: usize, w_row: &[u8], x_row: &[u8]) -> Result<f32, KernelError> {
    scalar::vec_dot(ty, k, w_row, x_row)
}

/// `out[j * m + i] = W[i] . x[j]` for the `m` rows of `w` and `n` activation rows `x` (of
/// `w.ty().vec_dot_type()`, `w.cols()` elements each, contiguous). Splits weight rows over `pool`
/// (`None` = current thread). Uses [`dispatch::active_tier`]; bit-identical to the scalar
/// reference whatever the tier, pool or split.
pub fn gemm(
    w: QMatrix<'_>,
    x: &[u8],
    n: usize,
    out: &mut [f32],
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), KernelError> {
    let tier = dispatch::configured_tier()?;
    dispatch::gemm_with(tier, w, x, n, out, pool)
}
