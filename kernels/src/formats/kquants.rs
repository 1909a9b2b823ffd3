//! The 256-element super-block family (K-quants): Q2_K … Q6_K weights and the Q8_K activation
//! format every K-quant dot product uses. Layouts follow ggml-common.h; `d`/`dmin` are
//! little-endian f16 except Q8_K's `d`, a little-endian f32, and its `bsums`, little-endian i16.

use super::legacy::f16_field;
use super::{Block, GgmlType};

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// 2-bit quants; 16 sub-blocks of 16 with 4-bit scale (low nibble) and 4-bit min (high nibble):
/// `x = d * (sc & 15) * q - dmin * (sc >> 4)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2_K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// 3-bit quants: low 2 bits in `qs`, high bit in `hmask`, sixteen 6-bit scales packed in 12
/// bytes: `x = d * (sc - 32) * (q - 4 * !hbit)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3_K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

/// 4-bit quants; 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes:
/// `x = d * sc * q - dmin * m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// 5-bit quants: like Q4_K plus one high bit per element in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 6-bit quants: low 4 bits in `ql`, high 2 bits in `qh`, 16 signed 8-bit scales:
/// `x = d * sc * (q - 32)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6_K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

/// 8-bit activations: f32 scale, quants, and the sum of each group of 16 quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_K {
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    pub bsums: [[u8; 2]; QK_K / 16],
}

/// Byte sizes and field offsets of the K-quant blocks for the SIMD tiers' pointer arithmetic,
/// derived from the structs above (never written as numbers in the tiers), and the K-quant kind
/// both architectures monomorphise over (a `u8`, so it can be a const generic).
pub(crate) mod layout {
    use super::{BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K};
    use crate::formats::GgmlType;
    use core::mem::{offset_of, size_of};

    /// Bytes of one Q8_K activation block.
    pub(crate) const Q8K_BYTES: usize = size_of::<BlockQ8_K>();
    /// Where a Q8_K block's 256 quants start.
    pub(crate) const Q8K_QS: usize = offset_of!(BlockQ8_K, qs);
    /// Where a Q8_K block's sixteen i16 group sums start (right after the quants).
    pub(crate) const Q8K_BSUMS: usize = offset_of!(BlockQ8_K, bsums);
    /// Offsets of the f16 super-block scales.
    pub(crate) const Q2K_D: usize = offset_of!(BlockQ2_K, d);
    pub(crate) const Q2K_DMIN: usize = offset_of!(BlockQ2_K, dmin);
    pub(crate) const Q3K_D: usize = offset_of!(BlockQ3_K, d);
    pub(crate) const Q6K_D: usize = offset_of!(BlockQ6_K, d);

    /// The K-quant kinds, named by their bit width: the one kind both architectures use (aarch64
    /// as the enum, x86 as its `u8` discriminant, which can be a const generic).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[repr(u8)]
    pub(crate) enum KKind {
        Q2 = 2,
        Q3 = 3,
        Q4 = 4,
        Q5 = 5,
        Q6 = 6,
    }

    impl KKind {
        /// The kind of `ty`, if it is a K-quant with SIMD paths.
        pub(crate) const fn of(ty: GgmlType) -> Option<KKind> {
            Some(match ty {
                GgmlType::Q2_K => KKind::Q2,
                GgmlType::Q3_K => KKind::Q3,
                GgmlType::Q4_K => KKind::Q4,
                GgmlType::Q5_K => KKind::Q5,
                GgmlType::Q6_K => KKind::Q6,
                _ => return None,
            })
        }

        /// Bytes per weight block (x86 uses the code's `block_bytes` in const contexts).
        #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
        pub(crate) const fn block_bytes(self) -> usize {
            block_bytes(self as u8)
        }
    }

    /// The kinds as const-generic codes.
    pub(crate) const Q2: u8 = KKind::Q2 as u8;
    pub(crate) const Q3: u8 = KKind::Q3 as u8;
    pub(crate) const Q4: u8 = KKind::Q4 as u8;
    pub(crate) const Q5: u8 = KKind::Q5 as u8;
    pub(crate) const Q6: u8 = KKind::Q6 as u8;

    /// Bytes per weight block of K-quant kind code `kind` (Q6_K for anything above 5).
    pub(crate) const fn block_bytes(kind: u8) -> usize {
        match kind {
            Q2 => size_of::<BlockQ2_K>(),
            Q3 => size_of::<BlockQ3_K>(),
            Q4 => size_of::<BlockQ4_K>(),
            Q5 => size_of::<BlockQ5_K>(),
            _ => size_of::<BlockQ6_K>(),
        }
    }

    const _: () = assert!(Q8K_BSUMS == Q8K_QS + 256 && Q8K_BYTES == Q8K_BSUMS + 32);
}

const _: () = assert!(std::mem::size_of::<BlockQ2_K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3_K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4_K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5_K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6_K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8_K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ2_K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ3_K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ4_K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ5_K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ6_K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ8_K>() == 1);

// SAFETY: repr(C) structs of u8/i8 arrays only: alignment 1 (asserted above), no padding (sizes
// asserted above equal the sum of the fields), every bit pattern valid.
unsafe impl Block for BlockQ2_K {
    const TYPE: GgmlType = GgmlType::Q2_K;
}
// SAFETY: as for BlockQ2_K.
unsafe impl Block for BlockQ3_K {
    const TYPE: GgmlType = GgmlType::Q3_K;
}
// SAFETY: as for BlockQ2_K.
unsafe impl Block for BlockQ4_K {
    const TYPE: GgmlType = GgmlType::Q4_K;
}
// SAFETY: as for BlockQ2_K.
unsafe impl Block for BlockQ5_K {
    const TYPE: GgmlType = GgmlType::Q5_K;
}
// SAFETY: as for BlockQ2_K.
unsafe impl Block for BlockQ6_K {
    const TYPE: GgmlType = GgmlType::Q6_K;
}
// SAFETY: as for BlockQ2_K.
unsafe impl Block for BlockQ8_K {
    const TYPE: GgmlType = GgmlType::Q8_K;
}

f16_field!(BlockQ2_K, d, dmin);
f16_field!(BlockQ3_K, d);
f16_field!(BlockQ4_K, d, dmin);
f16_field!(BlockQ5_K, d, dmin);
f16_field!(BlockQ6_K, d);

impl BlockQ3_K {
    /// The sixteen 6-bit scales, unpacked (0..=63; subtract 32 for the signed scale). Element j
    /// takes its low 4 bits from byte `j % 8` (low nibble for j < 8, high for j >= 8) and its
    /// high 2 bits from byte `8 + j % 4`, bits `2 * (j / 4)`.
    #[inline]
    pub fn unpacked_scales(&self) -> [u8; 16] {
        unpack_q3_k_scales(&self.scales)
    }
}

/// See [`BlockQ3_K::unpacked_scales`].
#[inline]
pub fn unpack_q3_k_scales(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xf } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = low | (high << 4);
    }
    out
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of Q4_K/Q5_K.
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl BlockQ4_K {
    /// The eight (scale, min) pairs.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        unpack_k4_scales(&self.scales)
    }
}

impl BlockQ5_K {
    /// The eight (scale, min) pairs.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        unpack_k4_scales(&self.scales)
    }
}

/// All eight (scale, min) pairs of a Q4_K/Q5_K block.
#[inline]
pub fn unpack_k4_scales(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

impl BlockQ8_K {
    /// The scale.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of quants `16 * j .. 16 * j + 16`.
    #[inline(always)]
    pub fn bsum(&self, j: usize) -> i16 {
        i16::from_le_bytes(self.bsums[j])
    }
}
