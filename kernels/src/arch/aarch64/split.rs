//! The lane-split K-quants (Q3_K, Q4_K, Q5_K) on SDOT and SMMLA. Their references keep eight
//! int32 lanes per block (lane `e % 8`), so a multiply-sum instruction may only ever add
//! products of one lane and, unless the scales are folded into the weights, one scale group.
//! Weights and activations are therefore stored in lane-grouped orders:
//! - Q5_K (dotprod and i8mm): `unpack::PERM32` (each 4-byte SDOT lane is 4 elements of one lane
//!   within a group of 32), SDOT with a by-element multiply-add per group
//!   (`dotprod::split32_perm`);
//! - Q4_K (dotprod, and i8mm for one activation row): the same order with the scales folded
//!   into the weights in two int8 streams (`unpack::q4_k_perm_folded`, `dotprod::folded32`): no
//!   per-group step; on i8mm with two or more activation rows, the two folded streams in Q3_K's
//!   lane-grouped layout (`unpack::q4_k_lanes`) on 2x2 SMMLA tiles ([`k4_mm`]);
//! - Q4_K and Q5_K repacked at load (`formats::repack::Layout::Rows4`): the `rows4` module
//!   (SDOT on PERM32 with scaled cumulative sums, USMMLA tiles), which shares this module's
//!   activation preparation;
//! - file-order Q3_K (dotprod and i8mm; repacked: `rows4_q3`): the scales folded into the weights (`unpack::q3_k_lanes`), so
//!   that 8 elements of one lane share an 8-byte slice: plain SDOT, and unmasked 2x2 SMMLA tiles
//!   ([`q3_k_gemm`]).
//!
//! File-order Q6_K (quant times scale, up to 4096, does not fit int8) stays on the NEON
//! widening core, except on i8mm from [`Q6_TILES_FROM`] activation rows (repacked Q6_K:
//! `rows4_q6`): there the products are split as
//! `64 * hi + lo` into two int8 streams in the lane-grouped layout (`unpack::q6_k_lanes`) and
//! run on [`k4_mm`]'s tiles. Masked SMMLA operands (half of every product zero) and half-padded
//! SDOTs both predicted slower than SMULL/SMLAL on Neoverse N2 and V2
//! (`benches/arm/REPORT.md`), as did masked SMMLA for Q4_K/Q5_K against SDOT; those cores are
//! gone (the SMMLA tiles are unmasked).
//!
//! The activation side is prepared once per chunk of activation rows in a per-thread scratch
//! buffer that only grows; every weight row (pair) then streams past it.

use core::arch::aarch64::*;
use std::cell::RefCell;

use super::kquant::{add_lanes, KAcc, Kind, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::neon::{from_magic, MAGIC_BITS};
use super::unpack::{self, Unpacked};
use super::{dotprod, i8mm, neon, Level};
use crate::formats::kquants::layout::{block_bytes, Q3, Q4, Q6};
use crate::Tile;

/// Activation rows prepared per chunk.
pub(super) const CH: usize = 8;

thread_local! {
    pub(super) static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The block's 256 activation quants in PERM32 order (256 bytes).
pub(super) fn perm32_block(xq: &[u8], dst: &mut [u8]) {
    let xq = &xq[..256];
    let dst = &mut dst[..256];
    for g in 0..8 {
        // SAFETY: 32 readable bytes at `xq[32g..]` and 32 writable at `dst[32g..]` (both slices
        // are 256 bytes, bounds-checked above).
        unsafe {
            let (p0, p1) = unpack::perm32(
                vld1q_u8(xq.as_ptr().add(32 * g)),
                vld1q_u8(xq.as_ptr().add(32 * g + 16)),
            );
            vst1q_u8(dst.as_mut_ptr().add(32 * g), p0);
            vst1q_u8(dst.as_mut_ptr().add(32 * g + 16), p1);
        }
    }
}

/// Whether `kind` at `level` runs here (else the caller uses the widening NEON core).
pub(crate) fn handles(kind: Kind, level: Level) -> bool {
    matches!(
        (kind, level),
        (Kind::Q4 | Kind::Q5 | Kind::Q3, Level::Dotprod | Level::I8mm)
    )
}

/// The float epilogue of one block (reference order: lanes, then Q4_K/Q5_K's min term).
#[inline(always)]
fn epilogue(kind: Kind, acc: &mut KAcc, lanes: (int32x4_t, int32x4_t), u: &Unpacked, xb: &[u8]) {
    let yd = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
    add_lanes(acc, lanes, u.d * yd);
    if matches!(kind, Kind::Q4 | Kind::Q5) {
        let sumi = neon::min_corr(&xb[Q8K_BSUMS..Q8K_BYTES], &u.mins);
        let dmin = u.dmin * yd;
        acc.sumf -= dmin * sumi as f32;
    }
}

/// `kind` x Q8_K over `t` (`rows, n, k >= 1`); `handles(kind, level)` holds.
pub(crate) fn gemm(level: Level, kind: Kind, t: &mut Tile<'_>) {
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let nb = t.k() / 256;
    let out = t.out();
    if kind == Kind::Q3 {
        return q3_k_gemm(level, nb, w, rows, x, n, out);
    }
    if level == Level::I8mm && kind == Kind::Q4 && n >= 2 {
        return k4_mm::<Q4>(nb, w, rows, x, n, out);
    }
    let wb = kind.block_bytes();
    let wrow = nb * wb;
    let xrow = nb * Q8K_BYTES;
    const PER: usize = 256;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = CH.min(n) * nb * PER;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let mut u = Unpacked::new();
        let mut q2 = [0i8; 256];
        for jc in (0..n).step_by(CH) {
            let cnt = CH.min(n - jc);
            for t in 0..cnt {
                for b in 0..nb {
                    let xq = &x[(jc + t) * xrow + b * Q8K_BYTES + Q8K_QS..][..256];
                    perm32_block(xq, &mut scratch[(t * nb + b) * PER..][..PER]);
                }
            }
            let prep = &scratch[..];
            for r in 0..rows {
                let mut acc = [KAcc::zero(); CH];
                for b in 0..nb {
                    match kind {
                        Kind::Q4 => {
                            let wblock = &w[r * wrow + b * wb..][..wb];
                            unpack::q4_k_perm_folded(wblock, &mut u, &mut q2)
                        }
                        _ => unpack::q5_k(&w[r * wrow + b * wb..][..wb], &mut u, true),
                    }
                    for (t, a) in acc.iter_mut().enumerate().take(cnt) {
                        let xb = &x[(jc + t) * xrow + b * Q8K_BYTES..][..Q8K_BYTES];
                        let pb = &prep[(t * nb + b) * PER..][..PER];
                        // SAFETY: the Dotprod and I8mm levels are only built from capabilities
                        // that proved SDOT.
                        let lanes = unsafe {
                            match kind {
                                Kind::Q4 => dotprod::folded32(&u.q, &q2, pb),
                                _ => dotprod::split32_perm(&u.q, pb, &u.scales),
                            }
                        };
                        epilogue(kind, a, lanes, &u, xb);
                    }
                }
                for (t, a) in acc.iter().enumerate().take(cnt) {
                    out[r * n + jc + t] = a.finish(kind);
                }
            }
        }
    });
}

/// 256 activation quants in `unpack::q3_k_lanes`' lane-grouped layout (256 bytes).
pub(super) fn lanes8_block(xq: &[u8], dst: &mut [u8]) {
    let xq = &xq[..256];
    let dst = &mut dst[..256];
    for k in 0..2 {
        // SAFETY: 32 readable bytes at `xq[128k + 32j..]` (xq is 256 bytes, bounds-checked
        // above); 64 writable bytes at `dst[128k + 64jp..]`.
        unsafe {
            let run = |j: usize| {
                let (a, b) = unpack::perm32(
                    vld1q_u8(xq.as_ptr().add(128 * k + 32 * j)),
                    vld1q_u8(xq.as_ptr().add(128 * k + 32 * j + 16)),
                );
                [a, b]
            };
            for jp in 0..2 {
                let c = unpack::lanes8_chunks(run(2 * jp), run(2 * jp + 1));
                for (i, c) in c.into_iter().enumerate() {
                    vst1q_u8(dst.as_mut_ptr().add(16 * (8 * k + 4 * jp + i)), c);
                }
            }
        }
    }
}

/// Two activation rows in the lane-grouped layout interleaved as SMMLA `B` operands (512
/// bytes, the layout of `i8mm::PairA`).
pub(super) fn pair_block(x0: &[u8], x1: &[u8], dst: &mut [u8]) {
    let (x0, x1, dst) = (&x0[..256], &x1[..256], &mut dst[..512]);
    for c in 0..16 {
        let (lo, hi) = i8mm::pair(neon::ld_s8(x0, 16 * c), neon::ld_s8(x1, 16 * c));
        // SAFETY: 32 writable bytes at `dst[32c..]` (dst is 512 bytes, bounds-checked).
        unsafe {
            vst1q_s8(dst.as_mut_ptr().add(32 * c).cast::<i8>(), lo);
            vst1q_s8(dst.as_mut_ptr().add(32 * c + 16).cast::<i8>(), hi);
        }
    }
}

/// Q3_K x Q8_K with the scales folded into the weights (`unpack::q3_k_lanes`): SDOT per
/// (weight row, activation row) on the dotprod tier; 2x2 SMMLA tiles (weight rows x activation
/// rows, an odd last row paired with itself) on i8mm, with the reference's eight float lanes of
/// the four dots of a tile kept lane-major (`sums[l]` is a vector over the tile).
fn q3_k_gemm(level: Level, nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
    const WB: usize = block_bytes(Q3);
    let wrow = nb * WB;
    let xrow = nb * Q8K_BYTES;
    let smmla = level == Level::I8mm;
    // Prepared bytes per block of one activation row (SDOT) or of one pair of rows (SMMLA).
    let per = if smmla { 512 } else { 256 };
    let units = if smmla { CH / 2 } else { CH };
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = units.min(n) * nb * per;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let mut u = [Unpacked::new(), Unpacked::new()];
        let mut pa = i8mm::PairA::new();
        let mut l8 = [[0u8; 256]; 2];
        for jc in (0..n).step_by(CH) {
            let cnt = CH.min(n - jc);
            let xq = |t: usize, b: usize| &x[(jc + t) * xrow + b * Q8K_BYTES + Q8K_QS..][..256];
            let yd = |t: usize, b: usize| {
                let at = (jc + t) * xrow + b * Q8K_BYTES;
                f32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]])
            };
            if !smmla {
                for t in 0..cnt {
                    for b in 0..nb {
                        lanes8_block(xq(t, b), &mut scratch[(t * nb + b) * per..][..per]);
                    }
                }
                for r in 0..rows {
                    let mut acc = [KAcc::zero(); CH];
                    for b in 0..nb {
                        unpack::q3_k_lanes(&w[r * wrow + b * WB..][..WB], &mut u[0]);
                        for (t, a) in acc.iter_mut().enumerate().take(cnt) {
                            let xl = &scratch[(t * nb + b) * per..][..per];
                            // SAFETY: the Dotprod level is only built from a capability that
                            // proved SDOT.
                            let lanes = unsafe { dotprod::lanes8(&u[0].q, xl) };
                            add_lanes(a, lanes, u[0].d * yd(t, b));
                        }
                    }
                    for (t, a) in acc.iter().enumerate().take(cnt) {
                        out[r * n + jc + t] = a.finish(Kind::Q3);
                    }
                }
                continue;
            }
            let pairs = cnt.div_ceil(2);
            let cols = |p: usize| (2 * p, (2 * p + 1).min(cnt - 1));
            for p in 0..pairs {
                let (t0, t1) = cols(p);
                for b in 0..nb {
                    lanes8_block(xq(t0, b), &mut l8[0]);
                    lanes8_block(xq(t1, b), &mut l8[1]);
                    pair_block(&l8[0], &l8[1], &mut scratch[(p * nb + b) * per..][..per]);
                }
            }
            let mut r = 0;
            while r < rows {
                let r1 = if r + 1 < rows { r + 1 } else { r };
                // SAFETY: NEON register arithmetic only.
                let mut sums = [[unsafe { vdupq_n_f32(0.0) }; 8]; CH / 2];
                for b in 0..nb {
                    unpack::q3_k_lanes(&w[r * wrow + b * WB..][..WB], &mut u[0]);
                    if r1 != r {
                        unpack::q3_k_lanes(&w[r1 * wrow + b * WB..][..WB], &mut u[1]);
                    }
                    let u1 = if r1 != r { &u[1] } else { &u[0] };
                    pa.set(&u[0].q, &u1.q);
                    let dw = [u[0].d, u[0].d, u1.d, u1.d];
                    for (p, sp) in sums.iter_mut().enumerate().take(pairs) {
                        let (t0, t1) = cols(p);
                        let (y0, y1) = (yd(t0, b), yd(t1, b));
                        let bx = &scratch[(p * nb + b) * per..][..per];
                        // SAFETY: this path runs only under the I8mm capability (SMMLA); the
                        // rest is NEON register arithmetic on 4 readable f32.
                        unsafe {
                            let l = i8mm::lanes8_2x2(&pa, bx);
                            // d = x.d * y.d per dot; sums[l] += d * aux32[l], lane by lane.
                            let yv = [y0, y1, y0, y1];
                            let d = vmulq_f32(vld1q_f32(dw.as_ptr()), vld1q_f32(yv.as_ptr()));
                            for (s, l) in sp.iter_mut().zip(l) {
                                *s = vaddq_f32(*s, vmulq_f32(d, vcvtq_f32_s32(l)));
                            }
                        }
                    }
                }
                for (p, sp) in sums.iter().enumerate().take(pairs) {
                    let (t0, t1) = cols(p);
                    let mut v = [0.0f32; 4];
                    // SAFETY: NEON register arithmetic; `v` has room for 4 f32.
                    unsafe {
                        // The reference's final `sumf = 0; sumf += sums[l]` for l = 0..8.
                        let mut f = vdupq_n_f32(0.0);
                        for s in sp {
                            f = vaddq_f32(f, *s);
                        }
                        vst1q_f32(v.as_mut_ptr(), f);
                    }
                    out[r * n + jc + t0] = v[0];
                    out[r * n + jc + t1] = v[1];
                    out[r1 * n + jc + t0] = v[2];
                    out[r1 * n + jc + t1] = v[3];
                }
                r = r1 + 1;
            }
        }
    });
}

/// Activation rows from which Q6_K on i8mm takes [`q6_k_gemm`]: below, its per-call decode of
/// the split streams costs more than the NEON widening core saves (`arm_trace` under llvm-mca's
/// N2 model, 512 x 32, cycles per 256 weights per row at batch 2 / 3 / 4: tiles 117 / 90 / 68,
/// widening core 111 / 92 / 83; tiles 62 at batch 5 and 44 at batch 8).
pub(crate) const Q6_TILES_FROM: usize = 4;

/// Q6_K x Q8_K on i8mm with [`Q6_TILES_FROM`] or more activation rows: [`k4_mm`]'s tiles, the
/// weights' scale folded in by `unpack::q6_k_lanes` (a signed high stream of weight 64 on
/// SMMLA, an unsigned low stream on USMMLA).
pub(crate) fn q6_k_gemm(t: &mut Tile<'_>) {
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let nb = t.k() / 256;
    k4_mm::<Q6>(nb, w, rows, x, n, t.out());
}

/// One block of a file-order Q4_K or Q6_K weight row pair, ready for the SMMLA tiles: both quant streams as
/// SMMLA `A` operands, the rows' mins and `[d0, d0, d1, d1]`, `[dmin0, dmin0, dmin1, dmin1]`.
pub(super) struct KPair {
    pub(super) hi: i8mm::PairA,
    pub(super) lo: i8mm::PairA,
    mins: [[i16; 16]; 2],
    pub(super) d: [f32; 4],
    dmin: [f32; 4],
}

impl KPair {
    fn new() -> KPair {
        KPair {
            hi: i8mm::PairA::new(),
            lo: i8mm::PairA::new(),
            mins: [[0; 16]; 2],
            d: [0.0; 4],
            dmin: [0.0; 4],
        }
    }
}

thread_local! {
    /// The decoded blocks of the current Q4_K/Q6_K weight row pair (`k4_mm`).
    static K_PAIRS: RefCell<Vec<KPair>> = const { RefCell::new(Vec::new()) };
}

/// File-order Q4_K x Q8_K (two or more activation rows) and Q6_K x Q8_K ([`q6_k_gemm`]) on 2x2
/// SMMLA tiles (i8mm): the weights in the lane-grouped layout with the scale folded in two
/// streams (`unpack::q4_k_lanes`: unsigned, USMMLA; `unpack::q6_k_lanes`: a signed high stream
/// of weight 64 on SMMLA), so each reference lane of the four dots of a tile is `8 * hi + lo`
/// (Q6_K: `64 * hi + lo`) of two unmasked sums (`i8mm::lanes4_2x2_from`); the activations in
/// the same layout, paired once per chunk. Each weight row pair is decoded once per chunk into
/// a per-thread buffer ([`KPair`] per block), then every activation pair runs over all its
/// blocks with its nine float accumulators in registers. For Q4_K the `hi` sums start at
/// `MAGIC_BITS / 8`, so that `hi << 3` plus the `lo` sums is `MAGIC_BITS + lane` and converts
/// with one subtraction (`neon::from_magic`); for Q6_K, SCVTF. An odd last weight or
/// activation row is paired with itself. Float epilogue as the reference's, lane by lane:
/// `sums[l] += (d * yd) * lane[l]`, `sumf -= (dmin * yd) * sumi(mins)` (Q4_K), then `sumf +
/// sums[0] + ... + sums[7]`.
fn k4_mm<const K: u8>(nb: usize, w: &[u8], rows: usize, x: &[u8], n: usize, out: &mut [f32]) {
    let wb = block_bytes(K);
    let wrow = nb * wb;
    let mut u = [Unpacked::new(), Unpacked::new()];
    let mut q2 = [[0i8; 256]; 2];
    k4_tiles::<K>(nb, rows, x, n, out, |r, r1, b, blk| {
        // GGUF order: Q4_K or Q6_K (`gemm` routes no other here).
        let lanes = if K == Q6 {
            unpack::q6_k_lanes
        } else {
            unpack::q4_k_lanes
        };
        let i1 = usize::from(r1 != r);
        lanes(&w[r * wrow + b * wb..][..wb], &mut u[0], &mut q2[0]);
        if i1 == 1 {
            let (u1, q21) = (&mut u[1], &mut q2[1]);
            lanes(&w[r1 * wrow + b * wb..][..wb], u1, q21);
        }
        blk.hi.set(&u[0].q, &u[i1].q);
        blk.lo.set(&q2[0], &q2[i1]);
        blk.mins = [u[0].mins, u[i1].mins];
        blk.d = [u[0].d, u[0].d, u[i1].d, u[i1].d];
        blk.dmin = [u[0].dmin, u[0].dmin, u[i1].dmin, u[i1].dmin];
    });
}

/// [`k4_mm`]'s tiles over weight row pairs that `decode(r, r1, b, blk)` writes into `blk`
/// (block `b` of rows `r`, `r1`; `r1 == r` for an odd last row): the activation pairing and
/// every activation pair's float epilogue. Also the tiles of repacked Q6_K
/// (`rows4_q6::q6_mm`), whose decode reads `Layout::Rows4`.
pub(super) fn k4_tiles<const K: u8>(
    nb: usize,
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
    mut decode: impl FnMut(usize, usize, usize, &mut KPair),
) {
    const PER: usize = 512;
    let xrow = nb * Q8K_BYTES;
    SCRATCH.with(|s| {
        K_PAIRS.with(|wp| {
            let mut scratch = s.borrow_mut();
            let need = (CH / 2).min(n.div_ceil(2)) * nb * PER;
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let mut wp = wp.borrow_mut();
            if wp.len() < nb {
                wp.resize_with(nb, KPair::new);
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
                        lanes8_block(&xb(t0, b)[Q8K_QS..Q8K_BSUMS], &mut l8[0]);
                        lanes8_block(&xb(t1, b)[Q8K_QS..Q8K_BSUMS], &mut l8[1]);
                        pair_block(&l8[0], &l8[1], &mut scratch[(p * nb + b) * PER..][..PER]);
                    }
                }
                let mut r = 0;
                while r < rows {
                    let r1 = if r + 1 < rows { r + 1 } else { r };
                    for (b, blk) in wp.iter_mut().enumerate().take(nb) {
                        decode(r, r1, b, blk);
                    }
                    for p in 0..pairs {
                        let (t0, t1) = cols(p);
                        // SAFETY: NEON register arithmetic only.
                        let zero = unsafe { vdupq_n_f32(0.0) };
                        let mut sums = [zero; 8];
                        let mut sumf = zero;
                        for (b, blk) in wp.iter().enumerate().take(nb) {
                            let (x0, x1) = (xb(t0, b), xb(t1, b));
                            let yd = |x: &[u8]| f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                            let yv = [yd(x0), yd(x1), yd(x0), yd(x1)];
                            let bx = &scratch[(p * nb + b) * PER..][..PER];
                            // SAFETY: this path runs only under the I8mm capability (SMMLA);
                            // the rest is NEON register arithmetic on 4 readable f32.
                            unsafe {
                                let yv = vld1q_f32(yv.as_ptr());
                                let d = vmulq_f32(vld1q_f32(blk.d.as_ptr()), yv);
                                let start =
                                    [vdupq_n_s32(if K == Q4 { MAGIC_BITS / 8 } else { 0 }); 4];
                                // The high stream's weight: 8 (Q4_K, Q5_K) or 64 (Q6_K).
                                let shift = |v: int32x4_t| {
                                    if K == Q6 {
                                        vshlq_n_s32::<6>(v)
                                    } else {
                                        vshlq_n_s32::<3>(v)
                                    }
                                };
                                let cvt = |l: int32x4_t| {
                                    if K == Q4 {
                                        from_magic(l)
                                    } else {
                                        vcvtq_f32_s32(l)
                                    }
                                };
                                let hi = if K == Q6 {
                                    i8mm::lanes4_2x2_from::<0, true>(&blk.hi, bx, start)
                                } else {
                                    i8mm::lanes4_2x2_from::<0, false>(&blk.hi, bx, start)
                                };
                                let lo_start = hi.map(&shift);
                                let lanes =
                                    i8mm::lanes4_2x2_from::<0, false>(&blk.lo, bx, lo_start);
                                for (sl, l) in sums[..4].iter_mut().zip(lanes) {
                                    *sl = vaddq_f32(*sl, vmulq_f32(d, cvt(l)));
                                }
                                let hi = if K == Q6 {
                                    i8mm::lanes4_2x2_from::<1, true>(&blk.hi, bx, start)
                                } else {
                                    i8mm::lanes4_2x2_from::<1, false>(&blk.hi, bx, start)
                                };
                                let lo_start = hi.map(shift);
                                let lanes =
                                    i8mm::lanes4_2x2_from::<1, false>(&blk.lo, bx, lo_start);
                                for (sl, l) in sums[4..].iter_mut().zip(lanes) {
                                    *sl = vaddq_f32(*sl, vmulq_f32(d, cvt(l)));
                                }
                                // Q6_K has no min term (its `sumf` stays the reference's 0).
                                if K != Q6 {
                                    let summs = i8mm::min_corr_2x2(
                                        [&x0[Q8K_BSUMS..Q8K_BYTES], &x1[Q8K_BSUMS..Q8K_BYTES]],
                                        [&blk.mins[0], &blk.mins[1]],
                                    );
                                    let dmin = vmulq_f32(vld1q_f32(blk.dmin.as_ptr()), yv);
                                    sumf = vsubq_f32(sumf, vmulq_f32(dmin, vcvtq_f32_s32(summs)));
                                }
                            }
                        }
                        let mut v = [0.0f32; 4];
                        // SAFETY: NEON register arithmetic; `v` has room for 4 f32.
                        unsafe {
                            let mut f = sumf;
                            for sl in sums {
                                f = vaddq_f32(f, sl);
                            }
                            vst1q_f32(v.as_mut_ptr(), f);
                        }
                        out[r * n + jc + t0] = v[0];
                        out[r * n + jc + t1] = v[1];
                        out[r1 * n + jc + t0] = v[2];
                        out[r1 * n + jc + t1] = v[3];
                    }
                    r = r1 + 1;
                }
            }
        })
    });
}
