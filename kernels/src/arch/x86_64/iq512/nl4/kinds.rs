//! The `nl4` kinds: where each unit's weights and floats are, and how its weights become
//! biased bytes (IQ4_XS, IQ4_NL, MXFP4, NVFP4: nibbles through a `vpshufb` table; Q1_0: bits
//! through a masked blend).

use core::arch::x86_64::*;

use super::{Nl4, V64};
use crate::arch::iq_tile::{Iq4Nl, Iq4Xs, Mxfp4, Nvfp4, Q1_0, Q2_0};
use crate::arch::x86_64::iq512::tables::{
    IQ4NL_BYTES, IQ4NL_QS, IQ4XS_QS, MXFP4_BYTES, MXFP4_QS, NVFP4_BYTES, NVFP4_QS, Q1_0_BYTES,
    Q1_0_QS, Q2_0_BYTES, Q2_0_QS,
};
use crate::arch::x86_64::kblock::f16_to_f32;
use crate::formats::{KVALUES_FP4, KVALUES_IQ4NL, QK, QK1_0, QK2_0};

/// `table + 128` in every 16-byte lane (the `vpshufb` table of the biased weights).
const fn biased(table: &[i8; 16]) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = (table[i % 16] as i16 + 128) as u8;
        i += 1;
    }
    V64(o)
}

pub(super) static BIASED_IQ4NL: V64 = biased(&KVALUES_IQ4NL);
static BIASED_FP4: V64 = biased(&KVALUES_FP4);
/// Four 16-byte pieces into one register (`at(l)`: the address of lane `l`'s bytes).
///
/// # Safety
/// The CPU has AVX-512 F; every `at(l)` is valid for 16 bytes.
#[inline(always)]
pub(super) unsafe fn lanes4(at: impl Fn(usize) -> *const u8) -> __m512i {
    // SAFETY: the caller's contract; unaligned loads.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(at(0) as *const __m128i));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(at(1) as *const __m128i));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(at(2) as *const __m128i));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(at(3) as *const __m128i))
    }
}

impl Nl4 for Iq4Xs {
    const SCALED: bool = true;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512i; 4] {
        let q = {
            // SAFETY: `p` is one block with 128 `qs` bytes, group `g`'s at `16 g`.
            core::array::from_fn(|h| unsafe {
                _mm512_loadu_si512(p.add(IQ4XS_QS + 64 * h) as *const __m512i)
            })
        };
        // SAFETY: the caller's features.
        unsafe { nibbles::<Self>(q) }
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is one block (alignment 1); the features are the caller's.
        unsafe {
            let b = &*(p as *const Self::W);
            let d = _mm256_set1_ps(f16_to_f32(u16::from_le_bytes(b.d)));
            // the eight 6-bit codes (`BlockIq4Xs::scale`): low nibble `g` of `scales_l` (bit
            // 16 + 4g below) and bits 2g..2g+2 of `scales_h`, as `code - 32` in f32
            let bits = u16::from_le_bytes(b.scales_h) as u64
                | (u32::from_le_bytes(b.scales_l) as u64) << 16;
            let v = _mm_set1_epi64x(bits as i64);
            let lo_at = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 44, 40, 36, 32, 28, 24, 20, 16);
            let hi_at = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
            let lo = _mm_and_si128(_mm_multishift_epi64_epi8(lo_at, v), _mm_set1_epi8(0x0f));
            let hi = _mm_and_si128(_mm_multishift_epi64_epi8(hi_at, v), _mm_set1_epi8(3));
            let code = _mm256_cvtepu8_epi32(_mm_or_si128(lo, _mm_slli_epi16::<4>(hi)));
            let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(code, _mm256_set1_epi32(32)));
            (d, s)
        }
    }
}

impl Nl4 for Iq4Nl {
    const SCALED: bool = false;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512i; 4] {
        let q = {
            // SAFETY: `p` is eight blocks, each with 16 `qs` bytes; the features are the caller's.
            core::array::from_fn(|h| unsafe {
                lanes4(|l| p.add(IQ4NL_BYTES * (4 * h + l) + IQ4NL_QS))
            })
        };
        // SAFETY: the caller's features.
        unsafe { nibbles::<Self>(q) }
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is eight blocks (alignment 1).
        let b = unsafe { core::slice::from_raw_parts(p as *const Self::W, 8) };
        // SAFETY: the caller's CPU has F16C.
        let d: [f32; 8] =
            core::array::from_fn(|g| unsafe { f16_to_f32(u16::from_le_bytes(b[g].d)) });
        // SAFETY: eight readable floats (AVX present).
        (unsafe { _mm256_loadu_ps(d.as_ptr()) }, unsafe {
            _mm256_set1_ps(1.0)
        })
    }
}

impl Nl4 for Mxfp4 {
    const SCALED: bool = false;
    fn values() -> &'static V64 {
        &BIASED_FP4
    }
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512i; 4] {
        let q = {
            // SAFETY: `p` is eight blocks, each with 16 `qs` bytes; the features are the caller's.
            core::array::from_fn(|h| unsafe {
                lanes4(|l| p.add(MXFP4_BYTES * (4 * h + l) + MXFP4_QS))
            })
        };
        // SAFETY: the caller's features.
        unsafe { nibbles::<Self>(q) }
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is eight blocks (alignment 1).
        let b = unsafe { core::slice::from_raw_parts(p as *const Self::W, 8) };
        let d: [f32; 8] = core::array::from_fn(|g| b[g].d());
        // SAFETY: eight readable floats (AVX present).
        (unsafe { _mm256_loadu_ps(d.as_ptr()) }, unsafe {
            _mm256_set1_ps(1.0)
        })
    }
}

impl Nl4 for Nvfp4 {
    const SCALED: bool = false;
    const SPLIT: bool = true;
    fn values() -> &'static V64 {
        &BIASED_FP4
    }
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512i; 4] {
        let q = {
            // group c: the 16 `qs` bytes of sub-blocks 2c and 2c + 1 (block c / 2, half c % 2)
            let at = |c: usize| NVFP4_BYTES * (c / 2) + NVFP4_QS + 16 * (c % 2);
            // SAFETY: `p` is four blocks, each with 32 `qs` bytes; the features are the caller's.
            core::array::from_fn(|h| unsafe { lanes4(|l| p.add(at(4 * h + l))) })
        };
        // SAFETY: the caller's features.
        unsafe { nibbles::<Self>(q) }
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: forwarded (four blocks, alignment 1).
        unsafe { (nvfp4_scales(p, 0), _mm256_set1_ps(1.0)) }
    }
    #[inline(always)]
    unsafe fn floats_hi(p: *const u8) -> __m256 {
        // SAFETY: forwarded.
        unsafe { nvfp4_scales(p, 2) }
    }
}

/// The halved UE4M3 scales of sub-blocks `4 b0 .. 4 b0 + 8` of the four NVFP4 blocks at `p`.
///
/// # Safety
/// `p` is valid for four blocks; the CPU has AVX.
#[inline(always)]
unsafe fn nvfp4_scales(p: *const u8, b0: usize) -> __m256 {
    // SAFETY: `p` is four blocks (alignment 1).
    let b = unsafe { core::slice::from_raw_parts(p as *const crate::formats::BlockNvfp4, 4) };
    let d: [f32; 8] = core::array::from_fn(|i| b[b0 + i / 4].d(i % 4));
    // SAFETY: eight readable floats (AVX present).
    unsafe { _mm256_loadu_ps(d.as_ptr()) }
}

/// The biased weights of a nibble kind from its `qs` registers (see [`Nl4::weights`]): both
/// nibbles through the kind's table, NVFP4's sub-blocks put back in element order.
///
/// # Safety
/// The CPU has the tier's features.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn nibbles<K: Nl4>(q: [__m512i; 2]) -> [__m512i; 4] {
    let (values, nib) = (K::values().get(), _mm512_set1_epi8(0x0f));
    let lo = |q: __m512i| _mm512_shuffle_epi8(values, _mm512_and_si512(q, nib));
    let hi =
        |q: __m512i| _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib));
    if K::SPLIT {
        // lane: [low nibbles: A 0..8, B 0..8 | high: A 8..16, B 8..16] -> [A | B]
        let (l0, h0, l1, h1) = (lo(q[0]), hi(q[0]), lo(q[1]), hi(q[1]));
        [
            _mm512_unpacklo_epi64(l0, h0),
            _mm512_unpackhi_epi64(l0, h0),
            _mm512_unpacklo_epi64(l1, h1),
            _mm512_unpackhi_epi64(l1, h1),
        ]
    } else {
        [lo(q[0]), hi(q[0]), lo(q[1]), hi(q[1])]
    }
}

impl Nl4 for Q1_0 {
    const SCALED: bool = false;
    const BLOCK_SUMS: bool = true;
    const GROUPS_PER_BLOCK: usize = QK1_0 / QK;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512i; 4] {
        // block h's 128 bits as words 0..8 (u16, element j of word i: bit j); register 2h + half
        // takes words 2l + half into lane l, each bit a byte of +1 or -1, biased: 129 or 127
        let pick = |x: u64| (x & 0xffff) | ((x >> 16) & 0xffff_0000);
        // SAFETY: `p` is two blocks (caller's contract), 16 `qs` bytes each, read unaligned; the
        // CPU has AVX-512 F/BW (caller's contract).
        unsafe {
            let (plus, minus) = (_mm512_set1_epi8(129u8 as i8), _mm512_set1_epi8(127));
            core::array::from_fn(|c| {
                let (h, half) = (c / 2, c % 2);
                let qs = p.add(Q1_0_BYTES * h + Q1_0_QS);
                let lo = (qs as *const u64).read_unaligned() >> (16 * half);
                let hi = (qs.add(8) as *const u64).read_unaligned() >> (16 * half);
                _mm512_mask_blend_epi8(pick(lo) | pick(hi) << 32, minus, plus)
            })
        }
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is two blocks (alignment 1).
        let b = unsafe { core::slice::from_raw_parts(p as *const Self::W, 2) };
        // SAFETY: the caller's CPU has F16C.
        let d: [f32; 8] =
            core::array::from_fn(|g| unsafe { f16_to_f32(u16::from_le_bytes(b[g / 4].d)) });
        // SAFETY: eight readable floats (AVX present).
        (unsafe { _mm256_loadu_ps(d.as_ptr()) }, unsafe {
            _mm256_set1_ps(1.0)
        })
    }
}

/// `Q2_PICK[half]`: bytes `k` = 0, 1 of qword `i` (lane `l = i / 2`, its half `i % 2`) take
/// byte `16 (l / 2) + 8 (l % 2) + 4 half + 2 (i % 2) + k` of two blocks' `qs`.
static Q2_PICK: [V64; 2] = [q2_pick(0), q2_pick(1)];

const fn q2_pick(half: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 8 {
        let l = i / 2;
        let mut k = 0;
        while k < 2 {
            o[8 * i + k] = (16 * (l / 2) + 8 * (l % 2) + 4 * half + 2 * (i % 2) + k) as u8;
            k += 1;
        }
        i += 1;
    }
    V64(o)
}

impl Nl4 for Q2_0 {
    const SCALED: bool = false;
    const BLOCK_SUMS: bool = true;
    const GROUPS_PER_BLOCK: usize = QK2_0 / QK;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512i; 4] {
        // register 2h + half, lane l: group 4h + l (block 2h + l / 2, second 32 if l is odd),
        // elements 16 half .. 16 half + 16: 4 `qs` bytes, 2 per qword (one byte permute of
        // both blocks' `qs`); one multishift takes each element's 2 bits (byte j: bits 2j of
        // its qword) to its own byte
        core::array::from_fn(|c| {
            let (h, half) = (c / 2, c % 2);
            // SAFETY: `p` is four blocks (caller's contract), 16 `qs` bytes each, read
            // unaligned; the CPU has AVX-512 F/BW and VBMI (caller's contract).
            unsafe {
                let qs = |b: usize| _mm_loadu_si128(p.add(Q2_0_BYTES * b + Q2_0_QS).cast());
                let both =
                    _mm512_inserti32x4::<1>(_mm512_castsi128_si512(qs(2 * h)), qs(2 * h + 1));
                let data =
                    _mm512_maskz_permutexvar_epi8(0x0303_0303_0303_0303, Q2_PICK[half].get(), both);
                let shifts = _mm512_set1_epi64(0x0e0c_0a08_0604_0200);
                let codes = _mm512_and_si512(
                    _mm512_multishift_epi64_epi8(shifts, data),
                    _mm512_set1_epi8(3),
                );
                // value `code - 1`, biased by 128
                _mm512_add_epi8(codes, _mm512_set1_epi8(127))
            }
        })
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is four blocks (alignment 1).
        let b = unsafe { core::slice::from_raw_parts(p as *const Self::W, 4) };
        // SAFETY: the caller's CPU has F16C.
        let d: [f32; 8] =
            core::array::from_fn(|g| unsafe { f16_to_f32(u16::from_le_bytes(b[g / 2].d)) });
        // SAFETY: eight readable floats (AVX present).
        (unsafe { _mm256_loadu_ps(d.as_ptr()) }, unsafe {
            _mm256_set1_ps(1.0)
        })
    }
}
