//! K-quant weight unpackers (AVX2, shared by both x86 tiers).
//!
//! Each unpacker decodes one super-block's scales into a [`BlockMeta`] and hands the 8 chunks of
//! 32 weight values, already in the permuted order of `kquant`, to a callback `put(c, w_c,
//! sc16)`. The batched path stores them into an [`Unpacked`] block that is reused against every
//! activation row ([`unpack`]); the batch-1 path multiplies them straight into the accumulators
//! without a round trip through memory ([`dot_fused`]). Q2_K/Q4_K/Q5_K values are unsigned
//! (0..=31); Q3_K/Q6_K values are signed (-4..=3, -32..=31).

use crate::formats::kquants::layout::{Q2K_D, Q2K_DMIN, Q3K_D, Q6K_D};
use core::arch::x86_64::*;

use super::kblock::{f16_to_f32, perm32, signed, Q2, Q3, Q4, Q5};

/// One weight super-block's values and per-chunk scale vectors, stored for reuse.
#[repr(C, align(64))]
pub(super) struct Unpacked {
    /// 256 weight values, permuted per 32-element chunk (u8 or i8 depending on the kind).
    pub w: [u8; 256],
    /// Per chunk, 16 i16: position `2m` the scale of the chunk's first 16 elements, `2m + 1` of
    /// the second 16.
    pub s: [i16; 128],
}

impl Unpacked {
    pub(super) fn new() -> Unpacked {
        Unpacked {
            w: [0; 256],
            s: [0; 128],
        }
    }
}

/// Per-block scalars and small vectors of one weight super-block.
#[derive(Clone, Copy)]
pub(super) struct BlockMeta {
    /// The 16 sub-block scales as i16 (Q4_K/Q5_K: each 32-element scale twice).
    pub sc16: __m256i,
    /// Per 16-element sub-block, the multiplier of the activation bsums (Q2_K: `sc >> 4`,
    /// Q4_K/Q5_K: the 6-bit min; unused otherwise).
    pub mins: __m256i,
    /// Signed kinds: `128 * sum(scale * w)` per lane, subtracted from the offset products.
    pub corr: __m256i,
    pub d: f32,
    pub dmin: f32,
}

#[inline(always)]
fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: callers pass a pointer inside a block they have bounds-checked; unaligned read.
    unsafe { u16::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 2])) }
}

#[inline(always)]
fn rd_u32(p: *const u8) -> u32 {
    // SAFETY: as `rd_u16`, for 4 bytes inside a block's scale array.
    unsafe { u32::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 4])) }
}

/// `v >> s` per byte for a compile-time `s` (16-bit shifts; callers mask the result).
macro_rules! shr {
    ($v:expr, $s:literal) => {
        _mm256_srli_epi16::<$s>($v)
    };
}

/// The scale vector of chunk `c`: the i16 pair (2c, 2c+1) of `sc16` in every i32 lane.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn chunk_scales(sc16: __m256i, c: usize) -> __m256i {
    _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(c as i32))
}

/// Decodes one block of kind `K` at `b`, calling `put(c, w_c, sc16)` for each chunk.
///
/// # Safety
/// `b` must be valid for `block_bytes(K)` bytes; the CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode<const K: u8, F: FnMut(usize, __m256i, __m256i)>(
    b: *const u8,
    put: F,
) -> BlockMeta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        match K {
            Q2 => decode_q2(b, put),
            Q3 => decode_q3(b, put),
            Q4 => decode_q45::<false, F>(b, put),
            Q5 => decode_q45::<true, F>(b, put),
            _ => decode_q6(b, put),
        }
    }
}

/// Unpacks one block of kind `K` at `b` into `u` (values and scale vectors) and returns its
/// meta, with the correction for signed kinds.
///
/// # Safety
/// As [`decode`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn unpack<const K: u8>(b: *const u8, u: &mut Unpacked) -> BlockMeta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let wp = u.w.as_mut_ptr();
        let mut meta = decode::<K, _>(b, |c, w, _| {
            _mm256_storeu_si256(wp.add(32 * c) as *mut __m256i, w);
        });
        let k128 = _mm256_set1_epi8(-128);
        let mut corr = _mm256_setzero_si256();
        for c in 0..8 {
            let s = chunk_scales(meta.sc16, c);
            _mm256_storeu_si256(u.s.as_mut_ptr().add(16 * c) as *mut __m256i, s);
            if signed(K) {
                let w = _mm256_loadu_si256(u.w.as_ptr().add(32 * c) as *const __m256i);
                corr = _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(k128, w), s));
            }
        }
        meta.corr = corr;
        meta
    }
}

/// Batch-1 path: decodes the block at `b` and multiplies it with the packed activation block
/// `a` (offset by 128 for signed kinds) as it goes; returns the meta (with a zero correction)
/// and the 8 exact lane sums.
///
/// # Safety
/// As [`decode`], and `a` valid for 256 bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn dot_fused<const K: u8>(b: *const u8, a: *const u8) -> (BlockMeta, __m256i) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let k128 = _mm256_set1_epi8(-128);
        let mut acc = _mm256_setzero_si256();
        let mut sc32 = [0i32; 8];
        let meta = decode::<K, _>(b, |c, w, sc16| {
            if c == 0 {
                _mm256_storeu_si256(sc32.as_mut_ptr() as *mut __m256i, sc16);
            }
            // The i16 pair (2c, 2c+1) in every i32 lane, broadcast from memory.
            let s = _mm256_set1_epi32(sc32[c]);
            let av = _mm256_loadu_si256(a.add(32 * c) as *const __m256i);
            let t = if signed(K) {
                // Offset products minus 128 * (w0 + w1): the exact pair sums, within i16.
                _mm256_sub_epi16(_mm256_maddubs_epi16(av, w), _mm256_maddubs_epi16(k128, w))
            } else {
                _mm256_maddubs_epi16(w, av)
            };
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(t, s));
        });
        // The correction is already applied.
        (meta, acc)
    }
}

/// Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_q2<F: FnMut(usize, __m256i, __m256i)>(b: *const u8, mut put: F) -> BlockMeta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let m4 = _mm_set1_epi8(0x0f);
        let sc = _mm_loadu_si128(b as *const __m128i);
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, m4));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
        let m3 = _mm256_set1_epi8(3);
        for h in 0..2 {
            let v = perm32(_mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i));
            put(4 * h, _mm256_and_si256(v, m3), sc16);
            put(4 * h + 1, _mm256_and_si256(shr!(v, 2), m3), sc16);
            put(4 * h + 2, _mm256_and_si256(shr!(v, 4), m3), sc16);
            put(4 * h + 3, _mm256_and_si256(shr!(v, 6), m3), sc16);
        }
        BlockMeta {
            sc16,
            mins,
            corr: _mm256_setzero_si256(),
            d: f16_to_f32(rd_u16(b.add(Q2K_D))),
            dmin: f16_to_f32(rd_u16(b.add(Q2K_DMIN))),
        }
    }
}

/// Q3_K's 12 scale bytes -> 16 six-bit scales (as ggml packs them), minus 32.
#[inline(always)]
fn q3_scales(p: *const u8) -> [i8; 16] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let a0 = rd_u32(p);
    let a1 = rd_u32(p.wrapping_add(4));
    let hi = rd_u32(p.wrapping_add(8));
    let words = [
        (a0 & LOW4) | ((hi & LOW2) << 4),
        (a1 & LOW4) | (((hi >> 2) & LOW2) << 4),
        ((a0 >> 4) & LOW4) | (((hi >> 4) & LOW2) << 4),
        ((a1 >> 4) & LOW4) | (((hi >> 6) & LOW2) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, w) in words.iter().enumerate() {
        for (k, byte) in w.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = (*byte as i8).wrapping_sub(32);
        }
    }
    out
}

/// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108. Values `raw - 4` in [-4, 3].
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_q3<F: FnMut(usize, __m256i, __m256i)>(b: *const u8, mut put: F) -> BlockMeta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let sc = q3_scales(b.add(96));
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let hm = perm32(_mm256_loadu_si256(b as *const __m256i));
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm256_set1_epi8(4);
        // Bit c of every hmask byte moved to bit 2 (16-bit shifts; the mask drops what crossed bytes).
        let hbit = [
            _mm256_and_si256(_mm256_slli_epi16::<2>(hm), m4),
            _mm256_and_si256(_mm256_slli_epi16::<1>(hm), m4),
            _mm256_and_si256(hm, m4),
            _mm256_and_si256(shr!(hm, 1), m4),
            _mm256_and_si256(shr!(hm, 2), m4),
            _mm256_and_si256(shr!(hm, 3), m4),
            _mm256_and_si256(shr!(hm, 4), m4),
            _mm256_and_si256(shr!(hm, 5), m4),
        ];
        for h in 0..2 {
            let v = perm32(_mm256_loadu_si256(b.add(32 + 32 * h) as *const __m256i));
            let q = [
                _mm256_and_si256(v, m3),
                _mm256_and_si256(shr!(v, 2), m3),
                _mm256_and_si256(shr!(v, 4), m3),
                _mm256_and_si256(shr!(v, 6), m3),
            ];
            for (s, qv) in q.into_iter().enumerate() {
                let c = 4 * h + s;
                put(c, _mm256_sub_epi8(_mm256_or_si256(qv, hbit[c]), m4), sc16);
            }
        }
        BlockMeta {
            sc16,
            mins: _mm256_setzero_si256(),
            corr: _mm256_setzero_si256(),
            d: f16_to_f32(rd_u16(b.add(Q3K_D))),
            dmin: 0.0,
        }
    }
}

/// Q4_K / Q5_K's 12 scale bytes -> (8 scales, 8 mins), six bits each, one byte per value
/// (little-endian: value `i` in byte `i`). Built in general registers and returned as `u64` so
/// that callers move them into vectors with one `vmovq` (no byte stores re-read wider, which
/// would miss store forwarding).
#[inline(always)]
pub(super) fn k4_scales(p: *const u8) -> (u64, u64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let a0 = rd_u32(p);
    let a1 = rd_u32(p.wrapping_add(4));
    let a2 = rd_u32(p.wrapping_add(8));
    let sc0 = a0 & LOW6;
    let sc1 = (a2 & LOW4) | (((a0 >> 6) & LOW2) << 4);
    let mn0 = a1 & LOW6;
    let mn1 = ((a2 >> 4) & LOW4) | (((a1 >> 6) & LOW2) << 4);
    (
        sc0 as u64 | (sc1 as u64) << 32,
        mn0 as u64 | (mn1 as u64) << 32,
    )
}

/// Q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16. Q5_K adds qh[32] @16 and moves qs to @48.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_q45<const HIGH: bool, F: FnMut(usize, __m256i, __m256i)>(
    b: *const u8,
    mut put: F,
) -> BlockMeta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let (s8, m8) = k4_scales(b.add(4));
        let s = _mm_cvtsi64_si128(s8 as i64);
        let m = _mm_cvtsi64_si128(m8 as i64);
        // Duplicate every byte (one scale per 32 elements = two 16-element sub-blocks), widen.
        let sc16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s));
        let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
        let m4 = _mm256_set1_epi8(0x0f);
        let m16 = _mm256_set1_epi8(0x10);
        let qs = if HIGH { b.add(48) } else { b.add(16) };
        let qh = if HIGH {
            perm32(_mm256_loadu_si256(b.add(16) as *const __m256i))
        } else {
            _mm256_setzero_si256()
        };
        // Bit c of every qh byte moved to bit 4 (zero for Q4_K).
        let hbit = |c: usize| -> __m256i {
            if !HIGH {
                return _mm256_setzero_si256();
            }
            let v = match c {
                0 => _mm256_slli_epi16::<4>(qh),
                1 => _mm256_slli_epi16::<3>(qh),
                2 => _mm256_slli_epi16::<2>(qh),
                3 => _mm256_slli_epi16::<1>(qh),
                4 => qh,
                5 => shr!(qh, 1),
                6 => shr!(qh, 2),
                _ => shr!(qh, 3),
            };
            _mm256_and_si256(v, m16)
        };
        for j in 0..4 {
            let v = perm32(_mm256_loadu_si256(qs.add(32 * j) as *const __m256i));
            let lo = _mm256_and_si256(v, m4);
            let hi = _mm256_and_si256(shr!(v, 4), m4);
            if HIGH {
                put(2 * j, _mm256_or_si256(lo, hbit(2 * j)), sc16);
                put(2 * j + 1, _mm256_or_si256(hi, hbit(2 * j + 1)), sc16);
            } else {
                put(2 * j, lo, sc16);
                put(2 * j + 1, hi, sc16);
            }
        }
        BlockMeta {
            sc16,
            mins,
            corr: _mm256_setzero_si256(),
            d: f16_to_f32(rd_u16(b)),
            dmin: f16_to_f32(rd_u16(b.add(2))),
        }
    }
}

/// Q6_K: ql[128] @0, qh[64] @128, scales[16] (i8) @192, d @208. Values `raw - 32`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_q6<F: FnMut(usize, __m256i, __m256i)>(b: *const u8, mut put: F) -> BlockMeta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        let k32 = _mm256_set1_epi8(32);
        for h in 0..2 {
            let l0 = perm32(_mm256_loadu_si256(b.add(64 * h) as *const __m256i));
            let l1 = perm32(_mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i));
            let hb = perm32(_mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i));
            // Bits (2t, 2t+1) of qh moved to bits 4..5.
            let h0 = _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m30);
            let h1 = _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m30);
            let h2 = _mm256_and_si256(hb, m30);
            let h3 = _mm256_and_si256(shr!(hb, 2), m30);
            let vals = [
                _mm256_or_si256(_mm256_and_si256(l0, m4), h0),
                _mm256_or_si256(_mm256_and_si256(l1, m4), h1),
                _mm256_or_si256(_mm256_and_si256(shr!(l0, 4), m4), h2),
                _mm256_or_si256(_mm256_and_si256(shr!(l1, 4), m4), h3),
            ];
            for (t, v) in vals.into_iter().enumerate() {
                put(4 * h + t, _mm256_sub_epi8(v, k32), sc16);
            }
        }
        BlockMeta {
            sc16,
            mins: _mm256_setzero_si256(),
            corr: _mm256_setzero_si256(),
            d: f16_to_f32(rd_u16(b.add(Q6K_D))),
            dmin: 0.0,
        }
    }
}
