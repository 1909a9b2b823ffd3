//! i8mm (SMMLA) integer cores on 2x2 tiles: two weight rows times two activation rows. SMMLA
//! multiplies a 2x8 int8 tile by an 8x2 one: with `A = [row0 bytes 0..8 | row1 bytes 0..8]` and
//! `B = [col0 bytes 0..8 | col1 bytes 0..8]` it adds `[r0.c0, r0.c1, r1.c0, r1.c1]` to an int32x4.
//! Results of the cores are in that lane order, as are the min corrections. `vmmlaq_s32` is
//! unstable in Rust, so the instruction is emitted with stable `asm!`; callers hold an `I8mm`
//! capability.

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

/// [`smmla`] with `a` read as unsigned bytes (USMMLA, also FEAT_I8MM): `acc += A (2x8, u8) *
/// B^T (8x2, i8)`, same lane order.
///
/// # Safety
/// The CPU must implement FEAT_I8MM (the caller holds an `I8mm` capability).
#[inline(always)]
pub(crate) unsafe fn usmmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction; the caller guarantees the CPU has USMMLA.
    unsafe {
        asm!(
            ".arch_extension i8mm",
            "usmmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
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
pub(crate) fn pair(a: int8x16_t, b: int8x16_t) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON register reinterpretations and zips only.
    unsafe {
        let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
        (
            vreinterpretq_s8_s64(vzip1q_s64(a, b)),
            vreinterpretq_s8_s64(vzip2q_s64(a, b)),
        )
    }
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

    /// Writes one 16-byte `A` operand at byte `at` (`32c` or `32c + 16` of chunk `c`):
    /// for decoders that build the row pair's operands in registers.
    #[inline(always)]
    pub(crate) fn put(&mut self, at: usize, v: int8x16_t) {
        let d = &mut self.a[at..at + 16];
        // SAFETY: `d` is 16 writable bytes (bounds-checked).
        unsafe { vst1q_s8(d.as_mut_ptr(), v) }
    }

    #[inline(always)]
    fn ld(&self, at: usize) -> int8x16_t {
        let s = &self.a[at..at + 16];
        // SAFETY: `s` is 16 readable bytes (bounds-checked).
        unsafe { vld1q_s8(s.as_ptr()) }
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

/// Q3_K's lanes for a 2x2 tile: two weight rows in the lane-grouped form
/// (`unpack::q3_k_lanes`) as a [`PairA`], and two activation rows in the same layout,
/// interleaved like a [`PairA`] (`bx`, 512 bytes). Each 8-byte slice is 8 elements of one
/// reference lane, so every SMMLA product is useful: `acc[l]` is lane l of
/// `[r0.x0, r0.x1, r1.x0, r1.x1]` (negated back: the weights carry the negated scale).
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn lanes8_2x2(a: &PairA, bx: &[u8]) -> [int32x4_t; 8] {
    // SAFETY: the caller guarantees SMMLA; the rest is NEON register arithmetic.
    unsafe { lanes8_2x2_from(a, bx, [vdupq_n_s32(0); 8]).map(|v| vnegq_s32(v)) }
}

/// [`lanes8_2x2`]'s SMMLAs added to `acc` (no negation): `acc[l]` plus lane l of the tile's
/// four dots.
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn lanes8_2x2_from(
    a: &PairA,
    bx: &[u8],
    mut acc: [int32x4_t; 8],
) -> [int32x4_t; 8] {
    let bx = &bx[..512];
    // Written out chunk by chunk: as a loop, the compiler kept `acc` in memory (its index
    // `2 * (c % 4)` was not resolved), a store and a load around every SMMLA.
    macro_rules! chunk {
        ($c:literal) => {
            // SAFETY: the caller guarantees SMMLA.
            unsafe {
                let l = 2 * ($c % 4);
                acc[l] = smmla(acc[l], a.ld(32 * $c), ld_s8(bx, 32 * $c));
                acc[l + 1] = smmla(acc[l + 1], a.ld(32 * $c + 16), ld_s8(bx, 32 * $c + 16));
            }
        };
    }
    chunk!(0);
    chunk!(1);
    chunk!(2);
    chunk!(3);
    chunk!(4);
    chunk!(5);
    chunk!(6);
    chunk!(7);
    chunk!(8);
    chunk!(9);
    chunk!(10);
    chunk!(11);
    chunk!(12);
    chunk!(13);
    chunk!(14);
    chunk!(15);
    acc
}

/// Half of [`lanes8_2x2_from`] with unsigned weights (USMMLA: the folded Q4_K/Q5_K streams,
/// 0..=217, and Q6_K's low stream) or, with `SIGNED`, signed ones (SMMLA: Q6_K's high
/// stream): the lanes `4 * H .. 4 * H + 4` only (the chunks `c` with `(c % 4) / 2 == H`), so
/// that a caller keeping eight float sums live needs four integer accumulators at a time, not
/// eight.
///
/// # Safety
/// The CPU must implement FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn lanes4_2x2_from<const H: usize, const SIGNED: bool>(
    a: &PairA,
    bx: &[u8],
    mut acc: [int32x4_t; 4],
) -> [int32x4_t; 4] {
    let bx = &bx[..512];
    macro_rules! chunk {
        ($k:literal, $i:literal) => {
            // SAFETY: the caller guarantees SMMLA.
            unsafe {
                let c = 4 * $k + 2 * H + $i;
                let mm = if SIGNED { smmla } else { usmmla };
                acc[2 * $i] = mm(acc[2 * $i], a.ld(32 * c), ld_s8(bx, 32 * c));
                acc[2 * $i + 1] = mm(acc[2 * $i + 1], a.ld(32 * c + 16), ld_s8(bx, 32 * c + 16));
            }
        };
    }
    chunk!(0, 0);
    chunk!(0, 1);
    chunk!(1, 0);
    chunk!(1, 1);
    chunk!(2, 0);
    chunk!(2, 1);
    chunk!(3, 0);
    chunk!(3, 1);
    acc
}
