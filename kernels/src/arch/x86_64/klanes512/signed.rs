//! Q3_K and Q6_K weight decoding for the AVX-512 K-quant kernels (`klanes512`): one row's block
//! into 4 vectors of raw unsigned values (Q3_K `q | 4 * hbit` in 0..=7, Q6_K 0..=63; the offset
//! is subtracted on the activation side) permuted per 32-byte chunk, and the matching scale-pair
//! vectors; with GFNI the bit fields are moved by affine byte transforms.

use core::arch::x86_64::*;

use super::super::kblock::Q3;
use super::ops::{add_masked, gf_affine, pair_idx, perm64, permd};
use super::tables::{
    GF_NIB_HI, GF_Q3_HM, GF_Q3_HM_S, GF_Q3_QS, GF_Q6_HI, GF_Q6_HI_S, GF_Q6_LO, GF_Q6_LO_S,
};

/// Q3_K or Q6_K: one row's raw values and scale-pair vectors (with `sgn` and `G`: the true
/// values `raw - 4` / `raw - 32`).
///
/// # Safety
/// As [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn decode_signed<const K: u8, const G: bool>(
    b: *const u8,
    sgn: bool,
) -> ([__m512i; 4], [__m512i; 4]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        if K == Q3 {
            return decode_q3::<G>(b, sgn);
        }
        // Q6_K: ql[128] @0, qh[64] @128, scales[16] @192, d @208.
        let m0f = _mm512_set1_epi8(0x0f);
        let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
            b.add(192) as *const __m128i
        )));
        let m30 = _mm512_set1_epi8(0x30);
        // Low nibbles: qh bits 0-1 (shift left 4) / 2-3 (left 2) to bits 4-5 in the two
        // halves; high nibbles: bits 4-5 (no shift) / 6-7 (right 2).
        let shl = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
        let shr =
            _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_setzero_si512(), _mm512_set1_epi16(2));
        let mut w = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let l = perm64(_mm512_loadu_si512(b.add(64 * h) as *const __m512i));
            let qh = perm64(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                b.add(128 + 32 * h) as *const __m256i,
            )));
            if G && sgn {
                // `raw - 32`: the qh pair `v` as the 4-bit `v - 2` in bits 4-7 (bit 4 = v's bit 0,
                // bits 5-7 = not v's bit 1), so the values come out signed.
                let hlo = gf_affine::<0xE0>(qh, GF_Q6_LO_S.get());
                let hhi = gf_affine::<0xE0>(qh, GF_Q6_HI_S.get());
                w[2 * h] = _mm512_ternarylogic_epi32::<0xEC>(l, hlo, m0f);
                w[2 * h + 1] = _mm512_or_si512(gf_affine::<0>(l, GF_NIB_HI.get()), hhi);
            } else if G {
                // The qh pairs straight to bits 4-5 (per half), the high nibble to bits 0-3.
                let hlo = gf_affine::<0>(qh, GF_Q6_LO.get());
                let hhi = gf_affine::<0>(qh, GF_Q6_HI.get());
                w[2 * h] = _mm512_ternarylogic_epi32::<0xEC>(l, hlo, m0f);
                w[2 * h + 1] = _mm512_or_si512(gf_affine::<0>(l, GF_NIB_HI.get()), hhi);
            } else {
                let hlo = _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30);
                let hhi = _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30);
                // (a & 0x0f) | b
                w[2 * h] = _mm512_ternarylogic_epi32::<0xEC>(l, hlo, m0f);
                w[2 * h + 1] =
                    _mm512_ternarylogic_epi32::<0xEC>(_mm512_srli_epi16::<4>(l), hhi, m0f);
            }
        }
        let s = [
            permd(pair_idx(0, 1), sc),
            permd(pair_idx(2, 3), sc),
            permd(pair_idx(4, 5), sc),
            permd(pair_idx(6, 7), sc),
        ];
        (w, s)
    }
}

/// `w + add` in the bytes whose bit `c1` (low 32 bytes) or `c2` (high 32 bytes) of `h` is set.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn add_high_bit(w: __m512i, h: __m512i, c1: u32, c2: u32, add: i8) -> __m512i {
    let sel = _mm512_mask_blend_epi8(
        0xFFFF_FFFF_0000_0000,
        _mm512_set1_epi8((1u32 << c1) as u8 as i8),
        _mm512_set1_epi8((1u32 << c2) as u8 as i8),
    );
    let k = _mm512_test_epi8_mask(h, sel);
    add_masked(w, k, _mm512_set1_epi8(add))
}

/// Q3_K's 12 scale bytes at `p` -> the 16 six-bit scales minus 32 as i8 (as
/// `unpack::q3_scales`): scale `4i + k` = bits 0..4 of byte k (i = 0), of byte 4 + k (i = 1),
/// bits 4..8 of those (i = 2, 3), with bits `2i..2i+2` of byte `8 + k` on top.
///
/// # Safety
/// `p` must be valid for 12 bytes (the load is masked to them); CPU features as [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn q3_scales_simd(p: *const u8) -> __m128i {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let v = _mm_maskz_loadu_epi8(0x0FFF, p as *const i8);
        let lo = _mm_shuffle_epi8(
            v,
            _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
        );
        let lo = _mm_and_si128(
            _mm_srlv_epi16(lo, _mm_setr_epi16(0, 0, 0, 0, 4, 4, 4, 4)),
            _mm_set1_epi8(0x0f),
        );
        let hi = _mm_shuffle_epi8(
            v,
            _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11),
        );
        let hi = _mm_and_si128(
            _mm_srlv_epi16(hi, _mm_setr_epi16(0, 0, 2, 2, 4, 4, 6, 6)),
            _mm_set1_epi8(3),
        );
        _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16::<4>(hi)), _mm_set1_epi8(32))
    }
}

/// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108. The raw values `q | 4 * hbit` are
/// in 0..=7 (the true ones are 4 less); w[s] holds chunks (s, s + 4), which are bits `2s..2s+2`
/// of the two 32-byte halves of `qs`.
///
/// # Safety
/// As [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn decode_q3<const G: bool>(b: *const u8, sgn: bool) -> ([__m512i; 4], [__m512i; 4]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(q3_scales_simd(b.add(96))));
        let hm = perm64(_mm512_broadcast_i64x4(_mm256_loadu_si256(
            b as *const __m256i,
        )));
        let qs = perm64(_mm512_loadu_si512(b.add(32) as *const __m512i));
        let m3 = _mm512_set1_epi8(3);
        let w = if G && sgn {
            // `raw - 4`: bits 2..8 = not the hmask bit (the value minus 4, sign-extended).
            core::array::from_fn(|s| {
                let q = if s == 0 {
                    _mm512_and_si512(qs, m3)
                } else {
                    gf_affine::<0>(qs, GF_Q3_QS[s].get())
                };
                _mm512_or_si512(q, gf_affine::<0xFC>(hm, GF_Q3_HM_S[s].get()))
            })
        } else if G {
            // Bits 2s..2s+2 of qs to bits 0-1 and hmask bit s (s + 4 in the high half) to bit 2,
            // one affine byte transform each.
            core::array::from_fn(|s| {
                let q = if s == 0 {
                    _mm512_and_si512(qs, m3)
                } else {
                    gf_affine::<0>(qs, GF_Q3_QS[s].get())
                };
                _mm512_or_si512(q, gf_affine::<0>(hm, GF_Q3_HM[s].get()))
            })
        } else {
            [
                add_high_bit(_mm512_and_si512(qs, m3), hm, 0, 4, 4),
                add_high_bit(
                    _mm512_and_si512(_mm512_srli_epi16::<2>(qs), m3),
                    hm,
                    1,
                    5,
                    4,
                ),
                add_high_bit(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(qs), m3),
                    hm,
                    2,
                    6,
                    4,
                ),
                add_high_bit(
                    _mm512_and_si512(_mm512_srli_epi16::<6>(qs), m3),
                    hm,
                    3,
                    7,
                    4,
                ),
            ]
        };
        let s = [
            permd(pair_idx(0, 4), sc),
            permd(pair_idx(1, 5), sc),
            permd(pair_idx(2, 6), sc),
            permd(pair_idx(3, 7), sc),
        ];
        (w, s)
    }
}
