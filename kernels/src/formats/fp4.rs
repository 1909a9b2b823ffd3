//! The FP4 (E2M1) block types: MXFP4 (32 elements, one E8M0 power-of-two scale) and NVFP4 (64
//! elements, four UE4M3 scales, one per 16). Both pack two 4-bit codes per byte, low nibbles
//! first, into `KVALUES_FP4` (the E2M1 values doubled, so integers); the scale decoders below
//! return half the scale to undo the doubling, as ggml's `GGML_E8M0_TO_FP32_HALF` and
//! `ggml_ue4m3_to_fp32` do (ggml-common.h, ggml-impl.h).

use super::{Block, GgmlType};

/// Elements per MXFP4 block.
pub const QK_MXFP4: usize = 32;
/// Elements per NVFP4 block.
pub const QK_NVFP4: usize = 64;
/// Elements per NVFP4 sub-block (one UE4M3 scale each).
pub const QK_NVFP4_SUB: usize = 16;

/// The E2M1 values doubled (ggml's `kvalues_mxfp4`), indexed by a 4-bit code.
pub const KVALUES_FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `E8M0(e) / 2 * KVALUES_FP4[q]`, 4-bit codes: low nibbles the first 16 elements, high nibbles
/// the last 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK_MXFP4 / 2],
}

/// Four sub-blocks of 16: `UE4M3(d[s]) / 2 * KVALUES_FP4[q]`; sub-block `s` has its 8 bytes at
/// `qs[8 s..]`, low nibbles its first 8 elements, high nibbles its last 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockNvfp4 {
    pub d: [u8; QK_NVFP4 / QK_NVFP4_SUB],
    pub qs: [u8; QK_NVFP4 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);
const _: () = assert!(std::mem::size_of::<BlockNvfp4>() == 36);
const _: () = assert!(std::mem::align_of::<BlockMxfp4>() == 1);
const _: () = assert!(std::mem::align_of::<BlockNvfp4>() == 1);

// SAFETY: repr(C) structs of u8 fields only: alignment 1 (asserted above), no padding (sizes
// asserted above equal the sum of the fields), every bit pattern valid.
unsafe impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
}
// SAFETY: as for BlockMxfp4.
unsafe impl Block for BlockNvfp4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
}

impl BlockMxfp4 {
    /// The block's scale, halved (`GGML_E8M0_TO_FP32_HALF(e)`).
    #[inline(always)]
    pub fn d(&self) -> f32 {
        e8m0_to_f32_half(self.e)
    }
}

impl BlockNvfp4 {
    /// Sub-block `s`'s scale, halved (`ggml_ue4m3_to_fp32(d[s])`).
    #[inline(always)]
    pub fn d(&self, s: usize) -> f32 {
        ue4m3_to_f32_half(self.d[s])
    }
}

/// `2^(e - 128)`, ggml's `ggml_e8m0_to_fp32_half` (e = 0 and 1 give the subnormals 2^-128 and
/// 2^-127; e = 255 gives infinity, as ggml's bit construction does).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

/// Half the value of a UE4M3 byte (4 exponent bits with bias 7, 3 mantissa bits), as ggml's
/// `ggml_ue4m3_to_fp32`: 0x00 and 0x7F are zero, the top bit is ignored otherwise.
#[inline(always)]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    UE4M3_HALF[x as usize]
}

static UE4M3_HALF: [f32; 256] = ue4m3_table();

const fn ue4m3_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut x = 0usize;
    while x < 256 {
        t[x] = if x == 0 || x == 0x7f {
            0.0
        } else {
            let (exp, man) = ((x >> 3) & 0xf, (x & 7) as f32);
            // every step is exact: small integers and powers of two
            let raw = if exp == 0 {
                man * pow2(-9)
            } else {
                (1.0 + man / 8.0) * pow2(exp as i32 - 7)
            };
            raw * 0.5
        };
        x += 1;
    }
    t
}

/// 2^e for -126 <= e <= 127.
const fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// f32 -> UE4M3 byte, ggml's `ggml_fp32_to_ue4m3` (round half up on the mantissa, 448 and above
/// saturate to 0x7E, non-positive and NaN to 0).
pub fn f32_to_ue4m3(x: f32) -> u8 {
    // ggml's `!(x > 0)`: NaN as well
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xff) as i32 - 127;
    let fp32_man = ((bits >> 20) & 7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        // subnormal: man * 2^-9, man = round(x * 2^9); ggml truncates toward zero
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7e;
    }
    let mut man = fp32_man + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7e;
        }
    }
    ((exp << 3) | man) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    #[test]
    fn ue4m3_as_ggml_reads_and_writes_it() {
        // half values: 0x00 and 0x7F are zero, the top bit is ignored otherwise
        assert_eq!(ue4m3_to_f32_half(0x00), 0.0);
        assert_eq!(ue4m3_to_f32_half(0x7f), 0.0);
        assert_eq!(ue4m3_to_f32_half(0x01), 2f32.powi(-10));
        assert_eq!(ue4m3_to_f32_half(0x38), 0.5);
        assert_eq!(ue4m3_to_f32_half(0x7e), 224.0);
        assert_eq!(ue4m3_to_f32_half(0xff), 240.0);
        assert_eq!(ue4m3_to_f32_half(0x80), 0.0);
        // writes: saturation, subnormals, round half up on the mantissa, NaN and <= 0 to zero
        for (x, q) in [
            (f32::NAN, 0),
            (-1.0, 0),
            (0.0, 0),
            (1000.0, 0x7e),
            (448.0, 0x7e),
            (1.0, 0x38),
            (1.0625, 0x39),
            (1.0 + 15.0 / 16.0, 0x40),
            (2f32.powi(-9), 1),
            (7.4 / 512.0, 7),
            (0.4 / 512.0, 0),
        ] {
            assert_eq!(f32_to_ue4m3(x), q, "{x}");
        }
    }
}
