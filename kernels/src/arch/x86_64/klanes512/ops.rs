//! Single-instruction helpers of the AVX-512 K-quant kernels (`klanes512`): fixed permutations
//! and the instructions written as asm because LLVM would otherwise rewrite them into more uops
//! (`vpdpwssd` chains, merge-masked `vpaddb`, constant `vpermd`) or because the feature must stay
//! out of LLVM's own code generation (GFNI's `vgf2p8affineqb`).

use core::arch::x86_64::*;

/// `kblock::perm32` on both 32-byte halves: one `vpermb` (AVX512-VBMI).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn perm64(v: __m512i) -> __m512i {
    // Byte 4m + r of each half <- byte m + 8r of that half.
    let idx = _mm512_set_epi32(
        0x3F37_2F27,
        0x3E36_2E26,
        0x3D35_2D25,
        0x3C34_2C24,
        0x3B33_2B23,
        0x3A32_2A22,
        0x3931_2921,
        0x3830_2820,
        0x1F17_0F07,
        0x1E16_0E06,
        0x1D15_0D05,
        0x1C14_0C04,
        0x1B13_0B03,
        0x1A12_0A02,
        0x1911_0901,
        0x1810_0800,
    );
    _mm512_permutexvar_epi8(idx, v)
}

/// Lane pairs of chunk `c1` (lanes 0..8) and `c2` (lanes 8..16) from the i16 scale pairs.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn pair_idx(c1: i32, c2: i32) -> __m512i {
    _mm512_setr_epi32(
        c1, c1, c1, c1, c1, c1, c1, c1, c2, c2, c2, c2, c2, c2, c2, c2,
    )
}

/// Lanes `0..8` of `a` + lanes `8..16` of `a` in lanes 0..8, the same for `b` in lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) fn fold2(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0x44>(a, b),
        _mm512_shuffle_i64x2::<0xEE>(a, b),
    )
}

/// `vpdpwssd` as written: LLVM otherwise splits a chain of them into `vpmaddwd` + `vpaddd`
/// (shorter latency, one more uop on the ports these kernels saturate).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut r = acc;
    // SAFETY: a register-only AVX-512-VNNI instruction, and this function requires that feature.
    unsafe {
        core::arch::asm!(
            "vpdpwssd {r}, {a}, {b}",
            r = inout(zmm_reg) r,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    r
}

/// `w + v` in the bytes selected by `k` (one `vpaddb` with a merge mask; LLVM otherwise
/// rewrites it into `vporq` + a masked `vmovdqu8` when it can prove the add is an or).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn add_masked(w: __m512i, k: __mmask64, v: __m512i) -> __m512i {
    let mut r = w;
    // SAFETY: a register-only AVX-512BW instruction, and this function requires that feature.
    unsafe {
        core::arch::asm!(
            "vpaddb {r}{{{k}}}, {r}, {v}",
            r = inout(zmm_reg) r,
            k = in(kreg) k,
            v = in(zmm_reg) v,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    r
}

/// `vpermd` as written (LLVM otherwise turns a constant-index dword permute into `vpshufd` +
/// `vshufi64x2`: two shuffle uops instead of one).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn permd(idx: __m512i, v: __m512i) -> __m512i {
    let r: __m512i;
    // SAFETY: a register-only AVX-512F instruction, and this function requires that feature.
    unsafe {
        core::arch::asm!(
            "vpermd {r}, {idx}, {v}",
            r = lateout(zmm_reg) r,
            idx = in(zmm_reg) idx,
            v = in(zmm_reg) v,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    r
}

/// `vgf2p8affineqb x, m, C`: every byte of `x` times the bit matrix of its qword in `m` (see
/// `tables::gf`), then xor-ed with the constant `C` (0: none; 0xE0 / 0xFC flip bits 5-7 / 2-7).
/// Only reached when [`gfni`] said yes: the instruction is written as asm so that GFNI is never
/// enabled for LLVM's own code generation.
#[inline]
#[target_feature(enable = "avx512f")]
pub(in crate::arch::x86_64) fn gf_affine<const C: u8>(x: __m512i, m: __m512i) -> __m512i {
    let r: __m512i;
    // SAFETY: a register-only instruction; callers run it only on CPUs with GFNI (`G`).
    unsafe {
        core::arch::asm!(
            "vgf2p8affineqb {r}, {x}, {m}, {c}",
            r = lateout(zmm_reg) r,
            x = in(zmm_reg) x,
            m = in(zmm_reg) m,
            c = const C,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    r
}
