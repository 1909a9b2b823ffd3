//! The x86_64 SIMD tiers (AVX2, AVX-512-VNNI) against the scalar reference, bit for bit:
//! property tests over random blocks (every byte value, extreme/zero/subnormal scales, zero
//! blocks, activation counts that leave tile remainders), hand-picked edge cases, and ggml's
//! golden vectors. A tier this CPU lacks is reported and skipped.
#![cfg(target_arch = "x86_64")]

mod common;

use common::tile::tile;
use nightshift_kernels::arch::x86_64::{Avx2, Avx512Vnni};
use nightshift_kernels::rng::SplitMix64;
use nightshift_kernels::{scalar, GgmlType, QMatrix};
use proptest::prelude::*;

/// Types with an x86 path in both tiers.
const TYPES: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    Avx2,
    Avx512,
}

const TIERS: [Tier; 2] = [Tier::Avx2, Tier::Avx512];

/// Runs `tier`: None when this CPU lacks it, else whether it had a path.
#[allow(clippy::too_many_arguments)]
fn run(
    tier: Tier,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> Option<bool> {
    match tier {
        Tier::Avx2 => Avx2::new().map(|t| t.gemm_block(&mut tile(ty, k, w, rows, x, n, out))),
        Tier::Avx512 => {
            Avx512Vnni::new().map(|t| t.gemm_block(&mut tile(ty, k, w, rows, x, n, out)))
        }
    }
}

/// `check(tier, case) -> Ok` when every output has the reference's bits.
fn check(
    tier: Tier,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
) -> Result<(), String> {
    let mut expect = vec![0f32; rows * n];
    scalar::gemm_block(&mut tile(ty, k, w, rows, x, n, &mut expect)).map_err(|e| e.to_string())?;
    let mut got = vec![f32::NAN; rows * n];
    match run(tier, ty, k, w, rows, x, n, &mut got) {
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

#[derive(Clone, Copy, Debug)]
enum Scales {
    Normal,
    /// Half the scales from: zero, -0, f16 max, f16 min normal, f16 subnormals, large/tiny f32.
    Extreme,
}

fn f16_scale(rng: &mut SplitMix64, s: Scales) -> u16 {
    const EXTREME: [u16; 9] = [
        0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400, 0x0001, 0x83ff, 0x0200, 0x3c00,
    ];
    if matches!(s, Scales::Extreme) && rng.below(2) == 0 {
        return EXTREME[rng.below(EXTREME.len() as u64) as usize];
    }
    let exp = match s {
        Scales::Normal => 4 + rng.below(12),
        Scales::Extreme => rng.below(31),
    } as u16;
    ((rng.below(2) as u16) << 15) | (exp << 10) | rng.below(1024) as u16
}

/// A finite Q8_K scale, small enough that no product reaches infinity.
fn f32_scale(rng: &mut SplitMix64, s: Scales) -> f32 {
    const EXTREME: [f32; 6] = [0.0, -0.0, 2.5e5, -1.0e-30, f32::MIN_POSITIVE, 1.0e-42];
    if matches!(s, Scales::Extreme) && rng.below(2) == 0 {
        return EXTREME[rng.below(EXTREME.len() as u64) as usize];
    }
    let exp = match s {
        Scales::Normal => 115 + rng.below(12),
        Scales::Extreme => 1 + rng.below(145),
    } as u32;
    f32::from_bits(((rng.below(2) as u32) << 31) | (exp << 23) | rng.below(1 << 23) as u32)
}

/// `count` blocks of `ty` with random bytes (every quant value, bsums unrelated to the quants)
/// and valid finite scales; with `zero_every > 0` about one block in `zero_every` is all zero.
fn blocks(rng: &mut SplitMix64, ty: GgmlType, count: usize, s: Scales, zero_every: u64) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut out = vec![0u8; bb * count];
    for blk in out.chunks_exact_mut(bb) {
        if zero_every > 0 && rng.below(zero_every) == 0 {
            continue;
        }
        for v in blk.iter_mut() {
            *v = rng.next_u64() as u8;
        }
        if ty == GgmlType::Q8_K {
            blk[..4].copy_from_slice(&f32_scale(rng, s).to_le_bytes());
        }
        for &at in ty.f16_fields() {
            blk[at..at + 2].copy_from_slice(&f16_scale(rng, s).to_le_bytes());
        }
    }
    out
}

/// Activations made the production way (random floats through the reference quantizer).
fn quantized_acts(rng: &mut SplitMix64, ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let at = ty.vec_dot_type();
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

/// One generated case: (k, weights, activations).
#[allow(clippy::too_many_arguments)]
fn case(
    ty: GgmlType,
    seed: u64,
    nb: usize,
    rows: usize,
    n: usize,
    s: Scales,
    zero_every: u64,
    quant_x: bool,
) -> (usize, Vec<u8>, Vec<u8>) {
    let mut rng = SplitMix64::new(seed);
    let k = nb * ty.block_len();
    let w = blocks(&mut rng, ty, nb * rows, s, zero_every);
    let x = if quant_x {
        quantized_acts(&mut rng, ty, k, n)
    } else {
        blocks(&mut rng, ty.vec_dot_type(), nb * n, s, zero_every)
    };
    (k, w, x)
}

#[test]
fn tiers_detected_here() {
    eprintln!(
        "avx2={} avx512vnni={}",
        Avx2::new().is_some(),
        Avx512Vnni::new().is_some()
    );
    if std::env::var_os("NIGHTSHIFT_EXPECT_AVX512").is_some() {
        assert!(
            Avx512Vnni::new().is_some(),
            "this CPU should offer AVX-512-VNNI"
        );
    }
}

/// Bad lengths cannot reach a tier (a `Tile` is checked when built: `api.rs`); a type without a
/// path is a `false`, never a result.
#[test]
fn types_without_a_path_return_false() {
    let k = 256;
    for ty in [GgmlType::Q4_0, GgmlType::F32, GgmlType::Q4_1] {
        let w = vec![0u8; ty.row_bytes(k).expect("k fits")];
        let x = vec![0u8; ty.vec_dot_type().row_bytes(k).expect("k fits")];
        for tier in TIERS {
            assert_ne!(
                run(tier, ty, k, &w, 1, &x, 1, &mut [0.0]),
                Some(true),
                "{tier:?} {ty:?}"
            );
        }
    }
}

#[test]
fn edge_cases() {
    // (name, blocks per row, rows, acts, scales, zero every, quantized acts)
    type Case = (&'static str, usize, usize, usize, Scales, u64, bool);
    let cases: [Case; 14] = [
        ("single", 1, 1, 1, Scales::Normal, 0, false),
        (
            "2 row tiles + 3 rows x more acts than a chunk",
            2,
            19,
            67,
            Scales::Normal,
            0,
            true,
        ),
        (
            "row tiles + remainder, batch 1",
            3,
            21,
            1,
            Scales::Extreme,
            0,
            false,
        ),
        ("8 acts: full 1x8 tile", 2, 3, 8, Scales::Normal, 0, false),
        (
            "9 acts: tile + remainder",
            2,
            9,
            9,
            Scales::Normal,
            0,
            false,
        ),
        (
            "rows not a multiple of 8",
            1,
            11,
            3,
            Scales::Normal,
            0,
            false,
        ),
        ("17 acts", 1, 5, 17, Scales::Normal, 0, false),
        ("more acts than a chunk", 1, 2, 70, Scales::Normal, 0, false),
        ("extreme scales", 3, 3, 5, Scales::Extreme, 0, false),
        ("zero blocks", 4, 3, 3, Scales::Normal, 2, false),
        ("all zero", 1, 2, 2, Scales::Normal, 1, false),
        ("quantized activations", 3, 4, 5, Scales::Normal, 0, true),
        ("long rows", 9, 2, 2, Scales::Normal, 0, true),
        (
            "6 acts: the widest fused batch",
            2,
            9,
            6,
            Scales::Extreme,
            3,
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (ci, (name, nb, rows, n, s, zero_every, quant_x)) in cases.into_iter().enumerate() {
        for ty in TYPES {
            let nb = if ty == GgmlType::Q8_0 { nb * 3 } else { nb };
            let (k, w, x) = case(ty, 77 + ci as u64, nb, rows, n, s, zero_every, quant_x);
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

/// Every byte value of Q8_0 weights and activations, including -128 x -128 (where ggml's own
/// AVX2 sign trick overflows).
#[test]
fn q8_0_minus_128_is_exact() {
    let mut w = vec![0x80u8; 34 * 2];
    let mut x = vec![0x80u8; 34 * 2];
    for blk in w.chunks_exact_mut(34).chain(x.chunks_exact_mut(34)) {
        blk[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
    }
    let mut expect = [0f32; 1];
    scalar::gemm_block(&mut tile(GgmlType::Q8_0, 64, &w, 1, &x, 1, &mut expect)).expect("valid");
    assert_eq!(expect[0], 64.0 * 16384.0);
    for tier in TIERS {
        check(tier, GgmlType::Q8_0, 64, &w, 1, &x, 1).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Q2_K at its bounds in every tier, at batches that take each AVX-512 path (1: `q2k512`, 2..:
/// `q2k_row_lanes`): every 2-bit value 3 with scale and min 15 (the largest `4 * w * scale`
/// byte the lane kernel builds), activations -128 and 127, bsums at the i16 extremes, 16 + 3 rows.
#[test]
fn q2_k_saturated() {
    let (nb, rows) = (2, 19);
    let mut w = vec![0xffu8; 84 * nb * rows];
    for blk in w.chunks_exact_mut(84) {
        blk[80..82].copy_from_slice(&0x3c00u16.to_le_bytes());
        blk[82..84].copy_from_slice(&0x3800u16.to_le_bytes());
    }
    for n in [1usize, 2, 3, 4, 5] {
        let mut x = vec![0u8; 292 * nb * n];
        for (i, blk) in x.chunks_exact_mut(292).enumerate() {
            blk[..4].copy_from_slice(&0.5f32.to_le_bytes());
            let q = if i % 2 == 0 { 0x80u8 } else { 0x7f };
            blk[4..260].fill(q);
            for (j, b) in blk[260..].chunks_exact_mut(2).enumerate() {
                let v: i16 = if (i + j) % 3 == 0 { i16::MIN } else { i16::MAX };
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        for tier in TIERS {
            check(tier, GgmlType::Q2_K, 256 * nb, &w, rows, &x, n)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The golden vectors copied into the project (from ../shared/fixtures/kernels).
fn golden_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// ggml's golden vectors: weights and activations quantized by ggml, `dot_ref` from ggml's
/// generic functions; every tier must give the same f32 bits.
#[test]
fn golden_vectors() {
    let dir = golden_dir();
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .unwrap_or_else(|e| panic!("golden manifest in {}: {e}", dir.display()));
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest is json");
    let k = manifest["k"].as_u64().expect("k") as usize;
    let mut checked = 0;
    for ty in TYPES {
        let Some(entry) = manifest["kinds"].get(ty.name()) else {
            continue;
        };
        let load = |name: &str| -> Vec<u8> {
            let file = entry["arrays"][name]["file"].as_str().expect("file name");
            std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
        };
        let w = load("w_q");
        let x = load("x_q");
        let dot: Vec<f32> = load("dot_ref")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let rows = w.len() / ty.row_bytes(k).expect("k fits");
        let n = x.len() / ty.vec_dot_type().row_bytes(k).expect("k fits");
        assert_eq!(dot.len(), rows * n, "{}", ty.name());
        for tier in TIERS {
            let mut got = vec![f32::NAN; rows * n];
            match run(tier, ty, k, &w, rows, &x, n, &mut got) {
                None => continue,
                Some(ok) => assert!(ok, "{tier:?} has no path for {}", ty.name()),
            }
            for (i, (g, e)) in got.iter().zip(&dot).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{tier:?} {} row {} act {}: {g:e} vs ggml {e:e}",
                    ty.name(),
                    i / n,
                    i % n
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked > 0 || Avx2::new().is_none(),
        "no golden type checked"
    );
}

fn type_strategy() -> impl Strategy<Value = GgmlType> {
    prop::sample::select(TYPES.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn every_tier_matches_the_reference(
        ty in type_strategy(),
        seed in any::<u64>(),
        nb in 1usize..=3,
        rows in prop::sample::select(vec![1usize, 2, 3, 5, 8, 9, 16, 17]),
        n in prop::sample::select(vec![1usize, 2, 3, 4, 5, 6, 7, 8, 17]),
        extreme in any::<bool>(),
        zero_every in prop::sample::select(vec![0u64, 3]),
        quant_x in any::<bool>(),
    ) {
        let s = if extreme { Scales::Extreme } else { Scales::Normal };
        let nb = if ty == GgmlType::Q8_0 { nb * 4 } else { nb };
        let (k, w, x) = case(ty, seed, nb, rows, n, s, zero_every, quant_x);
        for tier in TIERS {
            if let Err(e) = check(tier, ty, k, &w, rows, &x, n) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}

/// Through the public dispatcher, with and without a thread pool (rows split into tiles whose
/// sizes leave 4-row remainders): every x86 tier gives the scalar tier's bits.
#[test]
fn dispatch_with_pool_matches_scalar() {
    use nightshift_kernels::dispatch::{gemm_with, is_available, Tier as DTier};
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    for (ci, ty) in TYPES.into_iter().enumerate() {
        let nb = if ty == GgmlType::Q8_0 { 8 } else { 2 };
        for (m, n) in [(37usize, 1usize), (21, 3), (10, 9)] {
            let (k, w, x) = case(ty, 500 + ci as u64, nb, m, n, Scales::Normal, 5, true);
            let mut expect = vec![0f32; m * n];
            let wq = QMatrix::new(ty, m, k, &w).expect("weight rows");
            gemm_with(DTier::Scalar, wq, &x, n, &mut expect, None).expect("scalar");
            for tier in [DTier::Avx2, DTier::Avx512Vnni] {
                if !is_available(tier) {
                    continue;
                }
                for pool in [None, Some(&pool)] {
                    let mut got = vec![f32::NAN; m * n];
                    gemm_with(tier, wq, &x, n, &mut got, pool).expect("tier");
                    let same = got
                        .iter()
                        .zip(&expect)
                        .all(|(g, e)| g.to_bits() == e.to_bits());
                    assert!(
                        same,
                        "{tier:?} {} m={m} n={n} pool={}",
                        ty.name(),
                        pool.is_some()
                    );
                }
            }
        }
    }
}
