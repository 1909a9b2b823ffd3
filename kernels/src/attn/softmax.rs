//! The one softmax of the workspace (attention scores and the MoE router's softmax gating) and
//! the exponential it uses, written so that the compiler vectorizes them: no call into libm
//! per element, no sum carried from one element to the next. At a depth of 16k positions a
//! query head's softmax was a libm `expf` per score plus 16k dependent f64 additions; here the
//! exponential is a branch-free f64 polynomial and the sum runs in eight lanes.
//!
//! Exactness: every operation is an IEEE f64 or f32 operation in a fixed order (Rust never fuses
//! or reassociates float operations), so the portable build, the AVX2 and AVX-512 builds
//! ([`crate::dispatch::float_level`]) and aarch64 give the same bits: what the batch-,
//! tier- and placement-invariance of the attention relies on. Against ggml (which uses its own
//! vectorized `expf` and sums 16 floats at a time) the results agree within the parity
//! tolerances, as they did with libm's `expf`.

use crate::dispatch::FloatLevel;

/// Lanes of the max, exponential and sum loops.
const LANES: usize = 8;

/// `log2(e)` and `ln(2)` in f64.
const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;
/// Adding 1.5 * 2^52 rounds an f64 of magnitude below 2^51 to an integer (nearest, ties to
/// even), which then sits in the low bits of the sum's representation.
const ROUND: f64 = 6755399441055744.0;
/// Below this `exp` is 0 in f32 (e^-104 is under half the least subnormal), above it
/// infinite; clamping there keeps `2^k` a normal f64.
const LOW: f32 = -110.0;
const HIGH: f32 = 100.0;
/// 1/j! for j = 0..=10: Taylor's series of e^t on |t| <= ln(2)/2, whose remainder
/// (0.347^11 / 11! < 2e-13 relative) is far below an f32 ulp, so the f32 result is the
/// correctly rounded e^x except within ~2e-13 of a rounding boundary.
const INV_FACT: [f64; 11] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362880.0,
    1.0 / 3628800.0,
];

/// e^x in f32: `x log2(e) = k + f` with `k` the nearest integer, `e^x = 2^k e^(f ln 2)`, the
/// second factor from [`INV_FACT`]'s polynomial (Horner), all in f64, rounded to f32 once.
/// NaN stays NaN; results below the f32 range are 0, above it infinity.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let c = x.clamp(LOW, HIGH);
    let z = c as f64 * LOG2E;
    let r = z + ROUND;
    let k = r - ROUND;
    let t = (z - k) * LN2;
    let mut p = INV_FACT[10];
    for &a in INV_FACT[..10].iter().rev() {
        p = p * t + a;
    }
    // k is in -159..=145: 2^k is a normal f64 built from its exponent bits
    let ki = (r.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    let two_k = f64::from_bits((ki.wrapping_add(1023) as u64) << 52);
    let e = (p * two_k) as f32;
    if x.is_nan() {
        x
    } else {
        e
    }
}

/// ggml_soft_max_ext on one row: `x * scale`, max, exp, sum, multiply by 1/sum, with the sum
/// taken in f64 over [`LANES`] lanes (lane `i` adds elements `i, i + 8, ...` in order; the lanes
/// are folded pairwise, then the tail is added).
pub fn softmax(x: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    match crate::dispatch::float_level() {
        FloatLevel::Avx512 => {
            // SAFETY: float_level is at most the widest level this CPU runs: it has AVX-512 F and DQ.
            unsafe { softmax_avx512(x, scale) };
            return;
        }
        FloatLevel::Avx2 => {
            // SAFETY: float_level is at most the widest level this CPU runs: it has AVX2 and FMA.
            unsafe { softmax_avx2(x, scale) };
            return;
        }
        FloatLevel::Baseline => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = FloatLevel::Baseline;
    softmax_body(x, scale);
}

/// [`softmax_body`] compiled for AVX-512, its exponentials 32 at a time by [`exp_blocks_avx512`]
/// (same operations, same order of the sums, same bits).
///
/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn softmax_avx512(x: &mut [f32], scale: f32) {
    let max = scaled_max(x, scale);
    let done = x.len() / 32 * 32;
    // SAFETY: the caller guarantees AVX-512 F and DQ.
    let sums = unsafe { exp_blocks_avx512(&mut x[..done], max) };
    let sum = exp_sum_from(&mut x[done..], max, sums);
    normalize(x, sum);
}

/// [`softmax_body`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2 and FMA (FMA is never used for these operations: Rust does not fuse).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(x: &mut [f32], scale: f32) {
    softmax_body(x, scale);
}

/// The portable body of [`softmax`].
#[inline(always)]
fn softmax_body(x: &mut [f32], scale: f32) {
    let max = scaled_max(x, scale);
    let sum = exp_sum_from(x, max, [0.0; LANES]);
    normalize(x, sum);
}

/// `x *= scale` and the maximum, over [`LANES`] lanes then the tail.
#[inline(always)]
fn scaled_max(x: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (m, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v *= scale;
            *m = if *v > *m { *v } else { *m };
        }
    }
    let mut max = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    for v in chunks.into_remainder() {
        *v *= scale;
        max = if *v > max { *v } else { max };
    }
    max
}

/// `x = exp(x - max)` and the f64 sum: lane `i` of `sums` (the lanes of the elements before
/// `x`, which starts at a multiple of [`LANES`]) adds elements `i, i + 8, ...` in order, the
/// lanes are folded pairwise, then the tail is added.
#[inline(always)]
fn exp_sum_from(x: &mut [f32], max: f32, mut sums: [f64; LANES]) -> f64 {
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v - max);
            *s += *v as f64;
        }
    }
    let mut sum =
        ((sums[0] + sums[4]) + (sums[1] + sums[5])) + ((sums[2] + sums[6]) + (sums[3] + sums[7]));
    for v in chunks.into_remainder() {
        *v = exp(*v - max);
        sum += *v as f64;
    }
    sum
}

/// `x *= 1 / sum` (the reciprocal rounded to f32 once).
#[inline(always)]
fn normalize(x: &mut [f32], sum: f64) {
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// [`exp_sum_from`]'s lane loop over `x` (a multiple of 32 floats) from zero sums, with
/// intrinsics: four 8-lane chunks per step, their [`exp`] polynomials side by side (one chunk's
/// is a chain of ~25 dependent f64 operations; the compiled lane loop ran one chain at a time
/// and left the float units waiting). Every value goes through [`exp`]'s operations (clamp,
/// f64 conversion, the same multiplies and adds unfused, 2^k from exponent bits, one rounding
/// to f32, NaN passed through), and each lane adds its chunks in order: same bits.
///
/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn exp_blocks_avx512(x: &mut [f32], max: f32) -> [f64; LANES] {
    use core::arch::x86_64::*;
    let vmax = _mm256_set1_ps(max);
    let (low, high) = (_mm256_set1_ps(LOW), _mm256_set1_ps(HIGH));
    let (log2e, ln2) = (_mm512_set1_pd(LOG2E), _mm512_set1_pd(LN2));
    let round = _mm512_set1_pd(ROUND);
    let round_bits = _mm512_set1_epi64(ROUND.to_bits() as i64);
    let bias = _mm512_set1_epi64(1023);
    let mut sums = _mm512_setzero_pd();
    for blk in x.chunks_exact_mut(32) {
        let p0 = blk.as_mut_ptr();
        let xs: [__m256; 4] = core::array::from_fn(|c| {
            // SAFETY: `blk` holds 32 floats: four unaligned 8-float loads.
            let v = unsafe { _mm256_loadu_ps(p0.add(8 * c)) };
            _mm256_sub_ps(v, vmax)
        });
        let z: [__m512d; 4] = core::array::from_fn(|c| {
            let cl = _mm256_min_ps(_mm256_max_ps(xs[c], low), high);
            _mm512_mul_pd(_mm512_cvtps_pd(cl), log2e)
        });
        let r: [__m512d; 4] = core::array::from_fn(|c| _mm512_add_pd(z[c], round));
        let t: [__m512d; 4] = core::array::from_fn(|c| {
            _mm512_mul_pd(_mm512_sub_pd(z[c], _mm512_sub_pd(r[c], round)), ln2)
        });
        let mut p = [_mm512_set1_pd(INV_FACT[10]); 4];
        for &a in INV_FACT[..10].iter().rev() {
            let a = _mm512_set1_pd(a);
            for (p, &t) in p.iter_mut().zip(&t) {
                *p = _mm512_add_pd(_mm512_mul_pd(*p, t), a);
            }
        }
        for c in 0..4 {
            let ki = _mm512_sub_epi64(_mm512_castpd_si512(r[c]), round_bits);
            let two_k = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_add_epi64(ki, bias)));
            let e = _mm512_cvtpd_ps(_mm512_mul_pd(p[c], two_k));
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(xs[c], xs[c]);
            let e = _mm256_blendv_ps(e, xs[c], nan);
            // SAFETY: as the loads above.
            unsafe { _mm256_storeu_ps(p0.add(8 * c), e) };
            sums = _mm512_add_pd(sums, _mm512_cvtps_pd(e));
        }
    }
    let mut out = [0.0f64; LANES];
    // SAFETY: `out` is 8 writable f64s.
    unsafe { _mm512_storeu_pd(out.as_mut_ptr(), sums) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 nearest to e^x computed in f64 by libm (accurate to < 1 f64 ulp).
    fn reference(x: f32) -> f32 {
        (x as f64).exp() as f32
    }

    /// Distance in f32 ulps (same sign, finite).
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_one_ulp_of_the_true_value_everywhere() {
        // every 389th f32 bit pattern in -110..=100 (~5.8M values; the aarch64 run is under qemu)
        let mut worst = 0;
        let mut off = 0u64;
        let mut checked = 0u64;
        for bits in (0..u32::MAX).step_by(389) {
            let x = f32::from_bits(bits);
            if !(LOW..=HIGH).contains(&x) {
                continue;
            }
            let (got, want) = (exp(x), reference(x));
            checked += 1;
            if want.is_infinite() || want == 0.0 {
                assert_eq!(got, want, "x = {x:e}");
                continue;
            }
            let d = ulps(got, want);
            worst = worst.max(d);
            off += u64::from(d > 0);
        }
        assert!(checked > 5_000_000, "{checked} values checked");
        assert!(worst <= 1, "worst error {worst} ulps");
        // correctly rounded but for values within ~2e-13 of a rounding boundary
        assert!(
            off * 100_000 < checked,
            "{off} of {checked} not correctly rounded"
        );
    }

    #[test]
    fn exp_edges() {
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(88.7), reference(88.7));
        assert_eq!(exp(-104.0), 0.0);
        // the subnormal range rounds like the reference
        for x in [-87.5f32, -90.0, -95.0, -100.0, -103.0] {
            assert_eq!(exp(x), reference(x), "x = {x}");
        }
    }

    #[test]
    fn special_values_give_the_same_bits_in_every_build() {
        // masked (-inf), overflowing, underflowing and NaN scores inside and after the 32-wide
        // blocks of the AVX-512 exponentials
        let specials = [
            f32::NEG_INFINITY,
            1e30,
            -1e30,
            200.0,
            -200.0,
            f32::NAN,
            0.0,
            -0.0,
        ];
        let mut rng = crate::rng::SplitMix64::new(9);
        for n in [33usize, 70, 96] {
            for (i, &sp) in specials.iter().enumerate() {
                let mut row: Vec<f32> = (0..n).map(|_| rng.gaussian() * 4.0).collect();
                row[(7 * i + 3) % n] = sp;
                row[n - 1 - i % 3] = specials[(i + 1) % specials.len()];
                let mut portable = row.clone();
                softmax_body(&mut portable, 0.5);
                let mut dispatched = row.clone();
                softmax(&mut dispatched, 0.5);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&dispatched), bits(&portable), "n {n}, special {sp}");
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_every_build_gives_the_same_bits() {
        let mut rng = crate::rng::SplitMix64::new(5);
        for n in [1usize, 3, 8, 9, 31, 64, 1000, 16_384 + 5] {
            let row: Vec<f32> = (0..n).map(|_| rng.gaussian() * 8.0).collect();
            let mut portable = row.clone();
            softmax_body(&mut portable, 0.125);
            let total: f64 = portable.iter().map(|&p| p as f64).sum();
            assert!((total - 1.0).abs() < 1e-5, "n {n}: sums to {total}");
            // against the definition in f64
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v * 0.125));
            let denom: f64 = row.iter().map(|&v| ((v * 0.125 - max) as f64).exp()).sum();
            for (&p, &v) in portable.iter().zip(&row) {
                let want = ((v * 0.125 - max) as f64).exp() / denom;
                assert!(
                    (p as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                    "n {n}"
                );
            }
            let mut dispatched = row.clone();
            softmax(&mut dispatched, 0.125);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dispatched), bits(&portable), "n {n}");
            #[cfg(target_arch = "x86_64")]
            {
                let f = crate::dispatch::x86_features();
                if f.avx2 && f.fma {
                    let mut v = row.clone();
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { softmax_avx2(&mut v, 0.125) };
                    assert_eq!(bits(&v), bits(&portable), "avx2, n {n}");
                }
                if f.avx512f && f.avx512dq {
                    let mut v = row.clone();
                    // SAFETY: the CPU has AVX-512 F and DQ (checked above).
                    unsafe { softmax_avx512(&mut v, 0.125) };
                    assert_eq!(bits(&v), bits(&portable), "avx512, n {n}");
                }
            }
        }
    }
}
