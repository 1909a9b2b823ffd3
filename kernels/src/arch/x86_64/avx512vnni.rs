//! AVX-512-VNNI tier: K-quant block dots 64 bytes at a time (`maddubs` then `vpdpwssd` by the
//! scale vector, folding the two 32-byte chunks' lanes at the end), on the driver of `kquant`
//! (Q8_0 has its own 16-row kernel on this tier, `q8_0_512`).

use core::arch::x86_64::*;

use super::kblock::signed;
use super::kquant::kquant_gemm;
use super::unpack::{decode, BlockMeta, Unpacked};

/// Same contract as the AVX2 `dot_k`: per weight block, the lane sums of `scale * w * q`.
///
/// # Safety
/// `a` must be valid for 256 bytes; the CPU must have AVX-512F/BW/VL/VNNI.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_k<const R: usize>(u: &[Unpacked; R], a: *const u8, signed: bool) -> [__m256i; R] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let mut acc = [_mm512_setzero_si512(); R];
        for h in 0..4 {
            let av = _mm512_loadu_si512(a.add(64 * h) as *const __m512i);
            for r in 0..R {
                let w = _mm512_loadu_si512(u[r].w.as_ptr().add(64 * h) as *const __m512i);
                let s = _mm512_loadu_si512(u[r].s.as_ptr().add(32 * h) as *const __m512i);
                let t = if signed {
                    _mm512_maddubs_epi16(av, w)
                } else {
                    _mm512_maddubs_epi16(w, av)
                };
                acc[r] = _mm512_dpwssd_epi32(acc[r], t, s);
            }
        }
        // Lanes m and m + 8 both belong to reference lane m.
        let mut out = [_mm256_setzero_si256(); R];
        for r in 0..R {
            out[r] = _mm256_add_epi32(
                _mm512_castsi512_si256(acc[r]),
                _mm512_extracti64x4_epi64::<1>(acc[r]),
            );
        }
        out
    }
}

/// Batch-1 path (see `unpack::dot_fused`): decoded chunks are paired into 64-byte vectors and
/// multiplied with `maddubs` + `vpdpwssd`; returns the meta (zero correction) and lane sums.
///
/// # Safety
/// `b` must be valid for the kind's block bytes and `a` for 256 bytes; the CPU must have
/// AVX-512F/BW/VL/VNNI, AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_fused<const K: u8>(b: *const u8, a: *const u8) -> (BlockMeta, __m256i) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let k128 = _mm512_set1_epi8(-128);
        let mut acc = _mm512_setzero_si512();
        let mut prev = _mm256_setzero_si256();
        let meta = decode::<K, _>(b, |c, w, sc16| {
            if c % 2 == 0 {
                prev = w;
                return;
            }
            let wz = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(prev), w);
            let lo = (c - 1) as i32;
            let hi = c as i32;
            let idx = _mm512_setr_epi32(
                lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
            );
            // Only lanes 0..8 of the widened `sc16` are read.
            let s = _mm512_permutexvar_epi32(idx, _mm512_castsi256_si512(sc16));
            let av = _mm512_loadu_si512(a.add(32 * (c - 1)) as *const __m512i);
            let t = if signed(K) {
                _mm512_sub_epi16(_mm512_maddubs_epi16(av, wz), _mm512_maddubs_epi16(k128, wz))
            } else {
                _mm512_maddubs_epi16(wz, av)
            };
            acc = _mm512_dpwssd_epi32(acc, t, s);
        });
        let folded = _mm256_add_epi32(
            _mm512_castsi512_si256(acc),
            _mm512_extracti64x4_epi64::<1>(acc),
        );
        (meta, folded)
    }
}

kquant_gemm!(
    "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dot_k,
    dot_fused
);
