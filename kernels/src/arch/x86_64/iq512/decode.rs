//! The per-type 64-byte decoders of `iq512`: one weight unit into four registers of signed
//! weights, the scale word of every `vpmaddubsw` pair and the unit's floats (see the parent
//! module for the arithmetic), plus each type's float epilogue in the reference's order.

use core::arch::x86_64::*;

use super::super::kblock::f16_to_f32;
use super::super::klanes512::V64;
use super::tables::*;
use super::{Dec, Wide};
use crate::arch::iq_tile::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs};
use crate::formats::iq_grids::{IQ2_VALUES, IQ3S_VALUES, IQ3XXS_VALUES};
use crate::formats::{BlockIq1M, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::scalar::iq1::IQ1_DELTA;

/// The largest of a magnitude table, as the kinds' `Wide::BIAS` (at most 63, see there).
const fn max_of(v: &[u8]) -> i8 {
    let (mut m, mut i) = (0u8, 0);
    while i < v.len() {
        if v[i] > m {
            m = v[i];
        }
        i += 1;
    }
    assert!(m <= 63);
    m as i8
}
const IQ2_BIAS: i8 = max_of(&IQ2_VALUES);
const IQ3XXS_BIAS: i8 = max_of(&IQ3XXS_VALUES);
const IQ3S_BIAS: i8 = max_of(&IQ3S_VALUES);

/// The four 64-bit sign masks of 32 sign bytes (low 256 bits of `sb`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn sign_masks(sb: __m512i) -> [u64; 4] {
    let mut m = [0u64; 4];
    // SAFETY: `m` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(m.as_mut_ptr() as *mut __m256i, _mm512_castsi512_si256(sb)) };
    m
}

/// IQ2_XXS/IQ3_XXS: from the eight sign-and-scale words (dwords 0..8 of `aux`), the four sign
/// masks, the scale words `2 * (aux >> 28) + 1` and each 16 elements' scale word (`Dec::gs`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn xxs_signs_scales(aux: __m512i) -> ([u64; 4], [__m512i; 4], __m256i) {
    let idx = _mm512_multishift_epi64_epi8(SIGN_SHIFTS.get(), aux);
    let sb = _mm512_permutex2var_epi8(KSIGNS_LO.get(), idx, KSIGNS_HI.get());
    let odd = _mm512_or_si512(
        _mm512_slli_epi32::<1>(_mm512_srli_epi32::<28>(aux)),
        _mm512_set1_epi32(1),
    );
    let sc = core::array::from_fn(|c| _mm512_permutexvar_epi16(DWORD_SCALES[c].get(), odd));
    let gs = _mm512_castsi512_si256(_mm512_permutexvar_epi16(DWORD_GROUPS.get(), odd));
    (sign_masks(sb), sc, gs)
}

/// The block's `d` (an f16 in its first two bytes, as `tables` asserts for the kinds using it).
///
/// # Safety
/// The CPU has the tier's features; `p` is valid for two bytes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn lead_d(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    f16_to_f32(u16::from_le_bytes(unsafe { [*p, *p.add(1)] }))
}

/// `g` negated where `neg` has a bit.
#[inline(always)]
pub(super) fn negate(g: __m512i, neg: u64) -> __m512i {
    // SAFETY: only reached from this module's `#[target_feature]` functions, which run on a CPU
    // with AVX512BW (the tier's capability).
    unsafe { _mm512_mask_sub_epi8(g, _cvtu64_mask64(neg), _mm512_setzero_si512(), g) }
}

/// The grid points of 32 indices (words of `idx`, each below `grid.len()`) from an expanded
/// 8-byte grid (`iq_grids`), eight points per register: one `vpgatherdq` per 8 points. On the
/// 2026-12-02 Xeon a two-register word permute costs two cycles of the one shuffle port, so
/// the 256- to 1024-point grids' permute-and-blend lookups (4 to 16 `vpermt2w` per 32 points)
/// and the fields' expansion (a `vpermw`, `vpmultishiftqb` and `vpermb` per register) cost
/// more than the gathers, which run on the load ports (4 of them per 32 points in 4.6 ns).
///
/// # Safety
/// The CPU has the tier's features; every word of `idx` is below `grid.len()`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn gather_points(idx: __m512i, grid: &[u64]) -> [__m512i; 4] {
    let half = [
        _mm512_cvtepu16_epi32(_mm512_castsi512_si256(idx)),
        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(idx)),
    ];
    core::array::from_fn(|c| {
        let i = if c % 2 == 0 {
            _mm512_castsi512_si256(half[c / 2])
        } else {
            _mm512_extracti64x4_epi64::<1>(half[c / 2])
        };
        // SAFETY: every index is inside `grid` (caller's contract).
        unsafe { _mm512_i32gather_epi64::<8>(i, grid.as_ptr() as *const i64) }
    })
}

/// The 16 four-byte grid points of each register `c` from an expanded 4-byte grid
/// (`iq_grids`), their indices (below `grid.len()`) the dwords of `idx[c]`: one `vpgatherdd`
/// per register (see [`gather_points`]).
///
/// # Safety
/// The CPU has the tier's features; every index is below `grid.len()`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gather_points4(idx: [__m512i; 4], grid: &[u32]) -> [__m512i; 4] {
    // SAFETY: every index is inside `grid` (caller's contract).
    idx.map(|i| unsafe { _mm512_i32gather_epi32::<4>(i, grid.as_ptr() as *const i32) })
}

/// [`gather_points4`] for two registers.
///
/// # Safety
/// As [`gather_points4`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gather_points2(idx: [__m512i; 2], grid: &[u32]) -> [__m512i; 2] {
    // SAFETY: every index is inside `grid` (caller's contract).
    idx.map(|i| unsafe { _mm512_i32gather_epi32::<4>(i, grid.as_ptr() as *const i32) })
}

impl Wide for Iq2Xxs {
    const BIAS: i8 = IQ2_BIAS;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block, whose `qs` are 64 bytes.
        unsafe {
            let q = _mm512_loadu_si512(p.add(IQ2XXS_QS) as *const __m512i);
            let idx = _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, IQ2XXS_IDX.get(), q);
            // SAFETY: byte indices, below the grid's 256 points.
            let g = gather_points(idx, &IQ2XXS_GRID);
            let odd_dwords = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 15, 13, 11, 9, 7, 5, 3, 1);
            let aux = _mm512_permutexvar_epi32(odd_dwords, q);
            let (neg, sc, gs) = xxs_signs_scales(aux);
            Dec {
                neg,
                gs,
                ..Dec::new(g, sc, lead_d(p))
            }
        }
    }
}

impl Wide for Iq3Xxs {
    const BIAS: i8 = IQ3XXS_BIAS;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (64 index bytes, then 32 sign-and-scale bytes).
        unsafe {
            // the first 32 points from the codes in registers (shuffle port), the other 32
            // gathered (load ports): either alone would leave the other's ports idle
            let i = _mm256_loadu_si256(p.add(IQ3XXS_QS) as *const __m256i);
            let codes = IQ3XXS_CODE_TABLE.lookup(_mm512_cvtepu8_epi16(i));
            // SAFETY: byte indices, below the grid's 256 points.
            let hi = gather_points2(
                core::array::from_fn(|c| {
                    let at = IQ3XXS_QS + 32 + 16 * c;
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(at) as *const __m128i))
                }),
                &IQ3XXS_GRID,
            );
            let g: [__m512i; 4] = core::array::from_fn(|c| {
                if c >= 2 {
                    return hi[c - 2];
                }
                let f = _mm512_multishift_epi64_epi8(
                    IQ3_SHIFTS.get(),
                    _mm512_permutexvar_epi16(IQ3_SPREAD[c].get(), codes),
                );
                _mm512_permutexvar_epi8(f, IQ3XXS_FIELD_VALUES.get())
            });
            let aux =
                _mm512_castsi256_si512(_mm256_loadu_si256(p.add(IQ3XXS_AUX) as *const __m256i));
            let (neg, sc, gs) = xxs_signs_scales(aux);
            Dec {
                neg,
                gs,
                ..Dec::new(g, sc, lead_d(p))
            }
        }
    }
}

/// The IQ1 grid points of 32 11-bit indices (dwords of `idx`, eight points per register) as
/// biased weights `8 * value + 8` (`IQ1_BIASED`): the kinds' `BIAS` is in the values, so no add
/// per register follows. The 2048-point grid does not fit in registers: one `vpgatherdq` of the
/// expanded grid per 8 points (on the 2026-12-02 Xeon, four of them per 32 points take the time
/// of two `vpgatherdd` of the u16 codes, 4.6 ns, and leave no fields to expand: on Zen 5 the
/// codes gathered were faster, 4.7 against 7.8 ns).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn iq1_points_biased(idx: [__m512i; 2]) -> [__m512i; 4] {
    core::array::from_fn(|c| {
        let i = if c % 2 == 0 {
            _mm512_castsi512_si256(idx[c / 2])
        } else {
            _mm512_extracti64x4_epi64::<1>(idx[c / 2])
        };
        // SAFETY: every index is below 2048 by construction (8 + 3 bits), the table's length.
        unsafe { _mm512_i32gather_epi64::<8>(i, IQ1_BIASED.0.as_ptr() as *const i64) }
    })
}

/// The 32 grid indices of an IQ1 block `b` (its bytes from 0): dword `i` of half `h` is built
/// from `table[h]`'s bytes (`qs` byte, then the bytes holding its 3 high bits) as `qs | ((bits >>
/// shift_i) & 0x700)`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn iq1_indices(b: __m512i, table: &[V64; 2], shifts: __m512i) -> [__m512i; 2] {
    core::array::from_fn(|h| {
        let m = _mm512_permutexvar_epi8(table[h].get(), b);
        let hi = _mm512_and_si512(_mm512_srlv_epi32(m, shifts), _mm512_set1_epi32(0x700));
        _mm512_or_si512(_mm512_and_si512(m, _mm512_set1_epi32(0xff)), hi)
    })
}

impl Wide for Iq1S {
    const BIAS: i8 = 8; // grid values 8 * {-1, 0, 1}
    const BSUMS: bool = true;
    const BIASED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (under 64 bytes): the masked load reads exactly its bytes.
        unsafe {
            let b = _mm512_maskz_loadu_epi8((1u64 << IQ1S_BYTES) - 1, p as *const i8);
            // chunk l of a group takes qh bits 3l..3l+3 as index bits 8..11
            let shifts = _mm512_set_epi32(9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0);
            let g = iq1_points_biased(iq1_indices(b, &IQ1S_IDX, shifts));
            let qh = _mm512_permutexvar_epi8(IQ1S_QH_WORDS.get(), b);
            let ls = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<11>(qh), _mm512_set1_epi16(0xe)),
                _mm512_set1_epi16(1),
            );
            let lsd =
                _mm512_mask_sub_epi16(ls, _mm512_movepi16_mask(qh), _mm512_setzero_si512(), ls);
            let sc = core::array::from_fn(|c| _mm512_permutexvar_epi16(WORD_SCALES[c].get(), ls));
            let mut d = Dec::new(g, sc, lead_d(p));
            d.bw = _mm512_castsi512_si256(_mm512_permutexvar_epi16(BSUM_PAIRS.get(), lsd));
            // minus `BIAS` times the scale words: group g (16 elements) has scale ls[g / 2]
            let ls8 = _mm512_mullo_epi16(ls, _mm512_set1_epi16(-(Self::BIAS as i16)));
            d.bb = _mm512_castsi512_si256(_mm512_permutexvar_epi16(BSUM_PAIRS.get(), ls8));
            d
        }
    }
    /// The integer is `8 sumi + sumi1`: over 8 it is the reference's `sumi + IQ1_DELTA *
    /// sumi1`, exactly (both are below 2^24 in magnitude).
    const TERM: f32 = IQ1_DELTA;
}

/// The odd scales `2 f + 1` of the fields picked by `shifts` (width `mask`) from the qword
/// `bits`, one byte each (byte `i` of `shifts` picks byte `i`'s field).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn odd_bytes(bits: u64, shifts: &V64, mask: i8) -> __m512i {
    let f = _mm512_and_si512(
        _mm512_multishift_epi64_epi8(shifts.get(), _mm512_set1_epi64(bits as i64)),
        _mm512_set1_epi8(mask),
    );
    _mm512_or_si512(_mm512_add_epi8(f, f), _mm512_set1_epi8(1))
}

/// The scale words of the four registers from one odd scale byte each ([`odd_bytes`];
/// `table`: which byte each word takes).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn byte_scales(odd: __m512i, table: &[V64; 4]) -> [__m512i; 4] {
    core::array::from_fn(|c| {
        _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, table[c].get(), odd)
    })
}

/// Index words of 32 grid points from `qs` bytes and high bits in `qh` bytes: word `i` =
/// `qs[at + i] | ((qh[(at + i) / per] >> shift(i)) & high)`, as `vpermi2b` (`qs` in the first
/// 64 bytes, `qh` in the second) and a per-word shift; see the users' tables.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn split_indices(
    qs: __m512i,
    qh: __m512i,
    bytes: &V64,
    shifts: &V64,
    high: i16,
) -> __m512i {
    let w = _mm512_permutex2var_epi8(qs, bytes.get(), qh);
    let hi = _mm512_and_si512(_mm512_srlv_epi16(w, shifts.get()), _mm512_set1_epi16(high));
    _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi16(0xff)), hi)
}

/// Four sign masks stored as bytes (IQ2_S, IQ3_S: one explicit byte per 8 weights).
///
/// # Safety
/// `p` is valid for 32 bytes.
#[inline(always)]
pub(super) unsafe fn stored_masks(p: *const u8) -> [u64; 4] {
    // SAFETY: the caller's contract; unaligned read.
    unsafe { (p as *const [u64; 4]).read_unaligned() }.map(u64::from_le)
}

impl Wide for Iq2Xs {
    const BIAS: i8 = IQ2_BIAS;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block: 32 `qs` words and 8 scale bytes at their offsets.
        unsafe {
            let q = _mm512_loadu_si512(p.add(IQ2XS_QS) as *const __m512i);
            // SAFETY: 9-bit indices, below the grid's 512 points.
            let w = gather_points(_mm512_and_si512(q, _mm512_set1_epi16(511)), &IQ2XS_GRID);
            let si = _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16::<9>(q)));
            let sb = _mm512_permutex2var_epi8(KSIGNS_LO.get(), si, KSIGNS_HI.get());
            let neg = sign_masks(sb);
            let bits = (p.add(IQ2XS_SCALES) as *const u64).read_unaligned();
            let odd = odd_bytes(u64::from_le(bits), &NIBBLES16, 0x0f);
            Dec {
                neg,
                // byte h (h < 16) of `odd`: the scale of 16-element group h
                gs: _mm256_cvtepu8_epi16(_mm512_castsi512_si128(odd)),
                ..Dec::new(w, byte_scales(odd, &SCALES16), lead_d(p))
            }
        }
    }
}

impl Wide for Iq2S {
    const BIAS: i8 = IQ2_BIAS;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block: 64 `qs` bytes (indices, then signs), 8 `qh` and 8 scale
        // bytes at their offsets.
        unsafe {
            let qs = _mm512_loadu_si512(p.add(IQ2S_QS) as *const __m512i);
            let qh = _mm512_castsi128_si512(_mm_loadl_epi64(p.add(IQ2S_QH) as *const __m128i));
            let idx = split_indices(qs, qh, &IQ2S_BYTES, &IQ2S_SHIFTS, 0x300);
            // SAFETY: 10-bit indices (8 + 2 bits), below the grid's 1024 points.
            let w = gather_points(idx, &IQ2S_GRID);
            let neg = stored_masks(p.add(IQ2S_SIGNS));
            let bits = (p.add(IQ2S_SCALES) as *const u64).read_unaligned();
            let odd = odd_bytes(u64::from_le(bits), &NIBBLES16, 0x0f);
            Dec {
                neg,
                // byte h (h < 16) of `odd`: the scale of 16-element group h
                gs: _mm256_cvtepu8_epi16(_mm512_castsi512_si128(odd)),
                ..Dec::new(w, byte_scales(odd, &SCALES16), lead_d(p))
            }
        }
    }
}

impl Wide for Iq3S {
    const BIAS: i8 = IQ3S_BIAS;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block: 64 `qs`, 8 `qh`, 32 sign and 4 scale bytes at their offsets.
        unsafe {
            let qs = _mm512_loadu_si512(p.add(IQ3S_QS) as *const __m512i);
            let qh = _mm512_castsi128_si512(_mm_loadl_epi64(p.add(IQ3S_QH) as *const __m128i));
            let idx: [__m512i; 2] = core::array::from_fn(|h| {
                split_indices(qs, qh, &IQ3S_BYTES[h], &IQ3S_SHIFTS, 0x100)
            });
            // SAFETY: 9-bit indices (8 + 1 bits), below the grid's 512 points.
            let w = gather_points4(
                core::array::from_fn(|c| {
                    let i = idx[c / 2];
                    _mm512_cvtepu16_epi32(if c % 2 == 0 {
                        _mm512_castsi512_si256(i)
                    } else {
                        _mm512_extracti64x4_epi64::<1>(i)
                    })
                }),
                &IQ3S_GRID,
            );
            let neg = stored_masks(p.add(IQ3S_SIGNS));
            let bits = (p.add(IQ3S_SCALES) as *const u32).read_unaligned();
            let odd = odd_bytes(u32::from_le(bits) as u64, &NIBBLES16, 0x0f);
            Dec {
                neg,
                // byte g (g < 8) of `odd`: the scale of 32-element group g
                gs: _mm512_castsi512_si256(_mm512_maskz_permutexvar_epi8(
                    0x5555_5555_5555_5555,
                    GROUP_BYTES32.get(),
                    odd,
                )),
                ..Dec::new(w, byte_scales(odd, &SCALES32), lead_d(p))
            }
        }
    }
}

impl Wide for Iq1M {
    const BIAS: i8 = 9; // 8 * {-1, 0, 1} + shift {-1, 1}
    const BIASED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (under 64 bytes): the masked load reads exactly its bytes.
        unsafe {
            let b = _mm512_maskz_loadu_epi8((1u64 << IQ1M_BYTES) - 1, p as *const i8);
            // even chunks take qh bits 0..3 as index bits 8..11, odd chunks bits 4..7
            let shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
            let g = iq1_points_biased(iq1_indices(b, &IQ1M_IDX, shifts));
            let blk = &*(p as *const BlockIq1M);
            let bits = (p.add(IQ1M_SCALES) as *const u64).read_unaligned();
            // byte h (h < 16) of `odd`: the scale of 16-element group h
            let odd = odd_bytes(u64::from_le(bits), &IQ1M_SCALE_SHIFTS, 0x07);
            let sc = byte_scales(odd, &SCALES16);
            // 8 * grid + shift sign + 9: one integer sum gives `8 sumi1 + sumi2` (plus the
            // bias); `g` is `8 * grid + 8`, so a shift of +1 adds 2 and one of -1 nothing
            let two = _mm512_set1_epi8(2);
            let w = core::array::from_fn(|c| {
                let sh = _mm512_permutexvar_epi8(IQ1M_SHIFT_BYTES[c].get(), b);
                let plus = _mm512_testn_epi8_mask(sh, IQ1M_SHIFT_BITS.get());
                _mm512_mask_add_epi8(g[c], plus, g[c], two)
            });
            Dec {
                // minus `BIAS` times the scale words, from the bytes
                bb: _mm256_mullo_epi16(
                    _mm256_cvtepu8_epi16(_mm512_castsi512_si128(odd)),
                    _mm256_set1_epi16(-(Self::BIAS as i16)),
                ),
                ..Dec::new(w, sc, f16_to_f32(blk.d_bits()))
            }
        }
    }
    /// The integer is `8 sumi1 + sumi2`: over 8 it is the reference's `sumi1 + IQ1_DELTA *
    /// sumi2`, exactly (both are below 2^24 in magnitude).
    const TERM: f32 = IQ1_DELTA;
}
