//! Every SIMD tier's path for the types decoded unit by unit (i-quants, ternary types, MXFP4,
//! NVFP4, Q1_0, Q2_0) against the scalar reference, bit for bit, on
//! x86_64 (AVX2, AVX-512-VNNI) and aarch64 (NEON, dotprod, i8mm; CI runs it under qemu):
//! property tests over random blocks (every grid index, sign and scale code; extreme, zero and
//! subnormal scales; activations with every byte value including -128 and unrelated bsums, or
//! made by the reference quantizer), odd row and activation counts, rows of the smaller-block
//! types that are not a whole number of 256-element units (the scalar fallback), and ggml's
//! golden vectors (tests/golden-iq, tests/golden-fp). A tier
//! this CPU lacks is skipped.
#![allow(clippy::too_many_arguments)]

mod common;

use common::tile::tile;
use nightshift_kernels::rng::SplitMix64;
use nightshift_kernels::{scalar, GgmlType};
use proptest::prelude::*;

const TYPES: [GgmlType; 15] = [
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ4_XS,
    GgmlType::IQ4_NL,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// Blocks per 256-element unit.
fn unit(ty: GgmlType) -> usize {
    256 / ty.block_len()
}

/// Runs every SIMD tier this CPU has through its capability type: (name, whether it had a
/// path, `out[r * n + j]`).
fn tiers(
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
) -> Vec<(&'static str, bool, Vec<f32>)> {
    let mut v = Vec::new();
    macro_rules! tier {
        ($name:expr, $cap:expr) => {
            if let Some(t) = $cap {
                let mut o = vec![f32::NAN; rows * n];
                let ok = t.gemm_block(&mut tile(ty, k, w, rows, x, n, &mut o));
                v.push(($name, ok, o));
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        use nightshift_kernels::arch::x86_64::{Avx2, Avx512Vnni};
        tier!("avx2", Avx2::new());
        tier!("avx512vnni", Avx512Vnni::new());
    }
    #[cfg(target_arch = "aarch64")]
    {
        use nightshift_kernels::arch::aarch64::{Dotprod, I8mm, Neon};
        tier!("neon", Neon::new());
        tier!("dotprod", Dotprod::new());
        tier!("i8mm", I8mm::new());
    }
    v
}

/// Every tier this CPU has; `Err` names the first output whose bits differ.
fn check(ty: GgmlType, k: usize, w: &[u8], rows: usize, x: &[u8], n: usize) -> Result<(), String> {
    let mut expect = vec![0f32; rows * n];
    scalar::gemm_block(&mut tile(ty, k, w, rows, x, n, &mut expect)).map_err(|e| e.to_string())?;
    for (name, ran, got) in tiers(ty, k, w, rows, x, n) {
        if !ran {
            // rows that are not whole 256-element units go to the scalar reference
            if !k.is_multiple_of(256) {
                continue;
            }
            return Err(format!("{name} has no path for {ty}"));
        }
        for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
            if g.to_bits() != e.to_bits() {
                return Err(format!(
                    "{name} {ty} k={k} rows={rows} n={n}: out[{i}] = {g:e} ({:#010x}), reference {e:e} ({:#010x})",
                    g.to_bits(),
                    e.to_bits()
                ));
            }
        }
    }
    Ok(())
}

/// A finite f16 scale: normal magnitudes, or with `extreme` also zero, -0, max, subnormals.
fn f16_scale(rng: &mut SplitMix64, extreme: bool) -> u16 {
    const EXTREME: [u16; 7] = [0x0000, 0x8000, 0x7bff, 0x0400, 0x0001, 0x83ff, 0x3c00];
    if extreme && rng.below(2) == 0 {
        return EXTREME[rng.below(EXTREME.len() as u64) as usize];
    }
    let exp = if extreme {
        rng.below(31)
    } else {
        4 + rng.below(12)
    } as u16;
    ((rng.below(2) as u16) << 15) | (exp << 10) | rng.below(1024) as u16
}

/// Random blocks of `ty` with a finite f16 scale where the type has one.
fn blocks(rng: &mut SplitMix64, ty: GgmlType, count: usize, extreme: bool) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut out = vec![0u8; bb * count];
    for blk in out.chunks_exact_mut(bb) {
        for v in blk.iter_mut() {
            *v = rng.next_u64() as u8;
        }
        let d = f16_scale(rng, extreme);
        match ty {
            GgmlType::IQ1_M => {
                // the f16 is the top nibble of each of the four scale words (bytes 49, 51, 53, 55)
                for i in 0..4 {
                    let at = 48 + 2 * i + 1;
                    blk[at] = (blk[at] & 0x0f) | ((((d >> (4 * i)) & 0xf) as u8) << 4);
                }
            }
            GgmlType::TQ1_0 => blk[52..54].copy_from_slice(&d.to_le_bytes()),
            GgmlType::TQ2_0 => blk[64..66].copy_from_slice(&d.to_le_bytes()),
            // E8M0: every byte when extreme (2^-128 ..= 2^127), else around 1
            GgmlType::MXFP4 if !extreme => blk[0] = 120 + rng.below(16) as u8,
            // UE4M3 scales: every byte is finite
            GgmlType::MXFP4 | GgmlType::NVFP4 => {}
            GgmlType::Q8_K => {
                let e = 115 + rng.below(12) as u32;
                let s = f32::from_bits(
                    ((rng.below(2) as u32) << 31) | (e << 23) | rng.below(1 << 23) as u32,
                );
                blk[..4].copy_from_slice(&s.to_le_bytes());
            }
            _ => blk[..2].copy_from_slice(&d.to_le_bytes()),
        }
    }
    out
}

fn quantized_acts(rng: &mut SplitMix64, at: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let row = at.row_bytes(k).expect("k fits");
    let mut out = vec![0u8; row * n];
    for r in 0..n {
        let f: Vec<f32> = (0..k)
            .map(|_| (rng.next_f64() - 0.5) as f32 * 4.0)
            .collect();
        scalar::quantize_row(at, &f, &mut out[r * row..][..row]).expect("quantize activations");
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    ty: GgmlType,
    seed: u64,
    nb: usize,
    rows: usize,
    n: usize,
    extreme: bool,
    quant_x: bool,
) -> Result<(), String> {
    let mut rng = SplitMix64::new(seed);
    let k = nb * ty.block_len();
    let w = blocks(&mut rng, ty, nb * rows, extreme);
    let at = ty.vec_dot_type();
    let x = if quant_x {
        quantized_acts(&mut rng, at, k, n)
    } else {
        blocks(&mut rng, at, k / at.block_len() * n, extreme)
    };
    check(ty, k, &w, rows, &x, n)
}

#[test]
fn edge_cases() {
    let mut failures = Vec::new();
    for (ci, ty) in TYPES.into_iter().enumerate() {
        let unit = unit(ty);
        for (nb, rows, n) in [
            (1, 1, 1),
            (2, 3, 5),
            (3, 9, 17),
            (1, 2, 70),
            // whole 16-row tiles (one weight row per lane) and a remainder, with 1, 4 and
            // more activation rows than a tile keeps in registers
            (2, 16, 1),
            (1, 33, 4),
            (2, 17, 6),
            // more than 4 activation rows: 16 per lane, a last group of at most 8 (24) or
            // more (25), and two passes over the activations (64 rows a pass, then 6)
            (2, 3, 24),
            (1, 3, 25),
            (3, 5, 70),
            // weight rows in blocks of 64 (64, 64, then 2)
            (1, 130, 9),
        ] {
            for (extreme, quant_x) in [(false, false), (true, false), (false, true)] {
                let seed = 1000 * ci as u64 + 7 * nb as u64 + n as u64;
                if let Err(e) = run_case(ty, seed, nb * unit, rows, n, extreme, quant_x) {
                    failures.push(e);
                }
            }
        }
        // rows of 3 smaller blocks (96 to 384 elements): no whole units, scalar fallback
        if unit > 1 {
            if let Err(e) = run_case(ty, 5, 3, 2, 3, false, true) {
                failures.push(e);
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

/// Weights at the extremes of every sign and grid, activations all -128.
#[test]
fn minus_128_activations_are_exact() {
    for (ty, rows) in TYPES.into_iter().flat_map(|t| [(t, 1), (t, 16)]) {
        let k = 256;
        let mut rng = SplitMix64::new(99);
        let w = blocks(&mut rng, ty, rows * k / ty.block_len(), false);
        let mut x = vec![0x80u8; ty.vec_dot_type().row_bytes(k).expect("k fits")];
        let at = ty.vec_dot_type();
        for blk in x.chunks_exact_mut(at.block_bytes()) {
            if at == GgmlType::Q8_K {
                blk[..4].copy_from_slice(&1.0f32.to_le_bytes());
                for b in blk[260..].chunks_exact_mut(2) {
                    b.copy_from_slice(&(-2048i16).to_le_bytes());
                }
            } else {
                blk[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
            }
        }
        check(ty, k, &w, rows, &x, 1).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// ggml's golden vectors for these types (tests/golden-iq, tests/golden-fp): every tier gives
/// `dot_ref`'s bits.
#[test]
fn golden_vectors() {
    for ty in TYPES {
        let sub = if ty.is_iq() { "golden-iq" } else { "golden-fp" };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join(sub);
        let text = std::fs::read_to_string(dir.join("manifest.json")).expect("golden manifest");
        let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest is json");
        let k = manifest["k"].as_u64().expect("k") as usize;
        let entry = &manifest["kinds"][ty.name()];
        let load = |name: &str| -> Vec<u8> {
            let file = entry["arrays"][name]["file"].as_str().expect("file name");
            std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
        };
        let (w, x) = (load("w_q"), load("x_q"));
        let dot: Vec<f32> = load("dot_ref")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let rows = w.len() / ty.row_bytes(k).expect("k fits");
        let n = x.len() / ty.vec_dot_type().row_bytes(k).expect("k fits");
        for (name, ok, got) in tiers(ty, k, &w, rows, &x, n) {
            assert!(ok, "{name} has no path for {ty}");
            for (i, (g, e)) in got.iter().zip(&dot).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{name} {ty} row {} act {}: {g:e} vs ggml {e:e}",
                    i / n,
                    i % n
                );
            }
        }
    }
}

#[test]
fn simd_tiers_exist_here() {
    let names: Vec<&str> = tiers(GgmlType::IQ1_S, 256, &[0; 50], 1, &[0; 292], 1)
        .into_iter()
        .map(|t| t.0)
        .collect();
    eprintln!("tiers with an i-quant path checked here: {names:?}");
}

/// `PROPTEST_CASES` when set (slow emulated runs lower it), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(256)))]

    #[test]
    fn every_tier_matches_the_reference(
        ty in prop::sample::select(TYPES.to_vec()),
        seed in any::<u64>(),
        nb in 1usize..=3,
        rows in prop::sample::select(vec![1usize, 2, 3, 5, 8, 16, 19]),
        n in prop::sample::select(vec![1usize, 2, 3, 4, 5, 6, 7, 8, 9]),
        extreme in any::<bool>(),
        quant_x in any::<bool>(),
    ) {
        let nb = nb * unit(ty);
        if let Err(e) = run_case(ty, seed, nb, rows, n, extreme, quant_x) {
            prop_assert!(false, "{}", e);
        }
    }
}
