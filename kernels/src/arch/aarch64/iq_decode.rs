//! The grid i-quants and IQ4_XS decoded with NEON, for every aarch64 tier.
//!
//! Weights are built in vector registers: two 8-byte grid rows (or four 4-byte IQ3_XXS rows)
//! loaded straight into one vector, the signs from a second table of byte masks (0xff where
//! the weight is negative; `KSIGN_MASK` for the 7-bit `ksigns` codes, `iq_tile::SIGN_MASK` for
//! IQ2_S's sign bytes) loaded the same way and applied as `(g ^ m) - m`; IQ4_XS through one
//! `TBL` per 16 codes. (The portable `iq_tile` decoders build each 8 bytes in a general
//! register and store them.)
//!
//! - On SDOT (dotprod and i8mm), [`gemm_sdot`]: IQ2_XXS, IQ3_XXS, IQ2_XS, IQ2_S, IQ1_S,
//!   IQ1_M and IQ4_XS with the decode fused into the dot products. A weight unit's 16 vectors
//!   stay in registers and go straight into SDOTs against every activation row; the per-32 (or
//!   per-16) sums are reduced by pairwise adds and multiplied by the scales, built once per
//!   unit as vectors, into the reference's integer block sums (exact in any order); the
//!   float steps are the reference's, in its order (IQ4_XS: one float product per group,
//!   added one by one). IQ1_M's weights are decoded as `8 * grid + shift`, so one SDOT covers
//!   both of its reference's sums ([`FIq1M`] says why the float result is the same).
//! - On NEON ([`gemm`]): IQ2_XXS, IQ2_XS and IQ3_XXS decoded to the same 256 bytes as
//!   `iq_tile`'s decoders, 16 at a time, then `iq_tile`'s loop, core and epilogue. (IQ2_S,
//!   IQ1_S and IQ1_M decoded this way were slower on the N2 model than the portable code,
//!   and stay with it.)

use core::arch::aarch64::*;

use super::dotprod::sdot;
use crate::arch::iq_tile::{
    self, gemm_units, sign_masks, unit_blocks, Decoded, IqKind, Sums, SIGN_MASK,
};
use crate::formats::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3Xxs, BlockIq4Xs, BlockQ8_K,
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL, QK_K,
};
use crate::scalar::{iq1, iq2};
use crate::{GgmlType, Tile};

/// `KSIGN_MASK[i]`: the byte mask (`iq_tile::SIGN_MASK`) of the sign byte `KSIGNS_IQ2XS[i]`.
static KSIGN_MASK: [u64; 128] = ksign_masks();

const fn ksign_masks() -> [u64; 128] {
    let masks = sign_masks();
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = masks[KSIGNS_IQ2XS[i] as usize];
        i += 1;
    }
    t
}

/// `[t[a], t[b]]` as one vector, each half loaded straight from the table.
#[inline(always)]
fn pair(t: &[u64], a: usize, b: usize) -> int8x16_t {
    let (a, b) = (&t[a], &t[b]);
    // SAFETY: NEON is baseline on aarch64; `a` and `b` are references to one u64 each.
    unsafe { vreinterpretq_s8_u64(vcombine_u64(vld1_u64(a), vld1_u64(b))) }
}

/// `g` with the bytes selected by the mask `m` (0xff or 0) negated: `(g ^ m) - m`.
#[inline(always)]
fn signed(g: int8x16_t, m: int8x16_t) -> int8x16_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { vsubq_s8(veorq_s8(g, m), m) }
}

/// Stores the 16 weights `v` at `out[16 * i..16 * i + 16]`.
#[inline(always)]
fn put(out: &mut [i8; QK_K], i: usize, v: int8x16_t) {
    let dst = &mut out[16 * i..16 * i + 16];
    // SAFETY: NEON is baseline on aarch64; `dst` is 16 bounds-checked bytes.
    unsafe { vst1q_s8(dst.as_mut_ptr(), v) }
}

/// The 32 weights of IQ2_XXS group `g`.
#[inline(always)]
fn iq2_xxs_group(b: &BlockIq2Xxs, g: usize) -> [int8x16_t; 2] {
    let (idx, sg) = b.words(g);
    let q = |l: u32| (idx >> (8 * l)) as usize & 255;
    let s = |l: u32| (sg >> (7 * l)) as usize & 127;
    [0, 2].map(|l| {
        signed(
            pair(&IQ2XXS_GRID, q(l), q(l + 1)),
            pair(&KSIGN_MASK, s(l), s(l + 1)),
        )
    })
}

/// IQ2_XXS decoded into `iq_tile`'s buffer for the NEON tier, group by group. (Storing
/// [`Fused::weights`]' whole array instead spills on the N2 model: 158 -> 191 cycles per 256
/// weights at batch 1, IQ3_XXS likewise 183 -> 221.)
fn iq2_xxs(b: &BlockIq2Xxs, out: &mut [i8; QK_K]) {
    for g in 0..8 {
        let [v0, v1] = iq2_xxs_group(b, g);
        put(out, 2 * g, v0);
        put(out, 2 * g + 1, v1);
    }
}

/// The 16 weights `16 i..16 i + 16` of an IQ2_XS block.
#[inline(always)]
fn iq2_xs_16(b: &BlockIq2Xs, i: usize) -> int8x16_t {
    let (q0, q1) = (b.q(2 * i) as usize, b.q(2 * i + 1) as usize);
    signed(
        pair(&IQ2XS_GRID, q0 & 511, q1 & 511),
        pair(&KSIGN_MASK, q0 >> 9, q1 >> 9),
    )
}

fn iq2_xs(b: &BlockIq2Xs, out: &mut [i8; QK_K]) {
    for i in 0..16 {
        put(out, i, iq2_xs_16(b, i));
    }
}

/// The 16 weights `32 g + 16 h..32 g + 16 h + 16` of an IQ2_S block.
#[inline(always)]
fn iq2_s_16(b: &BlockIq2S, g: usize, h: usize) -> int8x16_t {
    let (l0, l1) = (2 * h, 2 * h + 1);
    let grid = pair(
        &IQ2S_GRID,
        iq2::iq2_s_index(b, g, l0),
        iq2::iq2_s_index(b, g, l1),
    );
    let sg = &b.qs[QK_K / 8 + 4 * g..];
    signed(grid, pair(&SIGN_MASK, sg[l0] as usize, sg[l1] as usize))
}

/// The 32 weights of IQ3_XXS group `g`.
#[inline(always)]
fn iq3_xxs_group(b: &BlockIq3Xxs, g: usize) -> [int8x16_t; 2] {
    let aux = b.signs_scale(g);
    let s = |l: u32| (aux >> (7 * l)) as usize & 127;
    [0, 1].map(|h| {
        let q = &b.qs[8 * g + 4 * h..8 * g + 4 * h + 4];
        let p = [0, 1, 2, 3].map(|j| &IQ3XXS_GRID[q[j] as usize]);
        // SAFETY: NEON is baseline on aarch64; each `p[j]` is a reference to one u32.
        let grid = unsafe {
            let v = vld1q_dup_u32(p[0]);
            let v = vld1q_lane_u32::<1>(p[1], v);
            let v = vld1q_lane_u32::<2>(p[2], v);
            vreinterpretq_s8_u32(vld1q_lane_u32::<3>(p[3], v))
        };
        let l = 2 * h as u32;
        signed(grid, pair(&KSIGN_MASK, s(l), s(l + 1)))
    })
}

fn iq3_xxs(b: &BlockIq3Xxs, out: &mut [i8; QK_K]) {
    for g in 0..8 {
        let [v0, v1] = iq3_xxs_group(b, g);
        put(out, 2 * g, v0);
        put(out, 2 * g + 1, v1);
    }
}

/// An `iq_tile` kind with its decode replaced by a NEON one.
macro_rules! neon_kind {
    ($name:ident, $base:ty, $block:ty, |$b:ident, $out:ident| $decode:expr) => {
        struct $name;
        impl IqKind for $name {
            type W = $block;
            type X = BlockQ8_K;
            const UNIT: usize = 1;
            #[inline(always)]
            fn decode<S: Sums>(_core: &S, w: &[$block], $out: &mut Decoded) {
                let $b = &w[0];
                $decode
            }
            #[inline(always)]
            fn epilogue(
                w: &[$block],
                x: &[BlockQ8_K],
                s: &[i32; 16],
                s2: &[i32; 16],
                sumf: &mut f32,
            ) {
                <$base as IqKind>::epilogue(w, x, s, s2, sumf)
            }
            #[inline(always)]
            fn finish(sumf: f32) -> f32 {
                <$base as IqKind>::finish(sumf)
            }
        }
    };
}

neon_kind!(Iq2Xxs, iq_tile::Iq2Xxs, BlockIq2Xxs, |b, out| iq2_xxs(
    b, &mut out.w
));
neon_kind!(Iq2Xs, iq_tile::Iq2Xs, BlockIq2Xs, |b, out| iq2_xs(
    b, &mut out.w
));
neon_kind!(Iq3Xxs, iq_tile::Iq3Xxs, BlockIq3Xxs, |b, out| iq3_xxs(
    b, &mut out.w
));

/// A type on SDOT with its decode fused in: a weight unit's 16 decoded vectors stay in
/// registers and go straight into the dot products of every activation row (no decoded copy
/// in memory, no array of group sums), and the epilogue's scales are built as vectors once
/// per unit.
trait Fused {
    /// The `iq_tile` kind: its block, unit checks and `finish`.
    type K: IqKind<X = BlockQ8_K>;
    /// Whether the scales are per 32 weights (the sums of groups 0..4 and 4..8 in `s[0]` and
    /// `s[1]`) rather than per 16 (`s[k]`: the 16-element sums `4k..4k + 4`).
    const PER32: bool;
    /// What the epilogue needs of one unit.
    type U: Copy;
    fn weights(b: &<Self::K as IqKind>::W) -> [int8x16_t; 16];
    fn unit(b: &<Self::K as IqKind>::W) -> Self::U;
    /// Adds one activation row's contribution from the integer sums `s`, with the
    /// reference's integer block sums (exact in any order) and its float steps in order.
    fn row(u: &Self::U, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32);
}

/// The sixteen bytes at `b[at..at + 16]` as four u32.
#[inline(always)]
fn words16(b: &[u8], at: usize) -> uint32x4_t {
    let b = &b[at..at + 16];
    // SAFETY: NEON is baseline on aarch64; `b` is 16 bounds-checked bytes.
    unsafe { vreinterpretq_u32_u8(vld1q_u8(b.as_ptr())) }
}

/// `sum of s[k] * sc[k]` over the lanes (integers, exact in any order).
#[inline(always)]
fn dot_lanes<const N: usize>(s: &[int32x4_t; 4], sc: &[int32x4_t; N]) -> i32 {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let mut t = vmulq_s32(s[0], sc[0]);
        for k in 1..N {
            t = vmlaq_s32(t, s[k], sc[k]);
        }
        vaddvq_s32(t)
    }
}

/// The odd scales `2 * (w >> 28) + 1` of four groups' signs-and-scale words.
#[inline(always)]
fn odd_top4(v: uint32x4_t) -> int32x4_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let s = vshlq_n_u32::<1>(vshrq_n_u32::<28>(v));
        vreinterpretq_s32_u32(vorrq_u32(s, vdupq_n_u32(1)))
    }
}

/// Per-32 odd scales (IQ2_XXS, IQ3_XXS) and the super-block scale.
type Scale32 = ([int32x4_t; 2], f32);

/// The odd-scale types' step (IQ2_XXS, IQ3_XXS per 32; IQ2_XS, IQ2_S per 16): the integer
/// block sum `sum of s[k] * sc[k]`, then the reference's `d * d8 * bsum`.
#[inline(always)]
fn row_odd<const N: usize>(
    u: &([int32x4_t; N], f32),
    x: &BlockQ8_K,
    s: [int32x4_t; 4],
    sumf: &mut f32,
) {
    let bsum = dot_lanes(&s, &u.0);
    *sumf += u.1 * x.d() * bsum as f32;
}

struct FIq2Xxs;
impl Fused for FIq2Xxs {
    type K = iq_tile::Iq2Xxs;
    const PER32: bool = true;
    type U = Scale32;
    #[inline(always)]
    fn weights(b: &BlockIq2Xxs) -> [int8x16_t; 16] {
        let g: [[int8x16_t; 2]; 8] = core::array::from_fn(|g| iq2_xxs_group(b, g));
        core::array::from_fn(|i| g[i / 2][i % 2])
    }
    #[inline(always)]
    fn unit(b: &BlockIq2Xxs) -> Scale32 {
        // the (index, signs) word pairs of groups 0..8: the odd words
        let q = b.qs.as_flattened();
        // SAFETY: NEON is baseline on aarch64.
        let w = [0, 32].map(|at| unsafe { vuzp2q_u32(words16(q, at), words16(q, at + 16)) });
        (w.map(odd_top4), b.d())
    }
    #[inline(always)]
    fn row(u: &Scale32, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        row_odd(u, x, s, sumf);
    }
}

struct FIq3Xxs;
impl Fused for FIq3Xxs {
    type K = iq_tile::Iq3Xxs;
    const PER32: bool = true;
    type U = Scale32;
    #[inline(always)]
    fn weights(b: &BlockIq3Xxs) -> [int8x16_t; 16] {
        let g: [[int8x16_t; 2]; 8] = core::array::from_fn(|g| iq3_xxs_group(b, g));
        core::array::from_fn(|i| g[i / 2][i % 2])
    }
    #[inline(always)]
    fn unit(b: &BlockIq3Xxs) -> Scale32 {
        let w = [0, 16].map(|at| words16(&b.qs, QK_K / 4 + at));
        (w.map(odd_top4), b.d())
    }
    #[inline(always)]
    fn row(u: &Scale32, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        row_odd(u, x, s, sumf);
    }
}

/// Per-16 odd scales `2 * nibble + 1` (IQ2_XS, IQ2_S: low nibble first) and the super-block
/// scale.
type Scale16 = ([int32x4_t; 4], f32);

#[inline(always)]
fn scale16(scales: &[u8; 8], d: f32) -> Scale16 {
    // SAFETY: NEON is baseline on aarch64; `scales` is 8 bytes.
    unsafe {
        let v = vld1_u8(scales.as_ptr());
        let (lo, hi) = (vand_u8(v, vdup_n_u8(15)), vshr_n_u8::<4>(v));
        let z = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
        let z = vorrq_u8(vshlq_n_u8::<1>(z), vdupq_n_u8(1));
        let (a, b) = (vmovl_u8(vget_low_u8(z)), vmovl_high_u8(z));
        let sc = [
            vmovl_u16(vget_low_u16(a)),
            vmovl_high_u16(a),
            vmovl_u16(vget_low_u16(b)),
            vmovl_high_u16(b),
        ];
        (sc.map(|v| vreinterpretq_s32_u32(v)), d)
    }
}

struct FIq2Xs;
impl Fused for FIq2Xs {
    type K = iq_tile::Iq2Xs;
    const PER32: bool = false;
    type U = Scale16;
    #[inline(always)]
    fn weights(b: &BlockIq2Xs) -> [int8x16_t; 16] {
        core::array::from_fn(|i| iq2_xs_16(b, i))
    }
    #[inline(always)]
    fn unit(b: &BlockIq2Xs) -> Scale16 {
        scale16(&b.scales, b.d())
    }
    #[inline(always)]
    fn row(u: &Scale16, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        row_odd(u, x, s, sumf);
    }
}

struct FIq2S;
impl Fused for FIq2S {
    type K = iq_tile::Iq2S;
    const PER32: bool = false;
    type U = Scale16;
    #[inline(always)]
    fn weights(b: &BlockIq2S) -> [int8x16_t; 16] {
        core::array::from_fn(|i| iq2_s_16(b, i / 2, i % 2))
    }
    #[inline(always)]
    fn unit(b: &BlockIq2S) -> Scale16 {
        scale16(&b.scales, b.d())
    }
    #[inline(always)]
    fn row(u: &Scale16, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        row_odd(u, x, s, sumf);
    }
}

/// IQ1_S: the per-32 odd scales `ls`, the same times the shift sign `delta`, and `d`.
type Iq1Unit = ([int32x4_t; 2], [int32x4_t; 2], f32);

struct FIq1S;
impl Fused for FIq1S {
    type K = iq_tile::Iq1S;
    const PER32: bool = true;
    type U = Iq1Unit;
    #[inline(always)]
    fn weights(b: &BlockIq1S) -> [int8x16_t; 16] {
        core::array::from_fn(|i| {
            let (g, l) = (i / 2, 2 * (i % 2));
            pair(
                &IQ1S_GRID,
                iq1::iq1_s_index(b, g, l),
                iq1::iq1_s_index(b, g, l + 1),
            )
        })
    }
    #[inline(always)]
    fn unit(b: &BlockIq1S) -> Iq1Unit {
        // SAFETY: NEON is baseline on aarch64; `qh` is 16 bytes.
        unsafe {
            let qh = vreinterpretq_u16_u8(vld1q_u8(b.qh.as_flattened().as_ptr()));
            let ls = vandq_u16(vshrq_n_u16::<12>(qh), vdupq_n_u16(7));
            let ls = vreinterpretq_s16_u16(vorrq_u16(vshlq_n_u16::<1>(ls), vdupq_n_u16(1)));
            // -1 where bit 15 (delta < 0) is set
            let m = vshrq_n_s16::<15>(vreinterpretq_s16_u16(qh));
            let lsd = vsubq_s16(veorq_s16(ls, m), m);
            let wide = |v: int16x8_t| [vmovl_s16(vget_low_s16(v)), vmovl_high_s16(v)];
            (wide(ls), wide(lsd), b.d())
        }
    }
    #[inline(always)]
    fn row(u: &Iq1Unit, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        let sumi = dot_lanes(&s, &u.0);
        // SAFETY: NEON is baseline on aarch64; `bsums` is 32 bytes.
        let sumi1 = unsafe {
            let p = x.bsums.as_flattened().as_ptr();
            let b = [0, 16].map(|at| vpaddlq_s16(vreinterpretq_s16_u8(vld1q_u8(p.add(at)))));
            vaddvq_s32(vmlaq_s32(vmulq_s32(b[0], u.1[0]), b[1], u.1[1]))
        };
        *sumf += u.2 * x.d() * (sumi as f32 + iq1::IQ1_DELTA * sumi1 as f32);
    }
}

/// IQ1_M with each weight decoded as `8 * grid + delta` (the ±1 shift of its 8-element group):
/// one SDOT per 16 weights gives `8 * s1 + s2` (`s1` the grid's sum, `s2` the shift's), so the
/// integer block sum is `T = 8 * sumi1 + sumi2` of the reference. `|T| < 2^23` (each weight
/// within ±9, each activation within ±128, scales at most 15: 256 * 9 * 128 * 15), so `T`,
/// `T / 8`, `sumi1` and `IQ1_DELTA * sumi2` are exact floats and the reference's
/// `sumi1 + IQ1_DELTA * sumi2` is exactly `IQ1_DELTA * T`: the same float, then its
/// `d * d8 * (..)` in its order.
struct FIq1M;
impl Fused for FIq1M {
    type K = iq_tile::Iq1M;
    const PER32: bool = false;
    type U = Scale16;
    #[inline(always)]
    fn weights(b: &BlockIq1M) -> [int8x16_t; 16] {
        // SAFETY: NEON is baseline on aarch64; `qh` is 16 bytes.
        unsafe {
            let qh = vld1q_u8(b.qh.as_ptr());
            // byte i of `lo` (`hi`): the shift (1 or -1) of 8-element group 2 i (2 i + 1), from
            // bit 3 (bit 7) of `qh[i]`
            let one = vdupq_n_s8(1);
            let shift = |bit: u8| vorrq_s8(vreinterpretq_s8_u8(vtstq_u8(qh, vdupq_n_u8(bit))), one);
            let (lo, hi) = (shift(8), shift(128));
            // bytes 2 k and 2 k + 1 of `p[h]`: the two shifts of vector 8 h + k
            let p = [vzip1q_s8(lo, hi), vzip2q_s8(lo, hi)];
            const HALVES: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
            let halves = vld1q_u8(HALVES.as_ptr());
            // 8 hidden from the optimizer, which would turn the multiply-add back into a shift
            // and an add: two instructions, the shift on V1 only on N2 (the multiply-add: 87 ->
            // 82 cycles per 256 weights at batch 1)
            let eight = vdupq_n_s8(core::hint::black_box(8));
            core::array::from_fn(|i| {
                let (g, l) = (i / 2, 2 * (i % 2));
                let grid = pair(
                    &IQ1S_GRID,
                    iq1::iq1_m_index(b, g, l),
                    iq1::iq1_m_index(b, g, l + 1),
                );
                let at = vaddq_u8(halves, vdupq_n_u8(2 * (i % 8) as u8));
                let delta = vqtbl1q_s8(p[i / 8], at);
                vmlaq_s8(delta, grid, eight)
            })
        }
    }
    #[inline(always)]
    fn unit(b: &BlockIq1M) -> Scale16 {
        // SAFETY: NEON is baseline on aarch64; `scales` is 8 bytes.
        unsafe {
            // lane c of `w`: scale word c; lane k of vector c: its scale k (bits 3k..3k + 3)
            let w = vmovl_u16(vreinterpret_u16_u8(vld1_u8(b.scales.as_ptr())));
            const SH: [i32; 4] = [0, -3, -6, -9];
            let sh = vld1q_s32(SH.as_ptr());
            let odd = |v: uint32x4_t| {
                let v = vandq_u32(vshlq_u32(v, sh), vdupq_n_u32(7));
                vreinterpretq_s32_u32(vorrq_u32(vshlq_n_u32::<1>(v), vdupq_n_u32(1)))
            };
            (
                [
                    odd(vdupq_laneq_u32::<0>(w)),
                    odd(vdupq_laneq_u32::<1>(w)),
                    odd(vdupq_laneq_u32::<2>(w)),
                    odd(vdupq_laneq_u32::<3>(w)),
                ],
                b.d(),
            )
        }
    }
    #[inline(always)]
    fn row(u: &Scale16, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        let t = dot_lanes(&s, &u.0);
        *sumf += u.1 * x.d() * (iq1::IQ1_DELTA * t as f32);
    }
}

/// IQ4_XS: the per-32 scales `code - 32` as floats, and `d`.
type Iq4Unit = ([float32x4_t; 2], f32);

struct FIq4Xs;
impl Fused for FIq4Xs {
    type K = iq_tile::Iq4Xs;
    const PER32: bool = true;
    type U = Iq4Unit;
    #[inline(always)]
    fn weights(b: &BlockIq4Xs) -> [int8x16_t; 16] {
        // SAFETY: NEON is baseline on aarch64.
        let mut w = [unsafe { vdupq_n_s8(0) }; 16];
        for j in 0..8 {
            // SAFETY: NEON is baseline on aarch64; `qs` is 128 bytes, read 16 at a time in
            // bounds (j < 8).
            let q = unsafe { vld1q_u8(b.qs.as_ptr().add(16 * j)) };
            (w[2 * j], w[2 * j + 1]) = super::neon::nibble_values(&KVALUES_IQ4NL, q);
        }
        w
    }
    #[inline(always)]
    fn unit(b: &BlockIq4Xs) -> Iq4Unit {
        // SAFETY: NEON is baseline on aarch64.
        unsafe {
            let l = vcreate_u8(u32::from_le_bytes(b.scales_l) as u64);
            let l = vzip1_u8(vand_u8(l, vdup_n_u8(15)), vshr_n_u8::<4>(l));
            let h = vdupq_n_u16(u16::from_le_bytes(b.scales_h));
            const SH: [i16; 8] = [0, -2, -4, -6, -8, -10, -12, -14];
            let h = vandq_u16(vshlq_u16(h, vld1q_s16(SH.as_ptr())), vdupq_n_u16(3));
            let code = vorrq_u16(vmovl_u8(l), vshlq_n_u16::<4>(h));
            let ls = vsubq_s16(vreinterpretq_s16_u16(code), vdupq_n_s16(32));
            let f = |v: int32x4_t| vcvtq_f32_s32(v);
            (
                [f(vmovl_s16(vget_low_s16(ls))), f(vmovl_high_s16(ls))],
                b.d(),
            )
        }
    }
    #[inline(always)]
    fn row(u: &Iq4Unit, x: &BlockQ8_K, s: [int32x4_t; 4], sumf: &mut f32) {
        let d4d8 = u.1 * x.d();
        for h in 0..2 {
            // SAFETY: NEON is baseline on aarch64.
            let p = unsafe {
                // lane g: (d4d8 * ls[g]) * s[g], each one rounding as the reference's
                let dl = vmulq_n_f32(u.0[h], d4d8);
                let mut p = [0f32; 4];
                vst1q_f32(p.as_mut_ptr(), vmulq_f32(dl, vcvtq_f32_s32(s[h])));
                p
            };
            for v in p {
                *sumf += v;
            }
        }
    }
}

/// `gemm_units` for a [`Fused`] type: each weight unit decoded into registers once and run
/// against every activation row, each result accumulated in the reference's block order.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
unsafe fn gemm_fused<F: Fused>(
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    let Some((wb, xb, per_row)) = unit_blocks::<F::K>(k, w, rows, x, n, out) else {
        return false;
    };
    if n == 0 {
        return true;
    }
    out.fill(0.0);
    for (wr, o) in wb.chunks_exact(per_row).zip(out.chunks_exact_mut(n)) {
        for (u, b) in wr.iter().enumerate() {
            let wv = F::weights(b);
            let un = F::unit(b);
            for (j, acc) in o.iter_mut().enumerate() {
                let xb = &xb[j * per_row + u];
                let q = xb.qs.as_ptr();
                // SAFETY: the caller guarantees SDOT; `q` is 256 bytes, read 16 at a time in
                // bounds (i < 16); the rest is NEON.
                let s = unsafe {
                    let x = |i: usize| vld1q_s8(q.add(16 * i));
                    let z = vdupq_n_s32(0);
                    let quad = super::neon::sum4;
                    if F::PER32 {
                        let a: [int32x4_t; 8] = core::array::from_fn(|g| {
                            sdot(sdot(z, wv[2 * g], x(2 * g)), wv[2 * g + 1], x(2 * g + 1))
                        });
                        [
                            quad([a[0], a[1], a[2], a[3]]),
                            quad([a[4], a[5], a[6], a[7]]),
                            z,
                            z,
                        ]
                    } else {
                        [0, 1, 2, 3].map(|c| {
                            quad(core::array::from_fn(|i| {
                                sdot(z, wv[4 * c + i], x(4 * c + i))
                            }))
                        })
                    }
                };
                F::row(&un, xb, s, acc);
            }
        }
        for acc in o.iter_mut() {
            *acc = F::K::finish(*acc);
        }
    }
    true
}

/// The fused SDOT path ([`gemm_fused`]) of IQ2_XXS, IQ3_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M and
/// IQ4_XS; `None` for any other type.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
pub(super) unsafe fn gemm_sdot(t: &mut Tile<'_>) -> Option<bool> {
    let (ty, k, rows, n) = (t.ty(), t.k(), t.rows(), t.n());
    let (w, x) = (t.w().bytes(), t.x().bytes());
    let out = t.out();
    // SAFETY: forwarded from the caller.
    unsafe {
        Some(match ty {
            GgmlType::IQ2_XXS => gemm_fused::<FIq2Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_fused::<FIq3Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ2_XS => gemm_fused::<FIq2Xs>(k, w, rows, x, n, out),
            GgmlType::IQ2_S => gemm_fused::<FIq2S>(k, w, rows, x, n, out),
            GgmlType::IQ1_S => gemm_fused::<FIq1S>(k, w, rows, x, n, out),
            GgmlType::IQ1_M => gemm_fused::<FIq1M>(k, w, rows, x, n, out),
            GgmlType::IQ4_XS => gemm_fused::<FIq4Xs>(k, w, rows, x, n, out),
            _ => return None,
        })
    }
}

/// `iq_tile::gemm` with the NEON decoders of IQ2_XXS, IQ2_XS and IQ3_XXS; `None` for any other
/// type.
///
/// # Safety
/// As `iq_tile::gemm`: the CPU must have whatever `core` requires.
#[inline(always)]
pub(super) unsafe fn gemm<S: Sums>(core: &S, t: &mut Tile<'_>) -> Option<bool> {
    let (ty, k, rows, n) = (t.ty(), t.k(), t.rows(), t.n());
    let (w, x) = (t.w().bytes(), t.x().bytes());
    let out = t.out();
    // SAFETY: every arm forwards the caller's contract unchanged.
    unsafe {
        Some(match ty {
            GgmlType::IQ2_XXS => gemm_units::<Iq2Xxs, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ2_XS => gemm_units::<Iq2Xs, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_units::<Iq3Xxs, S>(core, k, w, rows, x, n, out),
            _ => return None,
        })
    }
}
