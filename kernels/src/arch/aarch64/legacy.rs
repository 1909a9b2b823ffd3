//! The 32-element types: Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 against Q8_0 activations and Q4_1,
//! Q5_1 against Q8_1: the block decoding and reference epilogues, and the NEON tier's loop (the
//! dotprod and i8mm tiers run `legacy_mm`'s SDOT quads and SMMLA tiles; IQ4_NL and MXFP4 reach
//! this module on those two tiers only, NEON keeps them on `iq`). Their references keep one
//! integer per block, so SDOT and SMMLA apply directly. Each weight block is unpacked to 32
//! signed bytes once per chunk of activation rows (IQ4_NL, MXFP4: both nibbles of a byte
//! through one 16-entry `TBL` of the type's values). Epilogues, as in ggml's generic dots: Q8_0
//! `sumf += sumi * (dw * dx)`, Q5_0 `sumf += (dw * dx) * sumi`, IQ4_NL and MXFP4 `sumf += (dx *
//! dw) * sumi` (the same two products: IEEE multiplication commutes), Q4_0 `sumf += sumi * dw *
//! dx` (left to right), Q4_1/Q5_1 `sumf += (dw * dx) * sumi + mw * sx`. MXFP4's `dw` is its
//! E8M0 scale halved, the others' an f16.

use core::arch::aarch64::*;

use super::neon::{ld_s8, nibble_values};
use super::{neon, Level};
use crate::formats::{e8m0_to_f32_half, BlockIq4Nl, BlockMxfp4, KVALUES_FP4, KVALUES_IQ4NL};
use crate::Tile;

/// Activation rows per unpacked weight block.
const JC: usize = 8;

/// The weight types of this module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Legacy {
    Q4_0,
    Q5_0,
    Q8_0,
    Q4_1,
    Q5_1,
    Iq4Nl,
    Mxfp4,
}

#[inline(always)]
fn f16_le(b: &[u8]) -> f32 {
    super::unpack::f16_at(b, 0)
}

/// Stores 16 bytes into `buf[at..at + 16]`.
#[inline(always)]
fn put(buf: &mut [u8; 32], at: usize, v: uint8x16_t) {
    let d = &mut buf[at..at + 16];
    // SAFETY: `d` is 16 writable bytes (bounds-checked).
    unsafe { vst1q_u8(d.as_mut_ptr(), v) }
}

/// 16 bytes whose byte j is 0x10 when bit j of `bits` (16 bits) is set.
#[inline(always)]
fn bit4(bits: u16) -> uint8x16_t {
    const M: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `M` is 16 readable bytes; the rest is NEON register arithmetic.
    unsafe {
        let [b0, b1] = bits.to_le_bytes();
        let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
        vandq_u8(vtstq_u8(v, vld1q_u8(M.as_ptr())), vdupq_n_u8(16))
    }
}

impl Legacy {
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            Legacy::Q4_0 => 18,
            Legacy::Q5_0 => 22,
            Legacy::Q8_0 => 34,
            Legacy::Q4_1 => 20,
            Legacy::Q5_1 => 24,
            Legacy::Iq4Nl => std::mem::size_of::<BlockIq4Nl>(),
            Legacy::Mxfp4 => std::mem::size_of::<BlockMxfp4>(),
        }
    }

    /// The 16 values a 4-bit code stands for (IQ4_NL, MXFP4) and where the codes start in a
    /// block; None for the types whose quants are their codes.
    #[inline(always)]
    pub(super) fn table(self) -> Option<(&'static [i8; 16], usize)> {
        match self {
            Legacy::Iq4Nl => Some((&KVALUES_IQ4NL, std::mem::offset_of!(BlockIq4Nl, qs))),
            Legacy::Mxfp4 => Some((&KVALUES_FP4, std::mem::offset_of!(BlockMxfp4, qs))),
            _ => None,
        }
    }

    /// [`Legacy::table`] of IQ4_NL or MXFP4 (the callers' match arms hold only those).
    #[inline(always)]
    pub(super) fn codes(self) -> (&'static [i8; 16], usize) {
        match self.table() {
            Some(t) => t,
            None => unreachable!("{self:?} has no code table"),
        }
    }

    /// The weight block's scale `dw` as its epilogue uses it.
    #[inline(always)]
    pub(super) fn weight_d(self, wb: &[u8]) -> f32 {
        match self {
            Legacy::Mxfp4 => e8m0_to_f32_half(wb[0]),
            _ => f16_le(wb),
        }
    }

    /// Bytes of an activation block (Q8_0: d, qs; Q8_1: d, s, qs).
    pub(super) fn act_bytes(self) -> usize {
        match self {
            Legacy::Q4_1 | Legacy::Q5_1 => 36,
            _ => 34,
        }
    }

    /// Offset of the quants in an activation block.
    pub(super) fn act_qs(self) -> usize {
        self.act_bytes() - 32
    }

    /// The block's 32 quants as signed bytes in element order (in `buf` unless stored as such).
    #[inline(always)]
    pub(super) fn quants<'a>(self, wb: &'a [u8], buf: &'a mut [u8; 32]) -> &'a [u8] {
        // Q4_0 (18 bytes: d, qs[16]): element j is (qs[j] & 15) - 8, element j + 16 is
        // (qs[j] >> 4) - 8; Q4_1 (20 bytes: d, m, qs[16]): the same without the - 8.
        // Q5_0 (22 bytes: d, qh u32, qs[16]): element j is ((qs[j] & 15) | bit j of qh << 4)
        // - 16, element j + 16 is ((qs[j] >> 4) | bit j + 16 of qh << 4) - 16; Q5_1 (24 bytes:
        // d, m, qh, qs[16]): the same without the - 16.
        // IQ4_NL (18 bytes: d, qs[16]) and MXFP4 (17: e, qs[16]): element j is the value of
        // the low nibble of qs[j], element j + 16 that of its high nibble.
        if let Some((values, at)) = self.table() {
            // SAFETY: reinterpretations.
            let q = unsafe { vreinterpretq_u8_s8(ld_s8(wb, at)) };
            let (lo, hi) = nibble_values(values, q);
            // SAFETY: reinterpretations.
            unsafe {
                put(buf, 0, vreinterpretq_u8_s8(lo));
                put(buf, 16, vreinterpretq_u8_s8(hi));
            }
            return &buf[..];
        }
        let (qs_at, qh_at, off) = match self {
            Legacy::Q8_0 => return &wb[2..34],
            Legacy::Iq4Nl | Legacy::Mxfp4 => unreachable!("decoded through their tables above"),
            Legacy::Q4_0 => (2, None, 8),
            Legacy::Q4_1 => (4, None, 0),
            Legacy::Q5_0 => (6, Some(2), 16),
            Legacy::Q5_1 => (8, Some(4), 0),
        };
        let q = ld_s8(wb, qs_at);
        let qh = qh_at.map_or(0, |at| {
            u32::from_le_bytes([wb[at], wb[at + 1], wb[at + 2], wb[at + 3]])
        });
        // SAFETY: NEON register arithmetic only.
        let (lo, hi) = unsafe {
            let q = vreinterpretq_u8_s8(q);
            let off = vdupq_n_u8(off);
            let (mut lo, mut hi) = (vandq_u8(q, vdupq_n_u8(15)), vshrq_n_u8::<4>(q));
            if qh_at.is_some() {
                lo = vorrq_u8(lo, bit4(qh as u16));
                hi = vorrq_u8(hi, bit4((qh >> 16) as u16));
            }
            (vsubq_u8(lo, off), vsubq_u8(hi, off))
        };
        put(buf, 0, lo);
        put(buf, 16, hi);
        &buf[..]
    }

    /// One block's contribution, in the reference's float order (`wb`, `xb`: the blocks).
    #[inline(always)]
    fn step(self, sumf: f32, sumi: i32, wb: &[u8], xb: &[u8]) -> f32 {
        let (dw, dx) = (self.weight_d(wb), f16_le(xb));
        match self {
            Legacy::Q4_0 => sumf + sumi as f32 * dw * dx,
            Legacy::Q5_0 | Legacy::Q8_0 | Legacy::Iq4Nl | Legacy::Mxfp4 => {
                sumf + sumi as f32 * (dw * dx)
            }
            Legacy::Q4_1 | Legacy::Q5_1 => {
                let (mw, sx) = (f16_le(&wb[2..]), f16_le(&xb[2..]));
                sumf + ((dw * dx) * sumi as f32 + mw * sx)
            }
        }
    }
}

/// `ty` x Q8_0/Q8_1 over `t` (weights of `ty`'s type, `rows, n, k >= 1`).
pub(crate) fn gemm(level: Level, ty: Legacy, t: &mut Tile<'_>) {
    if level != Level::Neon {
        return super::legacy_mm::gemm(level, ty, t);
    }
    let (rows, n, w, x) = (t.rows(), t.n(), t.w().bytes(), t.x().bytes());
    let nb = t.k() / 32;
    let out = t.out();
    let wbb = ty.block_bytes();
    let wrow = nb * wbb;
    let (xbb, xq) = (ty.act_bytes(), ty.act_qs());
    let xrow = nb * xbb;
    let mut r = 0;
    let mut buf = [0u8; 32];
    while r < rows {
        let wr = &w[r * wrow..][..wrow];
        for jc in (0..n).step_by(JC) {
            let cnt = JC.min(n - jc);
            let mut acc = [0.0f32; JC];
            for b in 0..nb {
                let wb = &wr[b * wbb..][..wbb];
                let wq = ty.quants(wb, &mut buf);
                for (t, a) in acc.iter_mut().enumerate().take(cnt) {
                    let xb = &x[(jc + t) * xrow + b * xbb..][..xbb];
                    *a = ty.step(*a, neon::dot32(wq, &xb[xq..]), wb, xb);
                }
            }
            out[r * n + jc..r * n + jc + cnt].copy_from_slice(&acc[..cnt]);
        }
        r += 1;
    }
}
