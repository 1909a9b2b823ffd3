//! The aarch64 GEMM entry point and the K-quant loops and float epilogues. [`gemm`] routes the
//! 32-element types to `legacy` and the lane-split K-quants on SDOT/SMMLA to `split`; what runs
//! here is Q2_K on every tier (SDOT rows on dotprod and i8mm) and the widening NEON path of the others.
//!
//! Each weight block is unpacked once and used for a chunk of up to [`JC`] activation rows
//! (row-major over weight rows, so each output needs only its own small accumulator). The
//! epilogues repeat ggml's generic float operations in the reference order, lane by lane: every
//! NEON float operation here (`vmulq`, `vaddq`, `vsubq`, `vcvtq`) is the same IEEE operation as
//! the scalar one, and there is no fused multiply-add anywhere.

use crate::formats::kquants::layout::{Q2K_D, Q2K_DMIN};

use super::kquant::{add_lanes, unpack_block, KAcc, Kind, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::legacy::{self, Legacy};
use super::unpack::{self, Unpacked};
use super::{dotprod, neon, Level};
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
    // Q2_K on i8mm runs the SDOT rows: its 2x2 SMMLA tiles (scaled quants paired per block,
    // `q2_k_rows2` until 2026-12-04) predicted slower at every batch once the row loop below
    // was specialized (N2 512 x 32, batch 2 / 4 / 8: tiles 61 / 42 / 40, SDOT 43 / 32 / 31 cycles
    // per 256 weights per row; V2 34 / 23 / 22 against 21 / 16 / 15).
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
    // One copy of the row loop per (level, kind), so the matches inside `kq_row` are resolved
    // at compile time rather than left to the inliner (which once kept them at run time after
    // an unrelated change: Q2_K on dotprod went from 77 to 95 cycles per 256 weights per row at
    // batch 2 under llvm-mca's N2 model).
    macro_rules! rows {
        ($level:expr, $kind:expr) => {
            while r < rows {
                kq_row(
                    $level,
                    $kind,
                    nb,
                    &w[r * wrow..][..wrow],
                    x,
                    n,
                    &mut out[r * n..(r + 1) * n],
                );
                r += 1;
            }
        };
    }
    match (level, kind) {
        (Level::Neon, Kind::Q2) => rows!(Level::Neon, Kind::Q2),
        (Level::Neon, Kind::Q3) => rows!(Level::Neon, Kind::Q3),
        (Level::Neon, Kind::Q4) => rows!(Level::Neon, Kind::Q4),
        (Level::Neon, Kind::Q5) => rows!(Level::Neon, Kind::Q5),
        (Level::Neon, Kind::Q6) => rows!(Level::Neon, Kind::Q6),
        (_, Kind::Q2) => rows!(Level::Dotprod, Kind::Q2),
        (_, Kind::Q3) => rows!(Level::Dotprod, Kind::Q3),
        (_, Kind::Q4) => rows!(Level::Dotprod, Kind::Q4),
        (_, Kind::Q5) => rows!(Level::Dotprod, Kind::Q5),
        (_, Kind::Q6) => rows!(Level::Dotprod, Kind::Q6),
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

/// One weight row against all `n` activation rows (inlined into one copy per `level` and
/// `kind`, see [`gemm`]).
#[inline(always)]
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
