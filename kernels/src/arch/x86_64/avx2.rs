//! AVX2 tier: the integer block dots for K-quants (`maddubs` + `madd` by the scale vector, 32
//! bytes at a time) and Q8_0 (sign-extend to i16 + `madd`, exact for every byte including -128),
//! plugged into the shared drivers of `kquant` and `q8_0`.

use core::arch::x86_64::*;

use super::kquant::kquant_gemm;
use super::q8_0::q8_0_gemm;
use super::unpack::{dot_fused, Unpacked};

/// For each of `R` unpacked weight blocks, the lane sums `aux[m] = sum of scale * w * q` over
/// lane `m` (offset form when `signed`: `maddubs(q + 128, w)`; the epilogue subtracts the
/// weight correction). Each 32-byte activation chunk is loaded once for all `R` rows.
///
/// # Safety
/// `a` must be valid for 256 bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dot_k<const R: usize>(u: &[Unpacked; R], a: *const u8, signed: bool) -> [__m256i; R] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let mut acc = [_mm256_setzero_si256(); R];
        for c in 0..8 {
            let av = _mm256_loadu_si256(a.add(32 * c) as *const __m256i);
            for r in 0..R {
                let w = _mm256_loadu_si256(u[r].w.as_ptr().add(32 * c) as *const __m256i);
                let s = _mm256_loadu_si256(u[r].s.as_ptr().add(16 * c) as *const __m256i);
                let t = if signed {
                    _mm256_maddubs_epi16(av, w)
                } else {
                    _mm256_maddubs_epi16(w, av)
                };
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(t, s));
            }
        }
        acc
    }
}

kquant_gemm!("avx2,f16c", dot_k, dot_fused);

/// One Q8_0 block's quants sign-extended to 2 x 16 i16.
///
/// # Safety
/// `blk` must be valid for 34 bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn prep_q8_0(blk: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(2) as *const __m128i));
        let hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(18) as *const __m128i));
        (lo, hi)
    }
}

/// 8 i32 partial sums of the 32 products of a prepared block with the block at `blk`.
///
/// # Safety
/// As [`prep_q8_0`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dot_q8_0(p: &(__m256i, __m256i), blk: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let (lo, hi) = prep_q8_0(blk);
        _mm256_add_epi32(_mm256_madd_epi16(p.0, lo), _mm256_madd_epi16(p.1, hi))
    }
}

q8_0_gemm!("avx2,f16c", prep_q8_0, dot_q8_0);
