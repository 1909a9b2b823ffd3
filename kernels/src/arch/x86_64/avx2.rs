//! AVX2 tier: the integer block dots for K-quants (`maddubs` + `madd` by the scale vector, 32
//! bytes at a time) and Q8_0 (sign-extend to i16 + `madd`, exact for every byte including -128),
//! plugged into the shared drivers of `kquant` and `q8_0`.

use core::arch::x86_64::*;

use super::kquant::{kquant_gemm, Unpacked};
use super::q8_0::q8_0_gemm;

/// Lane sums `aux[m] = sum over the block of scale * w * q` for lane `m` (offset form when
/// `signed`: `maddubs(q + 128, w)`; the caller subtracts the weight correction).
///
/// # Safety
/// `a` must be valid for 256 bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_k(u: &Unpacked, a: *const u8, signed: bool) -> __m256i {
    let mut acc0 = _mm256_setzero_si256();
    let mut acc1 = _mm256_setzero_si256();
    let wp = u.w.as_ptr();
    let sp = u.s.as_ptr();
    for c in (0..8).step_by(2) {
        let w0 = _mm256_loadu_si256(wp.add(32 * c) as *const __m256i);
        let w1 = _mm256_loadu_si256(wp.add(32 * c + 32) as *const __m256i);
        let a0 = _mm256_loadu_si256(a.add(32 * c) as *const __m256i);
        let a1 = _mm256_loadu_si256(a.add(32 * c + 32) as *const __m256i);
        let (t0, t1) = if signed {
            (_mm256_maddubs_epi16(a0, w0), _mm256_maddubs_epi16(a1, w1))
        } else {
            (_mm256_maddubs_epi16(w0, a0), _mm256_maddubs_epi16(w1, a1))
        };
        let s0 = _mm256_loadu_si256(sp.add(16 * c) as *const __m256i);
        let s1 = _mm256_loadu_si256(sp.add(16 * c + 16) as *const __m256i);
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(t0, s0));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(t1, s1));
    }
    _mm256_add_epi32(acc0, acc1)
}

kquant_gemm!("avx2", dot_k);

/// One Q8_0 block's quants sign-extended to 2 x 16 i16.
///
/// # Safety
/// `blk` must be valid for 34 bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prep_q8_0(blk: *const u8) -> (__m256i, __m256i) {
    let lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(2) as *const __m128i));
    let hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(18) as *const __m128i));
    (lo, hi)
}

/// 8 i32 partial sums of the 32 products of a prepared block with the block at `blk`.
///
/// # Safety
/// As [`prep_q8_0`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_q8_0(p: &(__m256i, __m256i), blk: *const u8) -> __m256i {
    let (lo, hi) = prep_q8_0(blk);
    _mm256_add_epi32(_mm256_madd_epi16(p.0, lo), _mm256_madd_epi16(p.1, hi))
}

q8_0_gemm!("avx2", prep_q8_0, dot_q8_0);
