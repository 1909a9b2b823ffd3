//! The 32-element block family: Q4_0, Q4_1, Q5_0, Q5_1 (weights) and Q8_0, Q8_1 (activations,
//! Q8_0 also weights), and the scale-and-bits types paired with Q8_0 like them: Q1_0 (128
//! elements, one bit each) and Q2_0 (64 elements, two bits each). Field order and sizes follow
//! ggml-common.h; `d`, `m` and `s` are little-endian f16, `qh` a little-endian u32 of high bits.

use super::{Block, GgmlType};

/// Elements per block of the legacy quants.
pub const QK: usize = 32;

/// `d * (q - 8)`, 4-bit quants, two per byte (low nibbles first 16, high nibbles last 16).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `d * q + m`, 4-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `d * (q - 16)`, 5-bit quants: low nibbles in `qs`, fifth bits in `qh` (bit j = element j).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `d * q + m`, 5-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `d * q`, 8-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

/// `d * q` with `s = d * sum(q)` precomputed, 8-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    pub d: [u8; 2],
    pub s: [u8; 2],
    pub qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ5_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ5_1>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ8_1>() == 1);

// SAFETY: repr(C) structs of u8/i8 arrays only: alignment 1 (asserted above), no padding (sizes
// asserted above equal the sum of the fields), every bit pattern valid.
unsafe impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
}
// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
}
// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
}
// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
}
// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
}
// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
}

macro_rules! f16_field {
    ($ty:ident, $($field:ident),+) => {
        impl $ty {
            $(
                #[doc = concat!("`", stringify!($field), "` as f32.")]
                #[inline(always)]
                pub fn $field(&self) -> f32 {
                    $crate::formats::f16_to_f32(u16::from_le_bytes(self.$field))
                }
            )+
        }
    };
}
pub(crate) use f16_field;

f16_field!(BlockQ4_0, d);
f16_field!(BlockQ4_1, d, m);
f16_field!(BlockQ5_0, d);
f16_field!(BlockQ5_1, d, m);
f16_field!(BlockQ8_0, d);
f16_field!(BlockQ8_1, d, s);

impl BlockQ5_0 {
    /// The 32 fifth bits as one little-endian word.
    #[inline(always)]
    pub fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
}

impl BlockQ5_1 {
    /// The 32 fifth bits as one little-endian word.
    #[inline(always)]
    pub fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
}

/// Elements per Q1_0 block.
pub const QK1_0: usize = 128;
/// Elements per Q2_0 block.
pub const QK2_0: usize = 64;

/// `±d`, one bit per element (set: `+d`), element j at bit `j % 8` of byte `j / 8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ1_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK1_0 / 8],
}

/// `d * (q - 1)`, 2-bit codes (values -1, 0, 1, 2), element j at bits `2 (j % 4)` of byte `j / 4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK2_0 / 4],
}

const _: () = assert!(std::mem::size_of::<BlockQ1_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ2_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ1_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ2_0>() == 1);

// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ1_0 {
    const TYPE: GgmlType = GgmlType::Q1_0;
}
// SAFETY: as for BlockQ4_0.
unsafe impl Block for BlockQ2_0 {
    const TYPE: GgmlType = GgmlType::Q2_0;
}

f16_field!(BlockQ1_0, d);
f16_field!(BlockQ2_0, d);

impl BlockQ1_0 {
    /// Element j's sign bit (1: `+d`).
    #[inline(always)]
    pub fn bit(&self, j: usize) -> u8 {
        (self.qs[j / 8] >> (j % 8)) & 1
    }
}

impl BlockQ2_0 {
    /// Element j's 2-bit code (the value is `code - 1`).
    #[inline(always)]
    pub fn code(&self, j: usize) -> u8 {
        (self.qs[j / 4] >> (2 * (j % 4))) & 3
    }
}
