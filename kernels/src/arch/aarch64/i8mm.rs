//! i8mm (SMMLA) integer cores on 2x2 tiles: two weight rows times two activation rows. SMMLA
//! multiplies a 2x8 int8 tile by an 8x2 one: with `A = [row0 bytes 0..8 | row1 bytes 0..8]` and
//! `B = [col0 bytes 0..8 | col1 bytes 0..8]` it adds `[r0.c0, r0.c1, r1.c0, r1.c1]` to an int32x4.
//! Results of the cores are in that lane order. Scales and min corrections stay in vector
//! registers in the same order. `vmmlaq_s32` is unstable in Rust, so the instruction is emitted
//! with stable `asm!`; callers hold an `I8mm` capability.

use core::arch::aarch64::*;
use core::arch::asm;

use super::neon::{ld_i16, ld_q, ld_s16, ld_s8};

/// `acc += A (2x8) * B^T (8x2)`, lanes `[a0.b0, a0.b1, a1.b0, a1.b1]`.
///
/// # Safety
/// The CPU must implement FEAT_I8MM (the caller holds an `I8mm` capability).
#[inline(always)]
pub(crate) unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction; the caller guarantees the CPU has SMMLA.
    unsafe {
        asm!(
            ".arch_extension i8mm",
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `[a.lo64 | b.lo64]` and `[a.hi64 | b.hi64]`: two 8-byte k-slices of two rows.
#[inline(always)]
fn pair(a: int8x16_t, b: int8x16_t) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON register reinterpretations and zips only.
    unsafe {
        let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
        (
            vreinterpretq_s8_s64(vzip1q_s64(a, b)),
            vreinterpretq_s8_s64(vzip2q_s64(a, b)),
        )
    }
}

/// `[a, a, b, b]`.
#[inline(always)]
fn row_lanes(a: i32, b: i32) -> int32x4_t {
    // SAFETY: NEON register arithmetic only.
    unsafe { vcombine_s32(vdup_n_s32(a), vdup_n_s32(b)) }
}

/// Two unpacked weight rows as SMMLA `A` operands: for each 16-byte chunk c of the quants,
/// `[r0 c[0..8] | r1 c[0..8]]` at `32c` and `[r0 c[8..16] | r1 c[8..16]]` at `32c + 16`. Built
/// once per pair of weight blocks and reused for every activation row.
#[repr(C, align(16))]
pub(crate) struct PairA {
    a: [i8; 512],
}

impl PairA {
    pub(crate) fn new() -> PairA {
        PairA { a: [0; 512] }
    }

    /// Interleaves the quants of two unpacked weight blocks.
    pub(crate) fn set(&mut self, q0: &[i8; 256], q1: &[i8; 256]) {
        for c in 0..16 {
            let (lo, hi) = pair(ld_q(q0, 16 * c), ld_q(q1, 16 * c));
            let d = &mut self.a[32 * c..32 * c + 32];
            // SAFETY: `d` is 32 writable bytes (bounds-checked above).
            unsafe {
                vst1q_s8(d.as_mut_ptr(), lo);
                vst1q_s8(d.as_mut_ptr().add(16), hi);
            }
        }
    }

    #[inline(always)]
    fn ld(&self, at: usize) -> int8x16_t {
        let s = &self.a[at..at + 16];
        // SAFETY: `s` is 16 readable bytes (bounds-checked).
        unsafe { vld1q_s8(s.as_ptr()) }
    }
}

/// `neon::total16` for the tile (two weight rows as a [`PairA`]) x (x0, x1).
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn total16_2x2(a: &PairA, xq: [&[u8]; 2], scales: [&[i16; 16]; 2]) -> int32x4_t {
    let (x0, x1) = (&xq[0][..256], &xq[1][..256]);
    // SAFETY: the caller guarantees SMMLA; the rest is NEON register arithmetic.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut acc = vdupq_n_s32(0);
        for g in 0..16 {
            let (a0, a1) = (a.ld(32 * g), a.ld(32 * g + 16));
            let (b0, b1) = pair(ld_s8(x0, 16 * g), ld_s8(x1, 16 * g));
            let t = smmla(smmla(zero, a0, b0), a1, b1);
            let s = row_lanes(i32::from(scales[0][g]), i32::from(scales[1][g]));
            acc = vmlaq_s32(acc, t, s);
        }
        acc
    }
}

/// `neon::min_corr` for the tile: `bsums` are the two activation rows' 32 sum bytes, `mins`
/// the two weight rows' mins.
#[inline(always)]
pub(crate) fn min_corr_2x2(bsums: [&[u8]; 2], mins: [&[i16; 16]; 2]) -> int32x4_t {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let one = |b: &[u8], m: &[i16; 16]| {
            let (b0, b1) = (ld_s16(b, 0), ld_s16(b, 16));
            let (m0, m1) = (ld_i16(m, 0), ld_i16(m, 8));
            let mut acc = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
            acc = vmlal_high_s16(acc, b0, m0);
            acc = vmlal_s16(acc, vget_low_s16(b1), vget_low_s16(m1));
            vmlal_high_s16(acc, b1, m1)
        };
        let r0 = vpaddq_s32(one(bsums[0], mins[0]), one(bsums[1], mins[0]));
        let r1 = vpaddq_s32(one(bsums[0], mins[1]), one(bsums[1], mins[1]));
        vpaddq_s32(r0, r1)
    }
}

/// `neon::dot32` for the tile: two Q8_0 weight blocks' quants times two activation blocks'.
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn dot32_2x2(wq: [&[u8]; 2], xq: [&[u8]; 2]) -> int32x4_t {
    // SAFETY: the caller guarantees SMMLA; the rest is NEON register arithmetic.
    unsafe {
        let (a0, a1) = pair(ld_s8(wq[0], 0), ld_s8(wq[1], 0));
        let (a2, a3) = pair(ld_s8(wq[0], 16), ld_s8(wq[1], 16));
        let (b0, b1) = pair(ld_s8(xq[0], 0), ld_s8(xq[1], 0));
        let (b2, b3) = pair(ld_s8(xq[0], 16), ld_s8(xq[1], 16));
        let mut acc = smmla(vdupq_n_s32(0), a0, b0);
        acc = smmla(acc, a1, b1);
        acc = smmla(acc, a2, b2);
        smmla(acc, a3, b3)
    }
}

/// Two Q4_K/Q5_K weight rows (quants in `unpack::PERM32` order, as a [`PairA`]) against one activation block
/// prepared by `split::mask32_block` (per group of 32 and 8-byte slice s, `B = [slice with only lane
/// 2s kept | slice with only lane 2s + 1 kept]`). SMMLA then yields `[r0 lane 2s, r0 lane
/// 2s+1, r1 lane 2s, r1 lane 2s+1]` per slice; the scales of both rows ride along in one vector.
/// Returns the eight reference lanes of row 0 (lo, hi) and of row 1 (lo, hi).
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn split32_2x1(
    a: &PairA,
    bprep: &[u8],
    scales: [&[i16; 16]; 2],
) -> [int32x4_t; 4] {
    let bprep = &bprep[..512];
    // SAFETY: the caller guarantees SMMLA; the rest is NEON register arithmetic.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut acc = [vdupq_n_s32(0); 4];
        for g in 0..8 {
            let (a0, a1) = (a.ld(64 * g), a.ld(64 * g + 16));
            let (a2, a3) = (a.ld(64 * g + 32), a.ld(64 * g + 48));
            let s = row_lanes(i32::from(scales[0][2 * g]), i32::from(scales[1][2 * g]));
            let at = 64 * g;
            acc[0] = vmlaq_s32(acc[0], smmla(zero, a0, ld_s8(bprep, at)), s);
            acc[1] = vmlaq_s32(acc[1], smmla(zero, a1, ld_s8(bprep, at + 16)), s);
            acc[2] = vmlaq_s32(acc[2], smmla(zero, a2, ld_s8(bprep, at + 32)), s);
            acc[3] = vmlaq_s32(acc[3], smmla(zero, a3, ld_s8(bprep, at + 48)), s);
        }
        regroup(acc)
    }
}

/// Two Q3_K/Q6_K weight rows (quants in `unpack::PERM16` order, as a [`PairA`]) against one activation block
/// prepared by `split::mask16_block` (per group of 16: four operands, operand m keeping lane 2m
/// in its low half and lane 2m + 1 in its high half). Each SMMLA yields `[r0 lane 2m, r0 lane
/// 2m+1, r1 lane 2m, r1 lane 2m+1]`. Returns the eight reference lanes of row 0 (lo, hi) and of
/// row 1 (lo, hi).
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn split16_2x1(
    a: &PairA,
    bprep: &[u8],
    scales: [&[i16; 16]; 2],
) -> [int32x4_t; 4] {
    let bprep = &bprep[..1024];
    // SAFETY: the caller guarantees SMMLA; the rest is NEON register arithmetic.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut acc = [vdupq_n_s32(0); 4];
        for g in 0..16 {
            let (a0, a1) = (a.ld(32 * g), a.ld(32 * g + 16));
            let s = row_lanes(i32::from(scales[0][g]), i32::from(scales[1][g]));
            let at = 64 * g;
            acc[0] = vmlaq_s32(acc[0], smmla(zero, a0, ld_s8(bprep, at)), s);
            acc[1] = vmlaq_s32(acc[1], smmla(zero, a0, ld_s8(bprep, at + 16)), s);
            acc[2] = vmlaq_s32(acc[2], smmla(zero, a1, ld_s8(bprep, at + 32)), s);
            acc[3] = vmlaq_s32(acc[3], smmla(zero, a1, ld_s8(bprep, at + 48)), s);
        }
        regroup(acc)
    }
}

/// `acc[m] = [r0 lane 2m, r0 lane 2m+1, r1 lane 2m, r1 lane 2m+1]` -> row 0 lanes 0..4,
/// row 0 lanes 4..8, row 1 lanes 0..4, row 1 lanes 4..8.
#[inline(always)]
fn regroup(acc: [int32x4_t; 4]) -> [int32x4_t; 4] {
    // SAFETY: NEON register reinterpretations and zips only.
    unsafe {
        let lo = |a: int32x4_t, b: int32x4_t| {
            vreinterpretq_s32_s64(vzip1q_s64(
                vreinterpretq_s64_s32(a),
                vreinterpretq_s64_s32(b),
            ))
        };
        let hi = |a: int32x4_t, b: int32x4_t| {
            vreinterpretq_s32_s64(vzip2q_s64(
                vreinterpretq_s64_s32(a),
                vreinterpretq_s64_s32(b),
            ))
        };
        [
            lo(acc[0], acc[1]),
            lo(acc[2], acc[3]),
            hi(acc[0], acc[1]),
            hi(acc[2], acc[3]),
        ]
    }
}
