//! The i-quants on the AVX-512-VNNI tier when the CPU also has AVX512-VBMI: each 256-element
//! weight unit is decoded straight into four 64-byte registers (grid points fetched with
//! `vpgather*`, sign bytes made by `vpmultishiftqb` + one `vpermi2b` of `KSIGNS_IQ2XS`, IQ4 nibbles
//! by `vpermb` + `vpshufb`), together with the per-pair scale words, and then used against every
//! activation row of the call (decode once, dot N rows).
//!
//! Exactness: the activations are packed once per call as `|x|` (unsigned bytes, so -128 is the
//! exact 128) plus their sign bits as 64-bit masks; per activation row a weight register is
//! negated where `x` is negative (masked `vpsubb`; no weight is -128), so `vpmaddubsw(|x|, w)`
//! gives the exact pair products (at most 2 * 128 * 127, below 2^15) and `vpdpwssd` with the scale
//! words adds them, scaled, into i32 lanes. Integer sums are exact in any order, so one
//! horizontal sum gives the reference's integer `bsum` (IQ1_S: also `sumi1` from the activation
//! `bsums`), and IQ4_XS/IQ4_NL get their eight 32-element sums; the float epilogue then repeats
//! the scalar reference's operations in its order. Types without a path here (IQ1_M, IQ2_XS,
//! IQ2_S, IQ3_S and the ternary types) return `false` and take the shared `iq` path.

use core::arch::x86_64::*;

use super::kblock::f16_to_f32;
use super::klanes512::V64;
use crate::arch::iq_tile::{
    act_chunk_offset, unit_blocks, Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Iq4Nl, Iq4Xs,
    IqKind,
};
use crate::formats::iq_grids::{
    IQ2S_CODES, IQ2XS_CODES, IQ2XXS_CODES, IQ2_VALUES, IQ3S_CODES, IQ3S_VALUES, IQ3XXS_CODES,
    IQ3XXS_VALUES,
};
use crate::formats::kquants::layout::Q8K_BSUMS;
use crate::formats::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockQ8_0, BlockQ8_K, IQ1S_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL, QK_K,
};
use crate::scalar::iq1::IQ1_DELTA;
use crate::GgmlType;
use core::mem::{offset_of, size_of};

// Field offsets the decoders address, from the block structs.
const IQ2XXS_QS: usize = offset_of!(BlockIq2Xxs, qs);
const IQ3XXS_QS: usize = offset_of!(BlockIq3Xxs, qs);
/// IQ3_XXS: the sign-and-scale words follow the 64 grid index bytes.
const IQ3XXS_AUX: usize = IQ3XXS_QS + QK_K / 4;
const IQ1S_QS: usize = offset_of!(BlockIq1S, qs);
const IQ1S_QH: usize = offset_of!(BlockIq1S, qh);
const IQ1S_BYTES: usize = size_of::<BlockIq1S>();
const IQ4XS_QS: usize = offset_of!(BlockIq4Xs, qs);
const IQ2XS_QS: usize = offset_of!(BlockIq2Xs, qs);
const IQ2XS_SCALES: usize = offset_of!(BlockIq2Xs, scales);
const IQ2S_QS: usize = offset_of!(BlockIq2S, qs);
const IQ2S_QH: usize = offset_of!(BlockIq2S, qh);
const IQ2S_SCALES: usize = offset_of!(BlockIq2S, scales);
/// IQ2_S: the explicit sign bytes are the second half of `qs`.
const IQ2S_SIGNS: usize = IQ2S_QS + QK_K / 8;
const IQ3S_QS: usize = offset_of!(BlockIq3S, qs);
const IQ3S_QH: usize = offset_of!(BlockIq3S, qh);
const IQ3S_SIGNS: usize = offset_of!(BlockIq3S, signs);
const IQ3S_SCALES: usize = offset_of!(BlockIq3S, scales);
const IQ1M_QS: usize = offset_of!(BlockIq1M, qs);
const IQ1M_QH: usize = offset_of!(BlockIq1M, qh);
const IQ1M_SCALES: usize = offset_of!(BlockIq1M, scales);
const IQ1M_BYTES: usize = size_of::<BlockIq1M>();
const IQ4NL_QS: usize = offset_of!(BlockIq4Nl, qs);
const IQ4NL_BYTES: usize = size_of::<BlockIq4Nl>();

/// Weight rows whose units are interleaved (see [`gemm_wide`]).
const ROWS: usize = 4;

/// Bytes of one packed activation unit: `|x|` (256), the four sign masks (32), the blocks' `d`
/// as f32 (up to 8: 32).
const PACKED_UNIT: usize = 320;
/// Where a packed unit's f32 scales start.
const PACKED_D: usize = 288;

/// One decoded weight unit: signed weights, the scale word of every `vpmaddubsw` pair, and the
/// floats its epilogue needs (converted once per unit, not once per activation row).
#[derive(Clone, Copy)]
struct Dec {
    w: [__m512i; 4],
    sc: [__m512i; 4],
    /// IQ1_M: the ±1 shift signs, weighed by the same scales.
    w2: [__m512i; 4],
    /// IQ1_S: the 16 words `ls * delta` by which `sumi1` weighs the activation `bsums`.
    bw: __m256i,
    /// The blocks' `d` (one per block of the unit).
    d: [f32; 8],
    /// IQ4_XS: the group scales `code - 32` as f32.
    s: [f32; 8],
}

impl Dec {
    /// A unit whose `d` is `d0` and whose other fields are zero.
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    fn new(w: [__m512i; 4], sc: [__m512i; 4], d0: f32) -> Dec {
        let mut d = [0f32; 8];
        d[0] = d0;
        Dec {
            w,
            sc,
            w2: [_mm512_setzero_si512(); 4],
            bw: _mm256_setzero_si256(),
            d,
            s: [0f32; 8],
        }
    }
}

/// How a kind's per-block integers are formed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One scaled sum (`bsum`).
    Scaled,
    /// The scaled sum and `sum(bw * bsums)` (IQ1_S).
    ScaledBsums,
    /// The scaled sums of `w` and of `w2` (IQ1_M).
    ScaledTwo,
    /// Eight unscaled 32-element sums (IQ4_XS, IQ4_NL).
    Groups,
}

/// An i-quant with a 64-byte decoder.
trait Wide: IqKind {
    const MODE: Mode;
    /// Decodes the unit starting at `p` (its first block's first byte).
    ///
    /// # Safety
    /// The CPU has the tier's features (see [`gemm`]); `p` is valid for `UNIT` blocks of `W`.
    unsafe fn decode_regs(p: *const u8) -> Dec;
    /// `sumf += ...` for one unit and activation unit, as the scalar reference does it, from
    /// the integers of [`Mode`] (`v[0]`, `v[1]`, or `v[0..8]`) and the activation blocks'
    /// scales `xd` (one per block).
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32);
}

/// ggml's `ksigns_iq2xs`, as the two halves of one `vpermi2b` table.
static KSIGNS_LO: V64 = V64(ksigns_half(0));
static KSIGNS_HI: V64 = V64(ksigns_half(64));

const fn ksigns_half(at: usize) -> [u8; 64] {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = KSIGNS_IQ2XS[at + i];
        i += 1;
    }
    o
}

/// `vpmultishiftqb` control: the four 7-bit sign indices of each u32 of a qword.
static SIGN_SHIFTS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = ((i % 8) / 4 * 32 + (i % 4) * 7) as u8;
        i += 1;
    }
    o
});

/// Word index vectors: register `c`'s 32 scale words repeat word `a` (first 16) and word `b`.
const fn word_pairs(a: usize, b: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        let src = if w < 16 { a } else { b };
        o[2 * w] = src as u8;
        w += 1;
    }
    V64(o)
}

/// Scale words of register `c` from one dword per 32-element group (group `g` = word `2g`).
static DWORD_SCALES: [V64; 4] = [
    word_pairs(0, 2),
    word_pairs(4, 6),
    word_pairs(8, 10),
    word_pairs(12, 14),
];

/// Scale words of register `c` from one word per 32-element group (group `g` = word `g`).
static WORD_SCALES: [V64; 4] = [
    word_pairs(0, 1),
    word_pairs(2, 3),
    word_pairs(4, 5),
    word_pairs(6, 7),
];

/// A grid of `N` points (256, 512 or 1024) as its ggml codes (`iq_grids`), one u16 each: 8 to
/// 32 registers, looked up in registers instead of gathering the expanded grid from memory.
#[repr(C, align(64))]
struct Codes<const N: usize>([u16; N]);

impl<const N: usize> Codes<N> {
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    fn get(&self, t: usize) -> __m512i {
        // SAFETY: 64 readable bytes at entry `32 t` (the slice index panics past the table).
        unsafe { _mm512_loadu_si512(self.0[32 * t..32 * t + 32].as_ptr() as *const __m512i) }
    }

    /// The codes of 32 indices (word lanes of `idx`, each below `N`): one two-register word
    /// permute per 64 entries on index bits 0..6, then a blend tree on bits 6, 7, ...
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    fn lookup(&self, idx: __m512i) -> __m512i {
        let mut r = [_mm512_setzero_si512(); 16];
        let mut len = N / 64;
        for (a, ra) in r.iter_mut().enumerate().take(len) {
            *ra = _mm512_permutex2var_epi16(self.get(2 * a), idx, self.get(2 * a + 1));
        }
        let mut bit = 0x40;
        while len > 1 {
            let m = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(bit));
            for a in 0..len / 2 {
                r[a] = _mm512_mask_blend_epi16(m, r[2 * a], r[2 * a + 1]);
            }
            len /= 2;
            bit <<= 1;
        }
        r[0]
    }
}

static IQ2XXS_CODE_TABLE: Codes<256> = Codes(IQ2XXS_CODES);
static IQ3XXS_CODE_TABLE: Codes<256> = Codes(IQ3XXS_CODES);
static IQ2XS_CODE_TABLE: Codes<512> = Codes(IQ2XS_CODES);
static IQ2S_CODE_TABLE: Codes<1024> = Codes(IQ2S_CODES);
static IQ3S_CODE_TABLE: Codes<512> = Codes(IQ3S_CODES);

/// `vpermb` table of a code field: entry `e` = `values[e % len]` (the field is the low bits).
const fn field_values<const N: usize>(values: [u8; N]) -> V64 {
    let mut o = [0u8; 64];
    let mut e = 0;
    while e < 64 {
        o[e] = values[e % N];
        e += 1;
    }
    V64(o)
}
static IQ2_FIELD_VALUES: V64 = field_values(IQ2_VALUES);
static IQ3XXS_FIELD_VALUES: V64 = field_values(IQ3XXS_VALUES);

/// `vpmultishiftqb` control: byte `j` of a qword from bit `step * (j % per) + 32 * (j / per)`.
const fn field_shifts(step: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let j = i % 8;
        o[i] = (step * (j % per) + 32 * (j / per)) as u8;
        i += 1;
    }
    V64(o)
}
/// IQ2: eight 2-bit fields of the code in each qword's low word.
static IQ2_SHIFTS: V64 = field_shifts(2, 8);
/// IQ3_XXS: four 3-bit fields of the code in each dword's low word.
static IQ3_SHIFTS: V64 = field_shifts(3, 4);

/// Word index vector: word `w` <- word `at + w / per` (`per` = words per grid point).
const fn spread(at: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        o[2 * w] = (at + w / per) as u8;
        w += 1;
    }
    V64(o)
}
/// IQ2_XXS register `c`: qword `q` <- code `8 c + q`.
static IQ2_SPREAD: [V64; 4] = [spread(0, 4), spread(8, 4), spread(16, 4), spread(24, 4)];
/// IQ3_XXS register `c` (codes of half `c / 2`): dword `k` <- code `16 (c % 2) + k`.
static IQ3_SPREAD: [V64; 2] = [spread(0, 2), spread(16, 2)];

/// IQ2_XXS grid indices: word `i` <- byte `8 (i / 4) + i % 4` of `qs`.
static IQ2XXS_IDX: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        o[2 * i] = (8 * (i / 4) + i % 4) as u8;
        i += 1;
    }
    o
});

/// IQ1_S index material: dword `i` (chunk `16 half + i`) = `qs` byte, then the group's `qh` word.
const fn iq1s_idx(half: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        let chunk = 16 * half + i;
        let qh = IQ1S_QH + 2 * (chunk / 4);
        o[4 * i] = (IQ1S_QS + chunk) as u8;
        o[4 * i + 1] = qh as u8;
        o[4 * i + 2] = (qh + 1) as u8;
        i += 1;
    }
    V64(o)
}
static IQ1S_IDX: [V64; 2] = [iq1s_idx(0), iq1s_idx(1)];

/// IQ1_S: the eight `qh` words of a block to words 0..8.
static IQ1S_QH_WORDS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        o[i] = (IQ1S_QH + i) as u8;
        i += 1;
    }
    o
});

/// Word `2g` and `2g + 1` <- word `g`.
static BSUM_PAIRS: V64 = V64({
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        o[2 * w] = (w / 2 % 8) as u8;
        w += 1;
    }
    o
});

/// IQ4: byte `p` of a register <- byte `16 (p / 32) + p % 16` of its 32 `qs` bytes (the low
/// nibble for `p % 32 < 16`, the high one above).
static IQ4_PERM: V64 = V64({
    let mut o = [0u8; 64];
    let mut p = 0;
    while p < 64 {
        o[p] = (16 * (p / 32) + p % 16) as u8;
        p += 1;
    }
    o
});

/// `KVALUES_IQ4NL` in every 16-byte lane (the `vpshufb` table).
static IQ4_VALUES: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = KVALUES_IQ4NL[i % 16] as u8;
        i += 1;
    }
    o
});

/// The four 64-bit sign masks of 32 sign bytes (low 256 bits of `sb`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn sign_masks(sb: __m512i) -> [u64; 4] {
    let mut m = [0u64; 4];
    // SAFETY: `m` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(m.as_mut_ptr() as *mut __m256i, _mm512_castsi512_si256(sb)) };
    m
}

/// IQ2_XXS/IQ3_XXS: from the eight sign-and-scale words (dwords 0..8 of `aux`), the four sign
/// masks and the scale words `2 * (aux >> 28) + 1`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn xxs_signs_scales(aux: __m512i) -> ([u64; 4], [__m512i; 4]) {
    let idx = _mm512_multishift_epi64_epi8(SIGN_SHIFTS.get(), aux);
    let sb = _mm512_permutex2var_epi8(KSIGNS_LO.get(), idx, KSIGNS_HI.get());
    let odd = _mm512_or_si512(
        _mm512_slli_epi32::<1>(_mm512_srli_epi32::<28>(aux)),
        _mm512_set1_epi32(1),
    );
    let sc = core::array::from_fn(|c| _mm512_permutexvar_epi16(DWORD_SCALES[c].get(), odd));
    (sign_masks(sb), sc)
}

/// `g` negated where `neg` has a bit.
#[inline(always)]
fn negate(g: __m512i, neg: u64) -> __m512i {
    // SAFETY: only reached from this module's `#[target_feature]` functions, which run on a CPU
    // with AVX512BW (the tier's capability).
    unsafe { _mm512_mask_sub_epi8(g, _cvtu64_mask64(neg), _mm512_setzero_si512(), g) }
}

impl Wide for Iq2Xxs {
    const MODE: Mode = Mode::Scaled;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block, whose `qs` are 64 bytes.
        unsafe {
            let q = _mm512_loadu_si512(p.add(IQ2XXS_QS) as *const __m512i);
            let idx = _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, IQ2XXS_IDX.get(), q);
            let codes = IQ2XXS_CODE_TABLE.lookup(idx);
            let g: [__m512i; 4] = core::array::from_fn(|c| {
                let f = _mm512_multishift_epi64_epi8(
                    IQ2_SHIFTS.get(),
                    _mm512_permutexvar_epi16(IQ2_SPREAD[c].get(), codes),
                );
                _mm512_permutexvar_epi8(f, IQ2_FIELD_VALUES.get())
            });
            let odd_dwords = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 15, 13, 11, 9, 7, 5, 3, 1);
            let aux = _mm512_permutexvar_epi32(odd_dwords, q);
            let (neg, sc) = xxs_signs_scales(aux);
            let w = core::array::from_fn(|c| negate(g[c], neg[c]));
            Dec::new(
                w,
                sc,
                f16_to_f32(u16::from_le_bytes((*(p as *const Self::W)).d)),
            )
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * v[0] as f32;
    }
}

impl Wide for Iq3Xxs {
    const MODE: Mode = Mode::Scaled;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (64 index bytes, then 32 sign-and-scale bytes).
        unsafe {
            let codes: [__m512i; 2] = core::array::from_fn(|h| {
                let i = _mm256_loadu_si256(p.add(IQ3XXS_QS + 32 * h) as *const __m256i);
                IQ3XXS_CODE_TABLE.lookup(_mm512_cvtepu8_epi16(i))
            });
            let g: [__m512i; 4] = core::array::from_fn(|c| {
                let f = _mm512_multishift_epi64_epi8(
                    IQ3_SHIFTS.get(),
                    _mm512_permutexvar_epi16(IQ3_SPREAD[c % 2].get(), codes[c / 2]),
                );
                _mm512_permutexvar_epi8(f, IQ3XXS_FIELD_VALUES.get())
            });
            let aux =
                _mm512_castsi256_si512(_mm256_loadu_si256(p.add(IQ3XXS_AUX) as *const __m256i));
            let (neg, sc) = xxs_signs_scales(aux);
            let w = core::array::from_fn(|c| negate(g[c], neg[c]));
            Dec::new(
                w,
                sc,
                f16_to_f32(u16::from_le_bytes((*(p as *const Self::W)).d)),
            )
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * v[0] as f32;
    }
}

impl Wide for Iq1S {
    const MODE: Mode = Mode::ScaledBsums;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (under 64 bytes): the masked load reads exactly its bytes;
        // the gathers read `IQ1S_GRID` at 11-bit indices (2048 entries).
        unsafe {
            let b = _mm512_maskz_loadu_epi8((1u64 << IQ1S_BYTES) - 1, p as *const i8);
            let grid = IQ1S_GRID.as_ptr() as *const i64;
            // chunk l of a group takes qh bits 3l..3l+3 as index bits 8..11
            let shifts = _mm512_set_epi32(9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0);
            let mut g = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let m = _mm512_permutexvar_epi8(IQ1S_IDX[h].get(), b);
                let hi = _mm512_and_si512(_mm512_srlv_epi32(m, shifts), _mm512_set1_epi32(0x700));
                let i = _mm512_or_si512(_mm512_and_si512(m, _mm512_set1_epi32(0xff)), hi);
                g[2 * h] = _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(i), grid);
                g[2 * h + 1] = _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(i), grid);
            }
            let qh = _mm512_permutexvar_epi8(IQ1S_QH_WORDS.get(), b);
            let ls = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<11>(qh), _mm512_set1_epi16(0xe)),
                _mm512_set1_epi16(1),
            );
            let lsd =
                _mm512_mask_sub_epi16(ls, _mm512_movepi16_mask(qh), _mm512_setzero_si512(), ls);
            let sc = core::array::from_fn(|c| _mm512_permutexvar_epi16(WORD_SCALES[c].get(), ls));
            let mut d = Dec::new(
                g,
                sc,
                f16_to_f32(u16::from_le_bytes((*(p as *const Self::W)).d)),
            );
            d.bw = _mm512_castsi512_si256(_mm512_permutexvar_epi16(BSUM_PAIRS.get(), lsd));
            d
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * (v[0] as f32 + IQ1_DELTA * v[1] as f32);
    }
}

/// The eight IQ2 magnitudes of register `c`'s grid points (codes `8 c .. 8 c + 8` of `codes`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn expand_iq2(codes: __m512i, c: usize) -> __m512i {
    let f = _mm512_multishift_epi64_epi8(
        IQ2_SHIFTS.get(),
        _mm512_permutexvar_epi16(IQ2_SPREAD[c].get(), codes),
    );
    _mm512_permutexvar_epi8(f, IQ2_FIELD_VALUES.get())
}

/// The sixteen IQ3 grid points of register `c` (codes `16 (c % 2) ..` of `codes`, the codes of
/// its half of the block) through the magnitudes `values`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn expand_iq3(codes: __m512i, c: usize, values: &V64) -> __m512i {
    let f = _mm512_multishift_epi64_epi8(
        IQ3_SHIFTS.get(),
        _mm512_permutexvar_epi16(IQ3_SPREAD[c % 2].get(), codes),
    );
    _mm512_permutexvar_epi8(f, values.get())
}

/// `vpmultishiftqb` control for sixteen 4-bit fields of a broadcast qword (bytes 0..16).
static NIBBLES16: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = (4 * (i % 8) + 32 * (i / 8 % 2)) as u8;
        i += 1;
    }
    o
});

/// IQ1_M's sixteen 3-bit scales (16-element groups `h`): bit `16 (h / 4) + 6 (h / 2 % 2) + 3 (h %
/// 2)` of the four scale words.
static IQ1M_SCALE_SHIFTS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let h = i % 16;
        o[i] = (16 * (h / 4) + 6 * (h / 2 % 2) + 3 * (h % 2)) as u8;
        i += 1;
    }
    o
});

/// Scale words of register `c` from one byte per 16-element group (`per` = 8) or per
/// 32-element group (`per` = 16): word `w` <- byte `c * 32 / per + w / per`, high byte zero.
const fn byte_words(c: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        o[2 * w] = (c * 32 / per + w / per) as u8;
        w += 1;
    }
    V64(o)
}
static SCALES16: [V64; 4] = [
    byte_words(0, 8),
    byte_words(1, 8),
    byte_words(2, 8),
    byte_words(3, 8),
];
static SCALES32: [V64; 4] = [
    byte_words(0, 16),
    byte_words(1, 16),
    byte_words(2, 16),
    byte_words(3, 16),
];

/// The odd scales `2 f + 1` of the fields picked by `shifts` (width `mask`) from the qword
/// `bits`, as the scale words of the four registers (`table`: which byte each word takes).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn odd_scales(bits: u64, shifts: &V64, mask: i8, table: &[V64; 4]) -> [__m512i; 4] {
    let f = _mm512_and_si512(
        _mm512_multishift_epi64_epi8(shifts.get(), _mm512_set1_epi64(bits as i64)),
        _mm512_set1_epi8(mask),
    );
    let odd = _mm512_or_si512(_mm512_add_epi8(f, f), _mm512_set1_epi8(1));
    core::array::from_fn(|c| {
        _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, table[c].get(), odd)
    })
}

/// Index words of 32 grid points from `qs` bytes and high bits in `qh` bytes: word `i` =
/// `qs[at + i] | ((qh[(at + i) / per] >> shift(i)) & high)`, as `vpermi2b` (`qs` in the first
/// 64 bytes, `qh` in the second) and a per-word shift; see the users' tables.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn split_indices(qs: __m512i, qh: __m512i, bytes: &V64, shifts: &V64, high: i16) -> __m512i {
    let w = _mm512_permutex2var_epi8(qs, bytes.get(), qh);
    let hi = _mm512_and_si512(_mm512_srlv_epi16(w, shifts.get()), _mm512_set1_epi16(high));
    _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi16(0xff)), hi)
}

/// `vpermi2b` index: word `i` = byte `at + i` of the first table, then byte `64 + (at + i) /
/// per` (the high bits, from the second).
const fn split_bytes(at: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        o[2 * i] = (at + i) as u8;
        o[2 * i + 1] = (64 + (at + i) / per) as u8;
        i += 1;
    }
    V64(o)
}

/// Per-word right shifts `step * (i % per)`.
const fn word_shifts(step: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        o[2 * i] = (step * (i % per)) as u8;
        i += 1;
    }
    V64(o)
}
/// IQ2_S: 4 points per `qh` byte, 2 high bits each.
static IQ2S_BYTES: V64 = split_bytes(0, 4);
static IQ2S_SHIFTS: V64 = word_shifts(2, 4);
/// IQ3_S: 8 points per `qh` byte, 1 high bit each (64 points: two halves).
static IQ3S_BYTES: [V64; 2] = [split_bytes(0, 8), split_bytes(32, 8)];
static IQ3S_SHIFTS: V64 = word_shifts(1, 8);
static IQ3S_FIELD_VALUES: V64 = field_values(IQ3S_VALUES);

/// Four sign masks stored as bytes (IQ2_S, IQ3_S: one explicit byte per 8 weights).
///
/// # Safety
/// `p` is valid for 32 bytes.
#[inline(always)]
unsafe fn stored_masks(p: *const u8) -> [u64; 4] {
    // SAFETY: the caller's contract; unaligned read.
    unsafe { (p as *const [u64; 4]).read_unaligned() }.map(u64::from_le)
}

impl Wide for Iq2Xs {
    const MODE: Mode = Mode::Scaled;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block: 32 `qs` words and 8 scale bytes at their offsets.
        unsafe {
            let q = _mm512_loadu_si512(p.add(IQ2XS_QS) as *const __m512i);
            let codes = IQ2XS_CODE_TABLE.lookup(_mm512_and_si512(q, _mm512_set1_epi16(511)));
            let si = _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16::<9>(q)));
            let sb = _mm512_permutex2var_epi8(KSIGNS_LO.get(), si, KSIGNS_HI.get());
            let neg = sign_masks(sb);
            let w = core::array::from_fn(|c| negate(expand_iq2(codes, c), neg[c]));
            let bits = (p.add(IQ2XS_SCALES) as *const u64).read_unaligned();
            let sc = odd_scales(u64::from_le(bits), &NIBBLES16, 0x0f, &SCALES16);
            Dec::new(
                w,
                sc,
                f16_to_f32(u16::from_le_bytes((*(p as *const Self::W)).d)),
            )
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * v[0] as f32;
    }
}

impl Wide for Iq2S {
    const MODE: Mode = Mode::Scaled;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block: 64 `qs` bytes (indices, then signs), 8 `qh` and 8 scale
        // bytes at their offsets.
        unsafe {
            let qs = _mm512_loadu_si512(p.add(IQ2S_QS) as *const __m512i);
            let qh = _mm512_castsi128_si512(_mm_loadl_epi64(p.add(IQ2S_QH) as *const __m128i));
            let idx = split_indices(qs, qh, &IQ2S_BYTES, &IQ2S_SHIFTS, 0x300);
            let codes = IQ2S_CODE_TABLE.lookup(idx);
            let neg = stored_masks(p.add(IQ2S_SIGNS));
            let w = core::array::from_fn(|c| negate(expand_iq2(codes, c), neg[c]));
            let bits = (p.add(IQ2S_SCALES) as *const u64).read_unaligned();
            let sc = odd_scales(u64::from_le(bits), &NIBBLES16, 0x0f, &SCALES16);
            Dec::new(
                w,
                sc,
                f16_to_f32(u16::from_le_bytes((*(p as *const Self::W)).d)),
            )
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * v[0] as f32;
    }
}

impl Wide for Iq3S {
    const MODE: Mode = Mode::Scaled;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block: 64 `qs`, 8 `qh`, 32 sign and 4 scale bytes at their offsets.
        unsafe {
            let qs = _mm512_loadu_si512(p.add(IQ3S_QS) as *const __m512i);
            let qh = _mm512_castsi128_si512(_mm_loadl_epi64(p.add(IQ3S_QH) as *const __m128i));
            let codes: [__m512i; 2] = core::array::from_fn(|h| {
                IQ3S_CODE_TABLE.lookup(split_indices(qs, qh, &IQ3S_BYTES[h], &IQ3S_SHIFTS, 0x100))
            });
            let neg = stored_masks(p.add(IQ3S_SIGNS));
            let w = core::array::from_fn(|c| {
                negate(expand_iq3(codes[c / 2], c, &IQ3S_FIELD_VALUES), neg[c])
            });
            let bits = (p.add(IQ3S_SCALES) as *const u32).read_unaligned();
            let sc = odd_scales(u32::from_le(bits) as u64, &NIBBLES16, 0x0f, &SCALES32);
            Dec::new(
                w,
                sc,
                f16_to_f32(u16::from_le_bytes((*(p as *const Self::W)).d)),
            )
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * v[0] as f32;
    }
}

/// IQ1_M index material: dword `i` (chunk `16 half + i`) = its `qs` byte, then its `qh` byte.
const fn iq1m_idx(half: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        let chunk = 16 * half + i;
        o[4 * i] = (IQ1M_QS + chunk) as u8;
        o[4 * i + 1] = (IQ1M_QH + chunk / 2) as u8;
        i += 1;
    }
    V64(o)
}
static IQ1M_IDX: [V64; 2] = [iq1m_idx(0), iq1m_idx(1)];

/// IQ1_M shift signs of register `c`: byte `8 q + j` <- the `qh` byte of chunk `8 c + q`.
const fn iq1m_shift_bytes(c: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = (IQ1M_QH + (8 * c + i / 8) / 2) as u8;
        i += 1;
    }
    V64(o)
}
static IQ1M_SHIFT_BYTES: [V64; 4] = [
    iq1m_shift_bytes(0),
    iq1m_shift_bytes(1),
    iq1m_shift_bytes(2),
    iq1m_shift_bytes(3),
];
/// The shift sign bit of each byte there: bit 3 for even chunks, bit 7 for odd ones.
static IQ1M_SHIFT_BITS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = if (i / 8) % 2 == 0 { 0x08 } else { 0x80 };
        i += 1;
    }
    o
});

impl Wide for Iq1M {
    const MODE: Mode = Mode::ScaledTwo;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (under 64 bytes): the masked load reads exactly its bytes;
        // the gathers read `IQ1S_GRID` at 11-bit indices (2048 entries).
        unsafe {
            let b = _mm512_maskz_loadu_epi8((1u64 << IQ1M_BYTES) - 1, p as *const i8);
            let grid = IQ1S_GRID.as_ptr() as *const i64;
            // even chunks take qh bits 0..3 as index bits 8..11, odd chunks bits 4..7
            let shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
            let mut g = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let m = _mm512_permutexvar_epi8(IQ1M_IDX[h].get(), b);
                let hi = _mm512_and_si512(_mm512_srlv_epi32(m, shifts), _mm512_set1_epi32(0x700));
                let i = _mm512_or_si512(_mm512_and_si512(m, _mm512_set1_epi32(0xff)), hi);
                g[2 * h] = _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(i), grid);
                g[2 * h + 1] = _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(i), grid);
            }
            let blk = &*(p as *const BlockIq1M);
            let bits = (p.add(IQ1M_SCALES) as *const u64).read_unaligned();
            let sc = odd_scales(u64::from_le(bits), &IQ1M_SCALE_SHIFTS, 0x07, &SCALES16);
            let mut d = Dec::new(g, sc, f16_to_f32(blk.d_bits()));
            d.w2 = core::array::from_fn(|c| {
                let sh = _mm512_permutexvar_epi8(IQ1M_SHIFT_BYTES[c].get(), b);
                let m = _mm512_test_epi8_mask(sh, IQ1M_SHIFT_BITS.get());
                _mm512_mask_blend_epi8(m, _mm512_set1_epi8(1), _mm512_set1_epi8(-1))
            });
            d
        }
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        *sumf += d.d[0] * xd[0] * (v[0] as f32 + IQ1_DELTA * v[1] as f32);
    }
}

/// The four weight registers of 32 IQ4 `qs` bytes per register.
///
/// # Safety
/// The CPU has the tier's features; `chunk(c)` gives register `c`'s 32 bytes in its low half.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn iq4_decode(chunks: [__m512i; 4]) -> Dec {
    let perm = IQ4_PERM.get();
    let values = IQ4_VALUES.get();
    let nib = _mm512_set1_epi8(0x0f);
    let w = chunks.map(|q| {
        let t = _mm512_permutexvar_epi8(perm, q);
        let h = _mm512_srli_epi16::<4>(t);
        let v = _mm512_mask_blend_epi8(0xffff_0000_ffff_0000, t, h);
        _mm512_shuffle_epi8(values, _mm512_and_si512(v, nib))
    });
    Dec::new(w, [_mm512_setzero_si512(); 4], 0.0)
}

impl Wide for Iq4Xs {
    const MODE: Mode = Mode::Groups;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block, with 128 `qs` bytes.
        let chunks = core::array::from_fn(|c| unsafe {
            _mm512_castsi256_si512(_mm256_loadu_si256(
                p.add(IQ4XS_QS + 32 * c) as *const __m256i
            ))
        });
        let mut d = iq4_decode(chunks);
        // SAFETY: `p` is one block (alignment 1).
        let b = unsafe { &*(p as *const Self::W) };
        d.d[0] = f16_to_f32(u16::from_le_bytes(b.d));
        d.s = core::array::from_fn(|g| (b.scale(g) as i32 - 32) as f32);
        d
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        // dl = d4d8 * (scale - 32) per group, then sumf += dl * sum, in group order
        let d4d8 = d.d[0] * xd[0];
        // SAFETY: reached only from this module's `#[target_feature]` functions (AVX present);
        // `d.s` is 32 readable bytes.
        let dl = unsafe { _mm256_mul_ps(_mm256_set1_ps(d4d8), _mm256_loadu_ps(d.s.as_ptr())) };
        add_products(dl, v, sumf);
    }
}

impl Wide for Iq4Nl {
    const MODE: Mode = Mode::Groups;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is eight consecutive blocks, each with 16 `qs` bytes.
        let chunks = core::array::from_fn(|c| unsafe {
            let lo = _mm_loadu_si128(p.add(IQ4NL_BYTES * 2 * c + IQ4NL_QS) as *const __m128i);
            let hi = _mm_loadu_si128(p.add(IQ4NL_BYTES * (2 * c + 1) + IQ4NL_QS) as *const __m128i);
            _mm512_castsi256_si512(_mm256_set_m128i(hi, lo))
        });
        let mut d = iq4_decode(chunks);
        // SAFETY: `p` is eight blocks (alignment 1).
        let b = unsafe { core::slice::from_raw_parts(p as *const Self::W, 8) };
        d.d = core::array::from_fn(|g| f16_to_f32(u16::from_le_bytes(b[g].d)));
        d
    }
    #[inline(always)]
    fn epilogue_ints(d: &Dec, xd: &[f32; 8], v: &[i32; 8], sumf: &mut f32) {
        // per block `x.d * w.d`, then sumf += that * sum, in block order
        // SAFETY: reached only from this module's `#[target_feature]` functions (AVX present);
        // `xd` and `d.d` are 32 readable bytes each.
        let dd =
            unsafe { _mm256_mul_ps(_mm256_loadu_ps(xd.as_ptr()), _mm256_loadu_ps(d.d.as_ptr())) };
        add_products(dd, v, sumf);
    }
}

/// Packs `units` activation units of type `act` at `x` into `dst` (`PACKED_UNIT` bytes each).
///
/// # Safety
/// The CPU has the tier's features; `x` holds `units` whole units, `dst` `units * PACKED_UNIT`
/// bytes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn pack(act: GgmlType, x: *const u8, unit_bytes: usize, units: usize, dst: *mut u8) {
    for u in 0..units {
        // SAFETY: unit `u` and its packed slot are inside the buffers (caller's contract).
        unsafe {
            let (xu, du) = (x.add(u * unit_bytes), dst.add(u * PACKED_UNIT));
            for c in 0..4 {
                let lo = _mm256_loadu_si256(xu.add(act_chunk_offset(act, 2 * c)) as *const __m256i);
                let hi =
                    _mm256_loadu_si256(xu.add(act_chunk_offset(act, 2 * c + 1)) as *const __m256i);
                let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                _mm512_storeu_si512(du.add(64 * c) as *mut __m512i, _mm512_abs_epi8(v));
                let neg = _cvtmask64_u64(_mm512_movepi8_mask(v));
                (du.add(256 + 8 * c) as *mut u64).write_unaligned(neg);
            }
            let mut xd = [0f32; 8];
            if act == GgmlType::Q8_0 {
                let b = core::slice::from_raw_parts(xu as *const BlockQ8_0, 8);
                xd = core::array::from_fn(|g| f16_to_f32(u16::from_le_bytes(b[g].d)));
            } else {
                xd[0] = (*(xu as *const BlockQ8_K)).d();
            }
            (du.add(PACKED_D) as *mut [f32; 8]).write_unaligned(xd);
        }
    }
}

/// The sum of the eight dwords of `v`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn hsum256(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The eight 32-element sums of four registers whose dword lanes 0..8 / 8..16 are the partial
/// sums of groups `2c` / `2c + 1`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn groups8(a: [__m512i; 4]) -> [i32; 8] {
    // 128-bit lanes [G0 G1 G2 G3] and [G4 G5 G6 G7], each lane still four partials
    let p = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(a[0], a[1]),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(a[0], a[1]),
    );
    let r = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(a[2], a[3]),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(a[2], a[3]),
    );
    let u = _mm512_add_epi32(_mm512_unpacklo_epi32(p, r), _mm512_unpackhi_epi32(p, r));
    let t = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0b01_00_11_10>(u));
    // group L is dword 4L, group 4 + L dword 4L + 1
    let order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    let mut s = [0i32; 8];
    let g = _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, t));
    // SAFETY: `s` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(s.as_mut_ptr() as *mut __m256i, g) };
    s
}

/// `sumf += d[g] * s[g] as f32` for g = 0..8 in order: the eight products in one register (each
/// rounded once, as the reference rounds it), then the additions one by one.
#[inline(always)]
fn add_products(d: __m256, s: &[i32; 8], sumf: &mut f32) {
    let mut p = [0f32; 8];
    // SAFETY: only reached from this module's `#[target_feature]` functions (AVX2 present);
    // `s` and `p` are 32 bytes each, unaligned accesses.
    unsafe {
        let sf = _mm256_cvtepi32_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i));
        _mm256_storeu_ps(p.as_mut_ptr(), _mm256_mul_ps(d, sf));
    }
    for v in p {
        *sumf += v;
    }
}

/// The integers of `K::MODE` for decoded unit `d` against the packed activation unit `px`
/// (and the activation blocks at `xu`, for the `bsums`).
///
/// # Safety
/// The CPU has the tier's features; `px` is one packed unit, `xu` one activation unit.
#[inline(always)]
unsafe fn dot<K: Wide>(d: &Dec, px: *const u8, xu: *const u8) -> [i32; 8] {
    // SAFETY: the reads stay inside the packed unit and the activation unit (caller's contract);
    // the features are the caller's.
    unsafe {
        let zero = _mm512_setzero_si512();
        let neg = |c: usize| (px.add(256 + 8 * c) as *const u64).read_unaligned();
        let ax = |c: usize| _mm512_loadu_si512(px.add(64 * c) as *const __m512i);
        let mut v = [0i32; 8];
        if K::MODE == Mode::Groups {
            let a =
                core::array::from_fn(|c| _mm512_dpbusd_epi32(zero, ax(c), negate(d.w[c], neg(c))));
            return groups8(a);
        }
        let mut acc = zero;
        let mut acc2 = zero;
        for c in 0..4 {
            let (a, m) = (ax(c), neg(c));
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(a, negate(d.w[c], m)), d.sc[c]);
            if K::MODE == Mode::ScaledTwo {
                let p2 = _mm512_maddubs_epi16(a, negate(d.w2[c], m));
                acc2 = _mm512_dpwssd_epi32(acc2, p2, d.sc[c]);
            }
        }
        v[0] = _mm512_reduce_add_epi32(acc);
        if K::MODE == Mode::ScaledTwo {
            v[1] = _mm512_reduce_add_epi32(acc2);
        }
        if K::MODE == Mode::ScaledBsums {
            let bsums = _mm256_loadu_si256(xu.add(Q8K_BSUMS) as *const __m256i);
            v[1] = hsum256(_mm256_madd_epi16(bsums, d.bw));
        }
        v
    }
}

/// `out[r * n + j] = W[r] . x[j]` for one kind: unit by unit, each decoded once and run against
/// every activation row, each result accumulated in the reference's block order.
///
/// # Safety
/// The CPU has the tier's features.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gemm_wide<K: Wide>(
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    let Some((wb, xb, per_row)) = unit_blocks::<K>(k, w, rows, x, n, out) else {
        return false;
    };
    if n == 0 {
        return true;
    }
    let act = <K::X as Block>::TYPE;
    let units = per_row / K::UNIT;
    let unit_bytes = K::UNIT * size_of::<K::X>();
    super::PACKED.with(|cell| {
        let mut packed = cell.borrow_mut();
        packed.resize(n * units * PACKED_UNIT, 0);
        // SAFETY: `x` holds `n * units` activation units (checked by `unit_blocks`) and `packed`
        // was sized for them; the caller guarantees the features.
        unsafe { pack(act, x.as_ptr(), unit_bytes, n * units, packed.as_mut_ptr()) };
        out.fill(0.0);
        // Rows in tiles of ROWS, so that the float chains of several outputs (each unit's
        // epilogue adds to its output in order) interleave instead of waiting on each other.
        for (wt, ot) in wb.chunks(ROWS * per_row).zip(out.chunks_mut(ROWS * n)) {
            for u in 0..units {
                for (wr, o) in wt.chunks_exact(per_row).zip(ot.chunks_exact_mut(n)) {
                    let wu = &wr[u * K::UNIT..][..K::UNIT];
                    // SAFETY: `wu` is one whole weight unit; features as above.
                    let d = unsafe { K::decode_regs(wu.as_ptr() as *const u8) };
                    for (j, acc) in o.iter_mut().enumerate() {
                        let xu = &xb[(j * units + u) * K::UNIT..][..K::UNIT];
                        // SAFETY: packed unit `j * units + u` and activation unit `xu` exist.
                        let (v, xd) = unsafe {
                            let pu = packed.as_ptr().add((j * units + u) * PACKED_UNIT);
                            let xd = (pu.add(PACKED_D) as *const [f32; 8]).read_unaligned();
                            (dot::<K>(&d, pu, xu.as_ptr() as *const u8), xd)
                        };
                        K::epilogue_ints(&d, &xd, &v, acc);
                    }
                }
            }
        }
        for acc in out.iter_mut() {
            *acc = K::finish(*acc);
        }
    });
    true
}

/// The 64-byte path for `ty`; false when it has none (or the lengths do not hold whole units).
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
    // SAFETY: the caller guarantees the features every arm needs.
    unsafe {
        match ty {
            GgmlType::IQ2_XXS => gemm_wide::<Iq2Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_wide::<Iq3Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ1_S => gemm_wide::<Iq1S>(k, w, rows, x, n, out),
            GgmlType::IQ4_XS => gemm_wide::<Iq4Xs>(k, w, rows, x, n, out),
            GgmlType::IQ4_NL => gemm_wide::<Iq4Nl>(k, w, rows, x, n, out),
            GgmlType::IQ2_XS => gemm_wide::<Iq2Xs>(k, w, rows, x, n, out),
            GgmlType::IQ2_S => gemm_wide::<Iq2S>(k, w, rows, x, n, out),
            GgmlType::IQ3_S => gemm_wide::<Iq3S>(k, w, rows, x, n, out),
            GgmlType::IQ1_M => gemm_wide::<Iq1M>(k, w, rows, x, n, out),
            _ => false,
        }
    }
}
