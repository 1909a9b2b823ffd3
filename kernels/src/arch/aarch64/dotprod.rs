//! dotprod (SDOT) integer cores. SDOT sums four adjacent int8 products into one int32 lane,
//! which is exact for the types whose reference keeps a single integer per block or group
//! (Q2_K's scaled group sums, Q8_0's block sum). `vdotq_s32` is unstable in Rust, so the
//! instruction is emitted with stable `asm!`; callers hold a `Dotprod` (or `I8mm`) capability.

use core::arch::aarch64::*;
use core::arch::asm;

use super::neon::{ld_q, ld_s8};

/// `acc[i] += a[4i..4i+4] . b[4i..4i+4]` (signed bytes).
///
/// # Safety
/// The CPU must implement FEAT_DotProd (the caller holds a `Dotprod` or `I8mm` capability).
#[inline(always)]
pub(crate) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction; the caller guarantees the CPU has SDOT.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// Same result as `neon::total16`, with SDOT.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn total16(q: &[i8; 256], xq: &[u8], scales: &[i16; 16]) -> i32 {
    let xq = &xq[..256];
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut acc0 = vdupq_n_s32(0);
        let mut acc1 = vdupq_n_s32(0);
        for g in (0..16).step_by(2) {
            let t0 = sdot(zero, ld_q(q, 16 * g), ld_s8(xq, 16 * g));
            let t1 = sdot(zero, ld_q(q, 16 * g + 16), ld_s8(xq, 16 * g + 16));
            acc0 = vmlaq_n_s32(acc0, t0, i32::from(scales[g]));
            acc1 = vmlaq_n_s32(acc1, t1, i32::from(scales[g + 1]));
        }
        vaddvq_s32(vaddq_s32(acc0, acc1))
    }
}

/// Same result as `neon::dot32`, with SDOT.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn dot32(wq: &[u8], xq: &[u8]) -> i32 {
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic.
    unsafe {
        let acc = sdot(vdupq_n_s32(0), ld_s8(wq, 0), ld_s8(xq, 0));
        vaddvq_s32(sdot(acc, ld_s8(wq, 16), ld_s8(xq, 16)))
    }
}

/// The eight reference lanes of one Q4_K block with SDOT: `q` and `xp` hold the weight and
/// activation quants in `unpack::PERM32` order, so each SDOT lane sums exactly the four
/// products of one reference lane within a group of 32; `scales` are per 16 (pairs equal).
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn split32_perm(
    q: &[i8; 256],
    xp: &[u8],
    scales: &[i16; 16],
) -> (int32x4_t, int32x4_t) {
    let xp = &xp[..256];
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut lo = vdupq_n_s32(0);
        let mut hi = vdupq_n_s32(0);
        for g in 0..8 {
            let s = i32::from(scales[2 * g]);
            let a = sdot(zero, ld_q(q, 32 * g), ld_s8(xp, 32 * g));
            let b = sdot(zero, ld_q(q, 32 * g + 16), ld_s8(xp, 32 * g + 16));
            lo = vmlaq_n_s32(lo, a, s);
            hi = vmlaq_n_s32(hi, b, s);
        }
        (lo, hi)
    }
}
