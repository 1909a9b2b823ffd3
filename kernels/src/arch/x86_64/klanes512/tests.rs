//! Batch sizes 1..=6 and a row count with a partial tile for every kind on this path: the
//! fused small-batch path (1..=4) and the tiled one (5, 6) against the scalar tier's bits,
//! through the dispatcher and directly with and without the GFNI decoders.

use super::super::kblock::{Q3, Q4, Q5, Q6};
use crate::dispatch::{available_tiers, gemm_with, Tier};
use crate::{quantize_row, GgmlType};

fn rows_of(ty: GgmlType, k: usize, count: usize, seed: u32) -> Vec<u8> {
    let rb = ty.row_bytes(k).expect("k is a multiple of 256");
    let mut out = vec![0u8; count * rb];
    let mut s = seed;
    for row in out.chunks_exact_mut(rb) {
        let f: Vec<f32> = (0..k)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect();
        quantize_row(ty, &f, row).expect("quantize");
    }
    out
}

/// `gemm_impl::<K, G>` on `m` rows of `w` and `n` Q8_K rows `x` of `k` elements, in the
/// dispatcher's output order (activation-major).
fn direct<const K: u8, const G: bool>(
    k: usize,
    w: &[u8],
    m: usize,
    x: &[u8],
    n: usize,
) -> Vec<f32> {
    let nb = k / 256;
    let mut xp = vec![0u8; n * nb * 256];
    let mut out = vec![0f32; m * n];
    // SAFETY: the caller checked the CPU features (GFNI too when `G`); the buffers have the
    // sizes `pack` and `gemm_impl` need.
    unsafe {
        super::pack::<K>(x.as_ptr(), n * nb, xp.as_mut_ptr());
        super::gemm_impl::<K, G>(super::KArgs {
            nb,
            w: w.as_ptr(),
            rows: m,
            x: x.as_ptr(),
            xp: xp.as_ptr(),
            n,
            out: out.as_mut_ptr(),
        });
    }
    (0..n * m).map(|i| out[(i % m) * n + i / m]).collect()
}

#[test]
fn small_and_tiled_batches_match_the_scalar_tier() {
    let cpu = crate::dispatch::x86_features();
    if !available_tiers().contains(&Tier::Avx512Vnni) || !cpu.avx512vbmi {
        return;
    }
    let gfni = cpu.gfni;
    let (k, m) = (512, 11);
    for ty in [
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let w = rows_of(ty, k, m, 7);
        for n in 1..=6 {
            let x = rows_of(GgmlType::Q8_K, k, n, 100 + n as u32);
            let mut want = vec![0f32; m * n];
            let mut got = vec![0f32; m * n];
            let wq = crate::QMatrix::new(ty, m, k, &w).expect("weight rows");
            gemm_with(Tier::Scalar, wq, &x, n, &mut want, None).expect("scalar");
            gemm_with(Tier::Avx512Vnni, wq, &x, n, &mut got, None).expect("avx512");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{} n={n}", ty.name());
            macro_rules! both {
                ($k:expr) => {{
                    let plain = direct::<{ $k }, false>(k, &w, m, &x, n);
                    assert_eq!(
                        bits(&plain),
                        bits(&want),
                        "{} n={n} without gfni",
                        ty.name()
                    );
                    if gfni {
                        let g = direct::<{ $k }, true>(k, &w, m, &x, n);
                        assert_eq!(bits(&g), bits(&want), "{} n={n} gfni", ty.name());
                    }
                }};
            }
            match ty {
                GgmlType::Q3_K => both!(Q3),
                GgmlType::Q4_K => both!(Q4),
                GgmlType::Q5_K => both!(Q5),
                _ => both!(Q6),
            }
        }
    }
}
