//! The i-quant and ternary GEMM path of the aarch64 tiers. Weight units are decoded to signed
//! bytes by the shared `arch::iq_tile` (which also holds the loops and the float epilogues);
//! this file has the integer cores that give the sixteen 16-element group sums: NEON widens
//! with SMULL (a product of a weight, |w| <= 127, and an activation, |x| <= 128, fits in int16)
//! and pairwise-adds to int32; dotprod and i8mm use SDOT (four products per int32 lane). The
//! i8mm tier has no SMMLA path for these types yet: SMMLA needs two decoded weight rows (or a
//! 2x2 tile), and it runs the SDOT core.

use core::arch::aarch64::*;

use super::dotprod::sdot;
use super::Level;
use crate::arch::iq_tile::{self, act_chunk_offset, Sums};
use crate::formats::QK_K;
use crate::GgmlType;

/// Loads the 16 weights of group `g` and the matching activations of the unit at `xu`.
///
/// # Safety
/// `xu` must be valid for one activation unit of type `act`.
#[inline(always)]
unsafe fn load(w: &[i8; QK_K], xu: *const u8, act: GgmlType, g: usize) -> (int8x16_t, int8x16_t) {
    let at = act_chunk_offset(act, g / 2) + 16 * (g % 2);
    // SAFETY: `w[16g..16g + 16]` is in bounds (g < 16); the caller guarantees `xu` covers the
    // unit, whose chunk `g / 2` spans 32 bytes from `act_chunk_offset`.
    unsafe {
        (
            vld1q_s8(w.as_ptr().add(16 * g)),
            vld1q_s8(xu.add(at).cast::<i8>()),
        )
    }
}

struct NeonSums;

impl Sums for NeonSums {
    #[inline(always)]
    unsafe fn sums(&self, w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16] {
        let mut s = [0i32; 16];
        for (g, sg) in s.iter_mut().enumerate() {
            // SAFETY: forwarded from the caller (valid unit); NEON is baseline on aarch64.
            unsafe {
                let (wv, xv) = load(w, xu, act, g);
                let lo = vmull_s8(vget_low_s8(wv), vget_low_s8(xv));
                let hi = vmull_high_s8(wv, xv);
                *sg = vaddvq_s32(vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
            }
        }
        s
    }
}

struct SdotSums;

impl Sums for SdotSums {
    #[inline(always)]
    unsafe fn sums(&self, w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16] {
        let mut s = [0i32; 16];
        for (g, sg) in s.iter_mut().enumerate() {
            // SAFETY: forwarded from the caller: a valid unit, and a CPU with SDOT.
            unsafe {
                let (wv, xv) = load(w, xu, act, g);
                *sg = vaddvq_s32(sdot(vdupq_n_s32(0), wv, xv));
            }
        }
        s
    }
}

/// The i-quant and ternary types' path on `level`; false for any other type (or unusable
/// lengths).
///
/// # Safety
/// The CPU must have `level`'s features (the caller holds its capability).
pub(super) unsafe fn gemm(
    level: Level,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    // SAFETY: `level`'s capability exists: NEON always, SDOT for Dotprod and I8mm.
    unsafe {
        match level {
            Level::Neon => iq_tile::gemm(&NeonSums, ty, k, w, rows, x, n, out),
            Level::Dotprod | Level::I8mm => iq_tile::gemm(&SdotSums, ty, k, w, rows, x, n, out),
        }
    }
}
