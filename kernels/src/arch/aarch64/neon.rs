//! NEON integer cores (widening SMULL/SMLAL, no dot-product instructions). They are also the
//! cores of the other tiers for the lane-split types, where SDOT/SMMLA cannot keep the lanes
//! apart (see the module docs of `arch::aarch64`).
//!
//! Range argument for the int16 intermediates: a product of a weight quant (|q| <= 32) and an
//! activation quant (|x| <= 128) is at most 4096 in magnitude, so the sum of the two products
//! of one lane within a group of 16 fits in int16 (the scale is applied after widening to
//! int32). Q8_0 x Q8_0 products (up to 16384) are widened after every single product.

use core::arch::aarch64::*;

/// 1.5 * 2^23: the float whose bits plus an integer `i` with `|i| < 2^22` are the bits of
/// `MAGIC + i` (the addition stays inside the mantissa), so `f32::from_bits(MAGIC_BITS + i) -
/// MAGIC` is `i as f32` exactly. Starting the SMMLA accumulator at `MAGIC_BITS` turns the
/// integer-to-float conversion (SCVTF: two cycles on Neoverse N2's V0 pipe only) into one
/// subtraction on either pipe. Every block's `sumi` is far inside the range: 32 products of at
/// most 128 * 128 in magnitude (Q8_0) make at most 2^19, a Q4_K lane (32 products of at most
/// 945 * 128) less than 3.9 * 2^20.
pub(crate) const MAGIC: f32 = 12_582_912.0;
pub(crate) const MAGIC_BITS: i32 = 0x4B40_0000;

/// `i as f32` for the lanes of `acc = MAGIC_BITS + i` (|i| < 2^22), exactly.
#[inline(always)]
pub(crate) fn from_magic(acc: int32x4_t) -> float32x4_t {
    // SAFETY: NEON register arithmetic only.
    unsafe { vsubq_f32(vreinterpretq_f32_s32(acc), vdupq_n_f32(MAGIC)) }
}

/// Loads 16 signed bytes at `p[at..at + 16]`.
/// `[sum of a[0]'s lanes, .. of a[1]'s, .. of a[2]'s, .. of a[3]'s]`: two rounds of pairwise
/// adds (ADDP), not an across-vector ADDV and a register move per vector. Integer sums: any
/// order gives the same values.
#[inline(always)]
pub(crate) fn sum4(a: [int32x4_t; 4]) -> int32x4_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3])) }
}

/// The values of the low and the high nibbles of `q`'s 16 bytes, each through one 16-entry
/// `TBL` of `values` (IQ4_NL's, IQ4_XS's and MXFP4's codes).
#[inline(always)]
pub(crate) fn nibble_values(values: &[i8; 16], q: uint8x16_t) -> (int8x16_t, int8x16_t) {
    // SAFETY: `values` is 16 readable bytes; the rest is NEON register arithmetic.
    unsafe {
        let t = vld1q_s8(values.as_ptr());
        (
            vqtbl1q_s8(t, vandq_u8(q, vdupq_n_u8(15))),
            vqtbl1q_s8(t, vshrq_n_u8::<4>(q)),
        )
    }
}

#[inline(always)]
pub(crate) fn ld_s8(p: &[u8], at: usize) -> int8x16_t {
    let s = &p[at..at + 16];
    // SAFETY: `s` is 16 readable bytes (bounds-checked); no alignment requirement.
    unsafe { vld1q_s8(s.as_ptr().cast::<i8>()) }
}

/// Loads 16 signed bytes at `q[at..at + 16]`.
#[inline(always)]
pub(crate) fn ld_q(q: &[i8; 256], at: usize) -> int8x16_t {
    let s = &q[at..at + 16];
    // SAFETY: `s` is 16 readable bytes (bounds-checked); no alignment requirement.
    unsafe { vld1q_s8(s.as_ptr()) }
}

/// Loads 8 little-endian i16 at `p[at..at + 16]`.
#[inline(always)]
pub(crate) fn ld_s16(p: &[u8], at: usize) -> int16x8_t {
    let s = &p[at..at + 16];
    // SAFETY: `s` is 16 readable bytes (bounds-checked); aarch64 Linux is little-endian, so
    // the lanes are the little-endian i16 values; no alignment requirement.
    unsafe { vld1q_s16(s.as_ptr().cast::<i16>()) }
}

/// Loads 8 i16 at `v[at..at + 8]`.
#[inline(always)]
pub(crate) fn ld_i16(v: &[i16; 16], at: usize) -> int16x8_t {
    let s = &v[at..at + 8];
    // SAFETY: `s` is 8 readable i16 (bounds-checked).
    unsafe { vld1q_s16(s.as_ptr()) }
}

/// The eight reference lanes of one K-quant block: lane l (0..4 in the first vector, 4..8 in
/// the second) = sum over groups g of `scales[g] * sum(q[e] * x[e])` over the elements e of
/// group g with `e % 8 == l`. `xq` holds the 256 activation quants.
#[inline(always)]
pub(crate) fn split16(q: &[i8; 256], xq: &[u8], scales: &[i16; 16]) -> (int32x4_t, int32x4_t) {
    let xq = &xq[..256];
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        // The scales stay in two vectors and are applied by element (no general-register ->
        // vector moves); even and odd groups accumulate separately (shorter chains).
        let sv = [ld_i16(scales, 0), ld_i16(scales, 8)];
        let mut lo = [vdupq_n_s32(0); 2];
        let mut hi = [vdupq_n_s32(0); 2];
        macro_rules! group {
            ($g:literal) => {{
                let w = ld_q(q, 16 * $g);
                let x = ld_s8(xq, 16 * $g);
                let p = vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(x)), w, x);
                let s = sv[$g / 8];
                lo[$g % 2] = vmlal_laneq_s16::<{ $g % 8 }>(lo[$g % 2], vget_low_s16(p), s);
                hi[$g % 2] = vmlal_high_laneq_s16::<{ $g % 8 }>(hi[$g % 2], p, s);
            }};
        }
        group!(0);
        group!(1);
        group!(2);
        group!(3);
        group!(4);
        group!(5);
        group!(6);
        group!(7);
        group!(8);
        group!(9);
        group!(10);
        group!(11);
        group!(12);
        group!(13);
        group!(14);
        group!(15);
        (vaddq_s32(lo[0], lo[1]), vaddq_s32(hi[0], hi[1]))
    }
}

/// One integer for the whole block: sum over groups of `scales[g] * sum(q[e] * x[e])` (Q2_K).
#[inline(always)]
pub(crate) fn total16(q: &[i8; 256], xq: &[u8], scales: &[i16; 16]) -> i32 {
    let (lo, hi) = split16(q, xq, scales);
    // SAFETY: NEON register arithmetic only.
    unsafe { vaddvq_s32(vaddq_s32(lo, hi)) }
}

/// `sum(bsums[g] * mins[g])` over the 16 groups; `bsums` are the 32 little-endian bytes of a
/// Q8_K block's sums.
#[inline(always)]
pub(crate) fn min_corr(bsums: &[u8], mins: &[i16; 16]) -> i32 {
    let b0 = ld_s16(bsums, 0);
    let b1 = ld_s16(bsums, 16);
    let m0 = ld_i16(mins, 0);
    let m1 = ld_i16(mins, 8);
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let mut acc = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
        acc = vmlal_high_s16(acc, b0, m0);
        acc = vmlal_s16(acc, vget_low_s16(b1), vget_low_s16(m1));
        acc = vmlal_high_s16(acc, b1, m1);
        vaddvq_s32(acc)
    }
}

/// Integer dot of 32 weight quants with 32 activation quants (one Q8_0 block pair).
#[inline(always)]
pub(crate) fn dot32(wq: &[u8], xq: &[u8]) -> i32 {
    let (w0, w1) = (ld_s8(wq, 0), ld_s8(wq, 16));
    let (x0, x1) = (ld_s8(xq, 0), ld_s8(xq, 16));
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
        acc = vpadalq_s16(acc, vmull_high_s8(w0, x0));
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
        acc = vpadalq_s16(acc, vmull_high_s8(w1, x1));
        vaddvq_s32(acc)
    }
}
