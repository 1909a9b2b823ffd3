//! The i8mm (SMMLA) GEMM of the 32-element types (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 x Q8_0; Q4_1,
//! Q5_1 x Q8_1):
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

use super::dotprod::sdot;
use super::i8mm::{pair, smmla};
use super::legacy::{nibble_values, Legacy};
use super::neon::{from_magic, ld_s8, MAGIC_BITS};
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
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Four little-endian f16 values (`b[i][at..at + 2]`) as f32, one FCVTL (exact for every f16,
/// as `unpack::f16_at`). The halves are gathered in a general register, so the vector pipes
/// see one move and one conversion.
#[inline(always)]
fn f16x4(b: [&[u8]; 4], at: usize) -> float32x4_t {
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
fn f16x4_run(b: &[u8], at: usize) -> float32x4_t {
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

/// The scales `dw` of four weight rows' blocks (`b[i]`, file layout) as f32: an f16 at 0, or
/// MXFP4's E8M0 byte halved.
#[inline(always)]
fn weight_d4(ty: Legacy, b: [&[u8]; 4]) -> float32x4_t {
    if ty == Legacy::Mxfp4 {
        let v: [f32; 4] = core::array::from_fn(|i| ty.weight_d(b[i]));
        // SAFETY: `v` is 4 readable f32.
        unsafe { vld1q_f32(v.as_ptr()) }
    } else {
        f16x4(b, 0)
    }
}

/// The `A` operands of a [`Layout::Rows4`] group's block (`blk`, `4 * block_bytes` bytes) for its
/// two row pairs, as `pair_quants` builds them from GGUF blocks: loads only (Q4_0: and the
/// nibble split).
#[inline(always)]
fn packed_quants(ty: Legacy, blk: &[u8]) -> [[int8x16_t; 4]; 2] {
    core::array::from_fn(|p| match ty {
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
    })
}

/// Stores a vector's 16 bytes at `dst[at..at + 16]`.
#[inline(always)]
fn put(dst: &mut [u8], at: usize, v: uint8x16_t) {
    let d = &mut dst[at..at + 16];
    // SAFETY: `d` is 16 writable bytes (bounds-checked); no alignment requirement.
    unsafe { vst1q_u8(d.as_mut_ptr(), v) }
}

/// Loads 16 bytes at `src[at..at + 16]`.
#[inline(always)]
fn get(src: &[u8], at: usize) -> uint8x16_t {
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
            let (values, at) = ty.table().expect("a table type");
            // as Q4_0's, each nibble through the table instead of as is
            let (lo, hi) = pair(ld_s8(w0, at), ld_s8(w1, at));
            let (l0, h0) = nibble_values(values, lo);
            let (l1, h1) = nibble_values(values, hi);
            // SAFETY: NEON register arithmetic only.
            unsafe {
                [
                    vreinterpretq_s8_u8(l0),
                    vreinterpretq_s8_u8(l1),
                    vreinterpretq_s8_u8(h0),
                    vreinterpretq_s8_u8(h1),
                ]
            }
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
fn epilogue(
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
const TYPES: [Legacy; 7] = [
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
        // Q8_0 or Q4_0 in whole groups of four rows (`QMatrix::in_layout` checked it).
        let out = t.out();
        return match (ty, smmla) {
            (Legacy::Q4_0, true) => gemm_t::<1, true>(nb, w, rows, x, n, out),
            (_, true) => gemm_t::<0, true>(nb, w, rows, x, n, out),
            (Legacy::Q4_0, false) => gemm_dot_t::<1, true>(nb, w, rows, x, n, out),
            (_, false) => gemm_dot_t::<0, true>(nb, w, rows, x, n, out),
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
        (Legacy::Q8_0, false) => gemm_dot_t::<0, false>(nb, w, rows, x, n, out),
        (Legacy::Q4_0, false) => gemm_dot_t::<1, false>(nb, w, rows, x, n, out),
        (Legacy::Q5_0, false) => gemm_dot_t::<2, false>(nb, w, rows, x, n, out),
        (Legacy::Q4_1, false) => gemm_dot_t::<3, false>(nb, w, rows, x, n, out),
        (Legacy::Q5_1, false) => gemm_dot_t::<4, false>(nb, w, rows, x, n, out),
        (Legacy::Iq4Nl, false) => gemm_dot_t::<5, false>(nb, w, rows, x, n, out),
        (Legacy::Mxfp4, false) => gemm_dot_t::<6, false>(nb, w, rows, x, n, out),
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
            let d = f16x4_run(blk, 0);
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

/// Bytes of one prepared (block, activation row) for the SDOT quads: quants (32), start value
/// (16: lane 0 as in [`PREP`]'s, the other lanes zero), scale (16, broadcast), Q8_1 sum (16,
/// broadcast).
const PREP1: usize = 80;
/// Activation rows prepared per chunk for the SDOT quads.
const ROWS1: usize = 8;

/// The prepared record of one block of one activation row for the SDOT quads.
#[inline(always)]
fn prep_row(ty: Legacy, xb: &[u8], dst: &mut [u8]) {
    let qs = ty.act_qs();
    let dst = &mut dst[..PREP1];
    put(dst, 0, get(xb, qs));
    put(dst, 16, get(xb, qs + 16));
    // SAFETY: NEON register arithmetic only; `v` is 4 readable i32.
    unsafe {
        let mut start = MAGIC_BITS;
        if ty == Legacy::Q4_0 {
            let (a, b) = (ld_s8(xb, qs), ld_s8(xb, qs + 16));
            start -= 8 * vaddlvq_s16(vaddq_s16(vpaddlq_s8(a), vpaddlq_s8(b)));
        }
        let v = [start, 0, 0, 0];
        put(dst, 32, vreinterpretq_u8_s32(vld1q_s32(v.as_ptr())));
        let d = f16x4([xb, xb, xb, xb], 0);
        put(dst, 48, vreinterpretq_u8_f32(d));
        let s = if matches!(ty, Legacy::Q4_1 | Legacy::Q5_1) {
            f16x4([xb, xb, xb, xb], 2)
        } else {
            vdupq_n_f32(0.0)
        };
        put(dst, 64, vreinterpretq_u8_f32(s));
    }
}

/// One weight row's block as SDOT operands: elements 0..16 and 16..32 (Q4_0: unsigned
/// nibbles, the `- 8` is in the start value).
#[inline(always)]
fn row_quants(ty: Legacy, wb: &[u8], buf: &mut [u8; 32]) -> [int8x16_t; 2] {
    match ty {
        Legacy::Q8_0 => [ld_s8(wb, 2), ld_s8(wb, 18)],
        Legacy::Q4_0 => {
            // SAFETY: NEON register arithmetic only.
            unsafe {
                let q = vreinterpretq_u8_s8(ld_s8(wb, 2));
                [
                    vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)),
                ]
            }
        }
        Legacy::Iq4Nl | Legacy::Mxfp4 => {
            let (values, at) = ty.table().expect("a table type");
            let (lo, hi) = nibble_values(values, ld_s8(wb, at));
            // SAFETY: NEON register arithmetic only.
            unsafe { [vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)] }
        }
        _ => {
            let q = ty.quants(wb, buf);
            [ld_s8(q, 0), ld_s8(q, 16)]
        }
    }
}

/// What prepares one block of one activation row for the SDOT quads ([`prep_row`],
/// [`prep_row_packed`]).
type PrepRow = fn(Legacy, &[u8], &mut [u8]);

/// [`gemm`]'s SDOT quads for the type `TYPES[T]` (`R`: Q8_0 or Q4_0 in [`Layout::Rows4`]): four
/// weight rows x up to eight activation rows per decoded weight block, the four rows' dots of
/// one activation row in the lanes of one vector.
fn gemm_dot_t<const T: usize, const R: bool>(
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
    let (rec, prep_one): (usize, PrepRow) = if R {
        (PREP1P, prep_row_packed)
    } else {
        (PREP1, prep_row)
    };
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = ROWS1.min(n) * nb * rec;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        for jc in (0..n).step_by(ROWS1) {
            let cnt = ROWS1.min(n - jc);
            for t in 0..cnt {
                for b in 0..nb {
                    let xb = &x[(jc + t) * xrow + b * xbb..][..xbb];
                    prep_one(ty, xb, &mut scratch[(b * cnt + t) * rec..][..rec]);
                }
            }
            let prep = &scratch[..nb * cnt * rec];
            for r in (0..rows).step_by(ROWS4) {
                match cnt {
                    1 => quad_dot_at::<1, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    2 => quad_dot_at::<2, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    3 => quad_dot_at::<3, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    4 => quad_dot_at::<4, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    5 => quad_dot_at::<5, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    6 => quad_dot_at::<6, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    7 => quad_dot_at::<7, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                    _ => quad_dot_at::<8, { T }, { R }>(nb, w, r, rows, prep, jc, n, out),
                }
            }
        }
    });
}

/// The SDOT quad of weight rows `r..r + 4` x the `J` prepared activation rows `jc..jc + J`:
/// one whole group in [`Layout::Rows4`] (`R`), else four rows of the file's layout, the last
/// clamped to `rows - 1` (a repeated row computes and stores its original's dot again).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn quad_dot_at<const J: usize, const T: usize, const R: bool>(
    nb: usize,
    w: &[u8],
    r: usize,
    rows: usize,
    prep: &[u8],
    jc: usize,
    n: usize,
    out: &mut [f32],
) {
    if R {
        quad_dot_packed::<J, T>(nb, w, r, prep, jc, n, out)
    } else {
        let rr: [usize; 4] = core::array::from_fn(|i| (r + i).min(rows - 1));
        quad_dot::<J, T>(nb, w, rr, prep, jc, n, out)
    }
}

/// Weight rows `rr` x the `J` prepared activation rows `jc..jc + J` on SDOT.
#[inline(always)]
fn quad_dot<const J: usize, const T: usize>(
    nb: usize,
    w: &[u8],
    rr: [usize; 4],
    prep: &[u8],
    jc: usize,
    n: usize,
    out: &mut [f32],
) {
    let ty = TYPES[T];
    let wbb = ty.block_bytes();
    let wrow = nb * wbb;
    let with_min = matches!(ty, Legacy::Q4_1 | Legacy::Q5_1);
    let mut bufs = [[0u8; 32]; 4];
    // SAFETY: NEON register arithmetic only.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut sums = [zero; J];
    let wr: [&[u8]; 4] = core::array::from_fn(|i| &w[rr[i] * wrow..][..wrow]);
    let prep = &prep[..nb * J * PREP1];
    for b in 0..nb {
        // SAFETY: b < nb, so both ranges lie inside `wr[i]` (nb blocks) and `prep` (nb * J
        // records), whose lengths were checked above: no per-block bounds checks.
        let (wb, pb) = unsafe {
            let wb: [&[u8]; 4] =
                core::array::from_fn(|i| wr[i].get_unchecked(b * wbb..(b + 1) * wbb));
            (wb, prep.get_unchecked(b * J * PREP1..(b + 1) * J * PREP1))
        };
        let [b0, b1, b2, b3] = &mut bufs;
        let q = [
            row_quants(ty, wb[0], b0),
            row_quants(ty, wb[1], b1),
            row_quants(ty, wb[2], b2),
            row_quants(ty, wb[3], b3),
        ];
        let dw = weight_d4(ty, wb);
        let mw = if with_min { f16x4(wb, 2) } else { zero };
        for (j, sum) in sums.iter_mut().enumerate() {
            let rec = &pb[j * PREP1..][..PREP1];
            let (x0, x1) = (get(rec, 0), get(rec, 16));
            // SAFETY: the caller holds a Dotprod or I8mm capability (SDOT); the rest is NEON
            // register arithmetic.
            unsafe {
                let (x0, x1) = (vreinterpretq_s8_u8(x0), vreinterpretq_s8_u8(x1));
                let start = vreinterpretq_s32_u8(get(rec, 32));
                let acc: [int32x4_t; 4] =
                    core::array::from_fn(|i| sdot(sdot(start, q[i][0], x0), q[i][1], x1));
                // Lane i: the four partial sums of weight row i (plus the start value).
                let s = vpaddq_s32(vpaddq_s32(acc[0], acc[1]), vpaddq_s32(acc[2], acc[3]));
                let dx = vreinterpretq_f32_u8(get(rec, 48));
                let sx = vreinterpretq_f32_u8(get(rec, 64));
                *sum = epilogue(ty, *sum, s, dw, dx, mw, sx);
            }
        }
    }
    for (j, sum) in sums.iter().enumerate() {
        let mut v = [0.0f32; 4];
        // SAFETY: `v` has room for 4 f32.
        unsafe { vst1q_f32(v.as_mut_ptr(), *sum) };
        // A clamped (repeated) row computes the same dot as its original.
        for i in 0..4 {
            out[rr[i] * n + jc + j] = v[i];
        }
    }
}

/// Bytes of one prepared (block, activation row) for the SDOT quads on [`Layout::Rows4`]
/// weights: each 8-byte k-slice of the quants twice (64), the start value (16: lanes 0 and 2,
/// one per row of a pair, as [`PREP1`]'s lane 0), the scale (16, broadcast).
const PREP1P: usize = 96;

/// The prepared record of one block of one activation row for [`quad_dot_packed`].
#[inline(always)]
fn prep_row_packed(ty: Legacy, xb: &[u8], dst: &mut [u8]) {
    let qs = ty.act_qs();
    let dst = &mut dst[..PREP1P];
    for c in 0..4 {
        let h = &xb[qs + 8 * c..qs + 8 * c + 8];
        // SAFETY: `h` is 8 readable bytes (bounds-checked); NEON register arithmetic.
        let v = unsafe {
            let v = vld1_u8(h.as_ptr());
            vcombine_u8(v, v)
        };
        put(dst, 16 * c, v);
    }
    // SAFETY: NEON register arithmetic only; `v` is 4 readable i32.
    unsafe {
        let mut start = MAGIC_BITS;
        if ty == Legacy::Q4_0 {
            let (a, b) = (ld_s8(xb, qs), ld_s8(xb, qs + 16));
            start -= 8 * vaddlvq_s16(vaddq_s16(vpaddlq_s8(a), vpaddlq_s8(b)));
        }
        let v = [start, 0, start, 0];
        put(dst, 64, vreinterpretq_u8_s32(vld1q_s32(v.as_ptr())));
        put(dst, 80, vreinterpretq_u8_f32(f16x4([xb, xb, xb, xb], 0)));
    }
}

/// The group of weight rows `r..r + 4` ([`Layout::Rows4`]) x the `J` prepared activation rows
/// `jc..jc + J` on SDOT: per row pair, four SDOTs of the pair's `A` vectors by the doubled
/// k-slices leave `[ra, ra, rb, rb]` partial sums; one pairwise add of the two pairs gives the
/// four rows' sums in row order.
#[inline(always)]
fn quad_dot_packed<const J: usize, const T: usize>(
    nb: usize,
    w: &[u8],
    r: usize,
    prep: &[u8],
    jc: usize,
    n: usize,
    out: &mut [f32],
) {
    let ty = TYPES[T];
    let gbb = ROWS4 * ty.block_bytes();
    let wg = &w[r / ROWS4 * nb * gbb..][..nb * gbb];
    // SAFETY: NEON register arithmetic only.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut sums = [zero; J];
    let prep = &prep[..nb * J * PREP1P];
    for b in 0..nb {
        // SAFETY: b < nb, so both ranges lie inside `wg` (nb group blocks) and `prep` (nb * J
        // records), whose lengths were checked above: no per-block bounds checks.
        let (blk, pb) = unsafe {
            (
                wg.get_unchecked(b * gbb..(b + 1) * gbb),
                prep.get_unchecked(b * J * PREP1P..(b + 1) * J * PREP1P),
            )
        };
        let a = packed_quants(ty, blk);
        let dw = f16x4_run(blk, 0);
        for (j, sum) in sums.iter_mut().enumerate() {
            let rec = &pb[j * PREP1P..][..PREP1P];
            // SAFETY: the caller holds a Dotprod or I8mm capability (SDOT); the rest is NEON
            // register arithmetic.
            unsafe {
                let xs: [int8x16_t; 4] =
                    core::array::from_fn(|c| vreinterpretq_s8_u8(get(rec, 16 * c)));
                let start = vreinterpretq_s32_u8(get(rec, 64));
                let acc: [int32x4_t; 2] = core::array::from_fn(|p| {
                    let mut acc = sdot(start, a[p][0], xs[0]);
                    acc = sdot(acc, a[p][1], xs[1]);
                    acc = sdot(acc, a[p][2], xs[2]);
                    sdot(acc, a[p][3], xs[3])
                });
                let s = vpaddq_s32(acc[0], acc[1]);
                let dx = vreinterpretq_f32_u8(get(rec, 80));
                *sum = epilogue(ty, *sum, s, dw, dx, zero, zero);
            }
        }
    }
    for (j, sum) in sums.iter().enumerate() {
        let mut v = [0.0f32; 4];
        // SAFETY: `v` has room for 4 f32.
        unsafe { vst1q_f32(v.as_mut_ptr(), *sum) };
        for (i, &v) in v.iter().enumerate() {
            out[(r + i) * n + jc + j] = v;
        }
    }
}
