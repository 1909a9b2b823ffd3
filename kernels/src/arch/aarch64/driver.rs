//! The aarch64 GEMM entry point and the K-quant loops and float epilogues. [`gemm`] routes the
//! 32-element types to `legacy` and the lane-split K-quants on SDOT/SMMLA to `split`; what runs
//! here is Q2_K on every tier (SMMLA tiles on i8mm) and the widening NEON path of the others.
//!
//! Each weight block is unpacked once and used for a chunk of up to [`JC`] activation rows
//! (row-major over weight rows, so each output needs only its own small accumulator). The
//! epilogues repeat ggml's generic float operations in the reference order, lane by lane: every
//! NEON float operation here (`vmulq`, `vaddq`, `vsubq`, `vcvtq`) is the same IEEE operation as
//! the scalar one, and there is no fused multiply-add anywhere.

use crate::formats::kquants::layout::{Q2K_D, Q2K_DMIN};
use core::arch::aarch64::*;

use super::kquant::{add_lanes, unpack_block, KAcc, Kind, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::legacy::{self, Legacy};
use super::unpack::{self, Unpacked};
use super::{dotprod, i8mm, neon, Level};
use crate::formats::repack::Layout;
use crate::{GgmlType, Tile};

/// Activation rows processed per unpacked weight block.
const JC: usize = 4;

/// `out[r * n + j] = W[r] . x[j]` over `t` (a type with an aarch64 path, `rows, n, k >= 1`).
pub(crate) fn gemm(level: Level, t: &mut Tile<'_>) {
    let kind = match t.ty() {
        GgmlType::Q8_0 => return legacy::gemm(level, Legacy::Q8_0, t),
        GgmlType::Q4_0 => return legacy::gemm(level, Legacy::Q4_0, t),
        GgmlType::Q5_0 => return legacy::gemm(level, Legacy::Q5_0, t),
        GgmlType::Q4_1 => return legacy::gemm(level, Legacy::Q4_1, t),
        GgmlType::Q5_1 => return legacy::gemm(level, Legacy::Q5_1, t),
        ty => match Kind::of(ty) {
            Some(kind) => kind,
            None => unreachable!("aarch64 driver called for {ty:?} without a path"),
        },
    };
    if t.w().layout() == Layout::Rows4 {
        // Repacked K-quants (`reads_repacked`): Q4_K, Q5_K, Q6_K.
        return super::rows4::gemm(level, kind, t);
    }
    if kind == Kind::Q6 && level == Level::I8mm && t.n() >= super::split::Q6_TILES_FROM {
        return super::split::q6_k_gemm(t);
    }
    if super::split::handles(kind, level) {
        return super::split::gemm(level, kind, t);
    }
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let nb = t.k() / 256;
    let out = t.out();
    let wrow = nb * kind.block_bytes();
    let mut r = 0;
    if level == Level::I8mm && kind == Kind::Q2 && n >= 2 {
        while r + 2 <= rows {
            q2_k_rows2(
                nb,
                [&w[r * wrow..][..wrow], &w[(r + 1) * wrow..][..wrow]],
                x,
                n,
                &mut out[r * n..(r + 2) * n],
            );
            r += 2;
        }
    }
    let level = if level == Level::I8mm {
        Level::Dotprod
    } else {
        level
    };
    if kind == Kind::Q2 && level == Level::Dotprod && n == 1 {
        // A single activation row: nothing to reuse an unpacked block for.
        for (rr, o) in out.iter_mut().enumerate().take(rows).skip(r) {
            *o = q2_k_row1(nb, &w[rr * wrow..][..wrow], x);
        }
        return;
    }
    while r < rows {
        kq_row(
            level,
            kind,
            nb,
            &w[r * wrow..][..wrow],
            x,
            n,
            &mut out[r * n..(r + 1) * n],
        );
        r += 1;
    }
}

/// One block of one (weight row, activation row) pair, reference epilogue included.
#[inline(always)]
fn kq_step(level: Level, kind: Kind, u: &Unpacked, xb: &[u8], acc: &mut KAcc) {
    let xb = &xb[..Q8K_BYTES];
    let yd = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
    let xq = &xb[Q8K_QS..Q8K_BSUMS];
    let bsums = &xb[Q8K_BSUMS..Q8K_BYTES];
    match kind {
        Kind::Q2 => {
            let isum = match level {
                Level::Neon => neon::total16(&u.q, xq, &u.scales),
                // SAFETY: Dotprod/I8mm levels are only built from a capability that proved SDOT;
                // they unpack with `q2_k_scaled` (see `unpack_block`).
                Level::Dotprod | Level::I8mm => unsafe { dotprod::dot256(&u.q, xq) },
            };
            let summs = neon::min_corr(bsums, &u.mins);
            let dall = yd * u.d;
            let dmin = yd * u.dmin;
            acc.sumf += dall * isum as f32 - dmin * summs as f32;
        }
        Kind::Q3 | Kind::Q6 => {
            add_lanes(acc, neon::split16(&u.q, xq, &u.scales), u.d * yd);
        }
        Kind::Q4 | Kind::Q5 => {
            add_lanes(acc, neon::split16(&u.q, xq, &u.scales), u.d * yd);
            let sumi = neon::min_corr(bsums, &u.mins);
            let dmin = u.dmin * yd;
            acc.sumf -= dmin * sumi as f32;
        }
    }
}

/// Q2_K on SDOT, one weight row against one activation row, from the packed blocks
/// (`dotprod::q2_k_block`), with the reference epilogue.
fn q2_k_row1(nb: usize, wrow: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for b in 0..nb {
        let wb = &wrow[b * Kind::Q2.block_bytes()..(b + 1) * Kind::Q2.block_bytes()];
        let xb = &x[b * Q8K_BYTES..(b + 1) * Q8K_BYTES];
        // SAFETY: called only at the Dotprod level (a capability that proved SDOT).
        let (isum, summs) = unsafe { dotprod::q2_k_block(wb, xb) };
        let yd = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        let dall = yd * unpack::f16_at(wb, Q2K_D);
        let dmin = yd * unpack::f16_at(wb, Q2K_DMIN);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// One weight row against all `n` activation rows.
fn kq_row(level: Level, kind: Kind, nb: usize, wrow: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
    let wb = kind.block_bytes();
    let xrow = nb * Q8K_BYTES;
    let mut u = Unpacked::new();
    for jc in (0..n).step_by(JC) {
        let cnt = JC.min(n - jc);
        let mut acc = [KAcc::zero(); JC];
        for b in 0..nb {
            unpack_block(kind, level, &wrow[b * wb..(b + 1) * wb], &mut u);
            for (t, a) in acc.iter_mut().enumerate().take(cnt) {
                let at = (jc + t) * xrow + b * Q8K_BYTES;
                kq_step(level, kind, &u, &x[at..at + Q8K_BYTES], a);
            }
        }
        for (t, a) in acc.iter().enumerate().take(cnt) {
            out[jc + t] = a.finish(kind);
        }
    }
}

/// Four f32 in a vector.
#[inline(always)]
fn f4(v: [f32; 4]) -> float32x4_t {
    // SAFETY: `v` is 4 readable f32.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// Q2_K, i8mm: two weight rows (`w[0]`, `w[1]`) against all activation rows; `out` holds the
/// two output rows (`2 * n`). Pairs of activation rows go through SMMLA tiles, an odd last one
/// through the dotprod core.
fn q2_k_rows2(nb: usize, w: [&[u8]; 2], x: &[u8], n: usize, out: &mut [f32]) {
    const WB: usize = Kind::Q2.block_bytes();
    let xrow = nb * Q8K_BYTES;
    let mut u = [Unpacked::new(), Unpacked::new()];
    let mut pa = i8mm::PairA::new();
    for jc in (0..n).step_by(JC) {
        let cnt = JC.min(n - jc);
        let pairs = cnt / 2;
        // SAFETY: NEON register arithmetic only.
        let mut tile = [unsafe { vdupq_n_f32(0.0) }; JC / 2];
        let mut single = [KAcc::zero(); 2];
        for b in 0..nb {
            unpack::q2_k_scaled(&w[0][b * WB..(b + 1) * WB], &mut u[0]);
            unpack::q2_k_scaled(&w[1][b * WB..(b + 1) * WB], &mut u[1]);
            if pairs > 0 {
                pa.set(&u[0].q, &u[1].q);
            }
            let dw = f4([u[0].d, u[0].d, u[1].d, u[1].d]);
            let mw = f4([u[0].dmin, u[0].dmin, u[1].dmin, u[1].dmin]);
            for (p, t) in tile.iter_mut().enumerate().take(pairs) {
                let a0 = (jc + 2 * p) * xrow + b * Q8K_BYTES;
                let a1 = a0 + xrow;
                let (x0, x1) = (&x[a0..a0 + Q8K_BYTES], &x[a1..a1 + Q8K_BYTES]);
                let yd0 = f32::from_le_bytes([x0[0], x0[1], x0[2], x0[3]]);
                let yd1 = f32::from_le_bytes([x1[0], x1[1], x1[2], x1[3]]);
                let yd = f4([yd0, yd1, yd0, yd1]);
                // SAFETY: this path runs only under the I8mm capability (SMMLA present).
                let isum = unsafe {
                    i8mm::dot256_2x2(&pa, [&x0[Q8K_QS..Q8K_BSUMS], &x1[Q8K_QS..Q8K_BSUMS]])
                };
                let summs = i8mm::min_corr_2x2(
                    [&x0[Q8K_BSUMS..Q8K_BYTES], &x1[Q8K_BSUMS..Q8K_BYTES]],
                    [&u[0].mins, &u[1].mins],
                );
                // SAFETY: NEON register arithmetic only.
                unsafe {
                    // sumf += (y.d * x.d) * isum - (y.d * x.dmin) * summs, lane by lane.
                    let dall = vmulq_f32(yd, dw);
                    let dmin = vmulq_f32(yd, mw);
                    let v = vsubq_f32(
                        vmulq_f32(dall, vcvtq_f32_s32(isum)),
                        vmulq_f32(dmin, vcvtq_f32_s32(summs)),
                    );
                    *t = vaddq_f32(*t, v);
                }
            }
            if cnt % 2 == 1 {
                let at = (jc + cnt - 1) * xrow + b * Q8K_BYTES;
                for (r, a) in single.iter_mut().enumerate() {
                    kq_step(Level::Dotprod, Kind::Q2, &u[r], &x[at..at + Q8K_BYTES], a);
                }
            }
        }
        for (p, t) in tile.iter().enumerate().take(pairs) {
            let mut v = [0.0f32; 4];
            // SAFETY: `v` has room for 4 f32.
            unsafe { vst1q_f32(v.as_mut_ptr(), *t) };
            let j = jc + 2 * p;
            out[j] = v[0];
            out[j + 1] = v[1];
            out[n + j] = v[2];
            out[n + j + 1] = v[3];
        }
        if cnt % 2 == 1 {
            let j = jc + cnt - 1;
            out[j] = single[0].finish(Kind::Q2);
            out[n + j] = single[1].finish(Kind::Q2);
        }
    }
}
