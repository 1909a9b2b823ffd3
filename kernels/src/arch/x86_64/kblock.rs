//! The bottom of the x86 K-quant kernels, shared by `unpack` (weight decoders), `kquant` (the
//! activation packer, float epilogue and tile driver), the 64-byte AVX-512 kernels and Q8_0: the
//! K-quant kinds and the Q8_K layout (from `formats::kquants::layout`), exact f16 conversion,
//! the byte permutation both operands go through, and cache prefetch hints. A leaf module: it
//! uses nothing from its siblings, so the kernels above it form no circle.

use core::arch::x86_64::*;

// The Q8_K layout and the K-quant kinds (which one a monomorphised kernel handles) come from the
// block structs.
pub(super) use crate::formats::kquants::layout::{
    block_bytes, Q2, Q3, Q4, Q5, Q6, Q8K_BSUMS, Q8K_BYTES, Q8K_QS,
};

/// A K-quant GEMM call as the x86 kernels take it: raw pointers into a checked [`crate::Tile`]
/// (`w` holds `rows` rows of `nb` blocks, `x` `n` raw Q8_K rows of `nb` blocks, `xp` their
/// quants packed for the kernel (256 bytes per block), `out` `rows * n` floats, `out[r * n +
/// j]`), and `rows, n, nb >= 1`.
#[derive(Clone, Copy)]
pub(super) struct KArgs {
    pub nb: usize,
    pub w: *const u8,
    pub rows: usize,
    pub x: *const u8,
    pub xp: *const u8,
    pub n: usize,
    pub out: *mut f32,
}

/// True when kind `K` stores signed values (offset activations + weight-side correction).
pub(super) const fn signed(kind: u8) -> bool {
    matches!(kind, Q3 | Q6)
}

/// f16 bits -> f32 with F16C (exact, like the reference's conversion).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
pub(super) fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: callers pass the start of a Q8_K block they have bounds-checked; unaligned read.
    unsafe { f32::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 4])) }
}

/// Within each 32-byte chunk, byte `4m + r` <- byte `m + 8r` (see `kquant`'s module docs).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn perm32(v: __m256i) -> __m256i {
    let idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let v = _mm256_permutevar8x32_epi32(v, idx);
    let ctrl = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
        14, 3, 7, 11, 15,
    );
    _mm256_shuffle_epi8(v, ctrl)
}

/// Hints the block of kind `K` at `p` into L2 (the same block of the next tile's rows, so the
/// loads run ahead of the decode; past the end of the weights the hint is dropped harmlessly).
#[inline(always)]
pub(super) fn prefetch_block<const K: u8>(p: *const u8) {
    prefetch_span(p, block_bytes(K));
}

/// Hints every cache line of `p .. p + len` into L2. Blocks are not line-aligned (84, 110, 144,
/// 176, 210 bytes), so one can touch a line more than `len / 64` rounded up: the last byte's line
/// is hinted too (a repeated hint is a no-op).
#[inline(always)]
pub(super) fn prefetch_span(p: *const u8, len: usize) {
    for line in 0..len.div_ceil(64) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * line) as *const i8) };
    }
    // SAFETY: as above.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(len - 1) as *const i8) };
}
