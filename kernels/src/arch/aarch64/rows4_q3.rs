//! Q3_K repacked at load (`formats::repack::Layout::Rows4`) on SDOT (dotprod and i8mm, every
//! activation count). A quant times its negated group scale, `q * (32 - sc)`, fits int8
//! (-128..=124), so the scales are folded into the weights as they are decoded and the lane
//! sums need no per-group step; the layout puts four elements of one reference lane (`e % 8`)
//! in each 4-byte lane of a decoded field (byte `t` of a `qs` run holds the four elements
//! `128k + 32j + t`, all of lane `t % 8`), so each SDOT lane sums one reference lane and the
//! decode is shifts, masks and one byte multiply per 16 weights: no table lookups of quants,
//! no zips, nothing stored. Each decoded vector runs against up to `rows4_q6::FOLD_ROWS`
//! activation rows (in `unpack::PERM32` order, prepared once per chunk) straight from its
//! register; the lane halves run one after the other. The lanes are minus the reference's
//! `aux32` (exact), negated before the float epilogue, which is the reference's:
//! `sums[l] += (d * yd) * lane[l]`, then `0 + sums[0] + ... + sums[7]`.

use core::arch::aarch64::*;

use super::kquant::{KAcc, Kind};
use super::rows4_q6::{lane_of, perm_yds, Chunks, FOLD_ROWS};
use super::{dotprod, unpack};
use crate::formats::kquants::layout::{block_bytes, Q3};

/// Where row `h`'s scale bytes and quants start in a group block (`formats::repack`).
const SCALES: usize = 8;
const QUANTS: usize = 56;

/// Repacked Q3_K x Q8_K (`rows` a multiple of 4, `n, nb >= 1`).
#[inline(never)]
pub(super) fn gemm(nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
    let t = Chunks { nb, w, rows, x, n };
    t.run(Kind::Q3, out, |nb, w, r, prep, cnt| match cnt {
        1 => row::<1>(nb, w, r, prep),
        2 => row::<2>(nb, w, r, prep),
        3 => row::<3>(nb, w, r, prep),
        4 => row::<4>(nb, w, r, prep),
        5 => row::<5>(nb, w, r, prep),
        6 => row::<6>(nb, w, r, prep),
        7 => row::<7>(nb, w, r, prep),
        _ => row::<FOLD_ROWS>(nb, w, r, prep),
    });
}

/// The accumulators of weight row `r` against the first `NA` of the chunk's prepared
/// activation rows `prep` (the rest are zero).
#[inline(always)]
fn row<const NA: usize>(nb: usize, w: &[u8], r: usize, prep: &[u8]) -> [KAcc; FOLD_ROWS] {
    // Bytes 4l + m of a vector (lane l's elements l + 8m): group `g` for m = 0, 1 and `g + 1`
    // for m = 2, 3, `g` added per field.
    const PICK: [u8; 16] = [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1];
    let wb = block_bytes(Q3);
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
        let q = &g[QUANTS + 96 * h..][..96];
        let xs: [&[u8]; NA] = core::array::from_fn(|t| &prep[(t * nb + b) * 256..][..256]);
        // SAFETY: this path runs only under a Dotprod or I8mm capability (SDOT); the rest is
        // NEON register arithmetic and 16-byte loads inside `g`, `q`, `xs`, `PICK` (bounds-
        // checked by the slices above and `ld`) and `prep` (`yd`: 32 bytes at `yds + 32b`).
        unsafe {
            let ld = |v: &[u8], at: usize| vld1q_u8(v[at..at + 16].as_ptr());
            // The 12 scale bytes at lanes 2..14 of the 16 loaded (inside the group block:
            // row 0's start at byte 8).
            let sc = unpack::q3_k_scales16(ld(g, SCALES - 2 + 12 * h));
            let nsv = vsubq_u8(vdupq_n_u8(32), sc);
            let pick = vld1q_u8(PICK.as_ptr());
            let yd = &prep[yds + 32 * b..][..32];
            let dy = [
                vmulq_n_f32(vld1q_f32(yd.as_ptr().cast::<f32>()), d),
                vmulq_n_f32(vld1q_f32(yd[16..].as_ptr().cast::<f32>()), d),
            ];
            let (m3, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
            for i in 0..2 {
                let mut acc = [vdupq_n_s32(0); NA];
                let hm = ld(q, 16 * i);
                macro_rules! field {
                    ($k:literal, $j:literal, $qs:ident) => {{
                        let f = vandq_u8(vshlq_u8($qs, vdupq_n_s8(-2 * $j)), m3);
                        // q = f - 4 unless the element's hmask bit is set.
                        let set = vtstq_u8(hm, vdupq_n_u8(1 << (4 * $k + $j)));
                        let qv = vsubq_u8(f, vbicq_u8(four, set));
                        let s = vqtbl1q_u8(nsv, vaddq_u8(pick, vdupq_n_u8(8 * $k + 2 * $j)));
                        let wv = vreinterpretq_s8_u8(vmulq_u8(qv, s));
                        // Elements 128k + 32j + 0..32: PERM32 run 4k + j.
                        let at = 32 * (4 * $k + $j) + 16 * i;
                        for (x, a) in xs.iter().zip(acc.iter_mut()) {
                            *a = dotprod::sdot(*a, wv, vreinterpretq_s8_u8(ld(x, at)));
                        }
                    }};
                }
                let qs = ld(q, 32 + 16 * i);
                field!(0, 0, qs);
                field!(0, 1, qs);
                field!(0, 2, qs);
                field!(0, 3, qs);
                let qs = ld(q, 64 + 16 * i);
                field!(1, 0, qs);
                field!(1, 1, qs);
                field!(1, 2, qs);
                field!(1, 3, qs);
                for (t, a) in acc.iter().enumerate() {
                    let lane = vcvtq_f32_s32(vnegq_s32(*a));
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
