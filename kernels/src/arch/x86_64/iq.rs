//! The i-quant, ternary, FP4 and Q1_0/Q2_0 GEMM path of both x86 tiers (AVX2 instructions; the AVX-512 tier
//! runs the same code). Each weight unit (256 elements: one block, or 2 to 8 smaller ones) is
//! decoded once into signed bytes (`arch::iq_tile`), then used against every activation row:
//! per 32 bytes one `vpmaddubsw` of `|x|` with the weights carrying x's sign (`vpsignb`: exact
//! for every byte, -128 included, since no weight is -128 and a pair sum stays below 2^15) and
//! one `vpmaddwd` to 32 bits; two `vphaddd` rounds fold the eight chunk vectors into the sixteen
//! 16-element group sums, and the kind's epilogue replays the scalar reference's float steps.

use core::arch::x86_64::*;

use crate::arch::iq_tile::{self, act_chunk_offset, Sums};
use crate::formats::QK_K;
use crate::{GgmlType, Tile};

/// The sixteen 16-element group sums of `w` against the activation unit at `xu`.
///
/// # Safety
/// The CPU must have AVX2; `xu` must be valid for one activation unit of type `act` (Q8_K: one
/// 292-byte block; Q8_0: eight 34-byte blocks).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sums16(w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut v = [_mm256_setzero_si256(); 8];
        for (c, vc) in v.iter_mut().enumerate() {
            let xv = _mm256_loadu_si256(xu.add(act_chunk_offset(act, c)) as *const __m256i);
            let wv = _mm256_loadu_si256(w.as_ptr().add(32 * c) as *const __m256i);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(wv, xv));
            *vc = _mm256_madd_epi16(p, ones);
        }
        // v[c] lanes 0..4 hold group 2c, lanes 4..8 group 2c + 1; two hadd rounds give
        // [g0 g2 g4 g6 | g1 g3 g5 g7] and the same for groups 8..16.
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        let mut a = [0i32; 16];
        _mm256_storeu_si256(a.as_mut_ptr() as *mut __m256i, _mm256_hadd_epi32(h01, h23));
        _mm256_storeu_si256(
            a.as_mut_ptr().add(8) as *mut __m256i,
            _mm256_hadd_epi32(h45, h67),
        );
        let mut s = [0i32; 16];
        for c in 0..4 {
            s[2 * c] = a[c];
            s[2 * c + 1] = a[4 + c];
            s[8 + 2 * c] = a[8 + c];
            s[9 + 2 * c] = a[12 + c];
        }
        s
    }
}

struct Avx2Sums;

impl Sums for Avx2Sums {
    #[inline(always)]
    unsafe fn sums(&self, w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16] {
        // SAFETY: forwarded: the CPU has AVX2 and `xu` is one activation unit.
        unsafe { sums16(w, xu, act) }
    }

    /// Both nibbles of 16 bytes through one `vpshufb` of `table` each.
    #[inline(always)]
    fn nl_values(&self, table: &[i8; 16], qs: &[u8], out: &mut [i8; QK_K], at: usize) {
        let (qs, dst) = (&qs[..16], &mut out[at..at + 32]);
        // SAFETY: an `Avx2Sums` exists only inside `gemm`, whose caller guarantees AVX2 (SSSE3
        // included); `qs` and `dst` are bounds-checked 16 and 32 bytes, unaligned accesses.
        unsafe {
            let table = _mm_loadu_si128(table.as_ptr() as *const __m128i);
            let q = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
            let m = _mm_set1_epi8(0x0f);
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), m));
            _mm_storeu_si128(dst.as_mut_ptr() as *mut __m128i, lo);
            _mm_storeu_si128(dst.as_mut_ptr().add(16) as *mut __m128i, hi);
        }
    }
}

/// The path of the types `arch::iq_tile` decodes; false for any other type (or unusable
/// lengths).
///
/// # Safety
/// The CPU must have AVX2 (true under either x86 tier's capability).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn gemm(t: &mut Tile<'_>) -> bool {
    // SAFETY: the caller guarantees AVX2, all `Avx2Sums` needs.
    unsafe { iq_tile::gemm(&Avx2Sums, t) }
}
