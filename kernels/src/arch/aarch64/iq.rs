//! The i-quant, ternary, FP4 and Q1_0/Q2_0 GEMM path of the aarch64 tiers. On the SDOT tiers
//! (dotprod, and i8mm, which runs the same code) IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ1_S, IQ1_M
//! and IQ4_XS take `iq_decode`'s fused path (decode straight into SDOT operands, scales as
//! vectors). Every other type, and all of them on NEON, have their weight units decoded to
//! signed bytes by the shared `arch::iq_tile` (which also holds the loops and the float
//! epilogues; IQ2_XXS/IQ2_XS/IQ3_XXS by `iq_decode`'s NEON decoders), and this file has
//! the integer cores that give the sixteen 16-element group sums: NEON widens with SMULL (a
//! product of a weight, |w| <= 127, and an activation, |x| <= 128, fits in int16) and
//! pairwise-adds to int32; dotprod uses SDOT (four products per int32 lane), four groups'
//! lanes reduced together by pairwise adds. i8mm has no SMMLA path here: its 2x2 tile (two
//! weight rows x two activation rows, the lanes per pair rather than per group, each cell its
//! own float epilogue) cost more than SDOT on the Neoverse N2 model for every type whose
//! decode is cheap (`benches/arm`'s method, batch 4, cycles per 256 weights, SMMLA vs SDOT:
//! IQ4_NL 65 vs 60, MXFP4 81 vs 59, TQ2_0 52 vs 38; IQ4_NL and MXFP4 have since left this
//! path on dotprod and i8mm for `legacy_mm`'s tiles and `legacy_dot`'s quads), and for IQ2_XS
//! and IQ2_S, the two it
//! still served (N2 batch 1 / 4: 187 / 108 and 185 / 109), the fused SDOT path takes
//! 74 / 44 and 83 / 46.

use core::arch::aarch64::*;

use super::dotprod::sdot;
use super::iq_decode;
use super::Level;
use crate::arch::iq_tile::{self, act_chunk_offset, Sums};
use crate::formats::QK_K;
use crate::{GgmlType, Tile};

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

/// The four int32 lanes of each of `a` (groups `g .. g + 4`) summed, `[sum a0, sum a1, sum a2,
/// sum a3]`, stored at `s[g..g + 4]`: two rounds of pairwise adds (ADDP) instead of one
/// across-vector ADDV and a move to a general register per group. Integer sums: any order
/// gives the same values.
#[inline(always)]
fn store4(s: &mut [i32; 16], g: usize, a: [int32x4_t; 4]) {
    let dst = &mut s[g..g + 4];
    // SAFETY: NEON is baseline on aarch64; `dst` is 4 bounds-checked int32s.
    unsafe {
        vst1q_s32(dst.as_mut_ptr(), super::neon::sum4(a));
    }
}

/// Both nibbles of 16 bytes through one `TBL` of `table` each (every aarch64 tier).
#[inline(always)]
fn nl_tbl(table: &[i8; 16], qs: &[u8], out: &mut [i8; QK_K], at: usize) {
    let (qs, dst) = (&qs[..16], &mut out[at..at + 32]);
    // SAFETY: NEON is baseline on aarch64; `qs` and `dst` are bounds-checked 16 and 32 bytes.
    unsafe {
        let (lo, hi) = super::neon::nibble_values(table, vld1q_u8(qs.as_ptr()));
        vst1q_s8(dst.as_mut_ptr(), lo);
        vst1q_s8(dst.as_mut_ptr().add(16), hi);
    }
}

struct NeonSums;

impl Sums for NeonSums {
    #[inline(always)]
    fn nl_values(&self, table: &[i8; 16], qs: &[u8], out: &mut [i8; QK_K], at: usize) {
        nl_tbl(table, qs, out, at);
    }

    #[inline(always)]
    unsafe fn sums(&self, w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16] {
        let mut s = [0i32; 16];
        for g0 in (0..16).step_by(4) {
            // SAFETY: forwarded from the caller (valid unit); NEON is baseline on aarch64.
            let a = core::array::from_fn(|i| unsafe {
                let (wv, xv) = load(w, xu, act, g0 + i);
                let lo = vmull_s8(vget_low_s8(wv), vget_low_s8(xv));
                let hi = vmull_high_s8(wv, xv);
                vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi))
            });
            store4(&mut s, g0, a);
        }
        s
    }
}

struct SdotSums;

impl Sums for SdotSums {
    #[inline(always)]
    fn nl_values(&self, table: &[i8; 16], qs: &[u8], out: &mut [i8; QK_K], at: usize) {
        nl_tbl(table, qs, out, at);
    }

    #[inline(always)]
    unsafe fn sums(&self, w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16] {
        let mut s = [0i32; 16];
        for g0 in (0..16).step_by(4) {
            // SAFETY: forwarded from the caller: a valid unit, and a CPU with SDOT.
            let a = core::array::from_fn(|i| unsafe {
                let (wv, xv) = load(w, xu, act, g0 + i);
                sdot(vdupq_n_s32(0), wv, xv)
            });
            store4(&mut s, g0, a);
        }
        s
    }
}

/// The i-quant and ternary types' path on `level`; false for any other type (or unusable
/// lengths).
///
/// # Safety
/// The CPU must have `level`'s features (the caller holds its capability).
pub(super) unsafe fn gemm(level: Level, t: &mut Tile<'_>) -> bool {
    // SAFETY: `level`'s capability exists: NEON always, SDOT for Dotprod and I8mm.
    unsafe {
        match level {
            Level::Neon => run(&NeonSums, t),
            Level::Dotprod | Level::I8mm => {
                iq_decode::gemm_sdot(t).unwrap_or_else(|| run(&SdotSums, t))
            }
        }
    }
}

/// `core` on the NEON decoders of `iq_decode` where it has one for the type, else on the
/// portable decoders of `iq_tile`.
///
/// # Safety
/// The CPU must have whatever `core` requires.
#[inline(always)]
unsafe fn run<S: Sums>(core: &S, t: &mut Tile<'_>) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match iq_decode::gemm(core, t) {
            Some(done) => done,
            None => iq_tile::gemm(core, t),
        }
    }
}
