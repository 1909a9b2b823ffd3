//! Q4_K and Q5_K repacked at load (`formats::repack::Layout::Rows4`) on SDOT and USMMLA: each
//! row's operands come out of the lane-pair runs with de-interleaving loads or zips (no table
//! lookups) and are used straight from their registers for several activation rows. SDOT on
//! `unpack::PERM32` with the group scales applied to cumulative integer sums ([`rows4_sdot`]:
//! dotprod, and i8mm for one activation row); on i8mm from [`R4_TILES_FROM`] activation rows
//! the two folded streams on USMMLA 2x2 tiles ([`rows4_mm`]; Q5_K's reach 217: unsigned
//! weights). The activation preparation (`split`'s per-thread scratch and block orders) is
//! shared with the file-order kernels of `split`.

use core::arch::aarch64::*;

use super::kquant::{KAcc, Kind, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::neon::{from_magic, MAGIC_BITS};
use super::split::{lanes8_block, pair_block, perm32_block, CH, SCRATCH};
use super::{dotprod, i8mm, neon, unpack, Level};
use crate::formats::kquants::layout::{block_bytes, Q4, Q5};
use crate::Tile;

/// Repacked (`Layout::Rows4`) K-quants x Q8_K over `t`: Q4_K/Q5_K on [`rows4_mm`]'s tiles on
/// i8mm from [`R4_TILES_FROM`] activation rows, else [`rows4_sdot`]; Q6_K on
/// `rows4_q6::gemm` (SMMLA tiles on i8mm from a few rows, SDOT otherwise).
pub(super) fn gemm(level: Level, kind: Kind, t: &mut Tile<'_>) {
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let nb = t.k() / 256;
    let out = t.out();
    // Q4_K's lanes stay below 2^22 (`neon::MAGIC`), Q5_K's (up to 32 * 1953 * 128) do not.
    let tiles = level == Level::I8mm && n >= R4_TILES_FROM;
    match (kind, tiles) {
        (Kind::Q4, true) => rows4_mm::<false>(nb, w, rows, x, n, out),
        (Kind::Q4, false) => rows4_sdot::<false>(nb, w, rows, x, n, out),
        (Kind::Q5, true) => rows4_mm::<true>(nb, w, rows, x, n, out),
        (Kind::Q5, false) => rows4_sdot::<true>(nb, w, rows, x, n, out),
        (Kind::Q6, _) => super::rows4_q6::gemm(level, nb, w, rows, x, n, out),
        (Kind::Q3, _) => super::rows4_q3::gemm(nb, w, rows, x, n, out),
        // `reads_repacked` admits no other K-quant.
        (Kind::Q2, _) => unreachable!("no repacked {kind:?} path"),
    }
}

/// The 6-bit scales and mins of the row pair `p` of a `Layout::Rows4` Q4_K/Q5_K group block
/// `g` (`formats::unpack_k4_scales` for both rows at once, with table lookups):
/// `([row 2p's 8 scales, row 2p + 1's], [row 2p's 8 mins, row 2p + 1's])`. Scale `j < 4` is
/// `b[j] & 63`, `j >= 4` is `b[j + 4] & 15 | (b[j - 4] >> 6) << 4`; min `j < 4` is `b[j + 4] &
/// 63`, `j >= 4` is `b[j + 4] >> 4 | (b[j] >> 6) << 4` (`b`: the row's 12 scale bytes).
#[inline(always)]
fn k4_scales_pair(g: &[u8], p: usize) -> (uint8x16_t, uint8x16_t) {
    const X: u8 = 0xff; // out of range: TBL gives 0
    const SC_LO: [u8; 16] = [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27];
    const SC_MASK: [u8; 16] = [
        63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
    ];
    const SC_HI: [u8; 16] = [X, X, X, X, 0, 1, 2, 3, X, X, X, X, 16, 17, 18, 19];
    const M_LO: [u8; 16] = [4, 5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 24, 25, 26, 27];
    const M_SHIFT: [i8; 16] = [0, 0, 0, 0, -4, -4, -4, -4, 0, 0, 0, 0, -4, -4, -4, -4];
    const M_HI: [u8; 16] = [X, X, X, X, 4, 5, 6, 7, X, X, X, X, 20, 21, 22, 23];
    // Rows 2p and 2p + 1's scale bytes at 16 + 12h: 16 bytes from each stay inside the block.
    let (r0, r1) = (neon::ld_s8(g, 16 + 24 * p), neon::ld_s8(g, 28 + 24 * p));
    // SAFETY: the constants are 16 readable bytes each; the rest is NEON register arithmetic.
    unsafe {
        let t = uint8x16x2_t(vreinterpretq_u8_s8(r0), vreinterpretq_u8_s8(r1));
        let ld = |c: &[u8; 16]| vld1q_u8(c.as_ptr());
        let top = |idx: &[u8; 16]| vshlq_n_u8::<4>(vshrq_n_u8::<6>(vqtbl2q_u8(t, ld(idx))));
        let sc = vorrq_u8(
            vandq_u8(vqtbl2q_u8(t, ld(&SC_LO)), ld(&SC_MASK)),
            top(&SC_HI),
        );
        let m_lo = vshlq_u8(vqtbl2q_u8(t, ld(&M_LO)), vld1q_s8(M_SHIFT.as_ptr()));
        let m = vorrq_u8(vandq_u8(m_lo, vdupq_n_u8(63)), top(&M_HI));
        (sc, m)
    }
}

/// Q5_K's two vectors of 5-bit quants from a 16-byte quant run `v` (low nibbles: group `2j`,
/// high nibbles: group `2j + 1`) and the matching `qh` bytes `h` (fifth bits `2j`, `2j + 1`):
/// `(v & 15) | bit_2j << 4` by shift-left-and-insert, `(v >> 4) | bit_2j+1 << 4` by
/// shift-right-and-insert.
#[inline(always)]
fn q5_nibbles(v: uint8x16_t, h: uint8x16_t, j: usize) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        let t = vshlq_u8(h, vdupq_n_s8(-2 * j as i8));
        let lo = vsliq_n_u8::<4>(v, vandq_u8(t, vdupq_n_u8(1)));
        let hi = vsriq_n_u8::<4>(vandq_u8(vshlq_n_u8::<3>(t), vdupq_n_u8(16)), v);
        (lo, hi)
    }
}

/// Activation rows from which repacked Q4_K/Q5_K on i8mm take [`rows4_mm`]'s tiles (below:
/// [`rows4_sdot`]).
const R4_TILES_FROM: usize = 2;

/// Activation rows [`rows4_sdot`] runs against each decoded weight row at once.
const S4_ROWS: usize = 4;

/// Bytes per activation row and block of [`rows4_sdot`]'s prepared activations: the 256 quants
/// in `unpack::PERM32` order, then the eight bsum pairs `bsums[2s] + bsums[2s + 1]` (i16).
const S4_PER: usize = 256 + 16;

/// Repacked (`Layout::Rows4`) Q4_K (`FIFTH` false) or Q5_K x Q8_K with SDOT, the scales
/// applied to the integer sums per group of 32 in vector registers (no folded weights). A
/// weight row's 16-byte operand `uzp1/uzp2.4s` of two quant runs of its row pair, `& 15` or
/// `>> 4` (Q5_K: the fifth bits or-ed in), is lanes 0..4 or 4..8 of one group in
/// `unpack::PERM32` order: each SDOT lane sums the four products of one reference lane in one
/// group. The SDOTs of a lane half run as one cumulative chain over the groups (`S_g = C_0 +
/// ... + C_g`, no zeroed register per group), multiplied by the scale differences (`sum_g s_g
/// C_g = sum_g (s_g - s_{g+1}) S_g`, `s_8 = 0`): integer arithmetic, the reference's lanes
/// exactly (Q4_K's start at `MAGIC_BITS`, see `neon::from_magic`). Up to [`S4_ROWS`]
/// activation rows run against each decoded operand. Float epilogue as the reference's:
/// `sums[l] += (d * yd) * lane[l]`, `sumf -= (dmin * yd) * sumi(mins)`, then `sumf + sums[0] +
/// ... + sums[7]`.
#[inline(never)]
fn rows4_sdot<const FIFTH: bool>(
    nb: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) {
    let xrow = nb * Q8K_BYTES;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        // The prepared rows, then each block's `[y0, y1, y2, y3]`.
        let yds = S4_ROWS * nb * S4_PER;
        if scratch.len() < yds + nb * 16 {
            scratch.resize(yds + nb * 16, 0);
        }
        for jc in (0..n).step_by(S4_ROWS) {
            let cnt = S4_ROWS.min(n - jc);
            // Only the chunk's rows: the slots past `cnt` (read by the 4-row kernel at 3 rows,
            // and by the 4-lane load of the `yd`s) keep earlier bytes, whose results are never
            // stored (every lane is independent).
            for t in 0..cnt {
                for b in 0..nb {
                    let xb = &x[(jc + t) * xrow + b * Q8K_BYTES..][..Q8K_BYTES];
                    let dst = &mut scratch[(t * nb + b) * S4_PER..][..S4_PER];
                    perm32_block(&xb[Q8K_QS..Q8K_BSUMS], &mut dst[..256]);
                    let bs = &xb[Q8K_BSUMS..Q8K_BYTES];
                    let yd = &mut scratch[yds + 16 * b + 4 * t..][..4];
                    yd.copy_from_slice(&xb[..4]);
                    // SAFETY: NEON register arithmetic; 32 bytes loaded inside `bs` (bounds-
                    // checked by `neon::ld_s16`), 16 stored inside `dst` (S4_PER = 256 + 16).
                    unsafe {
                        let pr = vpaddq_s16(neon::ld_s16(bs, 0), neon::ld_s16(bs, 16));
                        let dst = &mut scratch[(t * nb + b) * S4_PER + 256..][..16];
                        vst1q_s16(dst.as_mut_ptr().cast::<i16>(), pr);
                    }
                }
            }
            let prep = &scratch[..yds + nb * 16];
            for r in 0..rows {
                let acc = match (cnt, r % 2 == 1) {
                    (1, false) => rows4_sdot_row::<FIFTH, false, 1>(nb, w, r, prep),
                    (1, true) => rows4_sdot_row::<FIFTH, true, 1>(nb, w, r, prep),
                    (2, false) => rows4_sdot_row::<FIFTH, false, 2>(nb, w, r, prep),
                    (2, true) => rows4_sdot_row::<FIFTH, true, 2>(nb, w, r, prep),
                    (_, false) => rows4_sdot_row::<FIFTH, false, S4_ROWS>(nb, w, r, prep),
                    (_, true) => rows4_sdot_row::<FIFTH, true, S4_ROWS>(nb, w, r, prep),
                };
                for (t, a) in acc.into_iter().enumerate().take(cnt) {
                    out[r * n + jc + t] = a.finish(if FIFTH { Kind::Q5 } else { Kind::Q4 });
                }
            }
        }
    });
}

/// [`rows4_sdot`]'s accumulators of weight row `r` (`ODD`: the second of its pair) against the
/// first `NA` of the [`S4_ROWS`] prepared activation rows `prep` (the rest are zero).
#[inline(always)]
fn rows4_sdot_row<const FIFTH: bool, const ODD: bool, const NA: usize>(
    nb: usize,
    w: &[u8],
    r: usize,
    prep: &[u8],
) -> [KAcc; S4_ROWS] {
    let wb = block_bytes(if FIFTH { Q5 } else { Q4 });
    let wrow = nb * wb;
    let yds = S4_ROWS * nb * S4_PER;
    let p = (r % 4) / 2;
    // SAFETY: NEON register arithmetic only.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut lo = [zero; NA];
    let mut hi = [zero; NA];
    let mut sumf = zero;
    for b in 0..nb {
        // Whole groups of four rows (`QMatrix::in_layout` checked it).
        let g = &w[(r / 4) * 4 * wrow + b * 4 * wb..][..4 * wb];
        let (sv, mv) = k4_scales_pair(g, p);
        let h = r % 4;
        let (d, dmin) = (unpack::f16_at(g, 2 * h), unpack::f16_at(g, 8 + 2 * h));
        let qs = &g[if FIFTH { 192 } else { 64 } + 256 * p..][..256];
        let qh = &g[64 + 64 * p..][..64];
        let xs: [&[u8]; NA] = core::array::from_fn(|t| &prep[(t * nb + b) * S4_PER..][..S4_PER]);
        // This row's 16 bytes of the two quant runs at `at` (32 bytes inside `v`): their
        // even (row 2p) or odd (row 2p + 1) 4-byte lanes, de-interleaved by the load.
        let row = |v: &[u8], at: usize| {
            let v = &v[at..at + 32];
            // SAFETY: 32 readable bytes (bounds-checked above).
            let t = unsafe { vld2q_u32(v.as_ptr().cast::<u32>()) };
            // SAFETY: a reinterpretation.
            unsafe { vreinterpretq_u8_u32(if ODD { t.1 } else { t.0 }) }
        };
        // SAFETY: this path runs only under a Dotprod or I8mm capability (SDOT); the rest is
        // NEON register arithmetic and 16-byte loads inside `xs` and `prep` (bounds-checked by
        // `neon::ld_s8`/`ld_s16`, or `yv` below: 16 bytes at `yds + 16b` inside `prep`).
        unsafe {
            let half = |v: uint8x16_t| if ODD { vget_high_u8(v) } else { vget_low_u8(v) };
            let s16 = vreinterpretq_s16_u16(vmovl_u8(half(sv)));
            let m16 = vreinterpretq_s16_u16(vmovl_u8(half(mv)));
            // s_g - s_{g+1} (s_8 = 0), as int32 lanes for the by-element multiplies.
            let ds = vsubq_s16(s16, vextq_s16::<1>(s16, vdupq_n_s16(0)));
            let (ds0, ds1) = (vmovl_s16(vget_low_s16(ds)), vmovl_high_s16(ds));
            let yv = vld1q_f32(prep[yds + 16 * b..][..16].as_ptr().cast::<f32>());
            // The reference's `sumi = sum_j bsums[j] * mins[j / 2]` per activation row.
            let mut part = [vdupq_n_s32(0); 4];
            for (t, pt) in part.iter_mut().enumerate().take(NA) {
                let bp = neon::ld_s16(xs[t], 256);
                *pt = vmlal_high_s16(vmull_s16(vget_low_s16(m16), vget_low_s16(bp)), m16, bp);
            }
            let sumi = neon::sum4(part);
            let dminy = vmulq_n_f32(yv, dmin);
            sumf = vsubq_f32(sumf, vmulq_f32(dminy, vcvtq_f32_s32(sumi)));
            let dy = vmulq_n_f32(yv, d);
            let start = vdupq_n_s32(if FIFTH { 0 } else { MAGIC_BITS });
            // Per activation row: the cumulative SDOT sums and the scaled sums, lanes 0..4 and
            // 4..8.
            let mut cs = [[vdupq_n_s32(0); 2]; NA];
            let mut acc = [[start; 2]; NA];
            let m15 = vdupq_n_u8(15);
            macro_rules! pair {
                ($j:literal, $dv:ident, $l0:literal, $l1:literal) => {{
                    let mut ops = [[vdupq_n_s8(0); 2]; 2];
                    for (hf, o) in ops.iter_mut().enumerate() {
                        let v = row(qs, 64 * $j + 32 * hf);
                        let (l, hg) = if FIFTH {
                            q5_nibbles(v, row(qh, 32 * hf), $j)
                        } else {
                            (vandq_u8(v, m15), vshrq_n_u8::<4>(v))
                        };
                        *o = [vreinterpretq_s8_u8(l), vreinterpretq_s8_u8(hg)];
                    }
                    for (x, (c, a)) in xs.iter().zip(cs.iter_mut().zip(acc.iter_mut())) {
                        for hf in 0..2 {
                            let (c, a) = (&mut c[hf], &mut a[hf]);
                            let x0 = neon::ld_s8(x, 64 * $j + 16 * hf);
                            dotprod::sdot_mla::<$l0>(c, a, ops[hf][0], x0, $dv);
                            let x1 = neon::ld_s8(x, 64 * $j + 32 + 16 * hf);
                            dotprod::sdot_mla::<$l1>(c, a, ops[hf][1], x1, $dv);
                        }
                    }
                }};
            }
            pair!(0, ds0, 0, 1);
            pair!(1, ds0, 2, 3);
            pair!(2, ds1, 0, 1);
            pair!(3, ds1, 2, 3);
            let cvt = |v: int32x4_t| {
                if FIFTH {
                    vcvtq_f32_s32(v)
                } else {
                    from_magic(v)
                }
            };
            macro_rules! epilogue {
                ($t:literal) => {
                    if $t < NA {
                        let a = &acc[$t];
                        lo[$t] = vaddq_f32(lo[$t], vmulq_laneq_f32::<$t>(cvt(a[0]), dy));
                        hi[$t] = vaddq_f32(hi[$t], vmulq_laneq_f32::<$t>(cvt(a[1]), dy));
                    }
                };
            }
            epilogue!(0);
            epilogue!(1);
            epilogue!(2);
            epilogue!(3);
        }
    }
    let mut sf = [0.0f32; 4];
    // SAFETY: `sf` has room for 4 f32.
    unsafe { vst1q_f32(sf.as_mut_ptr(), sumf) };
    core::array::from_fn(|t| {
        if t < NA {
            KAcc::from_parts(lo[t], hi[t], sf[t])
        } else {
            KAcc::zero()
        }
    })
}

/// Bytes per activation pair and block of [`rows4_mm`]'s prepared activations: the 512 bytes
/// of `B` operands ([`pair_block`]), the pair's `[y0, y1, y0, y1]` (f32), then each row's
/// eight bsum pairs `bsums[2s] + bsums[2s + 1]` (i16: at most 2 * 16 * 128 in magnitude).
const R4_PER: usize = 512 + 16 + 32;

/// Where [`R4_PER`]'s `[y0, y1, y0, y1]` and bsum pairs start.
const R4_YD: usize = 512;
const R4_BSUMS: usize = 528;

/// Repacked (`Layout::Rows4`) Q4_K (`Q5` false) or Q5_K x Q8_K on 2x2 USMMLA tiles (i8mm):
/// the weights' scales are folded into two unsigned streams (`q * (scale >> 3)` and `q *
/// (scale & 7)`, at most 15 * 7 (Q4_K) or 31 * 7 (Q5_K), so each reference lane of the four
/// dots of a tile is `8 * hi + lo` of two unmasked USMMLA sums. Unlike `split::k4_mm`, no decoded
/// block is stored: for each block of a weight row pair and each lane pair `i`, the four
/// 16-byte quant runs `(j, i)` of the row pair are unzipped into the `A` operands of lanes
/// `2i`, `2i + 1` (`zip1/zip2.4s(v & 15, v >> 4)`, Q5_K's fifth bits or-ed in), multiplied by
/// the run's scale picks, and run against every activation pair of the chunk at once
/// ([`rows4_pairs`], `NP` pairs), so each decoded operand is used `NP` times straight from its
/// register. The activations are prepared once per chunk ([`R4_PER`] bytes per pair and
/// block). Float epilogue as the reference's, lane by lane: `sums[l] += (d * yd) * lane[l]`,
/// `sumf -= (dmin * yd) * sumi(mins)`, then `sumf + sums[0] + ... + sums[7]`. An odd last
/// activation row is paired with itself; the row count is a multiple of 4 (the layout's).
#[inline(never)]
fn rows4_mm<const FIFTH: bool>(
    nb: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) {
    let xrow = nb * Q8K_BYTES;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = (CH / 2).min(n.div_ceil(2)) * nb * R4_PER;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let mut l8 = [[0u8; 256]; 2];
        for jc in (0..n).step_by(CH) {
            let cnt = CH.min(n - jc);
            let pairs = cnt.div_ceil(2);
            let cols = |p: usize| (2 * p, (2 * p + 1).min(cnt - 1));
            let xb = |t: usize, b: usize| &x[(jc + t) * xrow + b * Q8K_BYTES..][..Q8K_BYTES];
            for p in 0..pairs {
                let (t0, t1) = cols(p);
                for b in 0..nb {
                    let (x0, x1) = (xb(t0, b), xb(t1, b));
                    let dst = &mut scratch[(p * nb + b) * R4_PER..][..R4_PER];
                    lanes8_block(&x0[Q8K_QS..Q8K_BSUMS], &mut l8[0]);
                    lanes8_block(&x1[Q8K_QS..Q8K_BSUMS], &mut l8[1]);
                    pair_block(&l8[0], &l8[1], &mut dst[..512]);
                    let yd = |x: &[u8]| f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                    let yv = [yd(x0), yd(x1), yd(x0), yd(x1)];
                    // SAFETY: NEON register arithmetic; loads of 32 bytes inside each row's bsums
                    // (bounds-checked by `neon::ld_s16`), stores of 16 bytes inside `dst`
                    // (R4_PER bytes: 528 + 32).
                    unsafe {
                        vst1q_f32(
                            dst.as_mut_ptr().add(R4_YD).cast::<f32>(),
                            vld1q_f32(yv.as_ptr()),
                        );
                        for (h, xr) in [x0, x1].into_iter().enumerate() {
                            let bs = &xr[Q8K_BSUMS..Q8K_BYTES];
                            let pr = vpaddq_s16(neon::ld_s16(bs, 0), neon::ld_s16(bs, 16));
                            vst1q_s16(dst.as_mut_ptr().add(R4_BSUMS + 16 * h).cast::<i16>(), pr);
                        }
                    }
                }
            }
            let prep = &scratch[..pairs * nb * R4_PER];
            let o = Outs { out, n, jc, cnt };
            match pairs {
                1 => rows4_pairs::<FIFTH, 1>(nb, w, rows, prep, o),
                2 => rows4_pairs::<FIFTH, 2>(nb, w, rows, prep, o),
                3 => rows4_pairs::<FIFTH, 3>(nb, w, rows, prep, o),
                _ => rows4_pairs::<FIFTH, 4>(nb, w, rows, prep, o),
            }
        }
    });
}

/// Where [`rows4_pairs`] writes: `out[r * n + jc + t]` for the chunk's `cnt` activation rows.
struct Outs<'a> {
    out: &'a mut [f32],
    n: usize,
    jc: usize,
    cnt: usize,
}

/// [`rows4_mm`] for one chunk of `NP` activation pairs (`prep`: `NP * nb` prepared blocks,
/// pair-major).
#[inline(always)]
fn rows4_pairs<const FIFTH: bool, const NP: usize>(
    nb: usize,
    w: &[u8],
    rows: usize,
    prep: &[u8],
    o: Outs<'_>,
) {
    let wb = block_bytes(if FIFTH { Q5 } else { Q4 });
    let wrow = nb * wb;
    // Lanes 0..4 / 4..8 / 8..12 / 12..16 of an operand: row 0 group 2j, row 0 group 2j + 1,
    // row 1 group 2j, row 1 group 2j + 1 (scale bytes 2j, 2j + 1, 8 + 2j, 9 + 2j).
    const PICK: [u8; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 8, 8, 8, 8, 9, 9, 9, 9];
    let mut r = 0;
    while r < rows {
        // SAFETY: NEON register arithmetic only.
        let zero = unsafe { vdupq_n_f32(0.0) };
        let mut sums = [[zero; 8]; NP];
        let mut sumf = [zero; NP];
        for b in 0..nb {
            // Whole groups of four rows (`QMatrix::in_layout` checked it).
            let g = &w[(r / 4) * 4 * wrow + b * 4 * wb..][..4 * wb];
            let p = (r % 4) / 2;
            let (sv, mv) = k4_scales_pair(g, p);
            let (d0, d1) = (unpack::f16_at(g, 4 * p), unpack::f16_at(g, 4 * p + 2));
            let (m0, m1) = (unpack::f16_at(g, 8 + 4 * p), unpack::f16_at(g, 10 + 4 * p));
            let qs = &g[if FIFTH { 192 } else { 64 } + 256 * p..][..256];
            let qh = &g[64 + 64 * p..][..64];
            let bx: [&[u8]; NP] =
                core::array::from_fn(|q| &prep[(q * nb + b) * R4_PER..][..R4_PER]);
            // SAFETY: this path runs only under the I8mm capability (USMMLA); the rest is NEON
            // register arithmetic, loads of 16 bytes inside `PICK`, `qs`, `qh` and `bx` (bounds-
            // checked by `neon::ld_s8`/`ld_s16` or inside the fixed-size arrays) and of the 16
            // bytes at `R4_YD` inside each `bx` (R4_PER bytes).
            unsafe {
                let dw = vld1q_f32([d0, d0, d1, d1].as_ptr());
                let mw = vld1q_f32([m0, m0, m1, m1].as_ptr());
                let (mins0, mins1) = (
                    vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mv))),
                    vreinterpretq_s16_u16(vmovl_high_u8(mv)),
                );
                let mut dy = [zero; NP];
                for q in 0..NP {
                    let yv = vld1q_f32(bx[q].as_ptr().add(R4_YD).cast::<f32>());
                    dy[q] = vmulq_f32(dw, yv);
                    // The reference's `sumi = sum_j bsums[j] * mins[j / 2]`, per dot of the tile.
                    let (b0, b1) = (
                        neon::ld_s16(bx[q], R4_BSUMS),
                        neon::ld_s16(bx[q], R4_BSUMS + 16),
                    );
                    let dot = |m: int16x8_t, b: int16x8_t| {
                        vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(b)), m, b)
                    };
                    let sumi = vpaddq_s32(
                        vpaddq_s32(dot(mins0, b0), dot(mins0, b1)),
                        vpaddq_s32(dot(mins1, b0), dot(mins1, b1)),
                    );
                    let dmin = vmulq_f32(mw, yv);
                    sumf[q] = vsubq_f32(sumf[q], vmulq_f32(dmin, vcvtq_f32_s32(sumi)));
                }
                let (shi, slo) = (vshrq_n_u8::<3>(sv), vandq_u8(sv, vdupq_n_u8(7)));
                let pick = vld1q_u8(PICK.as_ptr());
                let m15 = vdupq_n_u8(15);
                let ld = |b: &[u8], at: usize| vreinterpretq_u8_s8(neon::ld_s8(b, at));
                // Q4_K: the high sums start at MAGIC_BITS / 8, so the lanes are MAGIC_BITS +
                // lane (see `neon::from_magic`).
                let start = vdupq_n_s32(if FIFTH { 0 } else { MAGIC_BITS / 8 });
                for i in 0..4 {
                    let h = ld(qh, 16 * i);
                    // The low stream's operands of runs (0, i)..(3, i), kept for the second
                    // pass: lane 2i's and 2i + 1's.
                    let mut low = [[vdupq_n_s8(0); 2]; 4];
                    // Per pair: lane 2i's and 2i + 1's high sums.
                    let mut acc = [[start; 2]; NP];
                    for (j, lj) in low.iter_mut().enumerate() {
                        let at = vaddq_u8(pick, vdupq_n_u8(2 * j as u8));
                        let (sh, sl) = (vqtbl1q_u8(shi, at), vqtbl1q_u8(slo, at));
                        let v = ld(qs, 64 * j + 16 * i);
                        let (lo, hi) = if FIFTH {
                            q5_nibbles(v, h, j)
                        } else {
                            (vandq_u8(v, m15), vshrq_n_u8::<4>(v))
                        };
                        let (lo, hi) = (vreinterpretq_u32_u8(lo), vreinterpretq_u32_u8(hi));
                        let a0 = vreinterpretq_u8_u32(vzip1q_u32(lo, hi));
                        let a1 = vreinterpretq_u8_u32(vzip2q_u32(lo, hi));
                        let s8 = |v: uint8x16_t| vreinterpretq_s8_u8(v);
                        let (a0h, a1h) = (s8(vmulq_u8(a0, sh)), s8(vmulq_u8(a1, sh)));
                        *lj = [s8(vmulq_u8(a0, sl)), s8(vmulq_u8(a1, sl))];
                        let c = 32 * (4 * j + i);
                        for (q, a) in acc.iter_mut().enumerate() {
                            a[0] = i8mm::usmmla(a[0], a0h, neon::ld_s8(bx[q], c));
                            a[1] = i8mm::usmmla(a[1], a1h, neon::ld_s8(bx[q], c + 16));
                        }
                    }
                    // The low sums start at 8 * the high sums: the lanes themselves.
                    for a in acc.iter_mut() {
                        *a = [vshlq_n_s32::<3>(a[0]), vshlq_n_s32::<3>(a[1])];
                    }
                    for (j, lj) in low.iter().enumerate() {
                        let c = 32 * (4 * j + i);
                        for (q, a) in acc.iter_mut().enumerate() {
                            a[0] = i8mm::usmmla(a[0], lj[0], neon::ld_s8(bx[q], c));
                            a[1] = i8mm::usmmla(a[1], lj[1], neon::ld_s8(bx[q], c + 16));
                        }
                    }
                    for (q, a) in acc.iter().enumerate() {
                        for (e, &lane) in a.iter().enumerate() {
                            let f = if FIFTH {
                                vcvtq_f32_s32(lane)
                            } else {
                                from_magic(lane)
                            };
                            let sl = &mut sums[q][2 * i + e];
                            *sl = vaddq_f32(*sl, vmulq_f32(dy[q], f));
                        }
                    }
                }
            }
        }
        for (q, (sq, fq)) in sums.iter().zip(sumf).enumerate() {
            let mut v = [0.0f32; 4];
            // SAFETY: NEON register arithmetic; `v` has room for 4 f32.
            unsafe {
                // The reference's final `sumf += sums[l]` for l = 0..8.
                let mut f = fq;
                for sl in sq {
                    f = vaddq_f32(f, *sl);
                }
                vst1q_f32(v.as_mut_ptr(), f);
            }
            let (t0, t1) = (2 * q, (2 * q + 1).min(o.cnt - 1));
            let at = o.jc;
            o.out[r * o.n + at + t0] = v[0];
            o.out[r * o.n + at + t1] = v[1];
            o.out[(r + 1) * o.n + at + t0] = v[2];
            o.out[(r + 1) * o.n + at + t1] = v[3];
        }
        r += 2;
    }
}
