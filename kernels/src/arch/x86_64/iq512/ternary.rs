//! The ternary types TQ1_0 and TQ2_0 as 64-byte decoders of `iq512`: weights `t - 1`, `t` in
//! {0, 1, 2}, one scale per block, so the decoders give `t` itself, the parent's biased weights
//! (`Wide::TERNARY`: bias 1, unit scales, one `vpdpbusd` per register).
//!
//! TQ2_0: each 32 `qs` bytes hold four 32-element runs in bit pairs 0..8; a register is one
//! 32-byte run broadcast to both halves, each qword shifted by its half's pair (`vpsrlvq`) and
//! masked to 2 bits (with GFNI: one affine byte transform). TQ1_0: base-3 digit `n` of a byte
//! `q` is `((q 3^n mod 256) * 3) >> 8`; each register gathers its elements' source bytes with
//! one `vpermb` of the block, and takes the digits in 16-bit lanes by two multiplies per byte
//! parity: `(q << 8) 3^n mod 2^16` is `(q 3^n mod 256) << 8` (the word's other byte shifted out
//! for even bytes, masked off for odd ones), and the high half of that times 3 (even) or the
//! product by `3 << 8` masked to its high byte (odd) is the digit, in the byte it belongs to.

use core::arch::x86_64::*;
use core::mem::{offset_of, size_of};

use super::super::kblock::f16_to_f32;
use super::super::klanes512::{gf_affine, gf_halves, GF_NONE, V64};
use super::{Dec, Wide};
use crate::arch::iq_tile::{Tq1_0, Tq2_0};
use crate::formats::{BlockTq1_0, BlockTq2_0, QK_K};

const TQ1_BYTES: usize = size_of::<BlockTq1_0>();
const TQ1_D: usize = offset_of!(BlockTq1_0, d);
const TQ1_QH: usize = offset_of!(BlockTq1_0, qh);
const TQ2_D: usize = offset_of!(BlockTq2_0, d);
const _: () = assert!(offset_of!(BlockTq2_0, qs) == 0 && offset_of!(BlockTq1_0, qs) == 0);

/// TQ1_0 element `e`'s source byte in the block and its base-3 digit (see `ternary::tq1_values`:
/// 32 `qs` bytes x 5 digits, 16 bytes x 5 digits, then the 4 `qh` bytes x 4 digits).
const fn tq1_source(e: usize) -> (usize, u32) {
    if e < 160 {
        (e % 32, (e / 32) as u32)
    } else if e < 240 {
        (32 + (e - 160) % 16, ((e - 160) / 16) as u32)
    } else {
        (TQ1_QH + (e - 240) % 4, ((e - 240) / 4) as u32)
    }
}

/// Register `c`'s `vpermb` indices: byte `i` <- the block byte of element `64 c + i`.
const fn tq1_bytes(c: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = tq1_source(64 * c + i).0 as u8;
        i += 1;
    }
    V64(o)
}

/// Register `c`'s multipliers as words: `3^n << 8` for its even bytes (`odd == 0`, multiplying
/// the whole word: the odd byte's product leaves the word), `3^n` for its odd bytes (the word
/// masked to its high byte).
const fn tq1_powers(c: usize, odd: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        let p = 3u8.pow(tq1_source(64 * c + 2 * w + odd).1);
        if odd == 0 {
            o[2 * w + 1] = p;
        } else {
            o[2 * w] = p;
        }
        w += 1;
    }
    V64(o)
}

static TQ1_BYTE_IDX: [V64; 4] = [tq1_bytes(0), tq1_bytes(1), tq1_bytes(2), tq1_bytes(3)];
static TQ1_POW_EVEN: [V64; 4] = [
    tq1_powers(0, 0),
    tq1_powers(1, 0),
    tq1_powers(2, 0),
    tq1_powers(3, 0),
];
static TQ1_POW_ODD: [V64; 4] = [
    tq1_powers(0, 1),
    tq1_powers(1, 1),
    tq1_powers(2, 1),
    tq1_powers(3, 1),
];
const _: () = assert!(TQ1_BYTES <= 64 && QK_K == 256);

/// A ternary unit: the biased weights `t`, unit scale words, the block's `d`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn unit(t: [__m512i; 4], d: f32) -> Dec {
    Dec::new(t, [_mm512_set1_epi16(1); 4], d)
}

/// TQ2_0 with GFNI: register `c`'s bit pairs `2 (c % 2)` (low half) and `2 (c % 2) + 1` (high
/// half) moved to bits 0-1 of each byte, the others cleared, by one affine byte transform.
static TQ2_GF: [V64; 2] = [
    gf_halves(
        [0, 1, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE],
        [2, 3, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE],
    ),
    gf_halves(
        [4, 5, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE],
        [6, 7, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE, GF_NONE],
    ),
];

/// TQ2_0's two 32-byte runs of bit pairs, each broadcast to both halves of a register, and
/// the block's `d`.
///
/// # Safety
/// The CPU has the tier's features; `p` is one block.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn tq2_runs(p: *const u8) -> ([__m512i; 2], f32) {
    // SAFETY: `p` is one block: 64 `qs` bytes, then `d`.
    unsafe {
        let q = core::array::from_fn(|j| {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(32 * j) as *const __m256i))
        });
        (
            q,
            f16_to_f32(u16::from_le_bytes([*p.add(TQ2_D), *p.add(TQ2_D + 1)])),
        )
    }
}

impl Wide for Tq2_0 {
    const BIAS: i8 = 1;
    const TERNARY: bool = true;
    /// Zen 4 (`x86_gemm`, k = 7168, in cache, three alternations, ns per row, activation and
    /// 256 elements), one activation tile -> lane tiles of 4: 3.10-3.14 -> 2.12-2.13 at 5 rows,
    /// 2.61-2.65 -> 2.04-2.05 at 6, 2.22-2.24 -> 2.01-2.02 at 7, 1.95-1.96 -> 1.98-1.99 at 8.
    const SPLIT_MAX: usize = 7;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs_gf(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (caller's contract), and the CPU has GFNI.
        let (q, d) = unsafe { tq2_runs(p) };
        unit(
            core::array::from_fn(|c| gf_affine::<0>(q[c / 2], TQ2_GF[c % 2].get())),
            d,
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (caller's contract).
        unsafe {
            let (q, d) = tq2_runs(p);
            // register c: run j = c / 2, bit pairs 2 (c % 2) (low half) and 2 (c % 2) + 1 (high)
            let shifts = [
                _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0),
                _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4),
            ];
            let three = _mm512_set1_epi8(3);
            let t = core::array::from_fn(|c| {
                _mm512_and_si512(_mm512_srlv_epi64(q[c / 2], shifts[c % 2]), three)
            });
            unit(t, d)
        }
    }
}

impl Wide for Tq1_0 {
    const BIAS: i8 = 1;
    const TERNARY: bool = true;
    /// As for TQ2_0 ([`Wide::SPLIT_MAX`]): 4.32-4.33 -> 4.07-4.10 at 5 rows, but 3.60 -> 3.62-3.90
    /// at 6 and worse beyond (its base-3 decode costs more).
    const SPLIT_MAX: usize = 5;
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    unsafe fn decode_regs(p: *const u8) -> Dec {
        // SAFETY: `p` is one block (under 64 bytes): the masked load reads exactly its bytes.
        unsafe {
            let b = _mm512_maskz_loadu_epi8((1u64 << TQ1_BYTES) - 1, p as *const i8);
            let high = _mm512_set1_epi16(0xff00u16 as i16);
            let t = core::array::from_fn(|c| {
                let q = _mm512_permutexvar_epi8(TQ1_BYTE_IDX[c].get(), b);
                // (q 3^n mod 256) << 8 per word, of the even and of the odd byte
                let even = _mm512_mullo_epi16(q, TQ1_POW_EVEN[c].get());
                let odd = _mm512_mullo_epi16(_mm512_and_si512(q, high), TQ1_POW_ODD[c].get());
                // the digit (3 v) >> 8: in the low byte (its high byte zero), in the high byte
                let de = _mm512_mulhi_epu16(even, _mm512_set1_epi16(3));
                let dod = _mm512_mulhi_epu16(odd, _mm512_set1_epi16(3 << 8));
                // de | (dod & 0xff00)
                _mm512_ternarylogic_epi32::<0xf8>(de, dod, high)
            });
            unit(
                t,
                f16_to_f32(u16::from_le_bytes([*p.add(TQ1_D), *p.add(TQ1_D + 1)])),
            )
        }
    }
}
