//! Repacked weights (`formats::repack`, `Layout::Rows4`: Q8_0, Q4_0, IQ4_NL, MXFP4, Q3_K, Q4_K, Q5_K and Q6_K four rows at a time)
//! give the scalar reference's bits on every tier: the aarch64 SDOT and SMMLA tiers read the
//! layout directly (checked here against the GGUF bytes' reference, at every activation count
//! that meets their remainders), every other tier through the scalar fallback's restore. A
//! repack with two rows' k-slices swapped must fail the comparison (so the tiers really read
//! the layout, not a GGUF copy), and mapped-order matrices keep working beside repacked ones.
#![allow(clippy::too_many_arguments)]

use nightshift_kernels::dispatch::{available_tiers, gemm_with};
use nightshift_kernels::formats::repack::{repack, Layout};
use nightshift_kernels::rng::SplitMix64;
use nightshift_kernels::{quantize_row, scalar, GgmlType, QMatrix};
use proptest::prelude::*;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// `blocks` weight blocks of `ty` in elements (a row length).
fn k_of(ty: GgmlType, blocks: usize) -> usize {
    ty.block_len() * blocks
}

/// Where two rows' first quant k-slices sit in a repacked group's first block: the byte ranges
/// of row 0's and row 1's (swapping them must break the result).
fn first_slices(ty: GgmlType) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    match ty {
        // lane 0 of run 0: row 0's four bytes, then row 1's
        GgmlType::Q4_K => (64..68, 68..72),
        // after the fifth-bit runs
        GgmlType::Q5_K => (192..196, 196..200),
        // after the scales: row 0's 192 quant bytes, then row 1's
        GgmlType::Q6_K => (72..264, 264..456),
        // after the scales: row 0's 96 quant bytes, then row 1's
        GgmlType::Q3_K => (56..152, 152..248),
        // MXFP4's four one-byte scales, then row 0's and row 1's 8-byte k-slices
        GgmlType::MXFP4 => (4..12, 12..20),
        // the scales take bytes 0..8, then row 0's and row 1's 8-byte k-slices
        _ => (8..16, 16..24),
    }
}

/// `rows` rows of `k` random values (per-row magnitudes from 2^-8 to 2^4) quantized to `ty`.
fn quantized(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let wrow = ty.row_bytes(k).expect("whole blocks");
    let mut out = vec![0u8; rows * wrow];
    let mut vals = vec![0f32; k];
    for r in 0..rows {
        let scale = (2f32).powi(rng.below(13) as i32 - 8);
        for v in &mut vals {
            *v = rng.gaussian() * scale;
        }
        if rng.below(8) == 0 {
            // a zero block now and then (d = 0)
            vals[..32].fill(0.0);
        }
        if ty == GgmlType::IQ4_NL {
            // no quantizer here: random codes under the row's f16 scale (a zero block too)
            // d (the type's one f16 field), then the codes
            let at = ty.f16_fields()[0];
            for (b, blk) in out[r * wrow..][..wrow]
                .chunks_exact_mut(ty.block_bytes())
                .enumerate()
            {
                for v in &mut blk[at + 2..] {
                    *v = rng.next_u64() as u8;
                }
                let d = if vals[32 * b..32 * b + 32].iter().all(|&v| v == 0.0) {
                    0.0
                } else {
                    scale / 64.0
                };
                let d = nightshift_kernels::formats::f32_to_f16(d);
                blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
            continue;
        }
        quantize_row(ty, &vals, &mut out[r * wrow..][..wrow]).expect("quantize");
    }
    out
}

/// The reference on GGUF bytes: `out[r * n + j] = scalar::vec_dot(W[r], x[j])`.
fn reference(ty: GgmlType, k: usize, w: &[u8], rows: usize, x: &[u8], n: usize) -> Vec<f32> {
    let wrow = ty.row_bytes(k).expect("k fits");
    let xrow = ty.vec_dot_type().row_bytes(k).expect("k fits");
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for j in 0..n {
            let v = scalar::vec_dot(ty, k, &w[r * wrow..][..wrow], &x[j * xrow..][..xrow]);
            out.push(v.expect("valid rows"));
        }
    }
    out
}

/// Weights, their Rows4 repack and activations for one case.
struct Case {
    ty: GgmlType,
    k: usize,
    rows: usize,
    n: usize,
    w: Vec<u8>,
    packed: Vec<u8>,
    x: Vec<u8>,
}

fn case(ty: GgmlType, k: usize, rows: usize, n: usize, seed: u64) -> Case {
    let w = quantized(ty, rows, k, seed);
    let x = quantized(ty.vec_dot_type(), n, k, seed ^ 0x5eed);
    let mut packed = vec![0u8; w.len()];
    let m = QMatrix::new(ty, rows, k, &w).expect("weights");
    repack(&m, Layout::Rows4, &mut packed).expect("rows4 fits");
    Case {
        ty,
        k,
        rows,
        n,
        w,
        packed,
        x,
    }
}

impl Case {
    fn matrix<'a>(&self, bytes: &'a [u8]) -> QMatrix<'a> {
        let m = QMatrix::new(self.ty, self.rows, self.k, bytes).expect("weights");
        m.in_layout(Layout::Rows4).expect("rows4 fits")
    }

    /// The reference, transposed to `gemm_with`'s `out[j * rows + r]`.
    fn expected(&self) -> Vec<f32> {
        let t = reference(self.ty, self.k, &self.w, self.rows, &self.x, self.n);
        let mut out = vec![0f32; t.len()];
        for r in 0..self.rows {
            for j in 0..self.n {
                out[j * self.rows + r] = t[r * self.n + j];
            }
        }
        out
    }

    /// Every available tier on the repacked bytes `packed`; Err names the first tier and
    /// output that differ from the reference.
    fn check_all(&self, packed: &[u8]) -> Result<(), String> {
        let expect = self.expected();
        for tier in available_tiers() {
            let mut got = vec![f32::NAN; expect.len()];
            gemm_with(tier, self.matrix(packed), &self.x, self.n, &mut got, None)
                .map_err(|e| format!("{tier}: {e}"))?;
            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != expect[i].to_bits()) {
                return Err(format!(
                    "{tier} {} k={} rows={} n={}: out[{i}] = {:e}, reference {:e}",
                    self.ty.name(),
                    self.k,
                    self.rows,
                    self.n,
                    got[i],
                    expect[i]
                ));
            }
        }
        Ok(())
    }
}

proptest! {
    #[test]
    fn repacked_weights_match_the_reference_on_every_tier(
        t in 0usize..6,
        blocks in 1usize..5,
        groups in 1usize..4,
        n in 1usize..12,
        seed in any::<u64>(),
    ) {
        let c = case(TYPES[t], k_of(TYPES[t], blocks), 4 * groups, n, seed);
        prop_assert_eq!(c.check_all(&c.packed), Ok(()));
    }
}

#[test]
fn repacked_weights_match_at_every_remainder() {
    for ty in TYPES {
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17] {
            let c = case(ty, k_of(ty, 4), 12, n, n as u64 * 31 + 5);
            assert_eq!(c.check_all(&c.packed), Ok(()));
        }
    }
}

/// Every quant and scale byte at or near an extreme (the f16 fields stay those of quantized
/// rows; activation quants of -128 and 127, Q8_K's group sums consistent with them): the largest integer sums and scale differences the
/// repacked kernels meet, at batches that reach each of their activation-row counts.
#[test]
fn repacked_saturated_quants_match() {
    let fills: [(&[u8], &[u8]); 4] = [
        (&[0x00], &[0x80]),
        (&[0xff], &[0x7f]),
        (&[0x80], &[0x80]),
        (&[0x00, 0xff, 0x80, 0x7f], &[0x80, 0x7f, 0x81]),
    ];
    for (fi, (wb, xb)) in fills.into_iter().enumerate() {
        for ty in TYPES {
            for n in [1, 2, 3, 4, 5, 9] {
                let mut c = case(ty, k_of(ty, 2), 8, n, 40 + fi as u64);
                let mut rng = SplitMix64::new(fi as u64);
                let keep = ty.f16_fields();
                for blk in c.w.chunks_exact_mut(ty.block_bytes()) {
                    for (i, v) in blk.iter_mut().enumerate() {
                        if !keep.iter().any(|&at| i == at || i == at + 1) {
                            *v = wb[rng.below(wb.len() as u64) as usize];
                        }
                    }
                }
                let act = ty.vec_dot_type();
                for blk in c.x.chunks_exact_mut(act.block_bytes()) {
                    if act == GgmlType::Q8_0 {
                        for v in &mut blk[2..] {
                            *v = xb[rng.below(xb.len() as u64) as usize];
                        }
                        continue;
                    }
                    // Q8_K: d (f32), 256 quants, then the 16 group sums, kept consistent
                    // (activations are always quantized in process).
                    for v in &mut blk[4..260] {
                        *v = xb[rng.below(xb.len() as u64) as usize];
                    }
                    for g in 0..16 {
                        let sum: i16 = blk[4 + 16 * g..][..16]
                            .iter()
                            .map(|&q| q as i8 as i16)
                            .sum();
                        blk[260 + 2 * g..][..2].copy_from_slice(&sum.to_le_bytes());
                    }
                }
                let m = QMatrix::new(ty, c.rows, c.k, &c.w).expect("weights");
                let mut packed = vec![0u8; c.w.len()];
                repack(&m, Layout::Rows4, &mut packed).expect("rows4 fits");
                assert_eq!(c.check_all(&packed), Ok(()), "fill {fi}");
            }
        }
    }
}

#[test]
fn a_repack_with_swapped_rows_fails() {
    for ty in TYPES {
        for n in [1, 4] {
            let c = case(ty, k_of(ty, 2), 8, n, 99);
            let mut broken = c.packed.clone();
            // first group, first block: swap rows 0 and 1's first quant k-slices
            let (r0, r1) = first_slices(ty);
            let (a, b) = broken[r0.start..r1.end].split_at_mut(r0.len());
            a.swap_with_slice(b);
            assert_ne!(broken, c.packed, "the swapped halves must differ");
            let err = c
                .check_all(&broken)
                .expect_err("a broken repack must not match");
            assert!(err.contains("out["), "{err}");
        }
    }
}

#[test]
fn repacked_row_ranges_split_over_a_pool() {
    // `gemm_with` hands each thread a row range: whole groups of four, same bits
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .expect("pool");
    for ty in TYPES {
        let c = case(ty, k_of(ty, 3), 40, 5, 7);
        let expect = c.expected();
        for tier in available_tiers() {
            let mut got = vec![f32::NAN; expect.len()];
            gemm_with(tier, c.matrix(&c.packed), &c.x, c.n, &mut got, Some(&pool)).expect("gemm");
            let same = got
                .iter()
                .zip(&expect)
                .all(|(g, e)| g.to_bits() == e.to_bits());
            assert!(same, "{tier} {}", ty.name());
        }
    }
}

/// The aarch64 tiers that read the layout take it directly (their `gemm_block` returns true,
/// no scalar restore), and match the reference.
#[cfg(target_arch = "aarch64")]
#[test]
fn aarch64_sdot_and_smmla_read_rows4() {
    use nightshift_kernels::arch::aarch64::{Dotprod, I8mm, Neon};
    use nightshift_kernels::Tile;
    let expect_all = std::env::var_os("NIGHTSHIFT_EXPECT_ALL_ARM_TIERS").is_some();
    for ty in TYPES {
        for n in [1, 2, 5, 8] {
            let c = case(ty, k_of(ty, 3), 8, n, 3 + n as u64);
            let expect = reference(ty, c.k, &c.w, c.rows, &c.x, n);
            let run = |f: &dyn Fn(&mut Tile<'_>) -> bool| -> Option<Vec<f32>> {
                let w = c.matrix(&c.packed);
                let x = QMatrix::activations(&w, &c.x, n).expect("activations");
                let mut out = vec![f32::NAN; c.rows * n];
                let took = f(&mut Tile::new(w, x, &mut out).expect("tile"));
                took.then_some(out)
            };
            let tiers: [(&str, Option<Option<Vec<f32>>>); 2] = [
                (
                    "dotprod",
                    Dotprod::new().map(|t| run(&|tile| t.gemm_block(tile))),
                ),
                ("i8mm", I8mm::new().map(|t| run(&|tile| t.gemm_block(tile)))),
            ];
            for (name, res) in tiers {
                match res {
                    None => assert!(!expect_all, "{name} missing"),
                    Some(None) => panic!("{name} did not take rows4 {}", ty.name()),
                    Some(Some(got)) => {
                        let same = got
                            .iter()
                            .zip(&expect)
                            .all(|(g, e)| g.to_bits() == e.to_bits());
                        assert!(same, "{name} {} n={n}", ty.name());
                    }
                }
            }
            // NEON has no rows4 path: it declines, and the scalar fallback restores the order
            if let Some(t) = Neon::new() {
                assert!(run(&|tile| t.gemm_block(tile)).is_none());
            }
        }
    }
}
