//! x86_64 tiers: AVX2 and AVX-512-VNNI GEMM paths for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (x Q8_K) and
//! Q8_0 (x Q8_0), bit-identical to the scalar reference.
//!
//! Each tier is a capability type constructed only when the CPU has the features, so the
//! `#[target_feature]` functions behind it are sound to call. A call packs the activation rows
//! once (into a thread-local scratch buffer that is reused, not reallocated, across calls), then
//! unpacks every weight block once and runs it against all activation rows; see `kquant` and
//! `q8_0` for how the integer work is arranged so that the float epilogue follows the reference
//! exactly. The AVX-512-VNNI tier has its own Q8_0 kernel (`q8_0_512`: 16 rows transposed
//! into one row per lane, no horizontal sums) and 64-byte kernels with 8-row tiles for Q2_K
//! (`q2k512`, built twice: with AVX512-VBMI its scale table is one `vpermb` lookup; from
//! batch 3 Q2_K takes `q2k_row_lanes`, 16 rows transposed into one row per lane) and, when
//! the CPU also has AVX512-VBMI (a capability of `dispatch`), Q3_K, Q4_K, Q5_K
//! and Q6_K (`klanes512`); without VBMI those use the shared 32-byte kernels. Types
//! without a path (legacy 4/5-bit, floats) return `false` and the caller falls back to the
//! scalar reference. The i-quants take `iq512` on the AVX-512 tier when the CPU has VBMI (grids
//! decoded in registers, one decode per unit for all activation rows), otherwise `iq` (AVX2 on
//! both tiers), as do the ternary types.

mod avx2;
mod avx512vnni;
mod iq;
mod iq512;
mod kblock;
mod klanes512;
mod kquant;
mod q2k512;
mod q2k_row_lanes;
mod q8_0;
mod q8_0_512;
mod unpack;

use std::cell::RefCell;

use crate::{GgmlType, Tile};
use kblock::KArgs;

thread_local! {
    /// Packed activations (K-quants) for the current call.
    static PACKED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Q8_0 activation scales for the current call.
    static SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Q8_0 activation scales and offset corrections for the current call (AVX-512 tier).
    static ACT_TABLE: RefCell<Vec<(f32, i32)>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Avx2,
    Avx512,
}

capability_tier!(
    /// AVX2 capability: only constructible when the CPU has AVX2 + FMA + F16C.
    Avx2,
    detect: {
        let f = crate::dispatch::x86_features();
        f.avx2 && f.fma && f.f16c
    },
    run: gemm_block(Level::Avx2)
);

capability_tier!(
    /// AVX-512-VNNI capability (AVX-512F/BW/VL + VNNI, and AVX2 + F16C).
    Avx512Vnni,
    detect: {
        let f = crate::dispatch::x86_features();
        f.avx2 && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni
    },
    run: gemm_block(Level::Avx512)
);

/// The K-quant kind code used by `kquant`, if `ty` has a path here.
fn kquant_kind(ty: GgmlType) -> Option<u8> {
    crate::formats::kquants::layout::KKind::of(ty).map(|k| k as u8)
}

/// Runs the tier's path for `t`. Only called with a `Level` whose capability value exists (so
/// the CPU has its features); the raw-pointer kernels below read within the extents that
/// `Tile` guarantees.
fn gemm_block(level: Level, t: &mut Tile<'_>) -> bool {
    let ty = t.ty();
    if ty.decodes_by_unit() {
        if level == Level::Avx512 && vbmi_enabled() {
            // SAFETY: the AVX-512 tier's capability means AVX-512 F/BW/VL + VNNI, AVX2 and
            // F16C, and `vbmi_enabled` that the CPU has VBMI: all `iq512` needs.
            if unsafe { iq512::gemm(t) } {
                return true;
            }
        }
        // SAFETY: `gemm_block` runs only for a level whose capability exists; both x86 tiers
        // require AVX2, all the i-quant path uses.
        return unsafe { iq::gemm(t) };
    }
    let kind = kquant_kind(ty);
    if kind.is_none() && ty != GgmlType::Q8_0 {
        return false;
    }
    let (rows, n) = (t.rows(), t.n());
    if rows == 0 || n == 0 {
        return true;
    }
    let nb = t.k() / ty.block_len();
    if nb == 0 {
        t.out().fill(0.0);
        return true;
    }
    match kind {
        Some(kind) => gemm_kquant(level, kind, nb, t),
        None => gemm_q8_0(level, nb, t),
    }
    true
}

/// K-quants (`nb` blocks per row, `rows, n >= 1`): pack the activations, then the tier's
/// monomorphised driver.
fn gemm_kquant(level: Level, kind: u8, nb: usize, t: &mut Tile<'_>) {
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let out = t.out().as_mut_ptr();
    PACKED.with(|cell| {
        let mut packed = cell.borrow_mut();
        packed.resize(n * nb * 256, 0);
        let (x, pp, blocks) = (x.as_ptr(), packed.as_mut_ptr(), n * nb);
        let a = KArgs {
            nb,
            w: w.as_ptr(),
            rows,
            x,
            xp: pp,
            n,
            out,
        };
        // SAFETY: the capability for `level` exists, so the CPU has AVX2 (and AVX-512 for
        // `Level::Avx512`, plus VBMI where `vbmi_enabled` says so); `a` describes a checked
        // `Tile` (`x` holds `n * nb` Q8_K blocks, `w` `rows * nb` blocks of `kind`, `out`
        // `rows * n` floats) and `packed` was sized for `n * nb` packed blocks
        // (`q2k_row_lanes` reads the raw activations and needs `fits(nb)`, checked before it).
        unsafe {
            if level == Level::Avx512 && kind == kblock::Q2 {
                if n >= Q2K_ROW_LANES_MIN && q2k_row_lanes::fits(nb) {
                    return q2k_row_lanes::gemm(a);
                }
                q2k512::pack(x, blocks, pp);
                if vbmi_enabled() {
                    q2k512::vbmi::gemm(a);
                } else {
                    q2k512::base::gemm(a);
                }
                return;
            }
            // The Q3_K..Q6_K 64-byte paths also need AVX512-VBMI (`vpermb`); without it the
            // tier keeps the shared 32-byte kernels below.
            if level == Level::Avx512 && vbmi_enabled() {
                macro_rules! lanes {
                    ($k:expr) => {{
                        klanes512::pack::<{ $k }>(x, blocks, pp);
                        klanes512::gemm::<{ $k }>(a);
                    }};
                }
                match kind {
                    kblock::Q3 => return lanes!(kblock::Q3),
                    kblock::Q4 => return lanes!(kblock::Q4),
                    kblock::Q5 => return lanes!(kblock::Q5),
                    kblock::Q6 => return lanes!(kblock::Q6),
                    _ => {}
                }
            }
            kquant::pack_q8k(x, blocks, kblock::signed(kind), pp);
            macro_rules! run {
                ($k:expr) => {
                    match level {
                        Level::Avx2 => avx2::gemm_k::<{ $k }>(a),
                        Level::Avx512 => avx512vnni::gemm_k::<{ $k }>(a),
                    }
                };
            }
            match kind {
                kblock::Q2 => run!(kblock::Q2),
                kblock::Q3 => run!(kblock::Q3),
                kblock::Q4 => run!(kblock::Q4),
                kblock::Q5 => run!(kblock::Q5),
                _ => run!(kblock::Q6),
            }
        }
    });
}

/// From this many activation rows on, Q2_K takes the one-row-per-lane kernel (`q2k_row_lanes`)
/// on the AVX-512 tier; below it `q2k512`. Measured on Zen 5 (`x86_gemm`, k = 7168, load 10-13,
/// interleaved, ns per row and block): at batch 1 the per-block transpose costs more than the
/// reductions it saves (3.4-4.7 vs 2.9-3.8); at batch 2 neither wins (the medians went either
/// way over four sets of runs, in cache and from DRAM); from 3 on the lane kernel is ahead.
const Q2K_ROW_LANES_MIN: usize = 3;

/// Q8_0 (`nb` blocks per row, `rows, n >= 1`): the activation tables, then the tier's driver
/// (AVX-512: the 16-row kernel `q8_0_512`).
fn gemm_q8_0(level: Level, nb: usize, t: &mut Tile<'_>) {
    let (rows, n, wp, xp) = (
        t.rows(),
        t.n(),
        t.w().bytes().as_ptr(),
        t.x().bytes().as_ptr(),
    );
    let op = t.out().as_mut_ptr();
    if level == Level::Avx512 {
        return ACT_TABLE.with(|cell| {
            let mut tab = cell.borrow_mut();
            // SAFETY: the AVX-512 capability exists (CPU features present); the pointers come
            // from a checked `Tile` (`w` `rows * nb` Q8_0 blocks, `x` `n * nb`, `out` `rows * n`
            // floats) and `act_table` fills `tab` with `n * nb` entries.
            unsafe {
                q8_0_512::act_table(xp, n, nb, &mut tab);
                q8_0_512::gemm(nb, wp, rows, xp, n, &tab, op);
            }
        });
    }
    SCALES.with(|cell| {
        let mut yd = cell.borrow_mut();
        // SAFETY: the capability for `level` exists (CPU features present); the pointers come
        // from a checked `Tile`: `w` holds `rows * nb` Q8_0 blocks, `x` `n * nb` blocks
        // (n >= 1) and `out` `rows * n` floats; `act_scales` sizes `yd` for the padded
        // activation count.
        unsafe {
            q8_0::act_scales(xp, n, nb, &mut yd);
            avx2::gemm_q8_0(nb, wp, rows, xp, n, yd.as_ptr(), op);
        }
    });
}

/// Whether the AVX512-VBMI kernels may run: the CPU has it and `NIGHTSHIFT_X86_VBMI=off` does not
/// withhold it (see [`crate::dispatch::X86Features`]).
fn vbmi_enabled() -> bool {
    crate::dispatch::x86_features().avx512vbmi
}
