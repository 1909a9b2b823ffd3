//! The SDOT quads of the 32-element types (`legacy_mm`'s types, on the dotprod tier and on
//! i8mm for one activation row): four weight rows x up to eight activation rows per decoded
//! weight block, each activation block prepared once per call into a per-thread record (its
//! quants, the accumulator's start value with `neon::MAGIC`'s bits, its scale), the four rows'
//! dots of one activation row in the lanes of one vector, and the same float epilogue as the
//! SMMLA tiles (`legacy_mm::epilogue`). Weights in the file's layout or repacked
//! (`Layout::Rows4`: the SMMLA tiles' row-pair vectors, multiplied by a record holding each
//! 8-byte k-slice twice, so one pairwise add leaves the four rows' sums in row order).

use core::arch::aarch64::*;

use super::dotprod::sdot;
use super::legacy::Legacy;
use super::legacy_mm::{
    epilogue, f16x4, get, packed_quants, put, weight_d4, weight_d4_run, SCRATCH, TYPES,
};
use super::neon::{ld_s8, nibble_values, MAGIC_BITS};
use crate::formats::repack::ROWS4;

/// Bytes of one prepared (block, activation row) for the SDOT quads: quants (32), start value
/// (16: lane 0 as in `legacy_mm`'s `PREP`'s, the other lanes zero), scale (16, broadcast), Q8_1 sum (16,
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
            let (values, at) = ty.codes();
            // SAFETY: a reinterpretation.
            let q = unsafe { vreinterpretq_u8_s8(ld_s8(wb, at)) };
            let (lo, hi) = nibble_values(values, q);
            [lo, hi]
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

/// `legacy_mm::gemm`'s SDOT quads for the type `TYPES[T]` (`R`: Q8_0 or Q4_0 in `Layout::Rows4`): four
/// weight rows x up to eight activation rows per decoded weight block, the four rows' dots of
/// one activation row in the lanes of one vector.
pub(super) fn gemm_dot_t<const T: usize, const R: bool>(
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
/// one whole group in `Layout::Rows4` (`R`), else four rows of the file's layout, the last
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
                let s = super::neon::sum4(acc);
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

/// Bytes of one prepared (block, activation row) for the SDOT quads on `Layout::Rows4`
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

/// The group of weight rows `r..r + 4` (`Layout::Rows4`) x the `J` prepared activation rows
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
        let dw = weight_d4_run(ty, blk);
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
