//! aarch64 tiers: NEON, dotprod (SDOT) and i8mm (SMMLA), each a capability type that can only be
//! built on a CPU that has the feature, with one entry point `gemm_block`.
//!
//! Every tier reproduces the scalar reference bit for bit. The K-quant references (ggml's
//! generic dots) keep eight int32 lanes per block, lane `l` holding the elements `e` with
//! `e % 8 == l`, and round `d * lane` into eight float sums: the SIMD cores therefore produce
//! exactly those eight lanes (any integer order is fine), and the float epilogue in
//! [`driver`] repeats the reference's float operations one by one (multiply then add, never a
//! fused multiply-add). Layout of the work:
//! - [`unpack`]: one weight block -> 256 signed int8 values in element order plus per-16 scales
//!   and mins (NEON, shared by every tier);
//! - [`neon`], [`dotprod`], [`i8mm`]: the integer cores of each tier;
//! - [`driver`]: the loops over weight rows, activation rows and blocks, and the epilogues;
//! - [`kquant`]: what `driver` and `split` share (kinds, Q8_K layout, the float accumulator);
//! - [`legacy`]: Q8_0/Q4_0/Q5_0 x Q8_0 and Q4_1/Q5_1 x Q8_1 (one integer per block of 32: SDOT/SMMLA apply as is);
//!   [`legacy_mm`] and [`legacy_dot`]: their dotprod and i8mm tiers (IQ4_NL and MXFP4 too, their
//!   codes by `TBL`), 4 weight rows x 8 activation rows per decoded block (SMMLA tiles of two
//!   row pairs x four activation pairs; SDOT quads);
//! - [`split`]: Q3_K/Q4_K/Q5_K on SDOT (and Q3_K, Q4_K, Q5_K, Q6_K on SMMLA), with lane-grouped element
//!   orders so that a multiply-sum instruction never mixes two reference lanes;
//!   [`rows4`], [`rows4_q3`], [`rows4_q6`]: the same for Q4_K/Q5_K, Q3_K and Q6_K weights
//!   repacked at load.
//!
//! Integer-to-float conversions of sums below 2^22 in magnitude use `neon::from_magic` (the
//! accumulator starts at a float's bits, one subtraction converts it exactly) instead of SCVTF,
//! which Neoverse N2 issues on one vector pipe only, at half rate.
//!
//! Where a quant times its group scale fits in int8 (Q2_K: 0..=45; Q3_K with the scale negated:
//! -128..=124) the scales are folded into the unpacked weights, so the integer cores are plain
//! dot products with no per-group step ("scales folded"; for Q3_K in the `LANES8` layout of
//! `unpack::q3_k_lanes`, where each 8-byte slice is 8 elements of one reference lane). Scale
//! vectors are built with vector shuffles and applied by element: moving a general register
//! into a vector (`dup v, w`) costs three cycles on Neoverse N2 (`benches/arm/REPORT.md`).
//!
//! Which instruction serves which type (every cell is bit-identical to the scalar reference):
//!
//! | type  | neon        | dotprod               | i8mm                                  |
//! |-------|-------------|-----------------------|---------------------------------------|
//! | Q2_K  | SMULL/SMLAL | SDOT, scales folded   | SDOT as dotprod                       |
//! | Q3_K  | SMULL/SMLAL | SDOT, LANES8 (repacked: SDOT, scales folded, 8 acts per decode) | SMMLA 2x2 tiles, LANES8 (repacked: SDOT as dotprod) |
//! | Q4_K  | SMULL/SMLAL | SDOT, PERM32, folded (repacked: SDOT on PERM32, scaled sums) | USMMLA 2x2 tiles, LANES8, folded x2 (n = 1: SDOT; repacked, n = 1: SDOT on PERM32, scaled sums) |
//! | Q5_K  | SMULL/SMLAL | SDOT on PERM32        | SDOT on PERM32 (repacked, n >= 2: USMMLA 2x2 tiles, LANES8, folded x2) |
//! | Q6_K  | SMULL/SMLAL | SMULL/SMLAL (repacked: SDOT, masked activations, scaled sums; n >= 4: SDOT, products split x2) | SMULL/SMLAL; n >= 4: SMMLA+USMMLA 2x2 tiles, LANES8, products split x2 (repacked: n < 4 SDOT as dotprod, n >= 4 the same tiles decoded from the repack) |
//! | Q8_0  | SMULL+SADALP| SDOT, 4 rows x 8 acts | SMMLA, 4 rows x 8 acts (n = 1: SDOT)  |
//! | Q4_0  | SMULL+SADALP| SDOT, 4 rows x 8 acts | SMMLA, 4 rows x 8 acts (n = 1: SDOT)  |
//! | Q5_0  | SMULL+SADALP| SDOT, 4 rows x 8 acts | SMMLA, 4 rows x 8 acts (n = 1: SDOT)  |
//! | Q4_1  | SMULL+SADALP| SDOT, 4 rows x 8 acts | SMMLA, 4 rows x 8 acts (n = 1: SDOT)  |
//! | Q5_1  | SMULL+SADALP| SDOT, 4 rows x 8 acts | SMMLA, 4 rows x 8 acts (n = 1: SDOT)  |
//! | IQ4_NL, MXFP4 | SMULL+SADDLP | SDOT, 4 rows x 8 acts (codes by TBL) | SMMLA, 4 rows x 8 acts (n = 1: SDOT) |
//! | IQ2_XXS, IQ2_XS, IQ3_XXS | SMULL+SADDLP, NEON decode | SDOT, decode fused | SDOT, decode fused |
//! | IQ2_S, IQ1_S, IQ1_M, IQ4_XS | SMULL+SADDLP | SDOT, decode fused | SDOT, decode fused |
//! | other IQ*, TQ*, NVFP4, Q1_0, Q2_0 | SMULL+SADDLP | SDOT | SDOT |
//!
//! Q8_0, Q4_0, IQ4_NL, MXFP4, Q3_K, Q4_K, Q5_K and Q6_K also have dotprod/i8mm paths for weights repacked at load
//! (`formats::repack::Layout::Rows4`, see `legacy_mm` and `rows4`): the same tiles with their
//! operands loaded (Q4_K/Q5_K: unpacked with zips and de-interleaving loads, no table lookups),
//! not interleaved per call; repacked Q4_K/Q5_K take SDOT with the group scales applied to
//! the integer sums (one activation row on i8mm, every count on dotprod) and USMMLA tiles from
//! two activation rows on i8mm, each decoded operand used for several activation rows
//! straight from its register; repacked Q3_K and Q6_K take SDOT on both tiers at every count
//! ([`rows4_q3`]: the scales folded as decoded, each decoded vector against up to 8 activation
//! rows; [`rows4_q6`]: below 5 activation rows two SDOTs per decoded operand against masked
//! activation copies, one group each, from 5 the products folded and split in two streams).
//! NEON declines repacked weights ([`reads_repacked`]).
//!
//! The i-quants and ternary types ([`iq`]) decode each block to signed bytes with the portable
//! `arch::iq_tile` (IQ2_XXS, IQ2_XS, IQ3_XXS: with the NEON decoders of [`iq_decode`]) and
//! need only 16-element group sums from a core; on SDOT, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ1_S, IQ1_M and IQ4_XS skip the decoded copy: `iq_decode` fuses their decode into the dot
//! products.
//!
//! The loops walk the weight rows one (or two adjacent) at a time, a sequential stream the
//! hardware prefetchers follow, so unlike the x86 tiers (`x86_64::kblock::prefetch_span`) they
//! issue no prefetch hints.

// Kernel signatures mirror the gemm contract; index loops over fixed-size groups read clearer.
#![allow(clippy::needless_range_loop)]

mod dotprod;
mod driver;
mod i8mm;
mod iq;
mod iq_decode;
mod kquant;
mod legacy;
mod legacy_dot;
mod legacy_mm;
mod neon;
mod rows4;
mod rows4_q3;
mod rows4_q6;
mod split;
mod unpack;

use crate::formats::repack::Layout;
use crate::{GgmlType, Tile};

/// Which integer cores a `gemm_block` call uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Neon,
    Dotprod,
    I8mm,
}

/// The weight types with an aarch64 path.
fn has_path(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q4_1
            | GgmlType::Q5_1
    )
}

/// Whether `level` has a path for `ty` weights repacked by `formats::repack` ([`Layout::Rows4`]:
/// Q8_0, Q4_0, IQ4_NL and MXFP4 on the SDOT and SMMLA tiers, `legacy_mm`; Q3_K, Q4_K, Q5_K and Q6_K on both,
/// `rows4`, `rows4_q3` and `rows4_q6`), so
/// that resident copies for `level` are repacked (`dispatch::resident_layout_for`): every such
/// path is predicted faster than the file order's (`benches/arm/REPORT.md`).
pub(crate) fn reads_repacked(level: Level, ty: GgmlType) -> bool {
    level != Level::Neon
        && matches!(
            ty,
            GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::IQ4_NL
                | GgmlType::MXFP4
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
}

/// Runs `level`'s path for `t`; false when it has none for the tile's type (or its layout).
fn run(level: Level, t: &mut Tile<'_>) -> bool {
    // IQ4_NL and MXFP4 keep one integer per 32-element block, as Q8_0 does: on SDOT and SMMLA
    // they take `legacy_mm`'s quads and tiles (their codes through a table), on NEON `iq`.
    let by_block = match t.ty() {
        GgmlType::IQ4_NL => Some(legacy::Legacy::Iq4Nl),
        GgmlType::MXFP4 => Some(legacy::Legacy::Mxfp4),
        _ => None,
    };
    if let Some(ty) = by_block.filter(|_| level != Level::Neon) {
        if t.w().layout() != Layout::Gguf && !reads_repacked(level, t.ty()) {
            return false;
        }
        if t.rows() == 0 || t.n() == 0 || t.k() == 0 {
            t.out().fill(0.0);
            return true;
        }
        legacy_mm::gemm(level, ty, t);
        return true;
    }
    if t.ty().decodes_by_unit() {
        // SAFETY: `run` is only reached through `level`'s capability value.
        return unsafe { iq::gemm(level, t) };
    }
    if !has_path(t.ty()) {
        return false;
    }
    if t.w().layout() != Layout::Gguf && !reads_repacked(level, t.ty()) {
        return false;
    }
    if t.rows() == 0 || t.n() == 0 || t.k() == 0 {
        t.out().fill(0.0);
        return true;
    }
    driver::gemm(level, t);
    true
}

capability_tier!(
    /// NEON (Advanced SIMD) capability.
    Neon,
    detect: crate::dispatch::aarch64_features().neon,
    run: run(Level::Neon)
);

capability_tier!(
    /// NEON + SDOT capability.
    Dotprod,
    detect: {
        let f = crate::dispatch::aarch64_features();
        f.neon && f.dotprod
    },
    run: run(Level::Dotprod)
);

capability_tier!(
    /// NEON + SDOT + SMMLA capability.
    I8mm,
    detect: {
        let f = crate::dispatch::aarch64_features();
        f.neon && f.dotprod && f.i8mm
    },
    run: run(Level::I8mm)
);
