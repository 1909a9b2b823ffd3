//! f16 and bf16 conversions exactly as ggml's portable C code does them (the build the golden
//! vectors come from has F16C off): f32 -> f16 rounds to nearest even, overflows to infinity and
//! turns every NaN into 0x7e00 (with its sign); f32 -> bf16 rounds to nearest even and quiets NaN.

/// f16 bits -> f32 (exact).
///
/// On aarch64 this is one `FCVT` (half to single is base Armv8 floating point, not FEAT_FP16):
/// the `half` crate would detect FP16 at run time and call out of line, a call per scale in
/// the kernels' epilogues (`benches/arm/REPORT.md`). Same bits: exact for every non-NaN, and a
/// NaN keeps its sign and payload with the quiet bit set, as `half`'s fallback does.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    #[cfg(target_arch = "aarch64")]
    {
        let out: f32;
        // SAFETY: FCVT on registers only; floating point is baseline on aarch64.
        unsafe {
            core::arch::asm!(
                "fcvt {o:s}, {i:h}",
                i = in(vreg) h,
                o = lateout(vreg) out,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        out
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        ::half::f16::from_bits(h).to_f32()
    }
}

/// f32 -> f16 bits, bit-identical to ggml's `ggml_compute_fp32_to_fp16`.
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    // Scaling by 2^112 then 2^-110 lets the float unit do the rounding (also for subnormals).
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xff00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7c00;
    let mantissa_bits = bits & 0x0000_0fff;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xff00_0000 {
            0x7e00
        } else {
            nonsign
        }) as u16
}

/// bf16 bits -> f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> bf16 bits, as ggml's `ggml_compute_fp32_to_bf16`.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_matches_half_crate_on_finite_values() {
        // half rounds to nearest even too; both must agree on every finite input pattern we try.
        let mut x: u32 = 0x1234_5678;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if f.is_nan() {
                assert_eq!(f32_to_f16(f) & 0x7fff, 0x7e00);
                continue;
            }
            assert_eq!(f32_to_f16(f), ::half::f16::from_f32(f).to_bits(), "{f:e}");
        }
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_f16(f), h);
            }
        }
    }

    #[test]
    fn f16_to_f32_matches_half_crate_on_every_pattern() {
        // aarch64's FCVT path against `half` (its FP16 or software path): the same bits for all
        // 65536 inputs, NaNs included (quiet bit set, sign and payload kept).
        for h in 0..=u16::MAX {
            let want = ::half::f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_to_f32(h).to_bits(), want, "{h:#06x}");
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        let check = |f: f32, expect: u16| assert_eq!(f32_to_bf16(f), expect, "{f:e}");
        check(1.0, 0x3f80);
        check(f32::from_bits(0x3f80_8000), 0x3f80); // tie, even stays
        check(f32::from_bits(0x3f81_8000), 0x3f82); // tie, odd rounds up
        check(f32::from_bits(0x3f80_8001), 0x3f81);
        check(f32::INFINITY, 0x7f80);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }
}
