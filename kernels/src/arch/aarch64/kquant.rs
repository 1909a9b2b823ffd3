//! What the K-quant loops of `driver` and `split` share: the kinds with an aarch64 path, the
//! Q8_K layout (from `formats::kquants::layout`) and the reference's float accumulator with its
//! lane update and final reduction. Below both loop modules (it uses only `unpack`), so they
//! form no circle.

use core::arch::aarch64::*;

use super::unpack::{self, Unpacked};
use super::Level;
pub(crate) use crate::formats::kquants::layout::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};

/// The K-quant kinds (all five have an aarch64 path).
pub(crate) use crate::formats::kquants::layout::KKind as Kind;

/// Unpacks a block of `kind` for the cores of `level` (Q2_K's SDOT core takes the scales
/// folded in).
pub(crate) fn unpack_block(kind: Kind, level: Level, b: &[u8], u: &mut Unpacked) {
    match kind {
        Kind::Q2 if level == Level::Neon => unpack::q2_k(b, u),
        Kind::Q2 => unpack::q2_k_scaled(b, u),
        Kind::Q3 => unpack::q3_k(b, u),
        Kind::Q4 => unpack::q4_k(b, u),
        Kind::Q5 => unpack::q5_k(b, u, false),
        Kind::Q6 => unpack::q6_k(b, u),
    }
}

/// Float state of one (weight row, activation row) K-quant dot: the reference's `sums[8]`
/// (in two vectors) and its scalar `sumf`.
#[derive(Clone, Copy)]
pub(crate) struct KAcc {
    lo: float32x4_t,
    hi: float32x4_t,
    pub(crate) sumf: f32,
}

impl KAcc {
    pub(crate) fn zero() -> KAcc {
        // SAFETY: NEON register arithmetic only.
        unsafe {
            KAcc {
                lo: vdupq_n_f32(0.0),
                hi: vdupq_n_f32(0.0),
                sumf: 0.0,
            }
        }
    }

    /// The accumulator with lanes `sums[0..4]`, `sums[4..8]` and `sumf`.
    pub(crate) fn from_parts(lo: float32x4_t, hi: float32x4_t, sumf: f32) -> KAcc {
        KAcc { lo, hi, sumf }
    }

    /// The reference's final reduction.
    pub(crate) fn finish(self, kind: Kind) -> f32 {
        let mut s = [0.0f32; 8];
        // SAFETY: `s` has room for the 8 lanes.
        unsafe {
            vst1q_f32(s.as_mut_ptr(), self.lo);
            vst1q_f32(s.as_mut_ptr().add(4), self.hi);
        }
        let mut sumf = match kind {
            Kind::Q2 => return self.sumf,
            Kind::Q4 | Kind::Q5 => self.sumf,
            Kind::Q3 | Kind::Q6 => 0.0,
        };
        for v in s {
            sumf += v;
        }
        sumf
    }
}

/// `sums[l] += d * lanes[l]` for the 8 lanes.
#[inline(always)]
pub(crate) fn add_lanes(acc: &mut KAcc, lanes: (int32x4_t, int32x4_t), d: f32) {
    // SAFETY: NEON register arithmetic only.
    unsafe {
        acc.lo = vaddq_f32(acc.lo, vmulq_n_f32(vcvtq_f32_s32(lanes.0), d));
        acc.hi = vaddq_f32(acc.hi, vmulq_n_f32(vcvtq_f32_s32(lanes.1), d));
    }
}
