//! The public, bit-exact scalar reference: ggml's reference quantizers (`quantize_row_*_ref`),
//! its dequantizers and its generic (non-SIMD) dot products, per type, transcribed so that every
//! integer and float operation happens as in ggml's C (no FMA, same order). SIMD tiers must match
//! these functions bit for bit; tests compare them with golden vectors produced by ggml.
//!
//! Row-level entry points take byte slices and validate lengths; the per-type modules work on
//! typed block slices (`crate::formats`) and are public so that SIMD tiers can reuse pieces
//! (unpacking, the float epilogue) and tests can call them directly.

pub mod float;
pub mod fp4;
pub mod iq1;
pub mod iq2;
pub mod iq3;
pub mod iq4;
pub mod legacy;
pub mod lowbit;
pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q6_k;
pub mod q8_k;
pub mod search;
pub mod ternary;

use crate::formats::{blocks, blocks_mut};
use crate::{GgmlType, KernelError, Tile};

fn check_bytes(what: &'static str, expected: usize, found: usize) -> Result<(), KernelError> {
    if expected != found {
        return Err(KernelError::Length {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// Any type -> f32. `src.len()` must be `ty.row_bytes(dst.len())`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    check_bytes("dequantize source row", ty.row_bytes(dst.len())?, src.len())?;
    match ty {
        GgmlType::F32 => float::dequantize_f32(src, dst),
        GgmlType::F16 => float::dequantize_f16(src, dst),
        GgmlType::BF16 => float::dequantize_bf16(src, dst),
        GgmlType::Q4_0 => legacy::dequantize_q4_0(blocks(src)?, dst),
        GgmlType::Q4_1 => legacy::dequantize_q4_1(blocks(src)?, dst),
        GgmlType::Q5_0 => legacy::dequantize_q5_0(blocks(src)?, dst),
        GgmlType::Q5_1 => legacy::dequantize_q5_1(blocks(src)?, dst),
        GgmlType::Q8_0 => legacy::dequantize_q8_0(blocks(src)?, dst),
        GgmlType::Q8_1 => legacy::dequantize_q8_1(blocks(src)?, dst),
        GgmlType::Q2_K => q2_k::dequantize(blocks(src)?, dst),
        GgmlType::Q3_K => q3_k::dequantize(blocks(src)?, dst),
        GgmlType::Q4_K => q4_k::dequantize_q4_k(blocks(src)?, dst),
        GgmlType::Q5_K => q4_k::dequantize_q5_k(blocks(src)?, dst),
        GgmlType::Q6_K => q6_k::dequantize(blocks(src)?, dst),
        GgmlType::Q8_K => q8_k::dequantize(blocks(src)?, dst),
        GgmlType::IQ2_XXS => iq2::dequantize_iq2_xxs(blocks(src)?, dst),
        GgmlType::IQ2_XS => iq2::dequantize_iq2_xs(blocks(src)?, dst),
        GgmlType::IQ2_S => iq2::dequantize_iq2_s(blocks(src)?, dst),
        GgmlType::IQ3_XXS => iq3::dequantize_iq3_xxs(blocks(src)?, dst),
        GgmlType::IQ3_S => iq3::dequantize_iq3_s(blocks(src)?, dst),
        GgmlType::IQ1_S => iq1::dequantize_iq1_s(blocks(src)?, dst),
        GgmlType::IQ1_M => iq1::dequantize_iq1_m(blocks(src)?, dst),
        GgmlType::IQ4_NL => iq4::dequantize_iq4_nl(blocks(src)?, dst),
        GgmlType::IQ4_XS => iq4::dequantize_iq4_xs(blocks(src)?, dst),
        GgmlType::TQ1_0 => ternary::dequantize_tq1_0(blocks(src)?, dst),
        GgmlType::TQ2_0 => ternary::dequantize_tq2_0(blocks(src)?, dst),
        GgmlType::MXFP4 => fp4::dequantize_mxfp4(blocks(src)?, dst),
        GgmlType::NVFP4 => fp4::dequantize_nvfp4(blocks(src)?, dst),
        GgmlType::Q1_0 => lowbit::dequantize_q1_0(blocks(src)?, dst),
        GgmlType::Q2_0 => lowbit::dequantize_q2_0(blocks(src)?, dst),
    }
    Ok(())
}

/// f32 -> `ty` exactly as ggml's reference quantizers (no importance matrix).
/// `dst.len()` must be `ty.row_bytes(src.len())`. The i-quants and ternary types have no
/// quantizer here ([`GgmlType::has_quantizer`]): an `Unsupported` error.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_bytes(
        "quantize destination row",
        ty.row_bytes(src.len())?,
        dst.len(),
    )?;
    match ty {
        GgmlType::F32 => float::quantize_f32(src, dst),
        GgmlType::F16 => float::quantize_f16(src, dst),
        GgmlType::BF16 => float::quantize_bf16(src, dst),
        GgmlType::Q4_0 => legacy::quantize_q4_0(src, blocks_mut(dst)?),
        GgmlType::Q4_1 => legacy::quantize_q4_1(src, blocks_mut(dst)?),
        GgmlType::Q5_0 => legacy::quantize_q5_0(src, blocks_mut(dst)?),
        GgmlType::Q5_1 => legacy::quantize_q5_1(src, blocks_mut(dst)?),
        GgmlType::Q8_0 => legacy::quantize_q8_0(src, blocks_mut(dst)?),
        GgmlType::Q8_1 => legacy::quantize_q8_1(src, blocks_mut(dst)?),
        GgmlType::Q2_K => q2_k::quantize(src, blocks_mut(dst)?),
        GgmlType::Q3_K => q3_k::quantize(src, blocks_mut(dst)?),
        GgmlType::Q4_K => q4_k::quantize_q4_k(src, blocks_mut(dst)?),
        GgmlType::Q5_K => q4_k::quantize_q5_k(src, blocks_mut(dst)?),
        GgmlType::Q6_K => q6_k::quantize(src, blocks_mut(dst)?),
        GgmlType::Q8_K => q8_k::quantize(src, blocks_mut(dst)?),
        GgmlType::MXFP4 => fp4::quantize_mxfp4(src, blocks_mut(dst)?),
        GgmlType::NVFP4 => fp4::quantize_nvfp4(src, blocks_mut(dst)?),
        GgmlType::Q1_0 => lowbit::quantize_q1_0(src, blocks_mut(dst)?),
        GgmlType::Q2_0 => lowbit::quantize_q2_0(src, blocks_mut(dst)?),
        _ => {
            return Err(KernelError::Unsupported {
                op: "quantize",
                ty: ty.name(),
            })
        }
    }
    Ok(())
}

/// One dot product of a weight row (`ty`) with an activation row (`ty.vec_dot_type()`) of `k`
/// elements, as ggml's generic `ggml_vec_dot_*`.
pub fn vec_dot(ty: GgmlType, k: usize, w_row: &[u8], x_row: &[u8]) -> Result<f32, KernelError> {
    if !ty.has_vec_dot() {
        return Err(KernelError::Unsupported {
            op: "vec_dot",
            ty: ty.name(),
        });
    }
    check_bytes("vec_dot weight row", ty.row_bytes(k)?, w_row.len())?;
    check_bytes(
        "vec_dot activation row",
        ty.vec_dot_type().row_bytes(k)?,
        x_row.len(),
    )?;
    dot_row(ty, w_row, x_row)
}

/// [`vec_dot`] without the length checks against `k` (rows must already have matching lengths;
/// a ragged row is still an error, never a panic).
#[inline]
pub(crate) fn dot_row(ty: GgmlType, w: &[u8], x: &[u8]) -> Result<f32, KernelError> {
    Ok(match ty {
        GgmlType::F32 => float::vec_dot_f32(w, x),
        GgmlType::F16 => float::vec_dot_f16(w, x),
        GgmlType::BF16 => float::vec_dot_bf16(w, x),
        GgmlType::Q4_0 => legacy::vec_dot_q4_0(blocks(w)?, blocks(x)?),
        GgmlType::Q4_1 => legacy::vec_dot_q4_1(blocks(w)?, blocks(x)?),
        GgmlType::Q5_0 => legacy::vec_dot_q5_0(blocks(w)?, blocks(x)?),
        GgmlType::Q5_1 => legacy::vec_dot_q5_1(blocks(w)?, blocks(x)?),
        GgmlType::Q8_0 => legacy::vec_dot_q8_0(blocks(w)?, blocks(x)?),
        GgmlType::Q2_K => q2_k::vec_dot(blocks(w)?, blocks(x)?),
        GgmlType::Q3_K => q3_k::vec_dot(blocks(w)?, blocks(x)?),
        GgmlType::Q4_K => q4_k::vec_dot_q4_k(blocks(w)?, blocks(x)?),
        GgmlType::Q5_K => q4_k::vec_dot_q5_k(blocks(w)?, blocks(x)?),
        GgmlType::Q6_K => q6_k::vec_dot(blocks(w)?, blocks(x)?),
        GgmlType::IQ2_XXS => iq2::vec_dot_iq2_xxs(blocks(w)?, blocks(x)?),
        GgmlType::IQ2_XS => iq2::vec_dot_iq2_xs(blocks(w)?, blocks(x)?),
        GgmlType::IQ2_S => iq2::vec_dot_iq2_s(blocks(w)?, blocks(x)?),
        GgmlType::IQ3_XXS => iq3::vec_dot_iq3_xxs(blocks(w)?, blocks(x)?),
        GgmlType::IQ3_S => iq3::vec_dot_iq3_s(blocks(w)?, blocks(x)?),
        GgmlType::IQ1_S => iq1::vec_dot_iq1_s(blocks(w)?, blocks(x)?),
        GgmlType::IQ1_M => iq1::vec_dot_iq1_m(blocks(w)?, blocks(x)?),
        GgmlType::IQ4_NL => iq4::vec_dot_iq4_nl(blocks(w)?, blocks(x)?),
        GgmlType::IQ4_XS => iq4::vec_dot_iq4_xs(blocks(w)?, blocks(x)?),
        GgmlType::TQ1_0 => ternary::vec_dot_tq1_0(blocks(w)?, blocks(x)?),
        GgmlType::TQ2_0 => ternary::vec_dot_tq2_0(blocks(w)?, blocks(x)?),
        GgmlType::MXFP4 => fp4::vec_dot_mxfp4(blocks(w)?, blocks(x)?),
        GgmlType::NVFP4 => fp4::vec_dot_nvfp4(blocks(w)?, blocks(x)?),
        GgmlType::Q1_0 => lowbit::vec_dot_q1_0(blocks(w)?, blocks(x)?),
        GgmlType::Q2_0 => lowbit::vec_dot_q2_0(blocks(w)?, blocks(x)?),
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            return Err(KernelError::Unsupported {
                op: "vec_dot",
                ty: ty.name(),
            })
        }
    })
}

/// Scalar tile: `out[r * n + j] = W[r] . x[j]` over `tile` (the same contract as the SIMD
/// tiers' `gemm_block`).
pub fn gemm_block(tile: &mut Tile<'_>) -> Result<(), KernelError> {
    if tile.w().layout() != crate::formats::repack::Layout::Gguf {
        // Repacked weights (`formats::repack`): the same blocks back in file order.
        let w = tile.w();
        let mut gguf = vec![0u8; w.bytes().len()];
        let w = crate::formats::repack::to_gguf(&w, &mut gguf)?;
        let x = tile.x();
        return gemm_block(&mut Tile::new(w, x, tile.out())?);
    }
    let float_tile = match tile.ty() {
        GgmlType::F32 => Some(float::gemm_f32 as fn(&mut Tile<'_>)),
        GgmlType::F16 => Some(float::gemm_f16 as _),
        GgmlType::BF16 => Some(float::gemm_bf16 as _),
        _ => None,
    };
    if let Some(run) = float_tile {
        run(tile);
        return Ok(());
    }
    let (ty, n) = (tile.ty(), tile.n());
    let (wm, xm) = (tile.w(), tile.x());
    let (w, x, wb, xb) = (wm.bytes(), xm.bytes(), wm.row_bytes(), xm.row_bytes());
    let out = tile.out();
    if wb == 0 || xb == 0 {
        out.fill(0.0);
        return Ok(());
    }
    for (w_row, o) in w.chunks_exact(wb).zip(out.chunks_exact_mut(n.max(1))) {
        for (x_row, dst) in x.chunks_exact(xb).zip(o.iter_mut()) {
            *dst = dot_row(ty, w_row, x_row)?;
        }
    }
    Ok(())
}
