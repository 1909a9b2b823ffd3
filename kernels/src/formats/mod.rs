//! ggml's tensor types and their block layouts.
//!
//! [`GgmlType`] names a type and knows its GGUF id, block length and block size. The block
//! structs (`BlockQ4_0` … `BlockQ8_K`, in `legacy`, `kquants`, `iquants` and `fp4`: MXFP4,
//! NVFP4 and their E8M0/UE4M3 scales) are `#[repr(C)]` mirrors of
//! ggml's C structs whose fields are all byte arrays: they have alignment 1 and no padding (sizes
//! asserted at compile time), so any `&[u8]` of the right length can be viewed as a block slice
//! with [`blocks`] / [`blocks_mut`] whatever its address (mmap'd GGUF data and wire buffers are not
//! necessarily aligned). Multi-byte fields are little-endian and read through accessors.

mod fp4;
mod half;
pub(crate) mod iq_grids;
mod iquants;
pub(crate) mod kquants;
mod legacy;
pub mod repack;

pub use fp4::{
    e8m0_to_f32_half, f32_to_ue4m3, ue4m3_to_f32_half, BlockMxfp4, BlockNvfp4, KVALUES_FP4,
    QK_MXFP4, QK_NVFP4, QK_NVFP4_SUB,
};
pub use half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};
pub use iquants::{
    set_iq_scale, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockTq1_0, BlockTq2_0, QK4_NL,
};
pub use kquants::{
    scale_min_k4, unpack_k4_scales, unpack_q3_k_scales, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K,
    BlockQ6_K, BlockQ8_K, QK_K,
};
pub use legacy::{
    BlockQ1_0, BlockQ2_0, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK,
    QK1_0, QK2_0,
};

use crate::KernelError;

/// ggml's tensor types, with the numeric ids used in GGUF files.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

impl GgmlType {
    /// Every type this crate knows, in id order.
    pub const ALL: [GgmlType; 30] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type with this GGUF/ggml id, if this crate supports it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The type with this name ("Q4_K", "F16", ...; case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// GGUF/ggml numeric id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::IQ1_M => 29,
            GgmlType::BF16 => 30,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::MXFP4 => 39,
            GgmlType::NVFP4 => 40,
            GgmlType::Q1_0 => 41,
            GgmlType::Q2_0 => 42,
        }
    }

    /// ggml's name for the type ("Q4_K", "F16", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::BF16 => "BF16",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::MXFP4 => "MXFP4",
            GgmlType::NVFP4 => "NVFP4",
            GgmlType::Q1_0 => "Q1_0",
            GgmlType::Q2_0 => "Q2_0",
        }
    }

    /// Elements per block: 1 for F32/F16/BF16, 32 for the legacy quants, IQ4_NL and MXFP4, 64
    /// for NVFP4 and Q2_0, 128 for Q1_0, 256 for K-quants, the other i-quants and the ternary
    /// types.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => QK,
            GgmlType::Q8_0 | GgmlType::Q8_1 => QK,
            GgmlType::IQ4_NL => QK4_NL,
            GgmlType::MXFP4 => QK_MXFP4,
            GgmlType::NVFP4 => QK_NVFP4,
            GgmlType::Q1_0 => QK1_0,
            GgmlType::Q2_0 => QK2_0,
            _ => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q8_1 => size_of::<BlockQ8_1>(),
            GgmlType::Q2_K => size_of::<BlockQ2_K>(),
            GgmlType::Q3_K => size_of::<BlockQ3_K>(),
            GgmlType::Q4_K => size_of::<BlockQ4_K>(),
            GgmlType::Q5_K => size_of::<BlockQ5_K>(),
            GgmlType::Q6_K => size_of::<BlockQ6_K>(),
            GgmlType::Q8_K => size_of::<BlockQ8_K>(),
            GgmlType::IQ2_XXS => size_of::<BlockIq2Xxs>(),
            GgmlType::IQ2_XS => size_of::<BlockIq2Xs>(),
            GgmlType::IQ3_XXS => size_of::<BlockIq3Xxs>(),
            GgmlType::IQ1_S => size_of::<BlockIq1S>(),
            GgmlType::IQ4_NL => size_of::<BlockIq4Nl>(),
            GgmlType::IQ3_S => size_of::<BlockIq3S>(),
            GgmlType::IQ2_S => size_of::<BlockIq2S>(),
            GgmlType::IQ4_XS => size_of::<BlockIq4Xs>(),
            GgmlType::IQ1_M => size_of::<BlockIq1M>(),
            GgmlType::TQ1_0 => size_of::<BlockTq1_0>(),
            GgmlType::TQ2_0 => size_of::<BlockTq2_0>(),
            GgmlType::MXFP4 => size_of::<BlockMxfp4>(),
            GgmlType::NVFP4 => size_of::<BlockNvfp4>(),
            GgmlType::Q1_0 => size_of::<BlockQ1_0>(),
            GgmlType::Q2_0 => size_of::<BlockQ2_0>(),
        }
    }

    /// Byte offsets of the little-endian f16 fields of one block (scales, and the mins or sums
    /// beside them), read off the `#[repr(C)]` blocks. Empty for the float types, Q8_K (an f32
    /// scale), IQ1_M, whose f16 scale is spread over the top nibbles of its scale words, and
    /// MXFP4/NVFP4 (byte scales: E8M0, UE4M3).
    pub fn f16_fields(self) -> &'static [usize] {
        use std::mem::offset_of;
        macro_rules! at {
            ($($block:ident . $field:ident),+) => {{
                const AT: &[usize] = &[$(offset_of!($block, $field)),+];
                AT
            }};
        }
        match self {
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_K
            | GgmlType::IQ1_M
            | GgmlType::MXFP4
            | GgmlType::NVFP4 => &[],
            GgmlType::Q4_0 => at!(BlockQ4_0.d),
            GgmlType::Q4_1 => at!(BlockQ4_1.d, BlockQ4_1.m),
            GgmlType::Q5_0 => at!(BlockQ5_0.d),
            GgmlType::Q5_1 => at!(BlockQ5_1.d, BlockQ5_1.m),
            GgmlType::Q8_0 => at!(BlockQ8_0.d),
            GgmlType::Q8_1 => at!(BlockQ8_1.d, BlockQ8_1.s),
            GgmlType::Q2_K => at!(BlockQ2_K.d, BlockQ2_K.dmin),
            GgmlType::Q3_K => at!(BlockQ3_K.d),
            GgmlType::Q4_K => at!(BlockQ4_K.d, BlockQ4_K.dmin),
            GgmlType::Q5_K => at!(BlockQ5_K.d, BlockQ5_K.dmin),
            GgmlType::Q6_K => at!(BlockQ6_K.d),
            GgmlType::IQ2_XXS => at!(BlockIq2Xxs.d),
            GgmlType::IQ2_XS => at!(BlockIq2Xs.d),
            GgmlType::IQ3_XXS => at!(BlockIq3Xxs.d),
            GgmlType::IQ1_S => at!(BlockIq1S.d),
            GgmlType::IQ4_NL => at!(BlockIq4Nl.d),
            GgmlType::IQ3_S => at!(BlockIq3S.d),
            GgmlType::IQ2_S => at!(BlockIq2S.d),
            GgmlType::IQ4_XS => at!(BlockIq4Xs.d),
            GgmlType::TQ1_0 => at!(BlockTq1_0.d),
            GgmlType::TQ2_0 => at!(BlockTq2_0.d),
            GgmlType::Q1_0 => at!(BlockQ1_0.d),
            GgmlType::Q2_0 => at!(BlockQ2_0.d),
        }
    }

    /// Bytes of one row of `k` elements; an error unless `k` is a multiple of the block length.
    pub fn row_bytes(self, k: usize) -> Result<usize, KernelError> {
        let bl = self.block_len();
        if !k.is_multiple_of(bl) {
            return Err(KernelError::KNotMultiple {
                ty: self.name(),
                k,
                block_len: bl,
            });
        }
        (k / bl)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| KernelError::Overflow {
                what: "row size",
                detail: format!("{k} elements of {}", self.name()),
            })
    }

    /// The activation type ggml pairs with this weight type in dot products: K-quants, i-quants
    /// and ternary types -> Q8_K except IQ4_NL -> Q8_0; Q4_0/Q5_0/Q8_0, MXFP4, NVFP4, Q1_0 and
    /// Q2_0 -> Q8_0, Q4_1/Q5_1 ->
    /// Q8_1, F16/BF16/F32 -> themselves (Q8_1 -> Q8_1 and Q8_K -> Q8_K, although neither has a
    /// dot product as a weight type).
    pub fn vec_dot_type(self) -> GgmlType {
        match self {
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                GgmlType::Q8_K
            }
            GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M
            | GgmlType::IQ4_XS
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => GgmlType::Q8_K,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => GgmlType::Q8_0,
            GgmlType::MXFP4 | GgmlType::NVFP4 | GgmlType::Q1_0 | GgmlType::Q2_0 => GgmlType::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
            other => other,
        }
    }

    /// True for the types that have a weight x activation dot product (all but Q8_1 and Q8_K).
    pub fn has_vec_dot(self) -> bool {
        !matches!(self, GgmlType::Q8_1 | GgmlType::Q8_K)
    }

    /// True for the types `quantize_row` can write: all but the i-quants and ternary types,
    /// whose ggml quantizers (importance-matrix searches) this crate does not reproduce.
    pub fn has_quantizer(self) -> bool {
        !self.is_iq()
    }

    /// True for the types the SIMD tiers decode unit by unit into signed bytes (`arch::iq_tile`):
    /// the i-quants, the ternary types, MXFP4, NVFP4, Q1_0 and Q2_0.
    pub fn decodes_by_unit(self) -> bool {
        self.is_iq()
            || matches!(
                self,
                GgmlType::MXFP4 | GgmlType::NVFP4 | GgmlType::Q1_0 | GgmlType::Q2_0
            )
    }

    /// True for the i-quants (IQ1_S … IQ4_XS) and the ternary types (TQ1_0, TQ2_0).
    pub fn is_iq(self) -> bool {
        matches!(
            self,
            GgmlType::IQ2_XXS
                | GgmlType::IQ2_XS
                | GgmlType::IQ2_S
                | GgmlType::IQ3_XXS
                | GgmlType::IQ3_S
                | GgmlType::IQ1_S
                | GgmlType::IQ1_M
                | GgmlType::IQ4_NL
                | GgmlType::IQ4_XS
                | GgmlType::TQ1_0
                | GgmlType::TQ2_0
        )
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A ggml block struct that may be viewed from raw bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, have alignment 1, contain no padding, and be valid for
/// every bit pattern (in this crate: structs made only of `u8`/`i8` arrays).
pub unsafe trait Block: Copy + 'static {
    /// The type whose blocks these are.
    const TYPE: GgmlType;
}

fn check_len<B: Block>(len: usize) -> Result<usize, KernelError> {
    let size = std::mem::size_of::<B>();
    if !len.is_multiple_of(size) {
        return Err(KernelError::Ragged {
            what: B::TYPE.name(),
            block_bytes: size,
            found: len,
        });
    }
    Ok(len / size)
}

/// Views `bytes` as blocks of `B`. Errors if the length is not a whole number of blocks; the
/// address never matters (blocks have alignment 1).
pub fn blocks<B: Block>(bytes: &[u8]) -> Result<&[B], KernelError> {
    let n = check_len::<B>(bytes.len())?;
    // SAFETY: `B: Block` guarantees repr(C), alignment 1, no padding and validity for every bit
    // pattern; `bytes` holds exactly `n * size_of::<B>()` initialised bytes and the returned slice
    // borrows them immutably for the same lifetime.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), n) })
}

/// Mutable version of [`blocks`].
pub fn blocks_mut<B: Block>(bytes: &mut [u8]) -> Result<&mut [B], KernelError> {
    let n = check_len::<B>(bytes.len())?;
    // SAFETY: as in `blocks`; the exclusive borrow of `bytes` moves to the returned slice, and
    // any bit pattern written through it is a valid byte pattern.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) })
}

/// Views blocks back as bytes.
pub fn block_bytes<B: Block>(b: &[B]) -> &[u8] {
    // SAFETY: `B: Block` has no padding, so every byte of the slice is initialised.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<u8>(), std::mem::size_of_val(b)) }
}
