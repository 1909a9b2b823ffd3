//! The aarch64 SIMD tiers (NEON, dotprod, i8mm) against the scalar reference, bit for bit:
//! property tests over random blocks (extreme and zero scales, zero blocks, odd row and
//! activation counts so the i8mm 2x2 tiles meet their remainders), a table of hand-picked edge
//! cases, and ggml's golden vectors. Runs on aarch64 only (CI: qemu-aarch64 -cpu max, see
//! scripts/test.d/20-aarch64.sh); each tier this CPU lacks is reported and skipped.
#![cfg(target_arch = "aarch64")]
#![allow(clippy::too_many_arguments)]

mod common;

use common::tile::tile;
use nightshift_kernels::arch::aarch64::{Dotprod, I8mm, Neon};
use nightshift_kernels::rng::SplitMix64;
use nightshift_kernels::{scalar, GgmlType};
use proptest::prelude::*;

/// The weight types every aarch64 tier must cover.
const TYPES: [GgmlType; 10] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TierName {
    Neon,
    Dotprod,
    I8mm,
}

const TIERS: [TierName; 3] = [TierName::Neon, TierName::Dotprod, TierName::I8mm];

/// Runs `tier` if this CPU has it: Some(path existed) or None (tier unavailable).
fn run_tier(
    tier: TierName,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> Option<bool> {
    match tier {
        TierName::Neon => Neon::new().map(|t| t.gemm_block(&mut tile(ty, k, w, rows, x, n, out))),
        TierName::Dotprod => {
            Dotprod::new().map(|t| t.gemm_block(&mut tile(ty, k, w, rows, x, n, out)))
        }
        TierName::I8mm => I8mm::new().map(|t| t.gemm_block(&mut tile(ty, k, w, rows, x, n, out))),
    }
}

/// The reference: `out[r * n + j] = scalar::vec_dot(W[r], x[j])`.
fn reference(ty: GgmlType, k: usize, w: &[u8], rows: usize, x: &[u8], n: usize) -> Vec<f32> {
    let wrow = ty.row_bytes(k).expect("k fits the weight type");
    let xrow = ty
        .vec_dot_type()
        .row_bytes(k)
        .expect("k fits the activation type");
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for j in 0..n {
            out.push(
                scalar::vec_dot(ty, k, &w[r * wrow..][..wrow], &x[j * xrow..][..xrow])
                    .expect("valid rows"),
            );
        }
    }
    out
}

/// Compares `tier` with the reference bit for bit; Err describes the first mismatch.
fn check(
    tier: TierName,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
) -> Result<(), String> {
    let expect = reference(ty, k, w, rows, x, n);
    let mut got = vec![f32::NAN; rows * n];
    match run_tier(tier, ty, k, w, rows, x, n, &mut got) {
        None => return Ok(()),
        Some(false) => return Err(format!("{tier:?} has no path for {}", ty.name())),
        Some(true) => {}
    }
    for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
        if g.to_bits() != e.to_bits() {
            return Err(format!(
                "{tier:?} {} k={k} rows={rows} n={n}: out[{i}] (row {}, act {}) = {g:e} ({:#010x}), reference {e:e} ({:#010x})",
                ty.name(),
                i / n,
                i % n,
                g.to_bits(),
                e.to_bits()
            ));
        }
    }
    Ok(())
}

/// splitmix64: a tiny deterministic generator for block bytes.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn fill(&mut self, b: &mut [u8]) {
        for v in b {
            *v = self.next() as u8;
        }
    }
}

/// How the scale fields of generated blocks are chosen.
#[derive(Clone, Copy, Debug)]
enum Scales {
    /// Ordinary magnitudes (f16 exponents around 2^-10..2^0, f32 around 2^-10..2^0).
    Normal,
    /// Extremes mixed in: zero, -0, f16 max/min normal/subnormal, large and tiny f32.
    Extreme,
}

/// A finite f16 bit pattern.
fn f16_bits(rng: &mut Rng, scales: Scales) -> u16 {
    const EXTREME: [u16; 8] = [
        0x0000, 0x8000, 0x7bff, 0xfbff, 0x0001, 0x83ff, 0x0400, 0x3c00,
    ];
    match scales {
        Scales::Extreme if rng.below(2) == 0 => EXTREME[rng.below(8) as usize],
        _ => {
            let sign = (rng.below(2) as u16) << 15;
            let exp = match scales {
                Scales::Normal => 5 + rng.below(11) as u16,
                Scales::Extreme => rng.below(31) as u16,
            };
            sign | (exp << 10) | (rng.below(1024) as u16)
        }
    }
}

/// A finite Q8_K scale (kept below 2^20 so no product overflows to infinity).
fn f32_scale(rng: &mut Rng, scales: Scales) -> f32 {
    const EXTREME: [f32; 6] = [0.0, -0.0, 1.0e6, -3.5e5, 1.0e-30, f32::MIN_POSITIVE];
    match scales {
        Scales::Extreme if rng.below(2) == 0 => EXTREME[rng.below(6) as usize],
        _ => {
            let e = match scales {
                Scales::Normal => 117 + rng.below(11) as u32,
                Scales::Extreme => 1 + rng.below(146) as u32,
            };
            f32::from_bits(((rng.below(2) as u32) << 31) | (e << 23) | (rng.below(1 << 23) as u32))
        }
    }
}

/// `count` random blocks of `ty` (weights, or activations when `ty` is Q8_K / Q8_0 used as
/// activation): random quant bytes with valid finite scales; about one block in `zero_every`
/// is all zero bytes.
fn blocks(
    rng: &mut Rng,
    ty: GgmlType,
    act: bool,
    count: usize,
    scales: Scales,
    zero_every: u64,
) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut out = vec![0u8; bb * count];
    for blk in out.chunks_exact_mut(bb) {
        if zero_every > 0 && rng.below(zero_every) == 0 {
            continue;
        }
        rng.fill(blk);
        if act && ty == GgmlType::Q8_K {
            blk[..4].copy_from_slice(&f32_scale(rng, scales).to_le_bytes());
        } else {
            for &at in ty.f16_fields() {
                blk[at..at + 2].copy_from_slice(&f16_bits(rng, scales).to_le_bytes());
            }
        }
    }
    out
}

/// Activation rows made the production way: random floats quantized by the reference.
fn quantized_acts(rng: &mut Rng, ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let at = ty.vec_dot_type();
    let row = at.row_bytes(k).expect("k fits");
    let mut out = vec![0u8; row * n];
    for r in 0..n {
        let f: Vec<f32> = (0..k)
            .map(|_| (rng.next() as i64 as f64 / i64::MAX as f64) as f32 * 3.0)
            .collect();
        scalar::quantize_row(at, &f, &mut out[r * row..][..row]).expect("quantize activations");
    }
    out
}

/// One generated case.
fn case(
    ty: GgmlType,
    seed: u64,
    nb: usize,
    rows: usize,
    n: usize,
    scales: Scales,
    zero_every: u64,
    quant_x: bool,
) -> (usize, Vec<u8>, Vec<u8>) {
    let mut rng = Rng(SplitMix64::new(seed));
    let k = nb * ty.block_len();
    let w = blocks(&mut rng, ty, false, nb * rows, scales, zero_every);
    let x = if quant_x {
        quantized_acts(&mut rng, ty, k, n)
    } else {
        blocks(
            &mut rng,
            ty.vec_dot_type(),
            true,
            nb * n,
            scales,
            zero_every,
        )
    };
    (k, w, x)
}

#[test]
fn tiers_are_detected_under_qemu_max() {
    // Reported, not asserted: real CPUs may lack dotprod/i8mm. The CI script asserts them.
    eprintln!(
        "neon={} dotprod={} i8mm={}",
        Neon::new().is_some(),
        Dotprod::new().is_some(),
        I8mm::new().is_some()
    );
    assert!(Neon::new().is_some(), "every aarch64 cpu has neon");
    if std::env::var_os("NIGHTSHIFT_EXPECT_ALL_ARM_TIERS").is_some() {
        assert!(
            Dotprod::new().is_some() && I8mm::new().is_some(),
            "qemu -cpu max should offer dotprod and i8mm"
        );
    }
}

#[test]
fn unsupported_types_report_no_path() {
    let mut out = [0.0f32; 1];
    let w = vec![0u8; GgmlType::F16.row_bytes(256).expect("k fits")];
    let x = vec![0u8; GgmlType::F16.row_bytes(256).expect("k fits")];
    for tier in TIERS {
        assert_ne!(
            run_tier(tier, GgmlType::F16, 256, &w, 1, &x, 1, &mut out),
            Some(true),
            "{tier:?}"
        );
    }
}

/// Hand-picked cases: (name, type, blocks per row, rows, activations, scales, zero every, quantized x).
#[test]
fn edge_cases() {
    type Case = (&'static str, usize, usize, usize, Scales, u64, bool);
    let cases: [Case; 9] = [
        ("single", 1, 1, 1, Scales::Normal, 0, false),
        ("2x2 tile", 2, 2, 2, Scales::Normal, 0, false),
        ("odd rows and acts", 2, 3, 3, Scales::Normal, 0, false),
        ("remainder act in chunk", 1, 2, 5, Scales::Normal, 0, false),
        ("many acts", 1, 5, 17, Scales::Normal, 0, false),
        ("extreme scales", 3, 3, 5, Scales::Extreme, 0, false),
        ("zero blocks", 4, 3, 3, Scales::Normal, 2, false),
        ("all zero", 1, 2, 2, Scales::Normal, 1, false),
        ("quantized activations", 3, 4, 5, Scales::Normal, 0, true),
    ];
    let mut failures = Vec::new();
    for (ci, (name, nb, rows, n, scales, zero_every, quant_x)) in cases.into_iter().enumerate() {
        for ty in TYPES {
            let (k, w, x) = case(
                ty,
                1000 + ci as u64,
                nb,
                rows,
                n,
                scales,
                zero_every,
                quant_x,
            );
            for tier in TIERS {
                if let Err(e) = check(tier, ty, k, &w, rows, &x, n) {
                    failures.push(format!("{name}: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Bytes for [`saturated_quants`]: one of `choices` at random.
fn pick(rng: &mut Rng, choices: &[u8]) -> u8 {
    choices[rng.below(choices.len() as u64) as usize]
}

/// Every quant byte at or near an extreme (weight bytes from `wb`, activation bytes from `xb`;
/// the f16/f32 scale fields stay random): the largest integer sums, int16 intermediates at
/// their bounds, and integer sums with enough significant bits that every float product
/// rounds (so a changed float order shows).
#[test]
fn saturated_quants() {
    const LOW_NIBBLES: [u8; 4] = [0x00, 0x01, 0x10, 0x11];
    let near_min_x: Vec<u8> = (0x80..=0x9c).collect();
    let fills: [(&[u8], &[u8]); 5] = [
        (&[0x00], &[0x80]),
        (&[0xff], &[0x80]),
        (&[0xff], &[0x7f]),
        (&LOW_NIBBLES, &near_min_x),
        (&[0x00, 0xff], &[0x80, 0x7f, 0x81]),
    ];
    let mut failures = Vec::new();
    for (fi, (wb, xb)) in fills.into_iter().enumerate() {
        for ty in TYPES {
            let (rows, n) = (3, 3);
            let seed = 7000 + fi as u64;
            let (k, mut w, mut x) = case(ty, seed, 2, rows, n, Scales::Normal, 0, false);
            let mut rng = Rng(SplitMix64::new(!seed));
            let keep = ty.f16_fields();
            for blk in w.chunks_exact_mut(ty.block_bytes()) {
                for (i, v) in blk.iter_mut().enumerate() {
                    if !keep.iter().any(|&at| i == at || i == at + 1) {
                        *v = pick(&mut rng, wb);
                    }
                }
            }
            let act = ty.vec_dot_type();
            let d_bytes = if act == GgmlType::Q8_0 { 2 } else { 4 };
            for blk in x.chunks_exact_mut(act.block_bytes()) {
                for v in &mut blk[d_bytes..] {
                    *v = pick(&mut rng, xb);
                }
            }
            for tier in TIERS {
                if let Err(e) = check(tier, ty, k, &w, rows, &x, n) {
                    failures.push(format!("fill {fi}: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn type_strategy() -> impl Strategy<Value = GgmlType> {
    prop::sample::select(TYPES.to_vec())
}

fn scales_strategy() -> impl Strategy<Value = Scales> {
    prop_oneof![Just(Scales::Normal), Just(Scales::Extreme)]
}

proptest! {
    // Cheap even under qemu (about 1 ms a case), so a fixed, generous count.
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_tier_matches_the_reference(
        ty in type_strategy(),
        seed in any::<u64>(),
        nb in 1usize..=3,
        rows in prop::sample::select(vec![1usize, 2, 3, 4, 5]),
        n in prop::sample::select(vec![1usize, 2, 3, 5, 17]),
        scales in scales_strategy(),
        zero_every in prop::sample::select(vec![0u64, 3]),
        quant_x in any::<bool>(),
    ) {
        let (k, w, x) = case(ty, seed, nb, rows, n, scales, zero_every, quant_x);
        for tier in TIERS {
            if let Err(e) = check(tier, ty, k, &w, rows, &x, n) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}
