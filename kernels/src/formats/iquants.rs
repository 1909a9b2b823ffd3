//! ggml's "i-quants" (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS) and
//! ternary types (TQ1_0, TQ2_0): the `#[repr(C)]` block mirrors of ggml-common.h. Apart from
//! IQ4_NL (32 elements, paired with Q8_0 activations) they are 256-element super-blocks paired
//! with Q8_K. Most pick 8 (or 4) weights at a time from a lookup grid (`iq_grids`), with sign
//! bits and small odd scales per 32 (or 16) elements; `d` is a little-endian f16 except in IQ1_M,
//! which spreads its f16 over the top nibbles of its four scale words. ggml's `uint16_t` arrays
//! are kept as byte pairs (read little-endian through accessors) so that every block has
//! alignment 1 like the others.

use super::legacy::f16_field;
use super::{Block, GgmlType, QK_K};

/// Elements per IQ4_NL block.
pub const QK4_NL: usize = 32;

/// 2.0625 bpw: per 32 elements two little-endian u32 words: four 8-bit grid indices
/// (`IQ2XXS_GRID`), then four 7-bit sign indices and a 4-bit scale in the top bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq2Xxs {
    pub d: [u8; 2],
    pub qs: [[u8; 2]; QK_K / 8],
}

/// 2.3125 bpw: per 8 elements a u16 of a 9-bit grid index (`IQ2XS_GRID`) and 7 sign bits; two
/// 4-bit scales per 32 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq2Xs {
    pub d: [u8; 2],
    pub qs: [[u8; 2]; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}

/// 2.5625 bpw: 10-bit grid indices (`IQ2S_GRID`; low 8 bits in the first half of `qs`, high 2 in
/// `qh`), 8 explicit sign bits per 8 elements (second half of `qs`), two 4-bit scales per 32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq2S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}

/// 3.0625 bpw: 8-bit indices into `IQ3XXS_GRID` (4 elements each) in the first 64 bytes of
/// `qs`, then per 32 elements a u32 of four 7-bit sign indices and a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq3Xxs {
    pub d: [u8; 2],
    pub qs: [u8; 3 * QK_K / 8],
}

/// 3.4375 bpw: 9-bit indices into `IQ3S_GRID` (high bits in `qh`), explicit sign bits, a 4-bit
/// scale per 32 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq3S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}

/// 1.5625 bpw: 11-bit indices into `IQ1S_GRID` (values -1, 0, 1), per 32 elements a u16 `qh`
/// holding the four high index parts, a 3-bit scale and the sign of the ±1/8 shift.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq1S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 8],
    pub qh: [[u8; 2]; QK_K / 32],
}

/// 1.75 bpw: like IQ1_S with a shift sign per 8 elements and two 3-bit scales per 32; the f16
/// super-block scale is the top nibbles of the four u16 scale words.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}

/// 4.5 bpw non-linear: 4-bit indices into `KVALUES_IQ4NL`, low nibbles first 16 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq4Nl {
    pub d: [u8; 2],
    pub qs: [u8; QK4_NL / 2],
}

/// 4.25 bpw non-linear: IQ4_NL's values with a 6-bit scale per 32 elements (low 4 bits in
/// `scales_l`, high 2 in the little-endian u16 `scales_h`), offset by 32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq4Xs {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// 1.6875 bpw ternary: five base-3 digits per byte of `qs` (as a fixed-point fraction of 243),
/// four per byte of `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTq1_0 {
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    pub qh: [u8; QK_K / 64],
    pub d: [u8; 2],
}

/// 2.0625 bpw ternary: 2 bits per element, `d * (q - 1)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTq2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
}

const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == 66);
const _: () = assert!(std::mem::size_of::<BlockIq2Xs>() == 74);
const _: () = assert!(std::mem::size_of::<BlockIq2S>() == 82);
const _: () = assert!(std::mem::size_of::<BlockIq3Xxs>() == 98);
const _: () = assert!(std::mem::size_of::<BlockIq3S>() == 110);
const _: () = assert!(std::mem::size_of::<BlockIq1S>() == 50);
const _: () = assert!(std::mem::size_of::<BlockIq1M>() == 56);
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);
const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);
const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);
const _: () = assert!(std::mem::align_of::<BlockIq2Xxs>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq2Xs>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq2S>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq3Xxs>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq3S>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq1S>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq1M>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq4Nl>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIq4Xs>() == 1);
const _: () = assert!(std::mem::align_of::<BlockTq1_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockTq2_0>() == 1);

macro_rules! block_impl {
    ($($block:ident => $ty:ident),+ $(,)?) => {
        $(
            // SAFETY: a repr(C) struct of u8 arrays only: alignment 1 and no padding (both
            // asserted above, the size being the sum of the fields), every bit pattern valid.
            unsafe impl Block for $block {
                const TYPE: GgmlType = GgmlType::$ty;
            }
        )+
    };
}

block_impl!(
    BlockIq2Xxs => IQ2_XXS,
    BlockIq2Xs => IQ2_XS,
    BlockIq2S => IQ2_S,
    BlockIq3Xxs => IQ3_XXS,
    BlockIq3S => IQ3_S,
    BlockIq1S => IQ1_S,
    BlockIq1M => IQ1_M,
    BlockIq4Nl => IQ4_NL,
    BlockIq4Xs => IQ4_XS,
    BlockTq1_0 => TQ1_0,
    BlockTq2_0 => TQ2_0,
);

f16_field!(BlockIq2Xxs, d);
f16_field!(BlockIq2Xs, d);
f16_field!(BlockIq2S, d);
f16_field!(BlockIq3Xxs, d);
f16_field!(BlockIq3S, d);
f16_field!(BlockIq1S, d);
f16_field!(BlockIq4Nl, d);
f16_field!(BlockIq4Xs, d);
f16_field!(BlockTq1_0, d);
f16_field!(BlockTq2_0, d);

impl BlockIq2Xxs {
    /// The two u32 words of 32-element group `ib` (grid indices, then signs and scale).
    #[inline(always)]
    pub fn words(&self, ib: usize) -> (u32, u32) {
        let q = &self.qs[4 * ib..4 * ib + 4];
        (
            u32::from_le_bytes([q[0][0], q[0][1], q[1][0], q[1][1]]),
            u32::from_le_bytes([q[2][0], q[2][1], q[3][0], q[3][1]]),
        )
    }
}

impl BlockIq2Xs {
    /// The u16 of 8-element group `i` (9-bit grid index, 7-bit sign index).
    #[inline(always)]
    pub fn q(&self, i: usize) -> u16 {
        u16::from_le_bytes(self.qs[i])
    }
}

impl BlockIq3Xxs {
    /// Signs and scale word of 32-element group `ib`.
    #[inline(always)]
    pub fn signs_scale(&self, ib: usize) -> u32 {
        let s = &self.qs[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4];
        u32::from_le_bytes([s[0], s[1], s[2], s[3]])
    }
}

impl BlockIq1S {
    /// The u16 `qh` of 32-element group `ib`.
    #[inline(always)]
    pub fn qh(&self, ib: usize) -> u16 {
        u16::from_le_bytes(self.qh[ib])
    }
}

impl BlockIq1M {
    /// Scale word `i` (0..4): two 3-bit scales per 32 elements, and a nibble of the f16 scale.
    #[inline(always)]
    pub fn sc(&self, i: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * i], self.scales[2 * i + 1]])
    }

    /// The bits of the f16 super-block scale: the top nibble of each scale word.
    #[inline(always)]
    pub fn d_bits(&self) -> u16 {
        (self.sc(0) >> 12)
            | ((self.sc(1) >> 8) & 0x00f0)
            | ((self.sc(2) >> 4) & 0x0f00)
            | (self.sc(3) & 0xf000)
    }

    /// The super-block scale.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        super::f16_to_f32(self.d_bits())
    }
}

impl BlockIq4Xs {
    /// The 6-bit scale code of 32-element group `ib` (0..=63; the scale is `code - 32`).
    #[inline(always)]
    pub fn scale(&self, ib: usize) -> u8 {
        let h = u16::from_le_bytes(self.scales_h);
        ((self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | ((((h >> (2 * ib)) & 3) as u8) << 4)
    }
}

/// Sets the f16 super-block scale `d` (raw bits) of one block of an i-quant or ternary type,
/// wherever the type keeps it (IQ1_M: the top nibble of each of its four scale words). For
/// writers of random valid blocks; errors for other types or a block of the wrong size.
pub fn set_iq_scale(ty: GgmlType, block: &mut [u8], d: u16) -> Result<(), crate::KernelError> {
    if !ty.is_iq() || block.len() != ty.block_bytes() {
        return Err(crate::KernelError::Unsupported {
            op: "set_iq_scale",
            ty: ty.name(),
        });
    }
    let at = match ty {
        GgmlType::IQ1_M => {
            // scales start after qs (32 bytes) and qh (16 bytes); word i's high byte is 49 + 2i
            for i in 0..4 {
                let b = &mut block[QK_K / 8 + QK_K / 16 + 2 * i + 1];
                *b = (*b & 0x0f) | ((((d >> (4 * i)) & 0xf) as u8) << 4);
            }
            return Ok(());
        }
        GgmlType::TQ1_0 => std::mem::offset_of!(BlockTq1_0, d),
        GgmlType::TQ2_0 => std::mem::offset_of!(BlockTq2_0, d),
        _ => 0,
    };
    block[at..at + 2].copy_from_slice(&d.to_le_bytes());
    Ok(())
}
