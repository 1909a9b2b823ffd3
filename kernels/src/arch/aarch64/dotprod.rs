//! dotprod (SDOT) integer cores. SDOT sums four adjacent int8 products into one int32 lane,
//! which is exact for the types whose reference keeps a single integer per block or group
//! (Q2_K's block total with the scales folded into the weights, Q8_0's block sum). `vdotq_s32` is unstable in Rust, so the
//! instruction is emitted with stable `asm!`; callers hold a `Dotprod` (or `I8mm`) capability.

use crate::formats::kquants::layout::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use crate::formats::BlockQ2_K;
use core::arch::aarch64::*;
use core::arch::asm;
use core::mem::size_of;

use super::neon::{ld_i16, ld_q, ld_s16, ld_s8};

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

/// `c += SDOT(a, b)`, then `acc += c * ds[L]` (by element): one step of a cumulative SDOT
/// chain whose partial sums are scaled as they go. One asm statement, so the chain's register
/// is updated in place (no copy kept for the multiply).
///
/// # Safety
/// The CPU must implement FEAT_DotProd (the caller holds a `Dotprod` or `I8mm` capability).
#[inline(always)]
pub(crate) unsafe fn sdot_mla<const L: usize>(
    c: &mut int32x4_t,
    acc: &mut int32x4_t,
    a: int8x16_t,
    b: int8x16_t,
    ds: int32x4_t,
) {
    // SAFETY: register-only instructions; the caller guarantees the CPU has SDOT.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {c:v}.4s, {a:v}.16b, {b:v}.16b",
            "mla {acc:v}.4s, {c:v}.4s, {ds:v}.s[{l}]",
            c = inout(vreg) *c,
            acc = inout(vreg) *acc,
            a = in(vreg) a,
            b = in(vreg) b,
            ds = in(vreg) ds,
            l = const L,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
}

/// `sum(q[e] * x[e])` over a block of 256 (Q2_K with scales folded in, see
/// `unpack::q2_k_scaled`): four independent SDOT chains, so the sum is not latency-bound.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn dot256(q: &[i8; 256], xq: &[u8]) -> i32 {
    let xq = &xq[..256];
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic.
    unsafe {
        let mut acc = [vdupq_n_s32(0); 4];
        for c in 0..16 {
            acc[c % 4] = sdot(acc[c % 4], ld_q(q, 16 * c), ld_s8(xq, 16 * c));
        }
        vaddvq_s32(vaddq_s32(
            vaddq_s32(acc[0], acc[1]),
            vaddq_s32(acc[2], acc[3]),
        ))
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
        // The eight per-32 scales as int32 lanes, applied with by-element multiplies (no
        // general-register -> vector moves).
        let e = vuzp1q_s16(ld_i16(scales, 0), ld_i16(scales, 8));
        let (s_lo, s_hi) = (vmovl_s16(vget_low_s16(e)), vmovl_high_s16(e));
        let zero = vdupq_n_s32(0);
        // Two accumulator pairs (even and odd groups) halve the multiply-add chains.
        let mut lo = [vdupq_n_s32(0); 2];
        let mut hi = [vdupq_n_s32(0); 2];
        macro_rules! group {
            ($g:literal, $s:ident, $l:literal) => {{
                let a = sdot(zero, ld_q(q, 32 * $g), ld_s8(xp, 32 * $g));
                let b = sdot(zero, ld_q(q, 32 * $g + 16), ld_s8(xp, 32 * $g + 16));
                lo[$g % 2] = vmlaq_laneq_s32::<$l>(lo[$g % 2], a, $s);
                hi[$g % 2] = vmlaq_laneq_s32::<$l>(hi[$g % 2], b, $s);
            }};
        }
        group!(0, s_lo, 0);
        group!(1, s_lo, 1);
        group!(2, s_lo, 2);
        group!(3, s_lo, 3);
        group!(4, s_hi, 0);
        group!(5, s_hi, 1);
        group!(6, s_hi, 2);
        group!(7, s_hi, 3);
        (vaddq_s32(lo[0], lo[1]), vaddq_s32(hi[0], hi[1]))
    }
}

/// The eight reference lanes of one Q3_K block from its lane-grouped form
/// (`unpack::q3_k_lanes`, quants times the negated group scale) and the activations in the same
/// layout: chunk c's SDOT lanes hold lanes `2(c % 4)` (twice) and `2(c % 4) + 1` (twice), so
/// four accumulators and two pairwise adds give lanes 0..4 and 4..8, negated back.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn lanes8(q: &[i8; 256], xl: &[u8]) -> (int32x4_t, int32x4_t) {
    let xl = &xl[..256];
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic.
    unsafe {
        let mut acc = [vdupq_n_s32(0); 4];
        for c in 0..16 {
            acc[c % 4] = sdot(acc[c % 4], ld_q(q, 16 * c), ld_s8(xl, 16 * c));
        }
        (
            vnegq_s32(vpaddq_s32(acc[0], acc[1])),
            vnegq_s32(vpaddq_s32(acc[2], acc[3])),
        )
    }
}

/// One Q2_K block against one Q8_K block straight from the packed bytes (`wb`: 84 bytes, `xb`:
/// the 292-byte activation block), for a single activation row, where an unpacked block would
/// not be reused: returns the reference's `(isum, summs)`. Per group g, one SDOT of the 2-bit
/// quants with the activations; pairwise adds gather the 16 group sums into four vectors, which
/// meet the scales (widened from the low nibbles) in four multiplies; the mins (high nibbles)
/// meet the activation block's `bsums`. All integer, exact in any order.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn q2_k_block(wb: &[u8], xb: &[u8]) -> (i32, i32) {
    let (wb, xb) = (&wb[..size_of::<BlockQ2_K>()], &xb[..Q8K_BYTES]);
    let xq = &xb[Q8K_QS..Q8K_BSUMS];
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic on loads
    // bounds-checked by `ld_s8`/`ld_s16`.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let zero = vdupq_n_s32(0);
        let u = |at: usize| vreinterpretq_u8_s8(ld_s8(wb, at));
        let sm = u(0);
        let mut p = [zero; 16];
        for k in 0..2 {
            let (lo, hi) = (u(16 + 32 * k), u(32 + 32 * k));
            let q = [
                vandq_u8(lo, m3),
                vandq_u8(hi, m3),
                vandq_u8(vshrq_n_u8::<2>(lo), m3),
                vandq_u8(vshrq_n_u8::<2>(hi), m3),
                vandq_u8(vshrq_n_u8::<4>(lo), m3),
                vandq_u8(vshrq_n_u8::<4>(hi), m3),
                vshrq_n_u8::<6>(lo),
                vshrq_n_u8::<6>(hi),
            ];
            for (i, q) in q.into_iter().enumerate() {
                let g = 8 * k + i;
                p[g] = sdot(zero, vreinterpretq_s8_u8(q), ld_s8(xq, 16 * g));
            }
        }
        let gsum = |a: usize| super::neon::sum4([p[a], p[a + 1], p[a + 2], p[a + 3]]);
        let sc = vandq_u8(sm, vdupq_n_u8(15));
        let (s0, s1) = (vmovl_u8(vget_low_u8(sc)), vmovl_high_u8(sc));
        let w = |v: uint16x8_t, hi: bool| {
            vreinterpretq_s32_u32(if hi {
                vmovl_high_u16(v)
            } else {
                vmovl_u16(vget_low_u16(v))
            })
        };
        let mut t = vmulq_s32(gsum(0), w(s0, false));
        t = vmlaq_s32(t, gsum(4), w(s0, true));
        t = vmlaq_s32(t, gsum(8), w(s1, false));
        t = vmlaq_s32(t, gsum(12), w(s1, true));
        let mins = vshrq_n_u8::<4>(sm);
        let m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
        let m1 = vreinterpretq_s16_u16(vmovl_high_u8(mins));
        let (b0, b1) = (ld_s16(xb, Q8K_BSUMS), ld_s16(xb, Q8K_BSUMS + 16));
        let mut m = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
        m = vmlal_high_s16(m, b0, m0);
        m = vmlal_s16(m, vget_low_s16(b1), vget_low_s16(m1));
        m = vmlal_high_s16(m, b1, m1);
        (vaddvq_s32(t), vaddvq_s32(m))
    }
}

/// The eight reference lanes of one Q4_K block from its folded two-stream form
/// (`unpack::q4_k_perm_folded`: `q` carries `scale >> 3`, `q2` carries `scale & 7`) and the
/// activations in `unpack::PERM32` order: 32 SDOTs with no per-group step, then `8 * hi + lo`.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn folded32(q: &[i8; 256], q2: &[i8; 256], xp: &[u8]) -> (int32x4_t, int32x4_t) {
    let xp = &xp[..256];
    // SAFETY: the caller guarantees SDOT; the rest is NEON register arithmetic.
    unsafe {
        // [stream][lanes 0..4 / 4..8]: chunk c holds lanes 0..4 for even c, 4..8 for odd c.
        let mut acc = [[vdupq_n_s32(0); 2]; 2];
        for c in 0..16 {
            let x = ld_s8(xp, 16 * c);
            acc[0][c % 2] = sdot(acc[0][c % 2], ld_q(q, 16 * c), x);
            acc[1][c % 2] = sdot(acc[1][c % 2], ld_q(q2, 16 * c), x);
        }
        (
            vaddq_s32(vshlq_n_s32::<3>(acc[0][0]), acc[1][0]),
            vaddq_s32(vshlq_n_s32::<3>(acc[0][1]), acc[1][1]),
        )
    }
}
