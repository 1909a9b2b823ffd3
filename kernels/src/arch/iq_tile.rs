//! The architecture-independent half of the SIMD i-quant kernels: each weight block decoded once
//! into 256 signed bytes (grid point times sign, or the IQ4 value), and the per-type float
//! epilogue that turns integer sums over 16-element groups into ggml's result.
//!
//! A tier only has to provide the integer part: for one decoded block and one activation block,
//! the sixteen sums `s[g] = sum of w[i] * x[i]` over elements `16 g .. 16 g + 16` (and, for
//! IQ1_M, the same sums `s2` with the block's ±1 shift signs as weights). Integer sums are exact
//! in any order, and [`IqKind::epilogue`] then replays the scalar reference's integer scale
//! products and its float operations in the reference order, so a tier built on this gives the
//! scalar path's bits. Activations are Q8_K blocks, or eight consecutive Q8_0 blocks (one
//! 256-element unit) against eight IQ4_NL or MXFP4 blocks, four NVFP4 or Q2_0 blocks, or two
//! Q1_0 blocks.

use crate::formats::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ8_0, BlockQ8_K,
    BlockTq1_0, BlockTq2_0, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_FP4, KVALUES_IQ4NL, QK_K,
};
use crate::scalar::{iq1, iq2, iq3, ternary};
use crate::{GgmlType, Tile};

/// One decoded 256-element unit: signed weights, and for IQ1_M the ±1 shift sign per element.
#[derive(Clone)]
#[repr(C, align(32))]
pub struct Decoded {
    pub w: [i8; QK_K],
    pub w2: [i8; QK_K],
}

impl Default for Decoded {
    fn default() -> Self {
        Decoded {
            w: [0; QK_K],
            w2: [0; QK_K],
        }
    }
}

/// One i-quant (or ternary) type as the SIMD tiers see it.
pub trait IqKind {
    /// `UNIT` consecutive weight blocks make one 256-element unit (8 for IQ4_NL and MXFP4, 4 for
    /// NVFP4 and Q2_0, 2 for Q1_0, else 1).
    type W: Block;
    /// The activation block type (`X_UNIT` of them per unit).
    type X: Block;
    const UNIT: usize;
    /// Activation blocks per unit (8 for Q8_0, 1 for Q8_K).
    const X_UNIT: usize = Self::UNIT;
    /// Whether `Decoded::w2` is used (the IQ1_M shifts).
    const HAS_W2: bool = false;
    /// Decodes one unit (`core` may supply a faster table lookup, see [`Sums::nl_values`]).
    fn decode<S: Sums>(core: &S, w: &[Self::W], out: &mut Decoded);
    /// Adds this unit's contribution to `sumf` exactly as the scalar reference does.
    fn epilogue(w: &[Self::W], x: &[Self::X], s: &[i32; 16], s2: &[i32; 16], sumf: &mut f32);
    /// The reference's final scaling of the row sum.
    #[inline(always)]
    fn finish(sumf: f32) -> f32 {
        sumf
    }
}

/// Byte j of `SIGN_MASK[s]` is 0xff when bit j of `s` is set (also the aarch64 NEON decoders'
/// sign masks, `arch::aarch64::iq_decode`).
pub(crate) static SIGN_MASK: [u64; 256] = sign_masks();

pub(crate) const fn sign_masks() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            if s & (1 << j) != 0 {
                t[s] |= 0xff << (8 * j);
            }
            j += 1;
        }
        s += 1;
    }
    t
}

/// Negates the bytes of `grid` selected by `signs`. Every grid byte is non-zero (IQ2/IQ3 grids),
/// so the per-byte negation `(g ^ 0xff) + 1` never carries into the next byte.
#[inline(always)]
fn signed(grid: u64, signs: u8) -> u64 {
    let m = SIGN_MASK[signs as usize];
    (grid ^ m).wrapping_add(m & 0x0101_0101_0101_0101)
}

#[inline(always)]
fn put(out: &mut [i8; QK_K], at: usize, v: u64) {
    for (o, b) in out[at..at + 8].iter_mut().zip(v.to_le_bytes()) {
        *o = b as i8;
    }
}

#[inline(always)]
fn s32(s: &[i32; 16], g: usize) -> i32 {
    s[2 * g] + s[2 * g + 1]
}

pub struct Iq2Xxs;
impl IqKind for Iq2Xxs {
    type W = BlockIq2Xxs;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq2Xxs], out: &mut Decoded) {
        let b = &w[0];
        for g in 0..8 {
            let (idx, sg) = b.words(g);
            for l in 0..4 {
                let grid = IQ2XXS_GRID[(idx >> (8 * l)) as usize & 255];
                let v = signed(grid, KSIGNS_IQ2XS[(sg >> (7 * l)) as usize & 127]);
                put(&mut out.w, 32 * g + 8 * l, v);
            }
        }
    }
    fn epilogue(w: &[BlockIq2Xxs], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        let mut bsum = 0i32;
        for g in 0..8 {
            bsum += s32(s, g) * (2 * (a.words(g).1 >> 28) as i32 + 1);
        }
        *sumf += a.d() * b.d() * bsum as f32;
    }
    fn finish(sumf: f32) -> f32 {
        0.125 * sumf
    }
}

pub struct Iq2Xs;
impl IqKind for Iq2Xs {
    type W = BlockIq2Xs;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq2Xs], out: &mut Decoded) {
        let b = &w[0];
        for i in 0..32 {
            let q = b.q(i);
            let v = signed(
                IQ2XS_GRID[(q & 511) as usize],
                KSIGNS_IQ2XS[(q >> 9) as usize],
            );
            put(&mut out.w, 8 * i, v);
        }
    }
    fn epilogue(w: &[BlockIq2Xs], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        *sumf += a.d() * b.d() * iq2_pairs(&a.scales, s) as f32;
    }
    fn finish(sumf: f32) -> f32 {
        0.125 * sumf
    }
}

/// `sum of (2 * lo + 1) * s[2g] + (2 * hi + 1) * s[2g + 1]` over the nibble-pair scales.
#[inline(always)]
fn iq2_pairs(scales: &[u8; 8], s: &[i32; 16]) -> i32 {
    let mut bsum = 0i32;
    for (g, &sc) in scales.iter().enumerate() {
        bsum += (2 * (sc & 0xf) as i32 + 1) * s[2 * g] + (2 * (sc >> 4) as i32 + 1) * s[2 * g + 1];
    }
    bsum
}

pub struct Iq2S;
impl IqKind for Iq2S {
    type W = BlockIq2S;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq2S], out: &mut Decoded) {
        let b = &w[0];
        for g in 0..8 {
            for l in 0..4 {
                let grid = IQ2S_GRID[iq2::iq2_s_index(b, g, l)];
                put(
                    &mut out.w,
                    32 * g + 8 * l,
                    signed(grid, b.qs[QK_K / 8 + 4 * g + l]),
                );
            }
        }
    }
    fn epilogue(w: &[BlockIq2S], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        *sumf += a.d() * b.d() * iq2_pairs(&a.scales, s) as f32;
    }
    fn finish(sumf: f32) -> f32 {
        0.125 * sumf
    }
}

pub struct Iq3Xxs;
impl IqKind for Iq3Xxs {
    type W = BlockIq3Xxs;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq3Xxs], out: &mut Decoded) {
        let b = &w[0];
        for g in 0..8 {
            let aux = b.signs_scale(g);
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127];
                put(
                    &mut out.w,
                    32 * g + 8 * l,
                    signed(iq3::iq3_xxs_point(b, g, l), signs),
                );
            }
        }
    }
    fn epilogue(w: &[BlockIq3Xxs], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        let mut bsum = 0i32;
        for g in 0..8 {
            bsum += s32(s, g) * (2 * (a.signs_scale(g) >> 28) as i32 + 1);
        }
        *sumf += a.d() * b.d() * bsum as f32;
    }
    fn finish(sumf: f32) -> f32 {
        0.25 * sumf
    }
}

pub struct Iq3S;
impl IqKind for Iq3S {
    type W = BlockIq3S;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq3S], out: &mut Decoded) {
        let b = &w[0];
        for g in 0..8 {
            for l in 0..4 {
                let v = signed(iq3::iq3_s_point(b, g, l), b.signs[4 * g + l]);
                put(&mut out.w, 32 * g + 8 * l, v);
            }
        }
    }
    fn epilogue(w: &[BlockIq3S], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        let mut bsum = 0i32;
        for g in 0..8 {
            bsum += s32(s, g) * iq3::iq3_s_scale(a, g);
        }
        *sumf += a.d() * b.d() * bsum as f32;
    }
}

pub struct Iq1S;
impl IqKind for Iq1S {
    type W = BlockIq1S;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq1S], out: &mut Decoded) {
        let b = &w[0];
        for g in 0..8 {
            for l in 0..4 {
                put(
                    &mut out.w,
                    32 * g + 8 * l,
                    IQ1S_GRID[iq1::iq1_s_index(b, g, l)],
                );
            }
        }
    }
    fn epilogue(w: &[BlockIq1S], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for g in 0..8 {
            let qh = a.qh(g);
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            sumi += ls * s32(s, g);
            sumi1 += ls * delta * (b.bsum(2 * g) as i32 + b.bsum(2 * g + 1) as i32);
        }
        *sumf += a.d() * b.d() * (sumi as f32 + iq1::IQ1_DELTA * sumi1 as f32);
    }
}

pub struct Iq1M;
impl IqKind for Iq1M {
    type W = BlockIq1M;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    const HAS_W2: bool = true;
    fn decode<S: Sums>(_core: &S, w: &[BlockIq1M], out: &mut Decoded) {
        let b = &w[0];
        for g in 0..8 {
            for l in 0..4 {
                let at = 32 * g + 8 * l;
                put(&mut out.w, at, IQ1S_GRID[iq1::iq1_m_index(b, g, l)]);
                let shift: i8 = if iq1::iq1_m_negative(b, g, l) { -1 } else { 1 };
                out.w2[at..at + 8].fill(shift);
            }
        }
    }
    fn epilogue(w: &[BlockIq1M], x: &[BlockQ8_K], s: &[i32; 16], s2: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for g in 0..8 {
            let ls = iq1::iq1_m_scales(a, g);
            sumi1 += s[2 * g] * ls[0] + s[2 * g + 1] * ls[1];
            sumi2 += s2[2 * g] * ls[0] + s2[2 * g + 1] * ls[1];
        }
        *sumf += a.d() * b.d() * (sumi1 as f32 + iq1::IQ1_DELTA * sumi2 as f32);
    }
}

/// The 32 values of 16 packed 4-bit codes in `table` (low nibbles, then high nibbles) at
/// `out[at..at + 32]`.
#[inline(always)]
pub(crate) fn nl_values(table: &[i8; 16], qs: &[u8], out: &mut [i8; QK_K], at: usize) {
    let (lo, hi) = out[at..at + 32].split_at_mut(16);
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = table[(q & 0xf) as usize];
        *h = table[(q >> 4) as usize];
    }
}

pub struct Iq4Xs;
impl IqKind for Iq4Xs {
    type W = BlockIq4Xs;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(core: &S, w: &[BlockIq4Xs], out: &mut Decoded) {
        for g in 0..8 {
            core.nl_values(
                &KVALUES_IQ4NL,
                &w[0].qs[16 * g..16 * g + 16],
                &mut out.w,
                32 * g,
            );
        }
    }
    fn epilogue(w: &[BlockIq4Xs], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let (a, b) = (&w[0], &x[0]);
        let d4d8 = a.d() * b.d();
        for g in 0..8 {
            let dl = d4d8 * (a.scale(g) as i32 - 32) as f32;
            *sumf += dl * s32(s, g) as f32;
        }
    }
}

pub struct Iq4Nl;
impl IqKind for Iq4Nl {
    type W = BlockIq4Nl;
    type X = BlockQ8_0;
    const UNIT: usize = 8;
    fn decode<S: Sums>(core: &S, w: &[BlockIq4Nl], out: &mut Decoded) {
        for (g, b) in w.iter().enumerate() {
            core.nl_values(&KVALUES_IQ4NL, &b.qs, &mut out.w, 32 * g);
        }
    }
    fn epilogue(w: &[BlockIq4Nl], x: &[BlockQ8_0], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        for (g, (a, b)) in w.iter().zip(x).enumerate() {
            let d = b.d() * a.d();
            *sumf += d * s32(s, g) as f32;
        }
    }
}

pub struct Tq1_0;
impl IqKind for Tq1_0 {
    type W = BlockTq1_0;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockTq1_0], out: &mut Decoded) {
        out.w = ternary::tq1_values(&w[0]);
    }
    fn epilogue(w: &[BlockTq1_0], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let sum: i32 = s.iter().sum();
        *sumf += sum as f32 * (w[0].d() * x[0].d());
    }
}

pub struct Tq2_0;
impl IqKind for Tq2_0 {
    type W = BlockTq2_0;
    type X = BlockQ8_K;
    const UNIT: usize = 1;
    fn decode<S: Sums>(_core: &S, w: &[BlockTq2_0], out: &mut Decoded) {
        out.w = ternary::tq2_values(&w[0]);
    }
    fn epilogue(w: &[BlockTq2_0], x: &[BlockQ8_K], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        let sum: i32 = s.iter().sum();
        *sumf += sum as f32 * (x[0].d() * w[0].d());
    }
}

pub struct Mxfp4;
impl IqKind for Mxfp4 {
    type W = BlockMxfp4;
    type X = BlockQ8_0;
    const UNIT: usize = 8;
    fn decode<S: Sums>(core: &S, w: &[BlockMxfp4], out: &mut Decoded) {
        for (g, b) in w.iter().enumerate() {
            core.nl_values(&KVALUES_FP4, &b.qs, &mut out.w, 32 * g);
        }
    }
    fn epilogue(w: &[BlockMxfp4], x: &[BlockQ8_0], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        for (g, (a, b)) in w.iter().zip(x).enumerate() {
            let d = b.d() * a.d();
            *sumf += d * s32(s, g) as f32;
        }
    }
}

pub struct Nvfp4;
impl IqKind for Nvfp4 {
    type W = BlockNvfp4;
    type X = BlockQ8_0;
    const UNIT: usize = 4;
    const X_UNIT: usize = 8;
    fn decode<S: Sums>(core: &S, w: &[BlockNvfp4], out: &mut Decoded) {
        for (i, b) in w.iter().enumerate() {
            for h in 0..2 {
                // 16 bytes are two sub-blocks of 8: the lookup gives [lo0 lo1 hi0 hi1], the
                // elements are [lo0 hi0 lo1 hi1]
                let at = 64 * i + 32 * h;
                core.nl_values(&KVALUES_FP4, &b.qs[16 * h..16 * h + 16], &mut out.w, at);
                let (a, c) = out.w[at + 8..at + 24].split_at_mut(8);
                a.swap_with_slice(c);
            }
        }
    }
    fn epilogue(w: &[BlockNvfp4], x: &[BlockQ8_0], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        for (i, (a, y)) in w.iter().zip(x.chunks_exact(2)).enumerate() {
            for sub in 0..4 {
                *sumf += y[sub / 2].d() * a.d(sub) * s[4 * i + sub] as f32;
            }
        }
    }
}

/// `PM1[m]`: byte j is +1 where bit j of `m` is set, else -1 (Q1_0's signs).
static PM1: [u64; 256] = pm1();

const fn pm1() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut j = 0;
        while j < 8 {
            let b: u64 = if m & (1 << j) != 0 { 0x01 } else { 0xff };
            t[m] |= b << (8 * j);
            j += 1;
        }
        m += 1;
    }
    t
}

/// `Q2_VALUES[q]`: byte j is `((q >> 2 j) & 3) - 1` (Q2_0's four values of one byte).
static Q2_VALUES: [u32; 256] = q2_values();

const fn q2_values() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut q = 0;
    while q < 256 {
        let mut j = 0;
        while j < 4 {
            let v = (((q >> (2 * j)) & 3) as i32 - 1) as u8 as u32;
            t[q] |= v << (8 * j);
            j += 1;
        }
        q += 1;
    }
    t
}

/// The float sum of one weight block over its Q8_0 blocks `x` (groups of 32 from `g0` in `s`),
/// in block order, as `scalar::lowbit::block_sum`.
#[inline(always)]
fn q8_block_sum(x: &[BlockQ8_0], s: &[i32; 16], g0: usize) -> f32 {
    crate::scalar::lowbit::block_sum(x, (g0..g0 + x.len()).map(|g| s32(s, g)))
}

pub struct Q1_0;
impl IqKind for Q1_0 {
    type W = BlockQ1_0;
    type X = BlockQ8_0;
    const UNIT: usize = 2;
    const X_UNIT: usize = 8;
    fn decode<S: Sums>(_core: &S, w: &[BlockQ1_0], out: &mut Decoded) {
        for (i, b) in w.iter().enumerate() {
            for (j, &m) in b.qs.iter().enumerate() {
                put(&mut out.w, 128 * i + 8 * j, PM1[m as usize]);
            }
        }
    }
    fn epilogue(w: &[BlockQ1_0], x: &[BlockQ8_0], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        for (i, (a, y)) in w.iter().zip(x.chunks_exact(4)).enumerate() {
            *sumf += a.d() * q8_block_sum(y, s, 4 * i);
        }
    }
}

pub struct Q2_0;
impl IqKind for Q2_0 {
    type W = BlockQ2_0;
    type X = BlockQ8_0;
    const UNIT: usize = 4;
    const X_UNIT: usize = 8;
    fn decode<S: Sums>(_core: &S, w: &[BlockQ2_0], out: &mut Decoded) {
        for (i, b) in w.iter().enumerate() {
            for (j, &q) in b.qs.iter().enumerate() {
                let at = 64 * i + 4 * j;
                for (o, v) in out.w[at..at + 4]
                    .iter_mut()
                    .zip(Q2_VALUES[q as usize].to_le_bytes())
                {
                    *o = v as i8;
                }
            }
        }
    }
    fn epilogue(w: &[BlockQ2_0], x: &[BlockQ8_0], s: &[i32; 16], _: &[i32; 16], sumf: &mut f32) {
        for (i, (a, y)) in w.iter().zip(x.chunks_exact(2)).enumerate() {
            *sumf += a.d() * q8_block_sum(y, s, 2 * i);
        }
    }
}

/// Byte offset of the 32 quants of activation chunk `c` (0..8) within one unit's activation
/// blocks: Q8_K keeps them contiguous after its f32 scale, Q8_0 has one chunk per block.
#[inline(always)]
pub fn act_chunk_offset(act: GgmlType, c: usize) -> usize {
    match act {
        GgmlType::Q8_0 => 34 * c + 2,
        _ => 4 + 32 * c,
    }
}

/// A tier's integer core: the sixteen 16-element group sums of decoded weights `w` against the
/// activation unit at `xu` (activation type `act`).
///
/// # Safety
/// Implementations may require CPU features; `xu` must be valid for one whole activation unit.
pub(crate) trait Sums {
    unsafe fn sums(&self, w: &[i8; QK_K], xu: *const u8, act: GgmlType) -> [i32; 16];

    /// The 32 values in `table` of the 16 bytes of 4-bit codes `qs` at `out[at..at + 32]` (a
    /// tier may override this with a byte shuffle of `table`). `qs.len()` must be 16 and
    /// `at <= 224`.
    #[inline(always)]
    fn nl_values(&self, table: &[i8; 16], qs: &[u8], out: &mut [i8; QK_K], at: usize) {
        nl_values(table, qs, out, at);
    }
}

/// `out[r * n + j] = W[r] . x[j]` for one kind on one tier's integer core: each weight unit
/// decoded once, run against every activation row, each result accumulated in the reference's
/// block order. False (nothing written) when the buffers do not hold whole units.
///
/// # Safety
/// The CPU must have whatever `core` requires.
#[inline(always)]
pub(crate) unsafe fn gemm_units<K: IqKind, S: Sums>(
    core: &S,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    let Some((wb, xb, per_row)) = unit_blocks::<K>(k, w, rows, x, n, out) else {
        return false;
    };
    let x_row = per_row / K::UNIT * K::X_UNIT;
    if n == 0 {
        return true;
    }
    let act = <K::X as Block>::TYPE;
    let mut dec = Decoded::default();
    let zero = [0i32; 16];
    out.fill(0.0);
    for (wr, o) in wb.chunks_exact(per_row).zip(out.chunks_exact_mut(n)) {
        for (u, wu) in wr.chunks_exact(K::UNIT).enumerate() {
            K::decode(core, wu, &mut dec);
            for (j, acc) in o.iter_mut().enumerate() {
                let xu = &xb[j * x_row + u * K::X_UNIT..j * x_row + (u + 1) * K::X_UNIT];
                let xp = xu.as_ptr() as *const u8;
                // SAFETY: the caller guarantees the core's CPU features; `xu` is one whole
                // activation unit (K::UNIT blocks of K::X) inside the checked `x`.
                let s = unsafe { core.sums(&dec.w, xp, act) };
                let s2 = if K::HAS_W2 {
                    // SAFETY: as above.
                    unsafe { core.sums(&dec.w2, xp, act) }
                } else {
                    zero
                };
                K::epilogue(wu, xu, &s, &s2, acc);
            }
        }
        for acc in o.iter_mut() {
            *acc = K::finish(*acc);
        }
    }
    true
}

/// The weight and activation blocks of one GEMM call and the weight blocks per row, when the
/// buffers hold whole 256-element units (`rows` weight rows, `n` activation rows, `rows * n`
/// outputs); a row has `per_row / UNIT * X_UNIT` activation blocks.
#[allow(clippy::type_complexity)]
pub(crate) fn unit_blocks<'a, K: IqKind>(
    k: usize,
    w: &'a [u8],
    rows: usize,
    x: &'a [u8],
    n: usize,
    out: &[f32],
) -> Option<(&'a [K::W], &'a [K::X], usize)> {
    if !k.is_multiple_of(QK_K) {
        return None;
    }
    let wb = crate::formats::blocks::<K::W>(w).ok()?;
    let xb = crate::formats::blocks::<K::X>(x).ok()?;
    let per_row = k / QK_K * K::UNIT;
    let x_row = k / QK_K * K::X_UNIT;
    let fits = per_row != 0
        && Some(wb.len()) == rows.checked_mul(per_row)
        && Some(xb.len()) == n.checked_mul(x_row)
        && Some(out.len()) == rows.checked_mul(n);
    fits.then_some((wb, xb, per_row))
}

/// Runs [`gemm_units`] for the kind of `ty`; false for a type without a kind here.
///
/// # Safety
/// As [`gemm_units`].
#[inline(always)]
pub(crate) unsafe fn gemm<S: Sums>(core: &S, t: &mut Tile<'_>) -> bool {
    let (ty, k, rows, n) = (t.ty(), t.k(), t.rows(), t.n());
    let (w, x) = (t.w().bytes(), t.x().bytes());
    let out = t.out();
    // SAFETY: every arm forwards the caller's contract (see `# Safety`) unchanged.
    unsafe {
        match ty {
            GgmlType::IQ2_XXS => gemm_units::<Iq2Xxs, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ2_XS => gemm_units::<Iq2Xs, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ2_S => gemm_units::<Iq2S, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_units::<Iq3Xxs, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ3_S => gemm_units::<Iq3S, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ1_S => gemm_units::<Iq1S, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ1_M => gemm_units::<Iq1M, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ4_XS => gemm_units::<Iq4Xs, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ4_NL => gemm_units::<Iq4Nl, S>(core, k, w, rows, x, n, out),
            GgmlType::TQ1_0 => gemm_units::<Tq1_0, S>(core, k, w, rows, x, n, out),
            GgmlType::TQ2_0 => gemm_units::<Tq2_0, S>(core, k, w, rows, x, n, out),
            GgmlType::MXFP4 => gemm_units::<Mxfp4, S>(core, k, w, rows, x, n, out),
            GgmlType::NVFP4 => gemm_units::<Nvfp4, S>(core, k, w, rows, x, n, out),
            GgmlType::Q1_0 => gemm_units::<Q1_0, S>(core, k, w, rows, x, n, out),
            GgmlType::Q2_0 => gemm_units::<Q2_0, S>(core, k, w, rows, x, n, out),
            _ => false,
        }
    }
}
