//! IQ4_XS, IQ4_NL, MXFP4, NVFP4, Q1_0 and Q2_0 on the AVX-512-VNNI tier (VBMI CPUs, beside the grid
//! kinds of `iq512`): biased weights, one weight row per lane for the float epilogue. MXFP4 is IQ4_NL
//! with another table (`KVALUES_FP4`) and an E8M0 block scale instead of an f16 one. NVFP4
//! (`Nl4::SPLIT`) has a float step per 16 elements: its two 8-byte sub-blocks per 32 elements
//! are put back in element order by one 64-bit unpack per register, the halves of each group are
//! summed apart (with their own `128 sum(x)`), and its sixteen products per unit go to the output
//! in the reference's order, interleaved from the even and odd halves. Q1_0 (`Nl4::BLOCK_SUMS`)
//! turns its sign bits into bytes by one masked blend per register, Q2_0 its 2-bit codes by one
//! VBMI multishift, and both add each block's `x.d sumi` before its `d` scales them, as their
//! reference does.
//!
//! Integers: a nibble is looked up by `vpshufb` as `kvalue + 128` (1..=241, an unsigned byte),
//! so `vpdpbusd` takes the activation bytes as they are (signed) and adds `sum(w x) + 128
//! sum(x)` per 32-element group; the activations are packed once per call with `128 sum(x)` of
//! each group, subtracted after the horizontal sums (exact: integers). The packed activations
//! are laid out like the nibbles (`[low nibbles | high nibbles]` of 64 `qs` bytes = groups
//! `4h..4h + 4`, one group per 128-bit lane), so no weight byte is moved and no sign applied.
//!
//! Floats: the reference adds `dl * sumi` per group and block to one sum per output, in order:
//! eight dependent adds per unit and output. Rows go in tiles of 16: each row's eight products
//! (computed as the reference computes them, each rounded once) are transposed so that one
//! register holds group `g` of 16 rows, and eight vector adds (no FMA) advance 16 outputs in the
//! reference's order. Rows past the last whole tile take the same integers with scalar adds.

mod kinds;

use core::arch::x86_64::*;
use core::mem::size_of;

use super::super::kblock::{f16_to_f32, prefetch_span};
use super::super::klanes512::V64;
use crate::arch::iq_tile::{
    act_chunk_offset, unit_blocks, Iq4Nl, Iq4Xs, IqKind, Mxfp4, Nvfp4, Q1_0, Q2_0,
};
use crate::formats::{Block, BlockQ8_0, BlockQ8_K};
use crate::GgmlType;
use kinds::{lanes4, BIASED_IQ4NL};
/// Rows whose float sums share one register's lanes.
const LANES: usize = 16;
/// Activation rows up to which a row tile decodes each unit straight into registers and keeps
/// its sums there (`row_tile`); more run in chunks of it up to [`SPLIT_MAX`], and beyond that
/// `wide_tile` decodes each unit once into a buffer.
const CHUNK: usize = 4;
/// Activation rows up to which more than [`CHUNK`] run as row tiles over chunks of [`CHUNK`]
/// (each chunk decodes the tile's units again) instead of one `wide_tile`, whose decoded units
/// and sums go through memory for every activation row. Measured on Zen 4 (`x86_gemm`, k =
/// 7168, thread CPU clock, three alternations, ns per row, activation and 256 elements), one
/// wide tile -> chunked row tiles: IQ4_XS in cache 5.52-5.66 -> 4.65-4.77 at 5 rows, 4.98-5.04 ->
/// 4.12-4.19 at 7, 4.62-4.69 -> 4.13-4.18 at 8; from DRAM 5.94-6.01 -> 5.00-5.03 at 5, 4.88-4.95
/// -> 4.35 at 8; IQ4_NL in cache 5.82-5.90 -> 5.05-5.18 at 5, 4.79-4.85 -> 4.48-4.52 at 8. From 9
/// rows three chunks would not beat the wide tile (4.44-4.49 there).
const SPLIT_MAX: usize = 2 * CHUNK;
/// Bytes of one packed activation unit: `x` (256), `128 sum(x)` per group (32), the blocks' `d`
/// per group as f32 (32); for NVFP4 (`packed_unit(true)`) also `128 sum(x)` of each group's
/// first and of its second half (2 x 32).
const PACKED_UNIT: usize = 320;

/// The bytes of a packed unit, with (`split`) or without the half-group sums.
const fn packed_unit(split: bool) -> usize {
    if split {
        PACKED_UNIT + 64
    } else {
        PACKED_UNIT
    }
}
/// Where a packed unit's `128 sum(x)` per group start (after the 256 bytes of `x`).
const PACKED_BIAS: usize = 256;
/// Where a packed unit's f32 scales start.
const PACKED_D: usize = 288;
/// Where a packed unit's `128 sum(x)` per half group start (first halves, then second halves).
const PACKED_BIAS16: usize = 320;

/// One decoded unit: biased weights in the packed activations' order and the floats of its
/// epilogue.
struct Dec4<const H: usize> {
    w: [__m512i; 4],
    /// The blocks' `d` per group (IQ4_XS: its one `d` eight times; NVFP4 (`H` = 2): its
    /// sub-blocks' 0..8, then 8..16).
    d: [__m256; H],
    /// IQ4_XS: the group scales `code - 32` as floats.
    s: __m256,
}

/// An IQ4 kind: where its unit's `qs` bytes and floats are.
trait Nl4: IqKind {
    /// Whether the products carry a group scale (`dl = (d x.d) s`; IQ4_NL, MXFP4: `dl = d x.d`).
    const SCALED: bool;
    /// The biased value table.
    fn values() -> &'static V64 {
        &BIASED_IQ4NL
    }
    /// Whether each 32-element group is two 16-element sub-blocks with their own float step
    /// (NVFP4; `floats` then gives sub-blocks 0..8 and `floats_hi` 8..16).
    const SPLIT: bool = false;
    /// NVFP4: the scales of sub-blocks 8..16.
    ///
    /// # Safety
    /// As [`Nl4::weights`].
    #[inline(always)]
    unsafe fn floats_hi(_p: *const u8) -> __m256 {
        // SAFETY: no memory access; AVX is the caller's.
        unsafe { _mm256_setzero_ps() }
    }
    /// The unit's biased weights in the packed activations' order: register `2h + half`, lane
    /// `l` holds elements `16 half .. 16 half + 16` of group `4h + l` (the nibble kinds: their
    /// 128 `qs` bytes, lane `l` of register `h` the 16 bytes of group `4h + l`, through
    /// [`nibbles`]).
    ///
    /// # Safety
    /// The CPU has the tier's features; `p` is valid for one unit.
    unsafe fn weights(p: *const u8) -> [__m512i; 4];
    /// Whether each weight block adds its groups' `x.d sumi` first and scales the sum by its `d`
    /// (Q1_0, Q2_0: `sumf += d sum(x.d sumi)`), instead of `dl = d x.d` per group.
    const BLOCK_SUMS: bool = false;
    /// `BLOCK_SUMS` kinds: groups per weight block (Q1_0: 4, Q2_0: 2).
    const GROUPS_PER_BLOCK: usize = 1;
    /// The blocks' `d` per group and the group scales (unused unless `SCALED`).
    ///
    /// # Safety
    /// As [`Nl4::weights`].
    unsafe fn floats(p: *const u8) -> (__m256, __m256);
}

/// Decodes the unit at `p`: its biased weights and floats.
///
/// # Safety
/// The CPU has the tier's features; `p` is valid for one unit of `K`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn decode<K: Nl4, const H: usize>(p: *const u8) -> Dec4<H> {
    // SAFETY: the caller's contract.
    let (d0, s) = unsafe { K::floats(p) };
    let d = core::array::from_fn(|h| {
        if h == 0 {
            d0
        } else {
            // SAFETY: as above (only NVFP4, `H` = 2, reads its second scales).
            unsafe { K::floats_hi(p) }
        }
    });
    // SAFETY: the caller's contract.
    let w = unsafe { K::weights(p) };
    Dec4 { w, d, s }
}

/// The eight group sums (group `g` in dword `g`) of two registers whose 128-bit lane `l` holds
/// partial sums of group `l` (`a`) and `4 + l` (`b`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn groups(a: __m512i, b: __m512i) -> __m256i {
    // per lane [a0+a2, b0+b2, a1+a3, b1+b3], then both halves added: dword 4l = group l,
    // 4l + 1 = group 4 + l
    let s = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let t = _mm512_add_epi32(s, _mm512_shuffle_epi32::<0b01_00_11_10>(s));
    let order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, t))
}

/// Packs `units` activation units of type `act` at `x` into `dst` (`packed_unit(split)` bytes
/// each): the `x` bytes as `[low half | high half]` of groups 0..4, then of groups 4..8 (16
/// bytes per lane, see `Nl4::qs`), `128 sum(x)` per group, the blocks' `d` per group, and with
/// `split` `128 sum(x)` per half group.
///
/// # Safety
/// The CPU has the tier's features; `x` holds `units` whole units, `dst` `units *
/// packed_unit(split)`
/// bytes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn pack(
    act: GgmlType,
    x: *const u8,
    unit_bytes: usize,
    units: usize,
    dst: *mut u8,
    split: bool,
) {
    let ones = _mm512_set1_epi8(1);
    for u in 0..units {
        // SAFETY: unit `u` and its packed slot are inside the buffers (caller's contract).
        unsafe {
            let (xu, du) = (x.add(u * unit_bytes), dst.add(u * packed_unit(split)));
            // half[h][half]: the sums of each group's half `half`, groups 4h..4h + 4
            let mut half_sums = [[_mm512_setzero_si512(); 2]; 2];
            for (h, hs) in half_sums.iter_mut().enumerate() {
                for (half, s) in hs.iter_mut().enumerate() {
                    let v = lanes4(|l| xu.add(act_chunk_offset(act, 4 * h + l) + 16 * half));
                    _mm512_storeu_si512(du.add(64 * (2 * h + half)) as *mut __m512i, v);
                    *s = _mm512_dpbusd_epi32(*s, ones, v);
                }
            }
            let [[a0, a1], [b0, b1]] = half_sums;
            let sums = if split {
                let (lo, hi) = (groups(a0, b0), groups(a1, b1));
                let bias16 = du.add(PACKED_BIAS16) as *mut __m256i;
                _mm256_storeu_si256(bias16, _mm256_slli_epi32::<7>(lo));
                _mm256_storeu_si256(bias16.add(1), _mm256_slli_epi32::<7>(hi));
                _mm256_add_epi32(lo, hi)
            } else {
                groups(_mm512_add_epi32(a0, a1), _mm512_add_epi32(b0, b1))
            };
            let bias = _mm256_slli_epi32::<7>(sums);
            _mm256_storeu_si256(du.add(PACKED_BIAS) as *mut __m256i, bias);
            let xd: [f32; 8] = if act == GgmlType::Q8_0 {
                let b = core::slice::from_raw_parts(xu as *const BlockQ8_0, 8);
                core::array::from_fn(|g| f16_to_f32(u16::from_le_bytes(b[g].d)))
            } else {
                [(*(xu as *const BlockQ8_K)).d(); 8]
            };
            (du.add(PACKED_D) as *mut [f32; 8]).write_unaligned(xd);
        }
    }
}

/// The eight products `dl * sumi` of decoded unit `d` against the packed activation unit `px`,
/// each as the reference rounds it (`dl = (d x.d) s`, or `d x.d` for IQ4_NL and MXFP4), in the
/// first register; for NVFP4 its sixteen (`x.d d`, sub-block order), eight per register. `H`
/// is the number of registers: 1, or 2 for NVFP4.
///
/// # Safety
/// The CPU has the tier's features; `px` is one packed unit.
#[inline(always)]
unsafe fn products<K: Nl4, const H: usize>(d: &Dec4<H>, px: *const u8) -> [__m256; H] {
    const { assert!(H == 1 + K::SPLIT as usize) };
    if K::SPLIT {
        // SAFETY: forwarded.
        let p = unsafe { products_split(d, px) };
        return core::array::from_fn(|h| p[h]);
    }
    // SAFETY: the reads stay inside the packed unit (caller's contract); the features are the
    // caller's.
    unsafe {
        let x: [__m512i; 4] =
            core::array::from_fn(|c| _mm512_loadu_si512(px.add(64 * c) as *const __m512i));
        let z = _mm512_setzero_si512();
        let a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, d.w[0], x[0]), d.w[1], x[1]);
        let b = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, d.w[2], x[2]), d.w[3], x[3]);
        let bias = _mm256_loadu_si256(px.add(PACKED_BIAS) as *const __m256i);
        let sumi = _mm256_sub_epi32(groups(a, b), bias);
        let xd = _mm256_loadu_ps(px.add(PACKED_D) as *const f32);
        // Q1_0: `x.d sumi` (the block's `d` comes after its sum)
        let mut dl = if K::BLOCK_SUMS {
            xd
        } else {
            _mm256_mul_ps(d.d[0], xd)
        };
        if K::SCALED {
            dl = _mm256_mul_ps(dl, d.s);
        }
        let p = _mm256_mul_ps(dl, _mm256_cvtepi32_ps(sumi));
        core::array::from_fn(|_| p)
    }
}

/// [`products`] for NVFP4: each group's halves summed apart.
///
/// # Safety
/// As [`products`].
#[inline(always)]
unsafe fn products_split<const H: usize>(d: &Dec4<H>, px: *const u8) -> [__m256; 2] {
    // SAFETY: as in `products`.
    unsafe {
        let x: [__m512i; 4] =
            core::array::from_fn(|c| _mm512_loadu_si512(px.add(64 * c) as *const __m512i));
        let z = _mm512_setzero_si512();
        let dp = |c: usize| _mm512_dpbusd_epi32(z, d.w[c], x[c]);
        let bias16 = px.add(PACKED_BIAS16) as *const __m256i;
        // sub-blocks 2g (first halves) and 2g + 1 (second halves), g = 0..8
        let even = _mm256_sub_epi32(groups(dp(0), dp(2)), _mm256_loadu_si256(bias16));
        let odd = _mm256_sub_epi32(groups(dp(1), dp(3)), _mm256_loadu_si256(bias16.add(1)));
        let (lo, hi) = (
            _mm256_unpacklo_epi32(even, odd),
            _mm256_unpackhi_epi32(even, odd),
        );
        let sumi = [
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        ];
        // x.d of group g for sub-blocks 2g and 2g + 1
        let xd = _mm256_loadu_ps(px.add(PACKED_D) as *const f32);
        let xd = [
            _mm256_permutevar8x32_ps(xd, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)),
            _mm256_permutevar8x32_ps(xd, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)),
        ];
        let w = [d.d[0], d.d[H - 1]];
        core::array::from_fn(|i| {
            _mm256_mul_ps(_mm256_mul_ps(xd[i], w[i]), _mm256_cvtepi32_ps(sumi[i]))
        })
    }
}

/// Output row of lane `l` after [`add_columns`]' transpose.
#[inline(always)]
fn lane_row(l: usize) -> usize {
    [0, 2, 1, 3][l / 4] * 4 + l % 4
}

/// The columns of the 16 x 8 matrix `p` (row `r`: output row `r`'s eight products): lane `l`
/// of column `g` is row [`lane_row`]`(l)`'s product `g`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn columns(p: &[__m256; LANES]) -> [__m512; 8] {
    // z[i]: rows i and 8 + i in the two 256-bit halves; each half is then an 8 x 8 transpose
    let z: [__m512; 8] = core::array::from_fn(|i| {
        let lo = _mm512_castps_pd(_mm512_castps256_ps512(p[i]));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(p[8 + i])))
    });
    let t: [__m512; 8] = core::array::from_fn(|i| {
        let (a, b) = (z[2 * (i / 2)], z[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4q + e]: element e (and e + 4 in the odd 128-bit lanes) of rows 4q..4q+4 (and 8 more)
    let u: [__m512; 8] = core::array::from_fn(|i| {
        let (q, e) = (i / 4, i % 4);
        let (a, b) = (t[4 * q + e / 2], t[4 * q + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b)
        } else {
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b)
        }
    });
    core::array::from_fn(|g| {
        let (a, b) = (u[g % 4], u[4 + g % 4]);
        if g < 4 {
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b)
        }
    })
}

/// `acc += column g` for g = 0..8 in order, where row `r` of the 16 x 8 matrix `p` is output
/// row `r`'s eight products: lane `l` of `acc` is output row [`lane_row`]`(l)`. For
/// `BLOCK_SUMS` kinds each block's columns are summed from zero first and `acc +=
/// d * sum`, `d` the block's column of `dcols` (the rows' `d` per group, transposed alike).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn add_columns<K: Nl4>(p: &[__m256; LANES], dcols: &[__m512; 8], acc: &mut __m512) {
    let c = columns(p);
    if K::BLOCK_SUMS {
        let per_block = K::GROUPS_PER_BLOCK;
        for (cb, db) in c
            .chunks_exact(per_block)
            .zip(dcols.iter().step_by(per_block))
        {
            let sum = cb
                .iter()
                .fold(_mm512_setzero_ps(), |t, &x| _mm512_add_ps(t, x));
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(*db, sum));
        }
    } else {
        for col in c {
            *acc = _mm512_add_ps(*acc, col);
        }
    }
}

/// The rows' `d` per group as [`columns`] (for `BLOCK_SUMS` kinds; zeros otherwise).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn d_columns<K: Nl4>(d: impl Fn(usize) -> __m256) -> [__m512; 8] {
    if K::BLOCK_SUMS {
        columns(&core::array::from_fn(d))
    } else {
        [_mm512_setzero_ps(); 8]
    }
}

/// Where a row's units are.
struct Geometry {
    units: usize,
    unit_w_bytes: usize,
    row_bytes: usize,
}

/// The sums of 16 weight rows from `wt` against `J` activation rows (`px(jj, u)`: packed unit
/// `u` of activation `jj`), lane `l` of `sums[jj]` being row [`lane_row`]`(l)`.
///
/// # Safety
/// The CPU has the tier's features; `wt` is valid for 16 rows of `geo`, `px` gives packed units.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn row_tile<K: Nl4, const J: usize, const H: usize>(
    wt: *const u8,
    geo: &Geometry,
    px: impl Fn(usize, usize) -> *const u8,
    sums: &mut [[f32; LANES]; CHUNK],
) {
    let mut acc = [_mm512_setzero_ps(); J];
    for u in 0..geo.units {
        let mut p = [[[_mm256_setzero_ps(); LANES]; H]; J];
        // the rows' `d` per group (only `BLOCK_SUMS` kinds read it)
        let mut dr = [_mm256_setzero_ps(); LANES];
        for r in 0..LANES {
            let at = wt.wrapping_add(r * geo.row_bytes + u * geo.unit_w_bytes);
            // the same unit of the next tile's rows, so the loads run ahead
            prefetch_span(at.wrapping_add(LANES * geo.row_bytes), geo.unit_w_bytes);
            // SAFETY: row r of the tile holds unit u (caller's contract).
            let d = unsafe { decode::<K, H>(at) };
            dr[r] = d.d[0];
            for (jj, pj) in p.iter_mut().enumerate() {
                // SAFETY: `px` gives one packed unit (caller's contract).
                let ph = unsafe { products::<K, H>(&d, px(jj, u)) };
                for (pjh, v) in pj.iter_mut().zip(ph) {
                    pjh[r] = v;
                }
            }
        }
        let dcols = d_columns::<K>(|r| dr[r]);
        for (a, pj) in acc.iter_mut().zip(&p) {
            for ph in pj {
                add_columns::<K>(ph, &dcols, a);
            }
        }
    }
    for (s, a) in sums.iter_mut().zip(&acc) {
        // SAFETY: `s` is 64 writable bytes; unaligned store.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), *a) };
    }
}

/// [`row_tile`] for more activation rows than [`CHUNK`]: each row's unit decoded once into a
/// buffer, then taken against each activation row; `acc[j]` holds activation `j`'s sums (lane
/// order as [`row_tile`]).
///
/// # Safety
/// As [`row_tile`]; `acc` has `n` entries, all zero.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn wide_tile<K: Nl4, const H: usize>(
    wt: *const u8,
    geo: &Geometry,
    px: impl Fn(usize, usize) -> *const u8,
    acc: &mut [[f32; LANES]],
) {
    for u in 0..geo.units {
        let dec: [Dec4<H>; LANES] = core::array::from_fn(|r| {
            let at = wt.wrapping_add(r * geo.row_bytes + u * geo.unit_w_bytes);
            prefetch_span(at.wrapping_add(LANES * geo.row_bytes), geo.unit_w_bytes);
            // SAFETY: row r of the tile holds unit u (caller's contract).
            unsafe { decode::<K, H>(at) }
        });
        let dcols = d_columns::<K>(|r| dec[r].d[0]);
        for (j, a) in acc.iter_mut().enumerate() {
            // p[h][r]: row r's products, half h (NVFP4's sub-blocks 8..16 in h = 1)
            let mut p = [[_mm256_setzero_ps(); LANES]; H];
            for (r, d) in dec.iter().enumerate() {
                // SAFETY: `px` gives one packed unit (caller's contract).
                let ph = unsafe { products::<K, H>(d, px(j, u)) };
                for (pjh, v) in p.iter_mut().zip(ph) {
                    pjh[r] = v;
                }
            }
            // SAFETY: `a` is 64 bytes; unaligned accesses.
            unsafe {
                let mut v = _mm512_loadu_ps(a.as_ptr());
                for ph in &p {
                    add_columns::<K>(ph, &dcols, &mut v);
                }
                _mm512_storeu_ps(a.as_mut_ptr(), v);
            }
        }
    }
}

/// `out[r * n + j] = W[r] . x[j]` for one kind (see the module doc); `H` registers of products
/// per unit (2 for NVFP4, else 1).
///
/// # Safety
/// The CPU has the tier's features.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gemm_nl4<K: Nl4, const H: usize>(
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    let Some((wb, _, per_row)) = unit_blocks::<K>(k, w, rows, x, n, out) else {
        return false;
    };
    if n == 0 {
        return true;
    }
    let act = <K::X as Block>::TYPE;
    let units = per_row / K::UNIT;
    let unit_bytes = K::X_UNIT * size_of::<K::X>();
    let unit_w_bytes = K::UNIT * size_of::<K::W>();
    let row_bytes = per_row * size_of::<K::W>();
    super::super::PACKED.with(|cell| {
        let mut packed = cell.borrow_mut();
        let stride = packed_unit(K::SPLIT);
        packed.resize(n * units * stride, 0);
        // SAFETY: `x` holds `n * units` activation units (checked by `unit_blocks`) and `packed`
        // was sized for them; the caller guarantees the features.
        unsafe {
            let dst = packed.as_mut_ptr();
            pack(act, x.as_ptr(), unit_bytes, n * units, dst, K::SPLIT)
        };
        let px = |j: usize, u: usize| -> *const u8 {
            // SAFETY: packed unit `j * units + u` exists (j < n, u < units).
            unsafe { packed.as_ptr().add((j * units + u) * stride) }
        };
        let whole = rows / LANES * LANES;
        let wp = wb.as_ptr() as *const u8;
        let geo = Geometry {
            units,
            unit_w_bytes,
            row_bytes,
        };
        let mut sums = [[0f32; LANES]; CHUNK];
        let mut acc = Vec::new();
        for r0 in (0..whole).step_by(LANES) {
            let wt = wp.wrapping_add(r0 * row_bytes);
            if n > SPLIT_MAX {
                acc.clear();
                acc.resize(n, [0f32; LANES]);
                // SAFETY: rows r0..r0 + 16 exist; `px` gives packed units; features as above.
                unsafe { wide_tile::<K, H>(wt, &geo, px, &mut acc) };
                for (j, v) in acc.iter().enumerate() {
                    for (l, &s) in v.iter().enumerate() {
                        out[(r0 + lane_row(l)) * n + j] = K::finish(s);
                    }
                }
                continue;
            }
            // row tiles over the activations in chunks of CHUNK (one chunk up to CHUNK rows)
            for j0 in (0..n).step_by(CHUNK) {
                let c = (n - j0).min(CHUNK);
                let pxc = |jj: usize, u: usize| px(j0 + jj, u);
                // SAFETY: rows r0..r0 + 16 exist; `pxc` gives packed units of activations
                // j0..j0 + c; features as above.
                unsafe {
                    match c {
                        1 => row_tile::<K, 1, H>(wt, &geo, pxc, &mut sums),
                        2 => row_tile::<K, 2, H>(wt, &geo, pxc, &mut sums),
                        3 => row_tile::<K, 3, H>(wt, &geo, pxc, &mut sums),
                        _ => row_tile::<K, CHUNK, H>(wt, &geo, pxc, &mut sums),
                    }
                }
                for (jj, v) in sums[..c].iter().enumerate() {
                    for (l, &s) in v.iter().enumerate() {
                        out[(r0 + lane_row(l)) * n + j0 + jj] = K::finish(s);
                    }
                }
            }
        }
        for r in whole..rows {
            out[r * n..(r + 1) * n].fill(0.0);
            for u in 0..units {
                let at = wp.wrapping_add(r * row_bytes + u * unit_w_bytes);
                // SAFETY: row r holds unit u; features as above.
                let d = unsafe { decode::<K, H>(at) };
                let mut dv = [0f32; 8];
                // SAFETY: `dv` is 32 writable bytes.
                unsafe { _mm256_storeu_ps(dv.as_mut_ptr(), d.d[0]) };
                for j in 0..n {
                    // SAFETY: as above.
                    let p = unsafe { products::<K, H>(&d, px(j, u)) };
                    let o = &mut out[r * n + j];
                    for ph in p {
                        let mut v = [0f32; 8];
                        // SAFETY: `v` is 32 writable bytes.
                        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), ph) };
                        if K::BLOCK_SUMS {
                            let per_block = K::GROUPS_PER_BLOCK;
                            for (vb, db) in
                                v.chunks_exact(per_block).zip(dv.iter().step_by(per_block))
                            {
                                let mut sum = 0f32;
                                for &x in vb {
                                    sum += x;
                                }
                                *o += db * sum;
                            }
                        } else {
                            for s in v {
                                *o += s;
                            }
                        }
                    }
                }
            }
            for o in &mut out[r * n..(r + 1) * n] {
                *o = K::finish(*o);
            }
        }
    });
    true
}

/// The IQ4_XS / IQ4_NL / MXFP4 / NVFP4 / Q1_0 / Q2_0 path; false for other types or lengths that are
/// not whole units.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI and VBMI (plus AVX2 and F16C).
pub(super) unsafe fn gemm(
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    // SAFETY: the caller guarantees the features.
    unsafe {
        match ty {
            GgmlType::IQ4_XS => gemm_nl4::<Iq4Xs, 1>(k, w, rows, x, n, out),
            GgmlType::IQ4_NL => gemm_nl4::<Iq4Nl, 1>(k, w, rows, x, n, out),
            GgmlType::MXFP4 => gemm_nl4::<Mxfp4, 1>(k, w, rows, x, n, out),
            // sixteen products per unit: two registers
            GgmlType::NVFP4 => gemm_nl4::<Nvfp4, 2>(k, w, rows, x, n, out),
            GgmlType::Q1_0 => gemm_nl4::<Q1_0, 1>(k, w, rows, x, n, out),
            GgmlType::Q2_0 => gemm_nl4::<Q2_0, 1>(k, w, rows, x, n, out),
            _ => false,
        }
    }
}
