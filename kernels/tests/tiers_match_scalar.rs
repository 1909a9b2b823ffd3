//! Property: `gemm` on every tier this CPU can run, with or without a thread pool, gives exactly
//! the scalar reference's bits — for every weight type, random blocks with extreme and zero
//! scales, all-zero blocks, batch sizes 1, 2, 3, 5, 17 and row counts that are not multiples of
//! any tile size. Activations come from the reference quantizer (as in production), including
//! zero blocks and extreme magnitudes. (Tier owners add their own tests next to this one.)

mod common;

use common::tile::tile;
use nightshift_kernels::dispatch::{self, Tier};
use nightshift_kernels::rng::SplitMix64;
use nightshift_kernels::{quantize_row, scalar, GgmlType, QMatrix};
use proptest::prelude::*;

/// splitmix64: a tiny deterministic generator so that one proptest seed describes a whole case.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

const WEIGHT_TYPES: [GgmlType; 17] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// An f16 scale: zero, the smallest subnormal, the smallest normal, 1, +-65504, or random finite.
fn f16_scale(rng: &mut Rng) -> u16 {
    match rng.below(8) {
        0 => 0x0000,
        1 => 0x0001,
        2 => 0x0400,
        3 => 0x3c00,
        4 => 0x7bff,
        5 => 0xfbff,
        _ => {
            let sign = (rng.below(2) as u16) << 15;
            let exp = (rng.below(31) as u16) << 10; // never 31: no inf/NaN
            sign | exp | rng.below(1024) as u16
        }
    }
}

fn f32_values(rng: &mut Rng, count: usize, zero_blocks: bool) -> Vec<f32> {
    let mut v = Vec::with_capacity(count);
    for blk in 0..count.div_ceil(256) {
        let magnitude = match rng.below(6) {
            0 => 1e-30,
            1 => 1e-3,
            2 => 1.0,
            3 => 1e4,
            4 => 3e4,
            _ => 30.0,
        };
        let zero = zero_blocks && rng.below(5) == 0;
        for _ in 0..(count - blk * 256).min(256) {
            v.push(if zero { 0.0 } else { rng.unit() * magnitude });
        }
    }
    v
}

fn weights(ty: GgmlType, k: usize, m: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(k).expect("k fits");
    let mut w = vec![0u8; rb * m];
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        for row in w.chunks_mut(rb) {
            quantize_row(ty, &f32_values(rng, k, true), row).expect("float row");
        }
        return w;
    }
    for b in w.iter_mut() {
        *b = rng.next() as u8;
    }
    for blk in w.chunks_mut(ty.block_bytes()) {
        if rng.below(10) == 0 {
            blk.fill(0);
            continue;
        }
        for &off in ty.f16_fields() {
            blk[off..off + 2].copy_from_slice(&f16_scale(rng).to_le_bytes());
        }
    }
    w
}

fn activations(ty: GgmlType, k: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let at = ty.vec_dot_type();
    let rb = at.row_bytes(k).expect("k fits");
    let mut x = vec![0u8; rb * n];
    for row in x.chunks_mut(rb) {
        quantize_row(at, &f32_values(rng, k, true), row).expect("activation row");
    }
    x
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn check_case(ty: GgmlType, blocks256: usize, m: usize, n: usize, seed: u64) -> Result<(), String> {
    let mut rng = Rng(SplitMix64::new(seed));
    let k = 256 * blocks256;
    let w = weights(ty, k, m, &mut rng);
    let x = activations(ty, k, n, &mut rng);

    let mut expect = vec![0f32; m * n];
    scalar::gemm_block(&mut tile(ty, k, &w, m, &x, n, &mut expect)).map_err(|e| e.to_string())?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .map_err(|e| e.to_string())?;
    let wq = QMatrix::new(ty, m, k, &w).map_err(|e| e.to_string())?;
    for tier in dispatch::available_tiers() {
        for p in [None, Some(&pool)] {
            let mut out = vec![f32::NAN; m * n];
            dispatch::gemm_with(tier, wq, &x, n, &mut out, p)
                .map_err(|e| format!("{tier}: {e}"))?;
            for i in 0..m {
                for j in 0..n {
                    let (got, want) = (out[j * m + i], expect[i * n + j]);
                    if !same_bits(got, want) {
                        return Err(format!(
                            "{ty} on {tier} (pool: {}), k={k} m={m} n={n}: row {i} act {j}: got {got:e} ({:#010x}), scalar {want:e} ({:#010x})",
                            p.is_some(),
                            got.to_bits(),
                            want.to_bits()
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// `PROPTEST_CASES` when set (slow emulated runs lower it), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), ..ProptestConfig::default() })]

    #[test]
    fn every_tier_is_bit_identical_to_scalar(
        ti in 0..WEIGHT_TYPES.len(),
        blocks256 in 1usize..=3,
        m in 1usize..=19,
        ni in 0usize..5,
        seed in any::<u64>(),
    ) {
        let n = [1, 2, 3, 5, 17][ni];
        if let Err(e) = check_case(WEIGHT_TYPES[ti], blocks256, m, n, seed) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// A fixed sweep so every type meets every batch size at least once, whatever proptest draws.
#[test]
fn every_type_and_batch_size() {
    for (t, &ty) in WEIGHT_TYPES.iter().enumerate() {
        for (b, n) in [1usize, 2, 3, 5, 17].into_iter().enumerate() {
            let m = [1, 3, 7, 13, 18][(t + b) % 5];
            if let Err(e) = check_case(ty, 1 + (t + b) % 2, m, n, (t * 31 + b) as u64) {
                panic!("{e}");
            }
        }
    }
}

/// Outputs large enough that the pool shares the transpose into the output layout (64Ki cells
/// and more), with neither side a multiple of its 16-cell blocks.
#[test]
fn large_outputs_are_transposed_exactly() {
    for (ty, m, n) in [(GgmlType::Q8_0, 290, 230), (GgmlType::Q4_K, 1043, 67)] {
        if let Err(e) = check_case(ty, 1, m, n, 5) {
            panic!("{e}");
        }
    }
}

#[test]
fn tier_names_round_trip() {
    for t in Tier::ALL {
        assert_eq!(Tier::from_name(t.name()), Some(t));
    }
    assert_eq!(Tier::from_name("AVX2"), Some(Tier::Avx2));
    assert_eq!(Tier::from_name("sse"), None);
    assert_eq!(dispatch::available_tiers().first(), Some(&Tier::Scalar));
}
