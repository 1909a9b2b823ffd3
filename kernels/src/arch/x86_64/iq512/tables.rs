//! Constant layouts of the AVX-512 i-quant decoders (`iq512::decode`): block field offsets (from
//! the block structs), the IQ1 grid expanded and biased for gathers, and the byte and word index
//! vectors and shift controls of the decoders' permutes, built at compile time.

use super::super::klanes512::V64;
use core::arch::x86_64::*;

use crate::formats::iq_grids::{IQ1S_CODES, IQ3XXS_CODES, IQ3XXS_VALUES};
use crate::formats::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockIq4Nl,
    BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, KSIGNS_IQ2XS, QK_K,
};
use core::mem::{offset_of, size_of};

// Field offsets the decoders address, from the block structs.
pub(super) const IQ2XXS_QS: usize = offset_of!(BlockIq2Xxs, qs);
pub(super) const IQ3XXS_QS: usize = offset_of!(BlockIq3Xxs, qs);
/// IQ3_XXS: the sign-and-scale words follow the 64 grid index bytes.
pub(super) const IQ3XXS_AUX: usize = IQ3XXS_QS + QK_K / 4;
pub(super) const IQ1S_QS: usize = offset_of!(BlockIq1S, qs);
pub(super) const IQ1S_QH: usize = offset_of!(BlockIq1S, qh);
pub(super) const IQ1S_BYTES: usize = size_of::<BlockIq1S>();
pub(super) const IQ4XS_QS: usize = offset_of!(BlockIq4Xs, qs);
pub(super) const IQ2XS_QS: usize = offset_of!(BlockIq2Xs, qs);
pub(super) const IQ2XS_SCALES: usize = offset_of!(BlockIq2Xs, scales);
pub(super) const IQ2S_QS: usize = offset_of!(BlockIq2S, qs);
pub(super) const IQ2S_QH: usize = offset_of!(BlockIq2S, qh);
pub(super) const IQ2S_SCALES: usize = offset_of!(BlockIq2S, scales);
/// IQ2_S: the explicit sign bytes are the second half of `qs`.
pub(super) const IQ2S_SIGNS: usize = IQ2S_QS + QK_K / 8;
pub(super) const IQ3S_QS: usize = offset_of!(BlockIq3S, qs);
pub(super) const IQ3S_QH: usize = offset_of!(BlockIq3S, qh);
pub(super) const IQ3S_SIGNS: usize = offset_of!(BlockIq3S, signs);
pub(super) const IQ3S_SCALES: usize = offset_of!(BlockIq3S, scales);
pub(super) const IQ1M_QS: usize = offset_of!(BlockIq1M, qs);
pub(super) const IQ1M_QH: usize = offset_of!(BlockIq1M, qh);
pub(super) const IQ1M_SCALES: usize = offset_of!(BlockIq1M, scales);
pub(super) const IQ1M_BYTES: usize = size_of::<BlockIq1M>();
pub(super) const IQ4NL_QS: usize = offset_of!(BlockIq4Nl, qs);
pub(super) const IQ4NL_BYTES: usize = size_of::<BlockIq4Nl>();
pub(super) const MXFP4_QS: usize = offset_of!(BlockMxfp4, qs);
pub(super) const MXFP4_BYTES: usize = size_of::<BlockMxfp4>();
pub(super) const NVFP4_QS: usize = offset_of!(BlockNvfp4, qs);
pub(super) const NVFP4_BYTES: usize = size_of::<BlockNvfp4>();
pub(super) const Q1_0_QS: usize = offset_of!(BlockQ1_0, qs);
pub(super) const Q1_0_BYTES: usize = size_of::<BlockQ1_0>();
pub(super) const Q2_0_QS: usize = offset_of!(BlockQ2_0, qs);
pub(super) const Q2_0_BYTES: usize = size_of::<BlockQ2_0>();
// `decode::lead_d` reads these kinds' `d` from a block's first two bytes.
const _: () = assert!(
    offset_of!(BlockIq2Xxs, d) == 0
        && offset_of!(BlockIq3Xxs, d) == 0
        && offset_of!(BlockIq2Xs, d) == 0
        && offset_of!(BlockIq2S, d) == 0
        && offset_of!(BlockIq3S, d) == 0
        && offset_of!(BlockIq1S, d) == 0
);

/// ggml's `ksigns_iq2xs`, as the two halves of one `vpermi2b` table.
pub(super) static KSIGNS_LO: V64 = V64(ksigns_half(0));
pub(super) static KSIGNS_HI: V64 = V64(ksigns_half(64));

pub(super) const fn ksigns_half(at: usize) -> [u8; 64] {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = KSIGNS_IQ2XS[at + i];
        i += 1;
    }
    o
}

/// `vpmultishiftqb` control: the four 7-bit sign indices of each u32 of a qword.
pub(super) static SIGN_SHIFTS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = ((i % 8) / 4 * 32 + (i % 4) * 7) as u8;
        i += 1;
    }
    o
});

/// Word index vectors: register `c`'s 32 scale words repeat word `a` (first 16) and word `b`.
pub(super) const fn word_pairs(a: usize, b: usize) -> V64 {
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
pub(super) static DWORD_SCALES: [V64; 4] = [
    word_pairs(0, 2),
    word_pairs(4, 6),
    word_pairs(8, 10),
    word_pairs(12, 14),
];

/// Each 16 elements' scale word from one dword per 32-element group (`Dec::gs`): word `w` <-
/// word `2 (w / 2)`.
pub(super) static DWORD_GROUPS: V64 = V64({
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 16 {
        o[2 * w] = (2 * (w / 2)) as u8;
        w += 1;
    }
    o
});

/// Scale words of register `c` from one word per 32-element group (group `g` = word `g`).
pub(super) static WORD_SCALES: [V64; 4] = [
    word_pairs(0, 1),
    word_pairs(2, 3),
    word_pairs(4, 5),
    word_pairs(6, 7),
];

/// A grid of `N` points as its ggml codes (`iq_grids`), one u16 each (`N / 32` registers),
/// looked up in registers instead of gathering the expanded grid from memory (IQ3_XXS: half of
/// each block's points, so that the shuffle port and the gathers' load ports share the work).
#[repr(C, align(64))]
pub(super) struct Codes<const N: usize>([u16; N]);

impl<const N: usize> Codes<N> {
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    pub(super) fn get(&self, t: usize) -> __m512i {
        // SAFETY: 64 readable bytes at entry `32 t` (the slice index panics past the table).
        unsafe { _mm512_loadu_si512(self.0[32 * t..32 * t + 32].as_ptr() as *const __m512i) }
    }

    /// The codes of 32 indices (word lanes of `idx`, each below `N`): one two-register word
    /// permute per 64 entries on index bits 0..6, then a blend tree on bits 6, 7, ...
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    pub(super) fn lookup(&self, idx: __m512i) -> __m512i {
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

pub(super) static IQ3XXS_CODE_TABLE: Codes<256> = Codes(IQ3XXS_CODES);

/// `vpermb` table of a code field: entry `e` = `values[e % len]` (the field is the low bits).
pub(super) const fn field_values<const N: usize>(values: [u8; N]) -> V64 {
    let mut o = [0u8; 64];
    let mut e = 0;
    while e < 64 {
        o[e] = values[e % N];
        e += 1;
    }
    V64(o)
}
pub(super) static IQ3XXS_FIELD_VALUES: V64 = field_values(IQ3XXS_VALUES);

/// `vpmultishiftqb` control: byte `j` of a qword from bit `step * (j % per) + 32 * (j / per)`.
pub(super) const fn field_shifts(step: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let j = i % 8;
        o[i] = (step * (j % per) + 32 * (j / per)) as u8;
        i += 1;
    }
    V64(o)
}
/// IQ3_XXS: four 3-bit fields of the code in each dword's low word.
pub(super) static IQ3_SHIFTS: V64 = field_shifts(3, 4);

/// Word index vector: word `w` <- word `at + w / per` (`per` = words per grid point).
pub(super) const fn spread(at: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        o[2 * w] = (at + w / per) as u8;
        w += 1;
    }
    V64(o)
}
/// IQ3_XXS register `c` (codes of half `c / 2`): dword `k` <- code `16 (c % 2) + k`.
pub(super) static IQ3_SPREAD: [V64; 2] = [spread(0, 2), spread(16, 2)];

/// IQ2_XXS grid indices: word `i` <- byte `8 (i / 4) + i % 4` of `qs`.
pub(super) static IQ2XXS_IDX: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        o[2 * i] = (8 * (i / 4) + i % 4) as u8;
        i += 1;
    }
    o
});

/// IQ1_S index material: dword `i` (chunk `16 half + i`) = `qs` byte, then the group's `qh` word.
pub(super) const fn iq1s_idx(half: usize) -> V64 {
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
pub(super) static IQ1S_IDX: [V64; 2] = [iq1s_idx(0), iq1s_idx(1)];

/// The 2048-point IQ1 grid expanded to bytes as the biased weights `8 * value + 8` (0, 8 or
/// 16 for -1, 0, 1: the code's 2-bit field times 8), eight per entry, gathered as qwords
/// (`vpgatherdq`): in units of the shift `IQ1_DELTA` = 1/8, so that one integer sum carries both
/// the grid and the shift terms, already biased to unsigned bytes (8 is IQ1_S's `BIAS`; IQ1_M
/// adds its shift on top).
#[repr(C, align(64))]
pub(super) struct Iq1Biased(pub(super) [u64; 2048]);
pub(super) static IQ1_BIASED: Iq1Biased = Iq1Biased({
    let mut o = [0u64; 2048];
    let mut i = 0;
    while i < 2048 {
        let mut j = 0;
        while j < 8 {
            let field = (IQ1S_CODES[i] >> (2 * j)) & 3;
            o[i] |= ((8 * field) as u64) << (8 * j);
            j += 1;
        }
        i += 1;
    }
    o
});

/// IQ1_S: the eight `qh` words of a block to words 0..8.
pub(super) static IQ1S_QH_WORDS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        o[i] = (IQ1S_QH + i) as u8;
        i += 1;
    }
    o
});

/// Word `2g` and `2g + 1` <- word `g`.
pub(super) static BSUM_PAIRS: V64 = V64({
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        o[2 * w] = (w / 2 % 8) as u8;
        w += 1;
    }
    o
});

/// `vpmultishiftqb` control for sixteen 4-bit fields of a broadcast qword (bytes 0..16).
pub(super) static NIBBLES16: V64 = V64({
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
pub(super) static IQ1M_SCALE_SHIFTS: V64 = V64({
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
pub(super) const fn byte_words(c: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        o[2 * w] = (c * 32 / per + w / per) as u8;
        w += 1;
    }
    V64(o)
}
pub(super) static SCALES16: [V64; 4] = [
    byte_words(0, 8),
    byte_words(1, 8),
    byte_words(2, 8),
    byte_words(3, 8),
];
/// Each 16 elements' scale word from one byte per 32-element group (`Dec::gs`).
pub(super) static GROUP_BYTES32: V64 = byte_words(0, 2);
pub(super) static SCALES32: [V64; 4] = [
    byte_words(0, 16),
    byte_words(1, 16),
    byte_words(2, 16),
    byte_words(3, 16),
];

/// `vpermi2b` index: word `i` = byte `at + i` of the first table, then byte `64 + (at + i) /
/// per` (the high bits, from the second).
pub(super) const fn split_bytes(at: usize, per: usize) -> V64 {
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
pub(super) const fn word_shifts(step: usize, per: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        o[2 * i] = (step * (i % per)) as u8;
        i += 1;
    }
    V64(o)
}
/// IQ2_S: 4 points per `qh` byte, 2 high bits each.
pub(super) static IQ2S_BYTES: V64 = split_bytes(0, 4);
pub(super) static IQ2S_SHIFTS: V64 = word_shifts(2, 4);
/// IQ3_S: 8 points per `qh` byte, 1 high bit each (64 points: two halves).
pub(super) static IQ3S_BYTES: [V64; 2] = [split_bytes(0, 8), split_bytes(32, 8)];
pub(super) static IQ3S_SHIFTS: V64 = word_shifts(1, 8);

/// IQ1_M index material: dword `i` (chunk `16 half + i`) = its `qs` byte, then its `qh` byte.
pub(super) const fn iq1m_idx(half: usize) -> V64 {
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
pub(super) static IQ1M_IDX: [V64; 2] = [iq1m_idx(0), iq1m_idx(1)];

/// IQ1_M shift signs of register `c`: byte `8 q + j` <- the `qh` byte of chunk `8 c + q`.
pub(super) const fn iq1m_shift_bytes(c: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = (IQ1M_QH + (8 * c + i / 8) / 2) as u8;
        i += 1;
    }
    V64(o)
}
pub(super) static IQ1M_SHIFT_BYTES: [V64; 4] = [
    iq1m_shift_bytes(0),
    iq1m_shift_bytes(1),
    iq1m_shift_bytes(2),
    iq1m_shift_bytes(3),
];
/// The shift sign bit of each byte there: bit 3 for even chunks, bit 7 for odd ones.
pub(super) static IQ1M_SHIFT_BITS: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = if (i / 8) % 2 == 0 { 0x08 } else { 0x80 };
        i += 1;
    }
    o
});
