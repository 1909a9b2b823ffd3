//! Weight blocks -> [`Unpacked`]: the 256 quants of one K-quant super-block as signed int8 in
//! element order, with one scale and one min per group of 16 elements (Q4_K's per-32 values are
//! repeated for both halves), and the block's float factors. Shared by every aarch64 tier; the
//! bit twiddling follows ggml's generic dots element for element (NEON, which every aarch64 CPU has).

use crate::formats::kquants::layout::{block_bytes, Q2, Q3, Q4, Q5, Q6};
use crate::formats::kquants::layout::{Q2K_D, Q2K_DMIN, Q3K_D, Q6K_D};
use core::arch::aarch64::*;
use core::arch::asm;

use crate::formats::unpack_k4_scales;

/// One unpacked K-quant weight block.
#[repr(C, align(16))]
pub(crate) struct Unpacked {
    /// Quant of element e (Q2_K 0..=3, Q3_K -4..=3, Q4_K 0..=15, Q6_K -32..=31).
    pub q: [i8; 256],
    /// Integer scale of elements `16 * g .. 16 * g + 16`.
    pub scales: [i16; 16],
    /// Integer min of the same group (Q2_K, Q4_K; zero otherwise).
    pub mins: [i16; 16],
    /// The block's `d` as f32.
    pub d: f32,
    /// The block's `dmin` as f32 (Q2_K, Q4_K; zero otherwise).
    pub dmin: f32,
}

impl Unpacked {
    pub(crate) fn new() -> Unpacked {
        Unpacked {
            q: [0; 256],
            scales: [0; 16],
            mins: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// The little-endian f16 at `b[at..at + 2]` as f32, with one FCVT (half to single, a base
/// ARMv8 instruction: exact for every f16, NaNs quieted with their payload kept, as the
/// `half` crate's conversion the scalar reference uses, which reaches it only through a
/// run-time FP16 check and a call).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u32::from(u16::from_le_bytes([b[at], b[at + 1]]));
    let out: f32;
    // SAFETY: register-only FP instructions of the aarch64 baseline.
    unsafe {
        asm!(
            "fmov {t:s}, {w:w}",
            "fcvt {o:s}, {t:h}",
            w = in(reg) bits,
            t = out(vreg) _,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Loads 16 bytes at `b[at..at + 16]`.
#[inline(always)]
fn load16(b: &[u8], at: usize) -> uint8x16_t {
    let s = &b[at..at + 16];
    // SAFETY: `s` is exactly 16 readable bytes (the slice above is bounds-checked); NEON is part
    // of the aarch64 baseline and vld1q_u8 has no alignment requirement.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// Stores 16 bytes into `u.q[at..at + 16]`.
#[inline(always)]
fn store16(u: &mut Unpacked, at: usize, v: uint8x16_t) {
    let d = &mut u.q[at..at + 16];
    // SAFETY: `d` is exactly 16 writable bytes (bounds-checked above); i8 and u8 share layout.
    unsafe { vst1q_u8(d.as_mut_ptr().cast::<u8>(), v) }
}

/// Q2_K (84 bytes: scales[16], qs[64], d, dmin): element `128k + 32j + l` is
/// `(qs[32k + l] >> 2j) & 3`; group g has scale `sc[g] & 15` and min `sc[g] >> 4`.
pub(crate) fn q2_k(b: &[u8], u: &mut Unpacked) {
    let b = &b[..block_bytes(Q2)];
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        let m3 = vdupq_n_u8(3);
        for k in 0..2 {
            let lo = load16(b, 16 + 32 * k);
            let hi = load16(b, 16 + 32 * k + 16);
            let base = 128 * k;
            store16(u, base, vandq_u8(lo, m3));
            store16(u, base + 16, vandq_u8(hi, m3));
            store16(u, base + 32, vandq_u8(vshrq_n_u8::<2>(lo), m3));
            store16(u, base + 48, vandq_u8(vshrq_n_u8::<2>(hi), m3));
            store16(u, base + 64, vandq_u8(vshrq_n_u8::<4>(lo), m3));
            store16(u, base + 80, vandq_u8(vshrq_n_u8::<4>(hi), m3));
            store16(u, base + 96, vshrq_n_u8::<6>(lo));
            store16(u, base + 112, vshrq_n_u8::<6>(hi));
        }
    }
    for g in 0..16 {
        u.scales[g] = i16::from(b[g] & 15);
        u.mins[g] = i16::from(b[g] >> 4);
    }
    u.d = f16_at(b, Q2K_D);
    u.dmin = f16_at(b, Q2K_DMIN);
}

/// Q2_K like [`q2_k`], with every quant already multiplied by its group's scale (0..=45: exact
/// in int8) and `scales` all 1. The block's integer total `sum(scale[g] * q[e] * x[e])` is then
/// a plain dot product of `q` and `x`, which SDOT/SMMLA accumulate with no per-group step
/// (integer sums are exact in any order; |total| < 2^31). Everything stays in vector registers.
#[inline(always)]
pub(crate) fn q2_k_scaled(b: &[u8], u: &mut Unpacked) {
    let b = &b[..block_bytes(Q2)];
    // SAFETY: (whole block) NEON register arithmetic only; `u.mins` is 16 writable i16.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let sm = load16(b, 0);
        let sc = vandq_u8(sm, vdupq_n_u8(15));
        let (lo0, hi0) = (load16(b, 16), load16(b, 32));
        let (lo1, hi1) = (load16(b, 48), load16(b, 64));
        // Group g = 8k + 2j (+1 for the second 16 bytes) holds `(qs[32k + l] >> 2j) & 3`.
        macro_rules! put {
            ($g:literal, $v:expr) => {
                store16(u, 16 * $g, vmulq_u8($v, vdupq_laneq_u8::<$g>(sc)))
            };
        }
        put!(0, vandq_u8(lo0, m3));
        put!(1, vandq_u8(hi0, m3));
        put!(2, vandq_u8(vshrq_n_u8::<2>(lo0), m3));
        put!(3, vandq_u8(vshrq_n_u8::<2>(hi0), m3));
        put!(4, vandq_u8(vshrq_n_u8::<4>(lo0), m3));
        put!(5, vandq_u8(vshrq_n_u8::<4>(hi0), m3));
        put!(6, vshrq_n_u8::<6>(lo0));
        put!(7, vshrq_n_u8::<6>(hi0));
        put!(8, vandq_u8(lo1, m3));
        put!(9, vandq_u8(hi1, m3));
        put!(10, vandq_u8(vshrq_n_u8::<2>(lo1), m3));
        put!(11, vandq_u8(vshrq_n_u8::<2>(hi1), m3));
        put!(12, vandq_u8(vshrq_n_u8::<4>(lo1), m3));
        put!(13, vandq_u8(vshrq_n_u8::<4>(hi1), m3));
        put!(14, vshrq_n_u8::<6>(lo1));
        put!(15, vshrq_n_u8::<6>(hi1));
        let mins = vshrq_n_u8::<4>(sm);
        let (m0, m1) = (vmovl_u8(vget_low_u8(mins)), vmovl_high_u8(mins));
        vst1q_s16(u.mins.as_mut_ptr(), vreinterpretq_s16_u16(m0));
        vst1q_s16(u.mins.as_mut_ptr().add(8), vreinterpretq_s16_u16(m1));
        vst1q_s16(u.scales.as_mut_ptr(), vdupq_n_s16(1));
        vst1q_s16(u.scales.as_mut_ptr().add(8), vdupq_n_s16(1));
    }
    u.d = f16_at(b, Q2K_D);
    u.dmin = f16_at(b, Q2K_DMIN);
}

/// Q3_K (110 bytes: hmask[32], qs[64], scales[12], d): element `128k + 32j + l` is
/// `((qs[32k + l] >> 2j) & 3) - (hmask[l] has bit 4k + j ? 0 : 4)`; scales are 6-bit minus 32.
pub(crate) fn q3_k(b: &[u8], u: &mut Unpacked) {
    let b = &b[..block_bytes(Q3)];
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let four = vdupq_n_u8(4);
        let ld = |at: usize| load16(b, at);
        let h = [ld(0), ld(16)];
        for k in 0..2 {
            let q = [ld(32 + 32 * k), ld(32 + 32 * k + 16)];
            for j in 0..4 {
                let bit = vdupq_n_u8(1u8 << (4 * k + j));
                for half in 0..2 {
                    let low = match j {
                        0 => vandq_u8(q[half], m3),
                        1 => vandq_u8(vshrq_n_u8::<2>(q[half]), m3),
                        2 => vandq_u8(vshrq_n_u8::<4>(q[half]), m3),
                        _ => vshrq_n_u8::<6>(q[half]),
                    };
                    // 4 where the high bit is clear, 0 where it is set.
                    let sub = vbicq_u8(four, vtstq_u8(h[half], bit));
                    store16(u, 128 * k + 32 * j + 16 * half, vsubq_u8(low, sub));
                }
            }
        }
    }
    // SAFETY: NEON register arithmetic; each store writes 8 i16 inside `u.scales`.
    unsafe {
        let s = q3_k_scales(b);
        let off = vdupq_n_s16(32);
        let lo = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(s))), off);
        let hi = vsubq_s16(vreinterpretq_s16_u16(vmovl_high_u8(s)), off);
        vst1q_s16(u.scales.as_mut_ptr(), lo);
        vst1q_s16(u.scales.as_mut_ptr().add(8), hi);
    }
    u.mins = [0; 16];
    u.d = f16_at(b, Q3K_D);
    u.dmin = 0.0;
}

/// The [`LANES8`] layout of 256 values given as eight 32-byte runs `v[k][j]` (elements
/// `128k + 32j + 0..32`), each already in [`PERM32`] order (two vectors: lanes 0..4, 4..8):
/// 16-byte chunk `c = 8k + 4(j/2) + 2h + z` is `zip{z+1}.4s(v[k][j][h], v[k][j+1][h])` for even
/// j, i.e. its low 8 bytes are the 8 elements of lane `4h + 2z` from groups j and j+1, its high
/// 8 bytes those of lane `4h + 2z + 1`.
#[inline(always)]
pub(crate) fn lanes8_chunks(v0: [uint8x16_t; 2], v1: [uint8x16_t; 2]) -> [uint8x16_t; 4] {
    // SAFETY: NEON register reinterpretations and zips only.
    unsafe {
        let z = |a: uint8x16_t, b: uint8x16_t| {
            let (a, b) = (vreinterpretq_u32_u8(a), vreinterpretq_u32_u8(b));
            (
                vreinterpretq_u8_u32(vzip1q_u32(a, b)),
                vreinterpretq_u8_u32(vzip2q_u32(a, b)),
            )
        };
        let (c0, c1) = z(v0[0], v1[0]);
        let (c2, c3) = z(v0[1], v1[1]);
        [c0, c1, c2, c3]
    }
}

/// Q3_K's sixteen 6-bit scales (0..=63, as `formats::unpack_q3_k_scales`) in one vector:
/// scale j takes its low 4 bits from scale byte `j % 8` (low nibble for j < 8, high for j >= 8)
/// and its high 2 bits from byte `8 + j % 4`, bits `2 * (j / 4)`; two table lookups and
/// per-lane shifts instead of sixteen scalar steps.
#[inline(always)]
fn q3_k_scales(b: &[u8]) -> uint8x16_t {
    // The 16 bytes ending with the block: the 12 scale bytes (96..108) sit at lanes 2..14.
    q3_k_scales16(load16(&b[..block_bytes(Q3)], block_bytes(Q3) - 16))
}

/// [`q3_k_scales`] from 16 bytes `v` holding the 12 scale bytes at lanes 2..14.
#[inline(always)]
pub(crate) fn q3_k_scales16(v: uint8x16_t) -> uint8x16_t {
    const LOW_AT: [u8; 16] = [2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9];
    const LOW_SHIFT: [i8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, -4, -4, -4, -4, -4, -4, -4, -4];
    const HIGH_AT: [u8; 16] = [
        10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13,
    ];
    const HIGH_SHIFT: [i8; 16] = [0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6];
    // SAFETY: the constants are 16 readable bytes each; the rest is NEON register arithmetic.
    unsafe {
        let low = vshlq_u8(
            vqtbl1q_u8(v, vld1q_u8(LOW_AT.as_ptr())),
            vld1q_s8(LOW_SHIFT.as_ptr()),
        );
        let high = vshlq_u8(
            vqtbl1q_u8(v, vld1q_u8(HIGH_AT.as_ptr())),
            vld1q_s8(HIGH_SHIFT.as_ptr()),
        );
        vorrq_u8(
            vandq_u8(low, vdupq_n_u8(15)),
            vshlq_n_u8::<4>(vandq_u8(high, vdupq_n_u8(3))),
        )
    }
}

/// Q3_K in the lane-grouped layout ([`lanes8_chunks`]) with each quant multiplied by the
/// negated scale of its group: `q[e] * (32 - sc[g])` lies in -128..=124 (exact in int8, where
/// `q * (sc - 32)` would reach 128). Every 8-byte slice then holds 8 elements of one reference
/// lane (`e % 8`) and needs no scale: the lane sums are minus the reference's `aux32` lanes,
/// exactly. `scales`/`mins` are not used by the cores of this layout and are set to zero.
pub(crate) fn q3_k_lanes(b: &[u8], u: &mut Unpacked) {
    let b = &b[..block_bytes(Q3)];
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let four = vdupq_n_u8(4);
        let nsv = vsubq_u8(vdupq_n_u8(32), q3_k_scales(b));
        // Position p of a PERM32 vector comes from group half `(p % 4) / 2`.
        const HALF: [u8; 16] = [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1];
        let half = vld1q_u8(HALF.as_ptr());
        let (h0, h1) = perm32(load16(b, 0), load16(b, 16));
        let h = [h0, h1];
        for k in 0..2 {
            let (p0, p1) = perm32(load16(b, 32 + 32 * k), load16(b, 48 + 32 * k));
            let p = [p0, p1];
            let mut v = [[vdupq_n_u8(0); 2]; 4];
            for j in 0..4 {
                let bit = vdupq_n_u8(1u8 << (4 * k + j));
                let scale = vqtbl1q_u8(nsv, vaddq_u8(half, vdupq_n_u8((8 * k + 2 * j) as u8)));
                for hh in 0..2 {
                    let low = match j {
                        0 => vandq_u8(p[hh], m3),
                        1 => vandq_u8(vshrq_n_u8::<2>(p[hh]), m3),
                        2 => vandq_u8(vshrq_n_u8::<4>(p[hh]), m3),
                        _ => vshrq_n_u8::<6>(p[hh]),
                    };
                    let q = vsubq_u8(low, vbicq_u8(four, vtstq_u8(h[hh], bit)));
                    v[j][hh] = vmulq_u8(q, scale);
                }
            }
            for jp in 0..2 {
                let c = lanes8_chunks(v[2 * jp], v[2 * jp + 1]);
                for (z, c) in c.into_iter().enumerate() {
                    store16(u, 16 * (8 * k + 4 * jp + z), c);
                }
            }
        }
    }
    u.scales = [0; 16];
    u.mins = [0; 16];
    u.d = f16_at(b, Q3K_D);
    u.dmin = 0.0;
}

/// Q4_K (144 bytes: d, dmin, scales[12], qs[128]): element `64j + l` is `qs[32j + l] & 15`,
/// element `64j + 32 + l` is `qs[32j + l] >> 4`; 6-bit scale and min per 32 elements.
pub(crate) fn q4_k(b: &[u8], u: &mut Unpacked) {
    let b = &b[..block_bytes(Q4)];
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        let m15 = vdupq_n_u8(15);
        for j in 0..4 {
            for half in 0..2 {
                let q = load16(b, 16 + 32 * j + 16 * half);
                store16(u, 64 * j + 16 * half, vandq_u8(q, m15));
                store16(u, 64 * j + 32 + 16 * half, vshrq_n_u8::<4>(q));
            }
        }
    }
    let mut sc = [0u8; 12];
    sc.copy_from_slice(&b[4..16]);
    let (s, m) = unpack_k4_scales(&sc);
    for g in 0..16 {
        u.scales[g] = i16::from(s[g / 2]);
        u.mins[g] = i16::from(m[g / 2]);
    }
    u.d = f16_at(b, 0);
    u.dmin = f16_at(b, 2);
}

/// Q6_K (210 bytes: ql[128], qh[64], scales[16] i8, d): for `l < 32` in chunk k, elements
/// `128k + l, +32, +64, +96` take the low/high nibble of `ql[64k + l]` / `ql[64k + 32 + l]`
/// and bits 0-1, 2-3, 4-5, 6-7 of `qh[32k + l]`, minus 32.
pub(crate) fn q6_k(b: &[u8], u: &mut Unpacked) {
    let b = &b[..block_bytes(Q6)];
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        let m15 = vdupq_n_u8(15);
        let m48 = vdupq_n_u8(0x30);
        let off = vdupq_n_u8(32);
        for k in 0..2 {
            for half in 0..2 {
                let l = 16 * half;
                let ld = |at: usize| load16(b, at);
                let l0 = ld(64 * k + l);
                let l1 = ld(64 * k + 32 + l);
                let h = ld(128 + 32 * k + l);
                let h0 = vandq_u8(vshlq_n_u8::<4>(h), m48);
                let h1 = vandq_u8(vshlq_n_u8::<2>(h), m48);
                let h2 = vandq_u8(h, m48);
                let h3 = vandq_u8(vshrq_n_u8::<2>(h), m48);
                let base = 128 * k + l;
                store16(u, base, vsubq_u8(vorrq_u8(vandq_u8(l0, m15), h0), off));
                store16(u, base + 32, vsubq_u8(vorrq_u8(vandq_u8(l1, m15), h1), off));
                store16(
                    u,
                    base + 64,
                    vsubq_u8(vorrq_u8(vshrq_n_u8::<4>(l0), h2), off),
                );
                store16(
                    u,
                    base + 96,
                    vsubq_u8(vorrq_u8(vshrq_n_u8::<4>(l1), h3), off),
                );
            }
        }
    }
    for g in 0..16 {
        u.scales[g] = i16::from(b[192 + g] as i8);
        u.mins[g] = 0;
    }
    u.d = f16_at(b, Q6K_D);
    u.dmin = 0.0;
}

/// The order SDOT/SMMLA want within each group of 32 elements: position p holds element
/// `p / 4 + 8 * (p % 4)`, so each 4-byte lane holds the four elements of one reference lane
/// (`e % 8`), lanes 0..8 in order. Used for Q4_K, whose scales cover 32 elements.
pub(crate) const PERM32: [u8; 32] = {
    let mut p = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        p[i] = (i / 4 + 8 * (i % 4)) as u8;
        i += 1;
    }
    p
};

/// Applies [`PERM32`] to the 32 bytes `lo ++ hi`.
#[inline(always)]
pub(crate) fn perm32(lo: uint8x16_t, hi: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: PERM32 is 32 readable bytes; the rest is NEON register arithmetic.
    unsafe {
        let t = uint8x16x2_t(lo, hi);
        let i0 = vld1q_u8(PERM32.as_ptr());
        let i1 = vld1q_u8(PERM32.as_ptr().add(16));
        (vqtbl2q_u8(t, i0), vqtbl2q_u8(t, i1))
    }
}

/// Q4_K in [`PERM32`] order with the per-32 scale folded in, in two streams so that both fit
/// int8: `q[e] = quant * (sc >> 3)` and `q2[e] = quant * (sc & 7)` (each at most 15 * 7), so
/// `quant * sc = 8 * q[e] + q2[e]`. The lane sums of both streams are plain SDOTs with no
/// per-group step; the caller combines them as `8 * hi + lo` (exact integers). `scales` are
/// not needed by that core and are left as unpacked (per 16), `mins` as in [`q4_k`].
pub(crate) fn q4_k_perm_folded(b: &[u8], u: &mut Unpacked, q2: &mut [i8; 256]) {
    let b = &b[..block_bytes(Q4)];
    let mut sc = [0u8; 12];
    sc.copy_from_slice(&b[4..16]);
    fold_perm32(&sc, u, q2, |j| {
        perm32(load16(b, 16 + 32 * j), load16(b, 32 + 32 * j))
    });
    u.d = f16_at(b, 0);
    u.dmin = f16_at(b, 2);
}

/// The folded streams of [`q4_k_perm_folded`] from the packed scale bytes `sc` and the quant
/// bytes of each 32-byte run `j` in [`PERM32`] order (`run(j)`, two vectors).
#[inline(always)]
fn fold_perm32(
    sc: &[u8; 12],
    u: &mut Unpacked,
    q2: &mut [i8; 256],
    run: impl Fn(usize) -> (uint8x16_t, uint8x16_t),
) {
    let (s, m) = unpack_k4_scales(sc);
    for g in 0..16 {
        u.scales[g] = i16::from(s[g / 2]);
        u.mins[g] = i16::from(m[g / 2]);
    }
    // Group 2j (low nibbles) and 2j + 1 (high nibbles) of 32 per j: byte 2j + h of `sv`.
    let mut sb = [0u8; 16];
    sb[..8].copy_from_slice(&s);
    // SAFETY: (whole block) NEON register arithmetic only; `sb` is 16 readable bytes and every
    // store writes 16 bytes inside `u.q` or `q2` (bounds-checked slices).
    unsafe {
        let m15 = vdupq_n_u8(15);
        let sv = vld1q_u8(sb.as_ptr());
        let (shi, slo) = (vshrq_n_u8::<3>(sv), vandq_u8(sv, vdupq_n_u8(7)));
        let st2 = |q2: &mut [i8; 256], at: usize, v: uint8x16_t| {
            let d = &mut q2[at..at + 16];
            vst1q_u8(d.as_mut_ptr().cast::<u8>(), v)
        };
        macro_rules! group {
            ($j:literal) => {{
                let (p0, p1) = run($j);
                let (l0, l1) = (vandq_u8(p0, m15), vandq_u8(p1, m15));
                let (h0, h1) = (vshrq_n_u8::<4>(p0), vshrq_n_u8::<4>(p1));
                let (a, c) = (
                    vdupq_laneq_u8::<{ 2 * $j }>(shi),
                    vdupq_laneq_u8::<{ 2 * $j }>(slo),
                );
                let (e, f) = (
                    vdupq_laneq_u8::<{ 2 * $j + 1 }>(shi),
                    vdupq_laneq_u8::<{ 2 * $j + 1 }>(slo),
                );
                store16(u, 64 * $j, vmulq_u8(l0, a));
                store16(u, 64 * $j + 16, vmulq_u8(l1, a));
                store16(u, 64 * $j + 32, vmulq_u8(h0, e));
                store16(u, 64 * $j + 48, vmulq_u8(h1, e));
                st2(q2, 64 * $j, vmulq_u8(l0, c));
                st2(q2, 64 * $j + 16, vmulq_u8(l1, c));
                st2(q2, 64 * $j + 32, vmulq_u8(h0, f));
                st2(q2, 64 * $j + 48, vmulq_u8(h1, f));
            }};
        }
        group!(0);
        group!(1);
        group!(2);
        group!(3);
    }
}

/// Q4_K in [`q3_k_lanes`]' lane-grouped layout ([`lanes8_chunks`] over the pairs of groups of
/// 32, here the low and high nibbles of one `qs[32j..32j + 32]`), with the per-32 scale folded
/// in two streams as in [`q4_k_perm_folded`]: `u.q` holds `quant * (sc >> 3)` and `q2`
/// `quant * (sc & 7)` (each at most 105), so every 8-byte slice is 8 elements of one reference
/// lane and `8 * hi + lo` over a slice is that lane's `scale * quant` sum. `scales`, `mins`,
/// `d`, `dmin` as in [`q4_k`].
pub(crate) fn q4_k_lanes(b: &[u8], u: &mut Unpacked, q2: &mut [i8; 256]) {
    let b = &b[..block_bytes(Q4)];
    let mut sc = [0u8; 12];
    sc.copy_from_slice(&b[4..16]);
    let (s, m) = unpack_k4_scales(&sc);
    for g in 0..16 {
        u.scales[g] = i16::from(s[g / 2]);
        u.mins[g] = i16::from(m[g / 2]);
    }
    let mut sb = [0u8; 16];
    sb[..8].copy_from_slice(&s);
    // SAFETY: NEON register arithmetic only; `sb` is 16 readable bytes and every store writes
    // 16 bytes inside `u.q` or `q2` (bounds-checked slices).
    unsafe {
        let m15 = vdupq_n_u8(15);
        let sv = vld1q_u8(sb.as_ptr());
        let (shi, slo) = (vshrq_n_u8::<3>(sv), vandq_u8(sv, vdupq_n_u8(7)));
        let st2 = |q2: &mut [i8; 256], at: usize, v: uint8x16_t| {
            let d = &mut q2[at..at + 16];
            vst1q_u8(d.as_mut_ptr().cast::<u8>(), v)
        };
        macro_rules! pair_of_groups {
            ($j:literal) => {{
                let (p0, p1) = perm32(load16(b, 16 + 32 * $j), load16(b, 32 + 32 * $j));
                let low = [vandq_u8(p0, m15), vandq_u8(p1, m15)];
                let high = [vshrq_n_u8::<4>(p0), vshrq_n_u8::<4>(p1)];
                let scaled =
                    |v: [uint8x16_t; 2], s: uint8x16_t| [vmulq_u8(v[0], s), vmulq_u8(v[1], s)];
                let h = lanes8_chunks(
                    scaled(low, vdupq_laneq_u8::<{ 2 * $j }>(shi)),
                    scaled(high, vdupq_laneq_u8::<{ 2 * $j + 1 }>(shi)),
                );
                let l = lanes8_chunks(
                    scaled(low, vdupq_laneq_u8::<{ 2 * $j }>(slo)),
                    scaled(high, vdupq_laneq_u8::<{ 2 * $j + 1 }>(slo)),
                );
                for i in 0..4 {
                    store16(u, 16 * (4 * $j + i), h[i]);
                    st2(q2, 16 * (4 * $j + i), l[i]);
                }
            }};
        }
        pair_of_groups!(0);
        pair_of_groups!(1);
        pair_of_groups!(2);
        pair_of_groups!(3);
    }
    u.d = f16_at(b, 0);
    u.dmin = f16_at(b, 2);
}

/// The 16 products `p = q * s` (Q6_K's quants minus 32 times their int8 scales, |p| <= 4096)
/// split as `64 * hi + lo`, from four times the quants (`q4 = 4 * q`, -128..=124): `(hi, lo)`
/// with `hi = p >> 6` (-64..=64) and `lo = p & 63` (0..=63), in five instructions: `4p = q4 *
/// s` (|4p| <= 16384, exact in int16), whose high byte is `p >> 6` and whose low byte is `4 *
/// (p & 63)`.
#[inline(always)]
pub(crate) fn split64(q4: int8x16_t, s: int8x16_t) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: NEON register arithmetic only (SMULL2 is base Advanced SIMD).
    unsafe {
        let p0 = vmull_s8(vget_low_s8(q4), vget_low_s8(s));
        // `vmull_high_s8` in asm: LLVM lowers the intrinsic to two EXTs and an SMULL here.
        let p1: int16x8_t;
        core::arch::asm!(
            "smull2 {p:v}.8h, {q:v}.16b, {s:v}.16b",
            p = out(vreg) p1,
            q = in(vreg) q4,
            s = in(vreg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
        let (b0, b1) = (vreinterpretq_u8_s16(p0), vreinterpretq_u8_s16(p1));
        (vuzp2q_u8(b0, b1), vshrq_n_u8::<2>(vuzp1q_u8(b0, b1)))
    }
}

/// Q6_K in [`q4_k_lanes`]' lane-grouped layout (each pair of groups of 32 through
/// [`lanes8_chunks`]), each quant times its group's scale (int8, per 16 elements) split in two
/// int8 streams: the product `p = q * sc` (|p| <= 4096, exact in int16) is `64 * hi + lo` with
/// `u.q = hi = p >> 6` (-64..=64, signed) and `q2 = lo = p & 63` (0..=63), so every 8-byte
/// slice is 8 elements of one reference lane and `64 * hi + lo` over a slice is that lane's
/// `scale * quant` sum: the reference's `aux32` lanes with no per-group step. `scales` and `d`
/// as in [`q6_k`].
pub(crate) fn q6_k_lanes(b: &[u8], u: &mut Unpacked, q2: &mut [i8; 256]) {
    q6_k(b, u);
    let b = &b[..block_bytes(Q6)];
    // SAFETY: (whole block) NEON register arithmetic only; loads and stores are 16 bytes
    // inside `b`, `u.q` and `q2` (bounds-checked slices).
    unsafe {
        let sv = vld1q_s8(b[192..208].as_ptr().cast::<i8>());
        let st2 = |q2: &mut [i8; 256], at: usize, v: uint8x16_t| {
            let d = &mut q2[at..at + 16];
            vst1q_u8(d.as_mut_ptr().cast::<u8>(), v)
        };
        macro_rules! pair_of_groups {
            ($j:literal) => {{
                let q = |at: usize| vld1q_s8(u.q[at..at + 16].as_ptr());
                let (q0, q1, q2v, q3) = (
                    q(64 * $j),
                    q(64 * $j + 16),
                    q(64 * $j + 32),
                    q(64 * $j + 48),
                );
                let (h0, l0) = split64(vshlq_n_s8::<2>(q0), vdupq_laneq_s8::<{ 4 * $j }>(sv));
                let (h1, l1) = split64(vshlq_n_s8::<2>(q1), vdupq_laneq_s8::<{ 4 * $j + 1 }>(sv));
                let (h2, l2) = split64(vshlq_n_s8::<2>(q2v), vdupq_laneq_s8::<{ 4 * $j + 2 }>(sv));
                let (h3, l3) = split64(vshlq_n_s8::<2>(q3), vdupq_laneq_s8::<{ 4 * $j + 3 }>(sv));
                let (ha, hb) = (perm32(h0, h1), perm32(h2, h3));
                let (la, lb) = (perm32(l0, l1), perm32(l2, l3));
                let h = lanes8_chunks([ha.0, ha.1], [hb.0, hb.1]);
                let l = lanes8_chunks([la.0, la.1], [lb.0, lb.1]);
                for i in 0..4 {
                    store16(u, 16 * (4 * $j + i), h[i]);
                    st2(q2, 16 * (4 * $j + i), l[i]);
                }
            }};
        }
        pair_of_groups!(0);
        pair_of_groups!(1);
        pair_of_groups!(2);
        pair_of_groups!(3);
    }
}

/// Q5_K (176 bytes: d, dmin, scales[12], qh[32], qs[128]): like Q4_K plus a fifth bit,
/// element `64j + l` is `(qs[32j + l] & 15) | (bit 2j of qh[l]) << 4`, element
/// `64j + 32 + l` is `(qs[32j + l] >> 4) | (bit 2j + 1 of qh[l]) << 4` (0..=31). With
/// `perm`, groups of 32 are stored in [`PERM32`] order (qs and qh share positions `l`).
pub(crate) fn q5_k(b: &[u8], u: &mut Unpacked, perm: bool) {
    let b = &b[..block_bytes(Q5)];
    let mut sc = [0u8; 12];
    sc.copy_from_slice(&b[4..16]);
    let order = |v: (uint8x16_t, uint8x16_t)| if perm { perm32(v.0, v.1) } else { v };
    let h = order((load16(b, 16), load16(b, 32)));
    q5_k_fill(u, &sc, h, |j| {
        order((load16(b, 48 + 32 * j), load16(b, 64 + 32 * j)))
    });
    u.d = f16_at(b, 0);
    u.dmin = f16_at(b, 2);
}

/// The quants, scales and mins of a Q5_K block into `u` from its packed scale bytes `sc`, its
/// 32 `qh` bytes `h` and the quant bytes of each run `j` (`run(j)`), `h` and the runs in the
/// same order (file or [`PERM32`]).
#[inline(always)]
fn q5_k_fill(
    u: &mut Unpacked,
    sc: &[u8; 12],
    h: (uint8x16_t, uint8x16_t),
    run: impl Fn(usize) -> (uint8x16_t, uint8x16_t),
) {
    // SAFETY: (whole block) NEON register arithmetic only.
    unsafe {
        let m15 = vdupq_n_u8(15);
        let sixteen = vdupq_n_u8(16);
        for j in 0..4 {
            let (q0, q1) = run(j);
            let lo_bit = vdupq_n_u8(1u8 << (2 * j));
            let hi_bit = vdupq_n_u8(2u8 << (2 * j));
            for (half, (q, h)) in [(q0, h.0), (q1, h.1)].into_iter().enumerate() {
                let hl = vandq_u8(vtstq_u8(h, lo_bit), sixteen);
                let hh = vandq_u8(vtstq_u8(h, hi_bit), sixteen);
                store16(u, 64 * j + 16 * half, vorrq_u8(vandq_u8(q, m15), hl));
                store16(u, 64 * j + 32 + 16 * half, vorrq_u8(vshrq_n_u8::<4>(q), hh));
            }
        }
    }
    let (s, m) = unpack_k4_scales(sc);
    for g in 0..16 {
        u.scales[g] = i16::from(s[g / 2]);
        u.mins[g] = i16::from(m[g / 2]);
    }
}
