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

use core::arch::aarch64::*;

use super::kquant::{KAcc, Kind, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::split::{perm32_block, SCRATCH};
use super::{dotprod, unpack};
use crate::formats::kquants::layout::{block_bytes, Q6};

/// Activation rows [`q6_sdot`] runs against each decoded weight row at once.
const ROWS: usize = 4;

/// Bytes per activation row and block of the prepared activations: for each run of 32
/// elements `R` and lane half `i` (lanes `4i..4i + 4`), the run's `unpack::PERM32` vector `i`
/// with bytes 2-3 of every lane zeroed, then with bytes 0-1 zeroed, at `64R + 32i`.
const PER: usize = 512;

/// Where row `h`'s scales and quants start in a group block (`formats::repack`).
const SCALES: usize = 8;
const QUANTS: usize = 72;

/// Repacked Q6_K x Q8_K (`rows` a multiple of 4, `n, nb >= 1`): up to [`ROWS`] activation
/// rows prepared per chunk, then every weight row decoded once per block and run against all
/// of them. Float epilogue as the reference's: `sums[l] += (d * yd) * lane[l]`, then `0 +
/// sums[0] + ... + sums[7]`.
#[inline(never)]
pub(super) fn q6_sdot(nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
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
                        let f = vreinterpretq_s8_u8($qh[i]);
                        let lo6 = vshrq_n_s8::<6>(vshlq_n_s8::<{ 6 - 2 * $h2 }>(f));
                        let wl = vsliq_n_u8::<4>(v, vreinterpretq_u8_s8(lo6));
                        let hi6 = vshrq_n_s8::<2>(vshlq_n_s8::<{ 2 - 2 * $h2 }>(f));
                        let wh = vsriq_n_u8::<4>(vreinterpretq_u8_s8(hi6), v);
                        let (wl, wh) = (vreinterpretq_s8_u8(wl), vreinterpretq_s8_u8(wh));
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
