//! Q6_K repacked at load (`formats::repack::Layout::Rows4`) on SDOT (dotprod and i8mm, every
//! activation count). Q6_K's reference keeps eight int32 lanes per block (lane `e % 8`) and a
//! scale per group of 16, so one lane holds only two elements of a group: a multiply-sum
//! instruction over four bytes of one lane must mix two groups, and a quant times its scale
//! (up to 4096) does not fit int8. The weights therefore stay unscaled: each 4-byte SDOT lane
//! of a decoded weight vector holds 2 + 2 elements of one reference lane from two consecutive
//! groups (the layout's `ql` vectors, low or high nibbles), and the activations are prepared
//! once per call in the same order as two masked copies (bytes 0-1 of each lane, bytes 2-3),
//! so the two SDOTs against one weight register each add exactly one group. The SDOTs of a
//! lane half run as one cumulative chain over the 16 groups in the layout's scale order
//! (`repack::Q6_CHAIN`), multiplied by the scale differences (`sum_g s_g C_g = sum_g (s_g -
//! s_next) S_g`, the last `s_next = 0`): integer arithmetic, the reference's lanes exactly.
//!
//! The 6-bit quants minus 32 come out of two shift-inserts per vector and no table lookups:
//! the `qh` vector with each 2-bit field's top bit flipped (`^ 0xAA`) holds each field as a
//! 2-bit two's-complement `hi - 2`; shifting a field to the top and arithmetically back gives
//! it sign-extended, which SLI (low nibbles) or SRI (high nibbles) joins to the nibble:
//! `16 * (hi - 2) + nibble = q - 32`.
//!
//! From [`FOLD_FROM`] activation rows, [`q6_fold`] instead folds each quant times its scale
//! into the decoded weights (two int8 streams, `64 * hi + lo`) and runs plain SDOT against up
//! to [`FOLD_ROWS`] activation rows per decoded vector; its chunked activation preparation
//! ([`Chunks`]) also serves `rows4_q3`.
//!
//! On i8mm from [`MM_FROM`] activation rows, [`q6_mm`] runs the same two folded streams on
//! 2x2 SMMLA tiles (`split::k4_tiles`): a row pair's `ql` and `qh` bytes of one lane are zipped
//! together before decoding, so each decoded vector is an `A` operand of 8 elements of one
//! reference lane for both rows, and an SMMLA does twice an SDOT's multiply-adds.

use core::arch::aarch64::*;

use super::kquant::{KAcc, Kind, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::split::{self, perm32_block, KPair, SCRATCH};
use super::{dotprod, unpack, Level};
use crate::formats::kquants::layout::{block_bytes, Q6};
use crate::formats::repack::Q6_CHAIN;

/// Activation rows [`q6_sdot`] runs against each decoded weight row at once.
const ROWS: usize = 4;

/// Bytes per activation row and block of the prepared activations: for each run of 32
/// elements `R` and lane half `i` (lanes `4i..4i + 4`), the run's `unpack::PERM32` vector `i`
/// with bytes 2-3 of every lane zeroed, then with bytes 0-1 zeroed, at `64R + 32i`.
const PER: usize = 512;

/// Where row `h`'s scales and quants start in a group block (`formats::repack`).
const SCALES: usize = 8;
const QUANTS: usize = 72;

/// Activation rows from which [`gemm`] takes [`q6_fold`] on SDOT (below: [`q6_sdot`]).
/// `arm_trace` under llvm-mca's N2 model (512 x 32, dotprod), cycles per 256 weights per row
/// at batch 1 / 2 / 3 / 4: masked 81 / 65 / 58 / 55, folded 119 / 76 / 61 / 53.
const FOLD_FROM: usize = 4;

/// Activation rows from which repacked Q6_K on i8mm takes [`q6_mm`]'s SMMLA tiles.
const MM_FROM: usize = 4;

/// Repacked Q6_K x Q8_K (`rows` a multiple of 4, `n, nb >= 1`): on i8mm from [`MM_FROM`]
/// activation rows the SMMLA tiles ([`q6_mm`]); else on SDOT, the masked, scaled-sum kernel
/// for few activation rows, the folded one from [`FOLD_FROM`].
pub(super) fn gemm(
    level: Level,
    nb: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) {
    if level == Level::I8mm && n >= MM_FROM {
        q6_mm(nb, w, rows, x, n, out)
    } else if n >= FOLD_FROM {
        q6_fold(nb, w, rows, x, n, out)
    } else {
        q6_sdot(nb, w, rows, x, n, out)
    }
}

/// Repacked Q6_K x Q8_K (`rows` a multiple of 4, `n, nb >= 1`): up to [`ROWS`] activation
/// rows prepared per chunk, then every weight row decoded once per block and run against all
/// of them. Float epilogue as the reference's: `sums[l] += (d * yd) * lane[l]`, then `0 +
/// sums[0] + ... + sums[7]`.
#[inline(never)]
fn q6_sdot(nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
    let xrow = nb * Q8K_BYTES;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        // The prepared rows, then each block's `[y0, y1, y2, y3]`.
        let yds = ROWS * nb * PER;
        if scratch.len() < yds + nb * 16 {
            scratch.resize(yds + nb * 16, 0);
        }
        let mut p32 = [0u8; 256];
        for jc in (0..n).step_by(ROWS) {
            let cnt = ROWS.min(n - jc);
            // Only the chunk's rows: the `yd` slots past `cnt` (in the 4-lane load) keep
            // earlier bytes, whose results are never stored (every lane is independent).
            for t in 0..cnt {
                for b in 0..nb {
                    let xb = &x[(jc + t) * xrow + b * Q8K_BYTES..][..Q8K_BYTES];
                    perm32_block(&xb[Q8K_QS..Q8K_BSUMS], &mut p32);
                    let dst = &mut scratch[(t * nb + b) * PER..][..PER];
                    masked_block(&p32, dst);
                    scratch[yds + 16 * b + 4 * t..][..4].copy_from_slice(&xb[..4]);
                }
            }
            let prep = &scratch[..yds + nb * 16];
            for r in 0..rows {
                let acc = match cnt {
                    1 => q6_row::<1>(nb, w, r, prep),
                    2 => q6_row::<2>(nb, w, r, prep),
                    3 => q6_row::<3>(nb, w, r, prep),
                    _ => q6_row::<ROWS>(nb, w, r, prep),
                };
                for (t, a) in acc.into_iter().enumerate().take(cnt) {
                    out[r * n + jc + t] = a.finish(Kind::Q6);
                }
            }
        }
    });
}

/// The quants minus 32 of a 16-byte `ql` vector `v` of run `H2` (0: `ql[64k..]`, 1: `ql[64k +
/// 32..]`) and its `qh` vector with each field's top bit flipped (`fqh = qh ^ 0xAA`): `(low
/// nibbles', high nibbles')`, in `v`'s byte order.
#[inline(always)]
fn quants<const H2: usize>(v: uint8x16_t, fqh: uint8x16_t) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let f = vreinterpretq_s8_u8(fqh);
        // Field H2 (low nibbles) and 2 + H2 (high nibbles) moved to bits 6-7.
        let (fl, fh) = if H2 == 0 {
            (vshlq_n_s8::<6>(f), vshlq_n_s8::<2>(f))
        } else {
            (vshlq_n_s8::<4>(f), f)
        };
        // Sign-extended back: `hi - 2` in the low bits (SLI keeps four of them) or in bits
        // 4-7 (SRI keeps those).
        let lo = vsliq_n_u8::<4>(v, vreinterpretq_u8_s8(vshrq_n_s8::<6>(fl)));
        let hi = vsriq_n_u8::<4>(vreinterpretq_u8_s8(vshrq_n_s8::<2>(fh)), v);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

/// Four times the quants minus 32 (`64 * (hi - 2) + 4 * nibble`, the input of
/// `unpack::split64`) of a 16-byte `ql` vector `v` and its `qh` vector with each field's top
/// bit flipped (`fqh`): `(low nibbles', high nibbles')`, in `v`'s byte order. Each byte's
/// fields are picked by its own shift: `lo_sh` moves the low nibble's two-bit field (a flipped
/// field is a two-bit `hi - 2`) to bits 0-1, `hi_sh` the high nibble's to bits 6-7; SLI puts
/// the first at bits 6-7 over the nibble at bits 2-5, SRI the nibble under the second.
#[inline(always)]
fn quants4(
    v: uint8x16_t,
    fqh: uint8x16_t,
    lo_sh: int8x16_t,
    hi_sh: int8x16_t,
) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let lo = vsliq_n_u8::<6>(vshlq_n_u8::<2>(v), vshlq_u8(fqh, lo_sh));
        // SRI in asm: LLVM rewrites SRI + BIC into four instructions.
        let hi: uint8x16_t;
        core::arch::asm!(
            "sri {d:v}.16b, {v:v}.16b, #2",
            d = inout(vreg) vshlq_u8(fqh, hi_sh) => hi,
            v = in(vreg) v,
            options(pure, nomem, nostack, preserves_flags),
        );
        let hi = vbicq_u8(hi, vdupq_n_u8(3));
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

/// The 256 PERM32-ordered quants `p32` as [`PER`] bytes of masked copies.
fn masked_block(p32: &[u8; 256], dst: &mut [u8]) {
    let dst = &mut dst[..PER];
    // SAFETY: NEON register arithmetic; 16-byte loads at `16v` inside `p32` (256 bytes) and
    // stores at `32v`, `32v + 16` inside `dst` (PER = 512 bytes, bounds-checked above).
    unsafe {
        let keep = vreinterpretq_u8_u32(vdupq_n_u32(0x0000_ffff));
        for v in 0..16 {
            let x = vld1q_u8(p32.as_ptr().add(16 * v));
            vst1q_u8(dst.as_mut_ptr().add(32 * v), vandq_u8(x, keep));
            vst1q_u8(dst.as_mut_ptr().add(32 * v + 16), vbicq_u8(x, keep));
        }
    }
}

/// [`q6_sdot`]'s accumulators of weight row `r` against the first `NA` of the [`ROWS`]
/// prepared activation rows `prep` (the rest are zero).
#[inline(always)]
fn q6_row<const NA: usize>(nb: usize, w: &[u8], r: usize, prep: &[u8]) -> [KAcc; ROWS] {
    let wb = block_bytes(Q6);
    let wrow = nb * wb;
    let yds = ROWS * nb * PER;
    let h = r % 4;
    // SAFETY: NEON register arithmetic only.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut lo = [zero; NA];
    let mut hi = [zero; NA];
    for b in 0..nb {
        // Whole groups of four rows (`QMatrix::in_layout` checked it).
        let g = &w[(r / 4) * 4 * wrow + b * 4 * wb..][..4 * wb];
        let d = unpack::f16_at(g, 2 * h);
        let sc = &g[SCALES + 16 * h..][..16];
        let q = &g[QUANTS + 192 * h..][..192];
        let xs: [&[u8]; NA] = core::array::from_fn(|t| &prep[(t * nb + b) * PER..][..PER]);
        // SAFETY: this path runs only under a Dotprod or I8mm capability (SDOT); the rest is
        // NEON register arithmetic and 16-byte loads inside `sc`, `q`, `xs` (bounds-checked by
        // the slices above and `ld`) and `prep` (`yv`: 16 bytes at `yds + 16b`).
        unsafe {
            let ld = |v: &[u8], at: usize| vld1q_u8(v[at..at + 16].as_ptr());
            // The scales in chain order and their differences s_j - s_{j+1} (s_16 = 0), as
            // int32 lanes for the by-element multiplies.
            let s8 = vreinterpretq_s8_u8(ld(sc, 0));
            let (s0, s1) = (vmovl_s8(vget_low_s8(s8)), vmovl_high_s8(s8));
            let d0 = vsubq_s16(s0, vextq_s16::<1>(s0, s1));
            let d1 = vsubq_s16(s1, vextq_s16::<1>(s1, vdupq_n_s16(0)));
            let ds = [
                vmovl_s16(vget_low_s16(d0)),
                vmovl_high_s16(d0),
                vmovl_s16(vget_low_s16(d1)),
                vmovl_high_s16(d1),
            ];
            // Per activation row and lane half: the cumulative SDOT sums and the scaled sums.
            let mut cs = [[vdupq_n_s32(0); 2]; NA];
            let mut acc = [[vdupq_n_s32(0); 2]; NA];
            let flip = vdupq_n_u8(0xaa);
            macro_rules! half {
                ($k:literal) => {{
                    let qh = [
                        veorq_u8(ld(q, 96 * $k), flip),
                        veorq_u8(ld(q, 96 * $k + 16), flip),
                    ];
                    run!($k, 0, qh, 0, 1, 2, 3);
                    run!($k, 1, qh, 4, 5, 6, 7);
                }};
            }
            // One `ql` run (`h2`: of `ql[64k + 32 h2..]`): its low nibbles are chain steps
            // `8k + $a`, `8k + $b` (masks 0, 1), its high nibbles `8k + $c`, `8k + $e` (a
            // step's difference is lane `step % 4` of `ds[step / 4]`).
            macro_rules! run {
                ($k:literal, $h2:literal, $qh:ident, $a:literal, $b:literal, $c:literal, $e:literal) => {{
                    // Runs of 32 elements in the block: low nibbles 4k + h2, high 4k + 2 + h2.
                    let (rl, rh) = (64 * (4 * $k + $h2), 64 * (4 * $k + 2 + $h2));
                    for i in 0..2 {
                        let v = ld(q, 96 * $k + 32 + 32 * $h2 + 16 * i);
                        let (wl, wh) = quants::<$h2>(v, $qh[i]);
                        for (x, (c, a)) in xs.iter().zip(cs.iter_mut().zip(acc.iter_mut())) {
                            let (c, a) = (&mut c[i], &mut a[i]);
                            let xv = |at: usize| vreinterpretq_s8_u8(ld(x, at + 32 * i));
                            dotprod::sdot_mla::<{ $a % 4 }>(c, a, wl, xv(rl), ds[2 * $k + $a / 4]);
                            dotprod::sdot_mla::<{ $b % 4 }>(c, a, wl, xv(rl + 16), ds[2 * $k + $b / 4]);
                            dotprod::sdot_mla::<{ $c % 4 }>(c, a, wh, xv(rh), ds[2 * $k + $c / 4]);
                            dotprod::sdot_mla::<{ $e % 4 }>(c, a, wh, xv(rh + 16), ds[2 * $k + $e / 4]);
                        }
                    }
                }};
            }
            half!(0);
            half!(1);
            let yv = vld1q_f32(prep[yds + 16 * b..][..16].as_ptr().cast::<f32>());
            let dy = vmulq_n_f32(yv, d);
            macro_rules! epilogue {
                ($t:literal) => {
                    if $t < NA {
                        let a = &acc[$t];
                        let (l, h) = (vcvtq_f32_s32(a[0]), vcvtq_f32_s32(a[1]));
                        lo[$t] = vaddq_f32(lo[$t], vmulq_laneq_f32::<$t>(l, dy));
                        hi[$t] = vaddq_f32(hi[$t], vmulq_laneq_f32::<$t>(h, dy));
                    }
                };
            }
            epilogue!(0);
            epilogue!(1);
            epilogue!(2);
            epilogue!(3);
        }
    }
    core::array::from_fn(|t| {
        if t < NA {
            KAcc::from_parts(lo[t], hi[t], 0.0)
        } else {
            KAcc::zero()
        }
    })
}

/// Activation rows [`q6_fold`] (and `rows4_q3`) run against each decoded weight row at once.
pub(super) const FOLD_ROWS: usize = 8;

/// Repacked Q6_K x Q8_K with each quant times its scale folded into the weights per call and
/// split as `64 * hi + lo` into two int8 streams (`unpack::split64`): both streams' SDOT lanes
/// are sums of one reference lane over any groups, so no per-group step and no masked copies:
/// two SDOTs per decoded 16-byte vector and activation row (against the activations in plain
/// `unpack::PERM32` order) where [`q6_sdot`] needs four and four multiply-adds, for a fold of
/// six instructions per vector and row that up to [`FOLD_ROWS`] activation rows share. The
/// lane halves run one after the other (two integer accumulators per activation row), and each
/// lane is `64 * hi + lo` of its two sums, exact in int32. Float epilogue as [`q6_sdot`]'s.
#[inline(never)]
fn q6_fold(nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
    let t = Chunks { nb, w, rows, x, n };
    t.run(Kind::Q6, out, |nb, w, r, prep, cnt| match cnt {
        1 => fold_row::<1>(nb, w, r, prep),
        2 => fold_row::<2>(nb, w, r, prep),
        3 => fold_row::<3>(nb, w, r, prep),
        4 => fold_row::<4>(nb, w, r, prep),
        5 => fold_row::<5>(nb, w, r, prep),
        6 => fold_row::<6>(nb, w, r, prep),
        7 => fold_row::<7>(nb, w, r, prep),
        _ => fold_row::<FOLD_ROWS>(nb, w, r, prep),
    });
}

/// A repacked K-quant GEMM over chunks of up to [`FOLD_ROWS`] activation rows, each prepared
/// once per chunk in `unpack::PERM32` order ([`perm_yds`]).
pub(super) struct Chunks<'a> {
    pub(super) nb: usize,
    pub(super) w: &'a [u8],
    pub(super) rows: usize,
    pub(super) x: &'a [u8],
    pub(super) n: usize,
}

/// Where the `yd`s start in a chunk's prepared activations (`nb` blocks): after the rows'
/// 256-byte PERM32 blocks (row-major), eight `yd` (f32) per block at `perm_yds(nb) + 32b`.
pub(super) const fn perm_yds(nb: usize) -> usize {
    FOLD_ROWS * nb * 256
}

impl Chunks<'_> {
    /// `out[r * n + j]` for every weight row `r`: `row(nb, w, r, prep, cnt)` gives the
    /// accumulators of row `r` against the chunk's `cnt` prepared rows.
    pub(super) fn run(
        &self,
        kind: Kind,
        out: &mut [f32],
        row: impl Fn(usize, &[u8], usize, &[u8], usize) -> [KAcc; FOLD_ROWS],
    ) {
        let Chunks { nb, w, rows, x, n } = *self;
        let xrow = nb * Q8K_BYTES;
        SCRATCH.with(|s| {
            let mut scratch = s.borrow_mut();
            let yds = perm_yds(nb);
            if scratch.len() < yds + nb * 32 {
                scratch.resize(yds + nb * 32, 0);
            }
            for jc in (0..n).step_by(FOLD_ROWS) {
                let cnt = FOLD_ROWS.min(n - jc);
                // Only the chunk's rows: the `yd` slots past `cnt` (in the 4-lane loads) keep
                // earlier bytes, whose results are never stored (every lane is independent).
                for t in 0..cnt {
                    for b in 0..nb {
                        let xb = &x[(jc + t) * xrow + b * Q8K_BYTES..][..Q8K_BYTES];
                        perm32_block(&xb[Q8K_QS..Q8K_BSUMS], &mut scratch[(t * nb + b) * 256..]);
                        scratch[yds + 32 * b + 4 * t..][..4].copy_from_slice(&xb[..4]);
                    }
                }
                let prep = &scratch[..yds + nb * 32];
                for r in 0..rows {
                    for (t, a) in row(nb, w, r, prep, cnt).into_iter().enumerate().take(cnt) {
                        out[r * n + jc + t] = a.finish(kind);
                    }
                }
            }
        });
    }
}

/// [`q6_fold`]'s accumulators of weight row `r` against the first `NA` of the [`FOLD_ROWS`]
/// prepared activation rows `prep` (the rest are zero).
#[inline(always)]
fn fold_row<const NA: usize>(nb: usize, w: &[u8], r: usize, prep: &[u8]) -> [KAcc; FOLD_ROWS] {
    // Bytes 4l + m of a vector (lane l's elements l + 8m): scale `2j` for m = 0, 1 and `2j +
    // 1` for m = 2, 3 of the chain-ordered scales, `j` added per run.
    const PICK: [u8; 16] = [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1];
    let wb = block_bytes(Q6);
    let wrow = nb * wb;
    let yds = perm_yds(nb);
    let h = r % 4;
    // SAFETY: NEON register arithmetic only.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut sums = [[zero; 2]; NA];
    for b in 0..nb {
        // Whole groups of four rows (`QMatrix::in_layout` checked it).
        let g = &w[(r / 4) * 4 * wrow + b * 4 * wb..][..4 * wb];
        let d = unpack::f16_at(g, 2 * h);
        let sc = &g[SCALES + 16 * h..][..16];
        let q = &g[QUANTS + 192 * h..][..192];
        let xs: [&[u8]; NA] = core::array::from_fn(|t| &prep[(t * nb + b) * 256..][..256]);
        // SAFETY: this path runs only under a Dotprod or I8mm capability (SDOT); the rest is
        // NEON register arithmetic and 16-byte loads inside `sc`, `q`, `xs`, `PICK` (bounds-
        // checked by the slices above and `ld`) and `prep` (`yd`: 16 bytes at `yds + 32b` and
        // `yds + 32b + 16`).
        unsafe {
            let ld = |v: &[u8], at: usize| vld1q_u8(v[at..at + 16].as_ptr());
            let s8 = vreinterpretq_s8_u8(ld(sc, 0));
            let pick = vld1q_u8(PICK.as_ptr());
            // The scales of chain steps `2j`, `2j + 1` in each lane's bytes 0-1, 2-3.
            let scales = |j: u8| vqtbl1q_s8(s8, vaddq_u8(pick, vdupq_n_u8(2 * j)));
            let flip = vdupq_n_u8(0xaa);
            // `quants4`'s field shifts: `ql[64k..]` fields 0 and 2, `ql[64k + 32..]` 1 and 3.
            let sh = [
                [vdupq_n_s8(0), vdupq_n_s8(2)],
                [vdupq_n_s8(-2), vdupq_n_s8(0)],
            ];
            let yd = &prep[yds + 32 * b..][..32];
            let dy = [
                vmulq_n_f32(vld1q_f32(yd.as_ptr().cast::<f32>()), d),
                vmulq_n_f32(vld1q_f32(yd[16..].as_ptr().cast::<f32>()), d),
            ];
            for i in 0..2 {
                let mut hi = [vdupq_n_s32(0); NA];
                let mut lo = [vdupq_n_s32(0); NA];
                macro_rules! run {
                    ($k:literal, $h2:literal, $fqh:ident) => {{
                        let v = ld(q, 96 * $k + 32 + 32 * $h2 + 16 * i);
                        let (wl, wh) = quants4(v, $fqh, sh[$h2][0], sh[$h2][1]);
                        // Chain steps 8k + 4h2 + (0, 1) (low nibbles), + (2, 3) (high).
                        let (hl, ll) = unpack::split64(wl, scales(4 * $k + 2 * $h2));
                        let (hh, lh) = unpack::split64(wh, scales(4 * $k + 2 * $h2 + 1));
                        let s8 = |v: uint8x16_t| vreinterpretq_s8_u8(v);
                        let (hl, ll, hh, lh) = (s8(hl), s8(ll), s8(hh), s8(lh));
                        // PERM32 runs of 32 elements: 4k + h2 (low nibbles), 4k + 2 + h2.
                        let (rl, rh) = (
                            32 * (4 * $k + $h2) + 16 * i,
                            32 * (4 * $k + 2 + $h2) + 16 * i,
                        );
                        for (x, (h, l)) in xs.iter().zip(hi.iter_mut().zip(lo.iter_mut())) {
                            let (xl, xh) = (s8(ld(x, rl)), s8(ld(x, rh)));
                            *h = dotprod::sdot(*h, hl, xl);
                            *l = dotprod::sdot(*l, ll, xl);
                            *h = dotprod::sdot(*h, hh, xh);
                            *l = dotprod::sdot(*l, lh, xh);
                        }
                    }};
                }
                for k in 0..2 {
                    let fqh = veorq_u8(ld(q, 96 * k + 16 * i), flip);
                    if k == 0 {
                        run!(0, 0, fqh);
                        run!(0, 1, fqh);
                    } else {
                        run!(1, 0, fqh);
                        run!(1, 1, fqh);
                    }
                }
                for (t, (h, l)) in hi.iter().zip(&lo).enumerate() {
                    // The reference's lane: 64 * hi + lo, then `sums[l] += (d * yd) * lane`.
                    let lane = vcvtq_f32_s32(vmlaq_n_s32(*l, *h, 64));
                    sums[t][i] = vaddq_f32(sums[t][i], vmulq_f32(lane, lane_of(&dy, t)));
                }
            }
        }
    }
    core::array::from_fn(|t| {
        if t < NA {
            KAcc::from_parts(sums[t][0], sums[t][1], 0.0)
        } else {
            KAcc::zero()
        }
    })
}

/// Lane `t` of the eight values `v` (two vectors) in every lane of a vector.
#[inline(always)]
pub(super) fn lane_of(v: &[float32x4_t; 2], t: usize) -> float32x4_t {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let h = v[t / 4];
        match t % 4 {
            0 => vdupq_laneq_f32::<0>(h),
            1 => vdupq_laneq_f32::<1>(h),
            2 => vdupq_laneq_f32::<2>(h),
            _ => vdupq_laneq_f32::<3>(h),
        }
    }
}

/// Repacked Q6_K x Q8_K on 2x2 SMMLA tiles (i8mm; `rows` a multiple of 4): `split::k4_tiles`
/// (the activation pairs, the float epilogue lane by lane) over weight row pairs decoded
/// straight from `Layout::Rows4` by [`mm_pair`]. Each product `q * scale` is split as `64 * hi
/// + lo` into two int8 streams (`unpack::split64`: a signed high stream on SMMLA, an unsigned
/// low one on USMMLA), so every 8-byte k-slice is 8 elements of one reference lane and a
/// lane is `64 * hi + lo` of two unmasked sums: 16 SMMLA per 256 weights per activation row,
/// half of [`q6_fold`]'s SDOTs.
fn q6_mm(nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
    let wb = block_bytes(Q6);
    let wrow = nb * wb;
    split::k4_tiles::<Q6>(nb, rows, x, n, out, |r, _, b, blk| {
        // Whole groups of four rows (`QMatrix::in_layout` checked it): rows `r`, `r + 1`.
        let g = &w[(r / 4) * 4 * wrow + b * 4 * wb..][..4 * wb];
        mm_pair(g, (r % 4) / 2, blk);
    });
}

/// For the run pair `J` (runs `2J`, `2J + 1` of 32 elements) of an `A` operand of row pair
/// `p`: the position of each byte's scale among the pair's 32 chain-ordered scales (row `2p`'s
/// 16, then row `2p + 1`'s). Bytes `0..8` are row `2p`'s, `8..16` row `2p + 1`'s; within
/// each, elements `l + 8m` of run `2J` (m = 0..4: groups `4J`, `4J`, `4J + 1`, `4J + 1`),
/// then of run `2J + 1` (groups `4J + 2`, `4J + 3`).
const MM_PICKS: [[u8; 16]; 4] = {
    let mut t = [[0u8; 16]; 4];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 16 {
            t[j][b] = (16 * (b / 8) + Q6_CHAIN[4 * j + (b % 8) / 2]) as u8;
            b += 1;
        }
        j += 1;
    }
    t
};

/// [`quants4`]'s field shifts per byte of a [`mm_pair`] operand: bytes from `ql[64k..]` have
/// fields 0 and 2, bytes from `ql[64k + 32..]` fields 1 and 3.
const MM_SHL_LO: [i8; 16] = [0, 0, 0, 0, -2, -2, -2, -2, 0, 0, 0, 0, -2, -2, -2, -2];
const MM_SHL_HI: [i8; 16] = [2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0];

/// Row pair `p` of the `Layout::Rows4` group block `g` as [`KPair`] operands (`hi`, `lo`
/// streams and `[d0, d0, d1, d1]`). For each half `k` of the block and lane `L`, the two
/// rows' `ql` bytes of lane `L` from `ql[64k..]` and `ql[64k + 32..]` are brought together
/// with zips (`zip1/zip2.4s` of a row's two runs, `zip1/zip2.2d` of the two rows) before
/// decoding, and so are their `qh` bytes: the low nibbles are then the `A` operand of lane `L`
/// for runs `4k`, `4k + 1` (chunk `8k + L / 2`), the high nibbles for runs `4k + 2`, `4k + 3`
/// (chunk `8k + 4 + L / 2`), the order of `split::pair_block`'s activations.
#[inline(always)]
fn mm_pair(g: &[u8], p: usize, blk: &mut KPair) {
    let (h0, h1) = (2 * p, 2 * p + 1);
    let (d0, d1) = (unpack::f16_at(g, 2 * h0), unpack::f16_at(g, 2 * h1));
    blk.d = [d0, d0, d1, d1];
    let sc = &g[SCALES + 32 * p..][..32];
    let q0 = &g[QUANTS + 192 * h0..][..192];
    let q1 = &g[QUANTS + 192 * h1..][..192];
    // SAFETY: NEON register arithmetic; 16-byte loads inside `sc`, `q0`, `q1` (bounds-checked
    // by `ld`) and the 16-byte constants.
    unsafe {
        let ld = |v: &[u8], at: usize| vld1q_u8(v[at..at + 16].as_ptr());
        let st = vld1q_u8_x2(sc.as_ptr());
        let scale = |j: usize| vreinterpretq_s8_u8(vqtbl2q_u8(st, vld1q_u8(MM_PICKS[j].as_ptr())));
        let flip = vdupq_n_u8(0xaa);
        let shl_lo = vld1q_s8(MM_SHL_LO.as_ptr());
        let shl_hi = vld1q_s8(MM_SHL_HI.as_ptr());
        // Two rows' lanes side by side: `i8mm::pair` with its ZIP1 in asm, as LLVM lowers
        // `vzip1q_u64` here to a register copy and an element insert (`i8mm::pair` itself keeps
        // the intrinsic: in asm there it cost the file-order Q3_K tiles ~1.3%, and the
        // intrinsic here costs this decode 0.6 of 47 cycles at batch 4 on N2).
        let z2 = |a: uint8x16_t, b: uint8x16_t| {
            let lo: uint8x16_t;
            core::arch::asm!(
                "zip1 {d:v}.2d, {a:v}.2d, {b:v}.2d",
                d = out(vreg) lo,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
            let (a, b) = (vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b));
            [lo, vreinterpretq_u8_u64(vzip2q_u64(a, b))]
        };
        let s8 = |v: uint8x16_t| vreinterpretq_s8_u8(v);
        for k in 0..2 {
            let (s_lo, s_hi) = (scale(2 * k), scale(2 * k + 1));
            // A row's `ql[64k..]` and `ql[64k + 32..]` lanes side by side (`unpack::lanes8_chunks`:
            // chunk `2i + half` holds lanes `4i + 2half`, `4i + 2half + 1`), and its `qh`
            // lanes twice (the same `qh` byte serves both runs).
            let runs = |q: &[u8]| {
                let v = |at: usize| [ld(q, 96 * k + at), ld(q, 96 * k + at + 16)];
                unpack::lanes8_chunks(v(32), v(64))
            };
            let fields = |q: &[u8]| {
                let h = [
                    veorq_u8(ld(q, 96 * k), flip),
                    veorq_u8(ld(q, 96 * k + 16), flip),
                ];
                unpack::lanes8_chunks(h, h)
            };
            let (zx, zy, hx, hy) = (runs(q0), runs(q1), fields(q0), fields(q1));
            for i in 0..2 {
                for half in 0..2 {
                    let c = z2(zx[2 * i + half], zy[2 * i + half]);
                    let f = z2(hx[2 * i + half], hy[2 * i + half]);
                    for e in 0..2 {
                        let (wl, wh) = quants4(c[e], f[e], shl_lo, shl_hi);
                        let (hl, ll) = unpack::split64(wl, s_lo);
                        let (hh, lh) = unpack::split64(wh, s_hi);
                        let at_lo = 32 * (8 * k + 2 * i + half) + 16 * e;
                        let at_hi = at_lo + 4 * 32;
                        blk.hi.put(at_lo, s8(hl));
                        blk.lo.put(at_lo, s8(ll));
                        blk.hi.put(at_hi, s8(hh));
                        blk.lo.put(at_hi, s8(lh));
                    }
                }
            }
        }
    }
}
