//! The dotprod/i8mm GEMM of the 32-element types (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 x Q8_0; Q4_1,
//! Q5_1 x Q8_1): its entry point and, here, the i8mm (SMMLA) tiles; the SDOT quads (dotprod, and
//! i8mm for one activation row) are in `legacy_dot`. The tiles:
//! tiles of four weight rows x up to eight activation rows per weight block, the integer dot of
//! every (weight row, activation row) pair of a block in one SMMLA lane.
//!
//! The activation side is prepared once per chunk of eight activation rows in a per-thread
//! scratch buffer (it only grows): for each pair of rows and block, the four SMMLA `B`
//! operands (`i8mm::pair` of the two rows' quants, elements 0..8, 8..16, 16..24, 24..32), the
//! scales as `[d0, d1, d0, d1]`, the accumulator's start value and, for Q8_1, the sums as
//! `[s0, s1, s0, s1]`. Every weight row quad then streams past it: each weight block is
//! decoded once into the `A` operands of two row pairs and used for every activation pair, so
//! the only per-tile work is four SMMLAs and the float epilogue. An odd last activation or
//! weight row is paired with itself (both lanes compute the same dot, written twice).
//!
//! Q4_0's quants are used as their unsigned nibbles (0..=15) and its `- 8` applied through the
//! start value `-8 * sum(x)` of the accumulator: `sum((q - 8) * x) = sum(q * x) - 8 * sum(x)`
//! exactly in int32, so the integer is the reference's `sumi`. The start value also carries
//! `neon::MAGIC`'s bits, which make the integer-to-float conversion one subtraction. The float epilogues are the
//! reference's (see `legacy`), lane by lane, with no fused multiply-add.
//!
//! Q8_0 and Q4_0 weights repacked at load (`formats::repack`, [`Layout::Rows4`]: four rows'
//! blocks together, each row pair's quants already in SMMLA `A` order, the four scales in one
//! 8-byte run) skip the per-call interleave: the SMMLA tiles load their `A` operands as they are
//! and the scales with one FCVTL; the SDOT quads multiply the same row-pair vectors by an
//! activation record holding each 8-byte k-slice twice (`prep_row_packed`), so one pairwise add
//! leaves the four rows' sums in row order. Same integers, same epilogue, same bits.

use core::arch::aarch64::*;
use core::arch::asm;
use std::cell::RefCell;

use super::i8mm::{pair, smmla};
use super::legacy::Legacy;
use super::neon::{from_magic, ld_s8, nibble_values, MAGIC_BITS};
use super::Level;
use crate::formats::repack::{Layout, ROWS4};
use crate::Tile;

/// Activation row pairs prepared per chunk.
const PAIRS: usize = 4;
/// Bytes of one prepared (block, activation pair): `B` operands (64), scales (16), start
/// value (16), Q8_1 sums (16).
const PREP: usize = 112;
const AT_D: usize = 64;
const AT_INIT: usize = 80;
const AT_S: usize = 96;

thread_local! {
    pub(super) static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Four little-endian f16 values (`b[i][at..at + 2]`) as f32, one FCVTL (exact for every f16,
/// as `unpack::f16_at`). The halves are gathered in a general register, so the vector pipes
/// see one move and one conversion.
#[inline(always)]
pub(super) fn f16x4(b: [&[u8]; 4], at: usize) -> float32x4_t {
    let h = |i: usize| u64::from(u16::from_le_bytes([b[i][at], b[i][at + 1]]));
    let bits = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    let out: float32x4_t;
    // SAFETY: register-only instructions of the aarch64 baseline.
    unsafe {
        asm!(
            "fmov {t:d}, {x}",
            "fcvtl {o:v}.4s, {t:v}.4h",
            x = in(reg) bits,
            t = out(vreg) _,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// The four f16 at `b[at..at + 8]` (a [`Layout::Rows4`] group's scales) as f32, one FCVTL.
#[inline(always)]
pub(super) fn f16x4_run(b: &[u8], at: usize) -> float32x4_t {
    let h = &b[at..at + 8];
    let out: float32x4_t;
    // SAFETY: `h` is 8 readable bytes (bounds-checked; no alignment requirement); the rest is a
    // register-only instruction of the aarch64 baseline.
    unsafe {
        let t = vld1_u8(h.as_ptr());
        asm!(
            "fcvtl {o:v}.4s, {t:v}.4h",
            t = in(vreg) t,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Four E8M0 bytes (`e`, little-endian, lane `i` from byte `i`) halved, as
/// `formats::e8m0_to_f32_half` does each: `(e - 1) << 23` as f32 bits, and for `e < 2` the
/// subnormals `0x0020_0000 << e`.
#[inline(always)]
fn e8m0_half_x4(e: u32) -> float32x4_t {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let v = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(u64::from(e)))));
        let normal = vshlq_n_u32::<23>(vsubq_u32(v, vdupq_n_u32(1)));
        let sub = vshlq_u32(vdupq_n_u32(0x0020_0000), vreinterpretq_s32_u32(v));
        let small = vcltq_u32(v, vdupq_n_u32(2));
        vreinterpretq_f32_u32(vbslq_u32(small, sub, normal))
    }
}

/// The scales `dw` of a [`Layout::Rows4`] group block's four rows (its first bytes).
#[inline(always)]
pub(super) fn weight_d4_run(ty: Legacy, blk: &[u8]) -> float32x4_t {
    if ty == Legacy::Mxfp4 {
        e8m0_half_x4(u32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]))
    } else {
        f16x4_run(blk, 0)
    }
}

/// The scales `dw` of four weight rows' blocks (`b[i]`, file layout) as f32: an f16 at 0, or
/// MXFP4's E8M0 byte halved.
#[inline(always)]
pub(super) fn weight_d4(ty: Legacy, b: [&[u8]; 4]) -> float32x4_t {
    if ty == Legacy::Mxfp4 {
        e8m0_half_x4(u32::from_le_bytes([b[0][0], b[1][0], b[2][0], b[3][0]]))
    } else {
        f16x4(b, 0)
    }
}

/// The `A` operands of a [`Layout::Rows4`] group's block (`blk`, `4 * block_bytes` bytes) for its
/// two row pairs, as `pair_quants` builds them from GGUF blocks: loads only (Q4_0: and the
/// nibble split).
#[inline(always)]
pub(super) fn packed_quants(ty: Legacy, blk: &[u8]) -> [[int8x16_t; 4]; 2] {
    [packed_pair(ty, blk, 0), packed_pair(ty, blk, 1)]
}

/// [`packed_quants`] of the row pair `p` (a function of its own, always inlined: as a closure
/// the compiler kept it out of line, with the type matched at run time).
#[inline(always)]
fn packed_pair(ty: Legacy, blk: &[u8], p: usize) -> [int8x16_t; 4] {
    match ty {
        Legacy::Iq4Nl | Legacy::Mxfp4 => {
            let (values, at) = ty.codes();
            // the four rows' scales (`at` bytes each) come first
            let q = ROWS4 * at + 32 * p;
            // SAFETY: reinterpretations.
            let (v0, v1) = unsafe {
                (
                    vreinterpretq_u8_s8(ld_s8(blk, q)),
                    vreinterpretq_u8_s8(ld_s8(blk, q + 16)),
                )
            };
            let (l0, h0) = nibble_values(values, v0);
            let (l1, h1) = nibble_values(values, v1);
            [l0, l1, h0, h1]
        }
        Legacy::Q4_0 => {
            let (lo, hi) = (ld_s8(blk, 8 + 32 * p), ld_s8(blk, 8 + 32 * p + 16));
            // SAFETY: NEON register arithmetic only.
            unsafe {
                let (lo, hi) = (vreinterpretq_u8_s8(lo), vreinterpretq_u8_s8(hi));
                let m = vdupq_n_u8(15);
                [
                    vreinterpretq_s8_u8(vandq_u8(lo, m)),
                    vreinterpretq_s8_u8(vandq_u8(hi, m)),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(lo)),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(hi)),
                ]
            }
        }
        // Q8_0 (the only other legacy type `Layout::Rows4` holds)
        _ => core::array::from_fn(|c| ld_s8(blk, 8 + 64 * p + 16 * c)),
    }
}

/// Stores a vector's 16 bytes at `dst[at..at + 16]`.
#[inline(always)]
pub(super) fn put(dst: &mut [u8], at: usize, v: uint8x16_t) {
    let d = &mut dst[at..at + 16];
    // SAFETY: `d` is 16 writable bytes (bounds-checked); no alignment requirement.
    unsafe { vst1q_u8(d.as_mut_ptr(), v) }
}

/// Loads 16 bytes at `src[at..at + 16]`.
#[inline(always)]
pub(super) fn get(src: &[u8], at: usize) -> uint8x16_t {
    let s = &src[at..at + 16];
    // SAFETY: `s` is 16 readable bytes (bounds-checked); no alignment requirement.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// The prepared record of one block of two activation rows (`x0`, `x1`: their blocks).
#[inline(always)]
fn prep_pair(ty: Legacy, x0: &[u8], x1: &[u8], dst: &mut [u8]) {
    let qs = ty.act_qs();
    let dst = &mut dst[..PREP];
    let (b0, b1) = pair(ld_s8(x0, qs), ld_s8(x1, qs));
    let (b2, b3) = pair(ld_s8(x0, qs + 16), ld_s8(x1, qs + 16));
    // SAFETY: NEON register arithmetic only.
    unsafe {
        for (i, b) in [b0, b1, b2, b3].into_iter().enumerate() {
            put(dst, 16 * i, vreinterpretq_u8_s8(b));
        }
        let d = f16x4([x0, x1, x0, x1], 0);
        put(dst, AT_D, vreinterpretq_u8_f32(d));
        let init = if ty == Legacy::Q4_0 {
            let sum = |x: &[u8]| {
                let (a, b) = (ld_s8(x, qs), ld_s8(x, qs + 16));
                MAGIC_BITS - 8 * vaddlvq_s16(vaddq_s16(vpaddlq_s8(a), vpaddlq_s8(b)))
            };
            let (s0, s1) = (sum(x0), sum(x1));
            let v = [s0, s1, s0, s1];
            vld1q_s32(v.as_ptr())
        } else {
            vdupq_n_s32(MAGIC_BITS)
        };
        put(dst, AT_INIT, vreinterpretq_u8_s32(init));
        // read only by the types with a sum (`quad`'s `with_min`)
        if matches!(ty, Legacy::Q4_1 | Legacy::Q5_1) {
            put(dst, AT_S, vreinterpretq_u8_f32(f16x4([x0, x1, x0, x1], 2)));
        }
    }
}

/// The `A` operands of two weight rows' blocks (`w0`, `w1`), in the prepared `B` order
/// (elements 0..8, 8..16, 16..24, 24..32 of both rows). Q4_0's are its unsigned nibbles.
#[inline(always)]
fn pair_quants(ty: Legacy, w0: &[u8], w1: &[u8], bufs: &mut [[u8; 32]; 2]) -> [int8x16_t; 4] {
    match ty {
        Legacy::Q8_0 => {
            let (a0, a1) = pair(ld_s8(w0, 2), ld_s8(w1, 2));
            let (a2, a3) = pair(ld_s8(w0, 18), ld_s8(w1, 18));
            [a0, a1, a2, a3]
        }
        Legacy::Q4_0 => {
            // qs[j] holds elements j (low nibble) and j + 16 (high nibble).
            let (lo, hi) = pair(ld_s8(w0, 2), ld_s8(w1, 2));
            // SAFETY: NEON register arithmetic only.
            unsafe {
                let (lo, hi) = (vreinterpretq_u8_s8(lo), vreinterpretq_u8_s8(hi));
                let m = vdupq_n_u8(15);
                [
                    vreinterpretq_s8_u8(vandq_u8(lo, m)),
                    vreinterpretq_s8_u8(vandq_u8(hi, m)),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(lo)),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(hi)),
                ]
            }
        }
        Legacy::Iq4Nl | Legacy::Mxfp4 => {
            let (values, at) = ty.codes();
            // as Q4_0's, each nibble through the table instead of as is
            let (lo, hi) = pair(ld_s8(w0, at), ld_s8(w1, at));
            // SAFETY: reinterpretations.
            let (lo, hi) = unsafe { (vreinterpretq_u8_s8(lo), vreinterpretq_u8_s8(hi)) };
            let (l0, h0) = nibble_values(values, lo);
            let (l1, h1) = nibble_values(values, hi);
            [l0, l1, h0, h1]
        }
        _ => {
            let [b0, b1] = bufs;
            let (q0, q1) = (ty.quants(w0, b0), ty.quants(w1, b1));
            let (a0, a1) = pair(ld_s8(q0, 0), ld_s8(q1, 0));
            let (a2, a3) = pair(ld_s8(q0, 16), ld_s8(q1, 16));
            [a0, a1, a2, a3]
        }
    }
}

/// The reference's block step for a tile (lanes `[ra.x0, ra.x1, rb.x0, rb.x1]`).
#[inline(always)]
pub(super) fn epilogue(
    ty: Legacy,
    sum: float32x4_t,
    acc: int32x4_t,
    dw: float32x4_t,
    dx: float32x4_t,
    mw: float32x4_t,
    sx: float32x4_t,
) -> float32x4_t {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        // `sumi as f32`: the accumulator started at MAGIC_BITS.
        let s = from_magic(acc);
        match ty {
            Legacy::Q4_0 => vaddq_f32(sum, vmulq_f32(vmulq_f32(s, dw), dx)),
            Legacy::Q5_0 | Legacy::Q8_0 | Legacy::Iq4Nl | Legacy::Mxfp4 => {
                vaddq_f32(sum, vmulq_f32(s, vmulq_f32(dw, dx)))
            }
            Legacy::Q4_1 | Legacy::Q5_1 => {
                let t = vaddq_f32(vmulq_f32(vmulq_f32(dw, dx), s), vmulq_f32(mw, sx));
                vaddq_f32(sum, t)
            }
        }
    }
}

/// The types as const-generic codes, so that each gets its own loop with the type's decode and
/// epilogue inlined (a runtime type would stay a branch inside the inner loop).
pub(super) const TYPES: [Legacy; 7] = [
    Legacy::Q8_0,
    Legacy::Q4_0,
    Legacy::Q5_0,
    Legacy::Q4_1,
    Legacy::Q5_1,
    Legacy::Iq4Nl,
    Legacy::Mxfp4,
];

/// `ty` x Q8_0/Q8_1 over `t` (weights of `ty`'s type, `rows, n, k >= 1`): SMMLA
/// tiles on the i8mm tier when there are at least two activation rows, SDOT quads otherwise.
///
/// `level` is Dotprod or I8mm (the caller holds that capability).
pub(crate) fn gemm(level: Level, ty: Legacy, t: &mut Tile<'_>) {
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let nb = t.k() / 32;
    let smmla = level == Level::I8mm && n >= 2;
    if t.w().layout() == Layout::Rows4 {
        // Q8_0, Q4_0, IQ4_NL or MXFP4 in whole groups of four rows (`QMatrix::in_layout`
        // checked it).
        let out = t.out();
        return match (ty, smmla) {
            (Legacy::Q4_0, true) => gemm_t::<1, true>(nb, w, rows, x, n, out),
            (Legacy::Iq4Nl, true) => gemm_t::<5, true>(nb, w, rows, x, n, out),
            (Legacy::Mxfp4, true) => gemm_t::<6, true>(nb, w, rows, x, n, out),
            (_, true) => gemm_t::<0, true>(nb, w, rows, x, n, out),
            (Legacy::Q4_0, false) => {
                super::legacy_dot::gemm_dot_t::<1, true>(nb, w, rows, x, n, out)
            }
            (Legacy::Iq4Nl, false) => {
                super::legacy_dot::gemm_dot_t::<5, true>(nb, w, rows, x, n, out)
            }
            (Legacy::Mxfp4, false) => {
                super::legacy_dot::gemm_dot_t::<6, true>(nb, w, rows, x, n, out)
            }
            (_, false) => super::legacy_dot::gemm_dot_t::<0, true>(nb, w, rows, x, n, out),
        };
    }
    let out = t.out();
    match (ty, smmla) {
        (Legacy::Q8_0, true) => gemm_t::<0, false>(nb, w, rows, x, n, out),
        (Legacy::Q4_0, true) => gemm_t::<1, false>(nb, w, rows, x, n, out),
        (Legacy::Q5_0, true) => gemm_t::<2, false>(nb, w, rows, x, n, out),
        (Legacy::Q4_1, true) => gemm_t::<3, false>(nb, w, rows, x, n, out),
        (Legacy::Q5_1, true) => gemm_t::<4, false>(nb, w, rows, x, n, out),
        (Legacy::Iq4Nl, true) => gemm_t::<5, false>(nb, w, rows, x, n, out),
        (Legacy::Mxfp4, true) => gemm_t::<6, false>(nb, w, rows, x, n, out),
        (Legacy::Q8_0, false) => super::legacy_dot::gemm_dot_t::<0, false>(nb, w, rows, x, n, out),
        (Legacy::Q4_0, false) => super::legacy_dot::gemm_dot_t::<1, false>(nb, w, rows, x, n, out),
        (Legacy::Q5_0, false) => super::legacy_dot::gemm_dot_t::<2, false>(nb, w, rows, x, n, out),
        (Legacy::Q4_1, false) => super::legacy_dot::gemm_dot_t::<3, false>(nb, w, rows, x, n, out),
        (Legacy::Q5_1, false) => super::legacy_dot::gemm_dot_t::<4, false>(nb, w, rows, x, n, out),
        (Legacy::Iq4Nl, false) => super::legacy_dot::gemm_dot_t::<5, false>(nb, w, rows, x, n, out),
        (Legacy::Mxfp4, false) => super::legacy_dot::gemm_dot_t::<6, false>(nb, w, rows, x, n, out),
    }
}

/// The prepared records of `cnt` activation rows `x` (`nb` blocks each) in pairs, an odd last
/// row paired with itself, at `dst[(b * pairs + p) * PREP..]`: one loop per type with
/// [`prep_pair`] inlined, kept out of the tile loops so that their code is not disturbed.
#[inline(never)]
fn prep_pairs<const T: usize>(nb: usize, x: &[u8], cnt: usize, dst: &mut [u8]) {
    let ty = TYPES[T];
    let xbb = ty.act_bytes();
    let xrow = nb * xbb;
    let pairs = cnt.div_ceil(2);
    let dst = &mut dst[..nb * pairs * PREP];
    for p in 0..pairs {
        let (j0, j1) = (2 * p, (2 * p + 1).min(cnt - 1));
        let (r0, r1) = (&x[j0 * xrow..][..xrow], &x[j1 * xrow..][..xrow]);
        for b in 0..nb {
            // SAFETY: b < nb and p < pairs, so the blocks lie inside the rows (nb blocks of
            // xbb bytes each) and the record inside `dst` (nb * pairs records), all sliced with
            // checks above: no per-block bounds checks.
            let (x0, x1, rec) = unsafe {
                (
                    r0.get_unchecked(b * xbb..(b + 1) * xbb),
                    r1.get_unchecked(b * xbb..(b + 1) * xbb),
                    dst.get_unchecked_mut((b * pairs + p) * PREP..(b * pairs + p + 1) * PREP),
                )
            };
            prep_pair(ty, x0, x1, rec);
        }
    }
}

/// [`gemm`]'s SMMLA tiles for the type `TYPES[T]` (`R`: weights in [`Layout::Rows4`]).
fn gemm_t<const T: usize, const R: bool>(
    nb: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) {
    let ty = TYPES[T];
    let xbb = ty.act_bytes();
    let xrow = nb * xbb;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = PAIRS.min(n.div_ceil(2)) * nb * PREP;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        for jc in (0..n).step_by(2 * PAIRS) {
            let cnt = (2 * PAIRS).min(n - jc);
            let pairs = cnt.div_ceil(2);
            prep_pairs::<T>(nb, &x[jc * xrow..(jc + cnt) * xrow], cnt, &mut scratch);
            let prep = &scratch[..nb * pairs * PREP];
            let cols: [usize; 2 * PAIRS] = core::array::from_fn(|i| jc + i.min(cnt - 1));
            let mut r = 0;
            while r < rows {
                let rr: [usize; 4] = core::array::from_fn(|i| (r + i).min(rows - 1));
                match pairs {
                    1 => quad::<1, { T }, { R }>(nb, w, rr, prep, &cols, n, out),
                    2 => quad::<2, { T }, { R }>(nb, w, rr, prep, &cols, n, out),
                    3 => quad::<3, { T }, { R }>(nb, w, rr, prep, &cols, n, out),
                    _ => quad::<4, { T }, { R }>(nb, w, rr, prep, &cols, n, out),
                }
                r += 4;
            }
        }
    });
}

/// Weight rows `rr` (two pairs) x the `P` prepared activation pairs (columns `cols`); with `R`
/// the weights are in [`Layout::Rows4`] and `rr` is one whole group.
#[inline(always)]
fn quad<const P: usize, const T: usize, const R: bool>(
    nb: usize,
    w: &[u8],
    rr: [usize; 4],
    prep: &[u8],
    cols: &[usize; 2 * PAIRS],
    n: usize,
    out: &mut [f32],
) {
    let ty = TYPES[T];
    let wbb = ty.block_bytes();
    let wrow = nb * wbb;
    let with_min = matches!(ty, Legacy::Q4_1 | Legacy::Q5_1);
    let mut bufs = [[[0u8; 32]; 2]; 2];
    // SAFETY: NEON register arithmetic only.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut sums = [[zero; P]; 2];
    let wr: [&[u8]; 4] = if R {
        // the group's rows are contiguous: one slice of `ROWS4 * wrow` bytes, in `wr[0]`
        core::array::from_fn(|_| &w[rr[0] * wrow..][..ROWS4 * wrow])
    } else {
        core::array::from_fn(|i| &w[rr[i] * wrow..][..wrow])
    };
    let prep = &prep[..nb * P * PREP];
    for b in 0..nb {
        let a;
        let (dw, mw);
        let pb;
        if R {
            let gbb = ROWS4 * wbb;
            // SAFETY: b < nb, so both ranges lie inside `wr[0]` (nb group blocks) and `prep`
            // (nb * P records), whose lengths were checked above: no per-block bounds checks.
            let (blk, p) = unsafe {
                (
                    wr[0].get_unchecked(b * gbb..(b + 1) * gbb),
                    prep.get_unchecked(b * P * PREP..(b + 1) * P * PREP),
                )
            };
            pb = p;
            a = packed_quants(ty, blk);
            let d = weight_d4_run(ty, blk);
            // SAFETY: NEON register arithmetic only.
            dw = unsafe { [vzip1q_f32(d, d), vzip2q_f32(d, d)] };
            mw = [zero; 2];
        } else {
            // SAFETY: b < nb, so both ranges lie inside `wr[i]` (nb blocks) and `prep` (nb * P
            // records), whose lengths were checked above: no per-block bounds checks.
            let (wb, p) = unsafe {
                let wb: [&[u8]; 4] =
                    core::array::from_fn(|i| wr[i].get_unchecked(b * wbb..(b + 1) * wbb));
                (wb, prep.get_unchecked(b * P * PREP..(b + 1) * P * PREP))
            };
            pb = p;
            let [b01, b23] = &mut bufs;
            a = [
                pair_quants(ty, wb[0], wb[1], b01),
                pair_quants(ty, wb[2], wb[3], b23),
            ];
            // SAFETY: NEON register arithmetic only.
            (dw, mw) = unsafe {
                let d = weight_d4(ty, wb);
                let m = if with_min { f16x4(wb, 2) } else { zero };
                (
                    [vzip1q_f32(d, d), vzip2q_f32(d, d)],
                    [vzip1q_f32(m, m), vzip2q_f32(m, m)],
                )
            };
        }
        for p in 0..P {
            let rec = &pb[p * PREP..][..PREP];
            // SAFETY: the caller holds an I8mm capability (SMMLA); the rest is NEON register
            // arithmetic.
            unsafe {
                let bq: [int8x16_t; 4] =
                    core::array::from_fn(|i| vreinterpretq_s8_u8(get(rec, 16 * i)));
                let dx = vreinterpretq_f32_u8(get(rec, AT_D));
                let init = vreinterpretq_s32_u8(get(rec, AT_INIT));
                let sx = if with_min {
                    vreinterpretq_f32_u8(get(rec, AT_S))
                } else {
                    zero
                };
                for wp in 0..2 {
                    let mut acc = smmla(init, a[wp][0], bq[0]);
                    acc = smmla(acc, a[wp][1], bq[1]);
                    acc = smmla(acc, a[wp][2], bq[2]);
                    acc = smmla(acc, a[wp][3], bq[3]);
                    sums[wp][p] = epilogue(ty, sums[wp][p], acc, dw[wp], dx, mw[wp], sx);
                }
            }
        }
    }
    for wp in 0..2 {
        let (ra, rb) = (rr[2 * wp], rr[2 * wp + 1]);
        for p in 0..P {
            let mut v = [0.0f32; 4];
            // SAFETY: `v` has room for 4 f32.
            unsafe { vst1q_f32(v.as_mut_ptr(), sums[wp][p]) };
            let (c0, c1) = (cols[2 * p], cols[2 * p + 1]);
            // A clamped (repeated) row or column computes the same dot as its original: the
            // repeated writes store equal values.
            out[ra * n + c0] = v[0];
            out[ra * n + c1] = v[1];
            out[rb * n + c0] = v[2];
            out[rb * n + c1] = v[3];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::e8m0_to_f32_half;

    #[test]
    fn e8m0_half_x4_is_the_scalar_conversion_for_every_byte() {
        for e in (0..=255u8).collect::<Vec<_>>().chunks(4) {
            let got = e8m0_half_x4(u32::from_le_bytes([e[0], e[1], e[2], e[3]]));
            let mut v = [0f32; 4];
            // SAFETY: `v` has room for 4 f32.
            unsafe { vst1q_f32(v.as_mut_ptr(), got) };
            for i in 0..4 {
                assert_eq!(
                    v[i].to_bits(),
                    e8m0_to_f32_half(e[i]).to_bits(),
                    "e = {}",
                    e[i]
                );
            }
        }
    }
}
