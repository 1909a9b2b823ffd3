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
//! batch 2 Q2_K takes `q2k_row_lanes`, 16 rows transposed into one row per lane) and, when
//! the CPU also has AVX512-VBMI (a capability of `dispatch`), Q3_K, Q4_K, Q5_K
//! and Q6_K (`klanes512`); without VBMI those use the shared 32-byte kernels. Q5_0 runs through
//! the Q8_0 kernels on its blocks decoded to Q8_0 (the same dot bit for bit). Types without a
//! path (the other legacy 4/5-bit types, floats) return `false` and the caller falls back to
//! the scalar reference. The i-quants take `iq512` on the AVX-512 tier when the CPU has VBMI (grids
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
    /// Q5_0 weight blocks of the current call as Q8_0 blocks.
    static AS_Q8_0: RefCell<Vec<crate::formats::BlockQ8_0>> = const { RefCell::new(Vec::new()) };
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
    if kind.is_none() && ty != GgmlType::Q8_0 && ty != GgmlType::Q5_0 {
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
        None if ty == GgmlType::Q5_0 => return gemm_q5_0(level, nb, t),
        None => gemm_q8_0(level, nb, t),
    }
    true
}

/// Q5_0 (`nb` blocks per row, `rows, n >= 1`): the weight blocks decoded to the Q8_0 blocks
/// whose dot is the Q5_0 dot bit for bit ([`q5_0_as_q8_0_avx2`]), then the Q8_0 driver.
/// DeepSeek's MLA `attn_k_b` rows are 128 long, so a Q4_K mix stores them as Q5_0 (llama.cpp's
/// fallback), and they were on the scalar reference. False (the scalar reference runs) if the
/// weight bytes are not whole blocks, which a checked `Tile` rules out.
fn gemm_q5_0(level: Level, nb: usize, t: &mut Tile<'_>) -> bool {
    use crate::formats::{BlockQ5_0, BlockQ8_0};
    let Ok(w) = crate::formats::blocks::<BlockQ5_0>(t.w().bytes()) else {
        return false;
    };
    let (rows, n, xp) = (t.rows(), t.n(), t.x().bytes().as_ptr());
    let op = t.out().as_mut_ptr();
    AS_Q8_0.with(|cell| {
        let mut q8 = cell.borrow_mut();
        let zero = BlockQ8_0 {
            d: [0; 2],
            qs: [0; 32],
        };
        q8.resize(w.len(), zero);
        // SAFETY: both x86 tiers require AVX2.
        unsafe { q5_0_as_q8_0_avx2(w, &mut q8) };
        let wp = crate::formats::block_bytes(&q8).as_ptr();
        // SAFETY: the capability for `level` exists; `wp` holds `rows * nb` Q8_0 blocks (one per
        // block of the checked `Tile`'s weights), `xp` `n * nb` Q8_0 activation blocks and `op`
        // `rows * n` floats, as `q8_0_rows` needs.
        unsafe { q8_0_rows(level, nb, rows, n, wp, xp, op) };
    });
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
/// on the AVX-512 tier; below it `q2k512`. At batch 1 the per-block transpose costs more than
/// the reductions it saves (Zen 5: 3.4-4.7 vs 2.9-3.8 ns per row and block; Zen 4, k = 7168, on
/// the thread's CPU clock: 5.16-5.28 vs 5.04-5.06 in cache). At batch 2 the lane kernel wins on
/// that clock (Zen 4, interleaved: 3.50-3.52 -> 3.08-3.10 ns per row, activation and block in
/// cache, 3.93-4.01 -> 3.47-3.73 from DRAM); the earlier "neither wins" came from the
/// tick-quantized clock.
const Q2K_ROW_LANES_MIN: usize = 2;

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
    // SAFETY: the capability for `level` exists; the pointers come from a checked `Tile` (`w`
    // `rows * nb` Q8_0 blocks, `x` `n * nb`, `out` `rows * n` floats).
    unsafe { q8_0_rows(level, nb, rows, n, wp, xp, op) }
}

/// Q5_0 blocks as the Q8_0 blocks with the same scale and quants (`q - 16`, in -16..=15): a
/// Q8_0 dot of them is the Q5_0 dot bit for bit (`ggml_vec_dot_q5_0_q8_0` and `_q8_0_q8_0` both
/// add `(d_w * d_x) * sumi` per block in order, and `sumi` is exact). A block in ~10 AVX2 ops:
/// the 32 high bits spread to one byte each by a byte shuffle and a bit mask, or-ed above the
/// nibbles.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn q5_0_as_q8_0_avx2(x: &[crate::formats::BlockQ5_0], y: &mut [crate::formats::BlockQ8_0]) {
    use core::arch::x86_64::*;
    // byte b of the 32 takes byte b / 8 of qh and tests bit b % 8
    let pick = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let (low4, sixteen) = (_mm_set1_epi8(0x0f), _mm256_set1_epi8(16));
    for (b, o) in x.iter().zip(y.iter_mut()) {
        let qh = _mm256_set1_epi32(i32::from_le_bytes(b.qh));
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bit), bit);
        let h = _mm256_and_si256(set, sixteen);
        // SAFETY: `qs` is 16 bytes, `o.qs` 32.
        let qs = unsafe { _mm_loadu_si128(b.qs.as_ptr().cast()) };
        let lo = _mm_and_si128(qs, low4);
        let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
        let q = _mm256_or_si256(_mm256_set_m128i(hi, lo), h);
        let v = _mm256_sub_epi8(q, sixteen);
        // SAFETY: `o.qs` is 32 bytes.
        unsafe { _mm256_storeu_si256(o.qs.as_mut_ptr().cast(), v) };
        o.d = b.d;
    }
}

/// The Q8_0 drivers over raw rows.
///
/// # Safety
/// The capability for `level` exists (the CPU has its features); `wp` points to `rows * nb`
/// Q8_0 blocks, `xp` to `n * nb` (n >= 1) and `op` to `rows * n` writable floats.
unsafe fn q8_0_rows(
    level: Level,
    nb: usize,
    rows: usize,
    n: usize,
    wp: *const u8,
    xp: *const u8,
    op: *mut f32,
) {
    if level == Level::Avx512 {
        return ACT_TABLE.with(|cell| {
            let mut tab = cell.borrow_mut();
            // SAFETY: the caller's contract; `act_table` fills `tab` with `n * nb` entries.
            unsafe {
                q8_0_512::act_table(xp, n, nb, &mut tab);
                q8_0_512::gemm(nb, wp, rows, xp, n, &tab, op);
            }
        });
    }
    SCALES.with(|cell| {
        let mut yd = cell.borrow_mut();
        // SAFETY: the caller's contract; `act_scales` sizes `yd` for the padded activation count.
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
