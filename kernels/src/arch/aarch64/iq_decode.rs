//! NEON decoders of the grid i-quants IQ2_XXS, IQ2_XS, IQ2_S and IQ3_XXS for every
//! aarch64 tier: the same 256 signed bytes as the portable `arch::iq_tile` decoders, built in
//! vector registers and stored 16 at a time. Two 8-byte grid rows (or four 4-byte IQ3 rows) are
//! loaded straight into one vector, and the signs come from a second table of byte masks
//! (0xff where the weight is negative) loaded the same way and applied as `(g ^ m) - m`; the
//! portable decoders build each 8 bytes in a general register and store them one by one.
//! Each kind here is its `iq_tile` kind with only `decode` replaced: the epilogue (and so the
//! float order) is the portable one.

use core::arch::aarch64::*;

use super::dotprod::sdot;
use crate::arch::iq_tile::{
    self, gemm_units, sign_masks, unit_blocks, Decoded, IqKind, Sums, SIGN_MASK,
};
use crate::formats::{
    BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3Xxs, BlockQ8_K, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID,
    IQ3XXS_GRID, KSIGNS_IQ2XS, QK_K,
};
use crate::scalar::iq2;
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

fn iq2_xxs(b: &BlockIq2Xxs, out: &mut [i8; QK_K]) {
    for g in 0..8 {
        let [v0, v1] = iq2_xxs_group(b, g);
        put(out, 2 * g, v0);
        put(out, 2 * g + 1, v1);
    }
}

fn iq2_xs(b: &BlockIq2Xs, out: &mut [i8; QK_K]) {
    for i in 0..16 {
        let (q0, q1) = (b.q(2 * i) as usize, b.q(2 * i + 1) as usize);
        let v = signed(
            pair(&IQ2XS_GRID, q0 & 511, q1 & 511),
            pair(&KSIGN_MASK, q0 >> 9, q1 >> 9),
        );
        put(out, i, v);
    }
}

fn iq2_s(b: &BlockIq2S, out: &mut [i8; QK_K]) {
    for g in 0..8 {
        for h in 0..2 {
            let (l0, l1) = (2 * h, 2 * h + 1);
            let grid = pair(
                &IQ2S_GRID,
                iq2::iq2_s_index(b, g, l0),
                iq2::iq2_s_index(b, g, l1),
            );
            let sg = &b.qs[QK_K / 8 + 4 * g..];
            let m = pair(&SIGN_MASK, sg[l0] as usize, sg[l1] as usize);
            put(out, 2 * g + h, signed(grid, m));
        }
    }
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
neon_kind!(Iq2S, iq_tile::Iq2S, BlockIq2S, |b, out| iq2_s(
    b, &mut out.w
));
neon_kind!(Iq3Xxs, iq_tile::Iq3Xxs, BlockIq3Xxs, |b, out| iq3_xxs(
    b, &mut out.w
));

/// IQ2_XXS and IQ3_XXS on SDOT with the decode fused in: a weight unit's 16 decoded vectors
/// stay in registers and go straight into the dot products of every activation row (no
/// decoded copy in memory, no 16-group sums array), and each group's odd scale
/// `2 * (word >> 28) + 1` comes from the block as a vector once per unit.
trait Grid32: IqKind<X = BlockQ8_K> {
    /// The 32 weights of group `g` (0..8).
    fn group(b: &Self::W, g: usize) -> [int8x16_t; 2];
    /// The signs-and-scale words of groups 0..4 and 4..8.
    fn words(b: &Self::W) -> [uint32x4_t; 2];
    fn d(b: &Self::W) -> f32;
}

/// The sixteen bytes at `b[at..at + 16]` as four u32.
#[inline(always)]
fn words16(b: &[u8], at: usize) -> uint32x4_t {
    let b = &b[at..at + 16];
    // SAFETY: NEON is baseline on aarch64; `b` is 16 bounds-checked bytes.
    unsafe { vreinterpretq_u32_u8(vld1q_u8(b.as_ptr())) }
}

impl Grid32 for Iq2Xxs {
    #[inline(always)]
    fn group(b: &BlockIq2Xxs, g: usize) -> [int8x16_t; 2] {
        iq2_xxs_group(b, g)
    }
    #[inline(always)]
    fn words(b: &BlockIq2Xxs) -> [uint32x4_t; 2] {
        // the (index, signs) word pairs of groups 0..8: the odd words
        let q = b.qs.as_flattened();
        // SAFETY: NEON is baseline on aarch64.
        unsafe { [0, 32].map(|at| vuzp2q_u32(words16(q, at), words16(q, at + 16))) }
    }
    #[inline(always)]
    fn d(b: &BlockIq2Xxs) -> f32 {
        b.d()
    }
}

impl Grid32 for Iq3Xxs {
    #[inline(always)]
    fn group(b: &BlockIq3Xxs, g: usize) -> [int8x16_t; 2] {
        iq3_xxs_group(b, g)
    }
    #[inline(always)]
    fn words(b: &BlockIq3Xxs) -> [uint32x4_t; 2] {
        [0, 16].map(|at| words16(&b.qs, QK_K / 4 + at))
    }
    #[inline(always)]
    fn d(b: &BlockIq3Xxs) -> f32 {
        b.d()
    }
}

/// `gemm_units` for a [`Grid32`] kind with the decode fused into SDOT. The integer block sum
/// is the reference's `bsum` (exact in any order) and the float steps are its own:
/// `sumf += d * d8 * bsum`, then `finish`.
///
/// # Safety
/// The CPU must implement FEAT_DotProd.
#[inline(always)]
unsafe fn gemm_grid32<K: Grid32>(
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
    if n == 0 {
        return true;
    }
    out.fill(0.0);
    for (wr, o) in wb.chunks_exact(per_row).zip(out.chunks_exact_mut(n)) {
        for (u, b) in wr.iter().enumerate() {
            let wv: [[int8x16_t; 2]; 8] = core::array::from_fn(|g| K::group(b, g));
            // SAFETY: NEON is baseline on aarch64.
            let sc = K::words(b).map(|v| unsafe {
                let s = vshlq_n_u32::<1>(vshrq_n_u32::<28>(v));
                vreinterpretq_s32_u32(vorrq_u32(s, vdupq_n_u32(1)))
            });
            let d = K::d(b);
            for (j, acc) in o.iter_mut().enumerate() {
                let xb = &xb[j * per_row + u];
                let q = &xb.qs;
                // SAFETY: the caller guarantees SDOT; `q` is 256 bytes, read 16 at a time in
                // bounds (g < 8); the rest is NEON.
                let bsum = unsafe {
                    let a: [int32x4_t; 8] = core::array::from_fn(|g| {
                        let x0 = vld1q_s8(q.as_ptr().add(32 * g));
                        let x1 = vld1q_s8(q.as_ptr().add(32 * g + 16));
                        sdot(sdot(vdupq_n_s32(0), wv[g][0], x0), wv[g][1], x1)
                    });
                    let r0 = vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3]));
                    let r1 = vpaddq_s32(vpaddq_s32(a[4], a[5]), vpaddq_s32(a[6], a[7]));
                    vaddvq_s32(vmlaq_s32(vmulq_s32(r0, sc[0]), r1, sc[1]))
                };
                *acc += d * xb.d() * bsum as f32;
            }
        }
        for acc in o.iter_mut() {
            *acc = K::finish(*acc);
        }
    }
    true
}

/// The fused SDOT path of [`gemm_grid32`] for IQ2_XXS and IQ3_XXS; `None` for any other type.
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
            GgmlType::IQ2_XXS => gemm_grid32::<Iq2Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_grid32::<Iq3Xxs>(k, w, rows, x, n, out),
            _ => return None,
        })
    }
}

/// `iq_tile::gemm` with the NEON decoders for the types above; `None` for any other type.
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
            GgmlType::IQ2_S => gemm_units::<Iq2S, S>(core, k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_units::<Iq3Xxs, S>(core, k, w, rows, x, n, out),
            _ => return None,
        })
    }
}
