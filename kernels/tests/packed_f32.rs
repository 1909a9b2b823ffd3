//! `PackedF32` against the scalar reference `gemm(F32)` (ggml's generic f32-product, f64-sum dot):
//! every output bit must match, for row counts around the 16-row tile and the tile pairs, odd row
//! lengths, several activation rows, with and without a pool; bad lengths are errors.

use nightshift_kernels::dispatch::{gemm_with, Tier};
use nightshift_kernels::{GgmlType, KernelError, PackedF32, QMatrix};

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            // mixed magnitudes, so the f64 sums carry bits an f32 sum would lose
            if i % 7 == 0 {
                u * 1e4
            } else {
                u * 1e-3
            }
        })
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn packed_gemm_has_the_scalar_bits() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    // (rows, k) pairs: tile edges and odd lengths, plus ones large enough that the pool is used
    // (200 x 2100 x n >= 3: over a million products; 128 x 2048 x 1, the Qwen3 router for one
    // token: a quarter million, the smallest split)
    let mut shapes: Vec<(usize, usize)> = Vec::new();
    for &rows in &[1usize, 15, 16, 17, 31, 33, 48, 128] {
        for &k in &[1usize, 7, 64, 257] {
            shapes.push((rows, k));
        }
    }
    shapes.push((200, 2100));
    shapes.push((128, 2048));
    for &(rows, k) in &shapes {
        {
            let w = values(rows * k, rows as u64 * 1000 + k as u64);
            let packed = PackedF32::pack(&bytes(&w), rows, k).expect("pack");
            for &n in &[1usize, 2, 5] {
                let x = values(n * k, 7 + n as u64);
                let mut want = vec![0f32; rows * n];
                let wb = bytes(&w);
                let wq = QMatrix::new(GgmlType::F32, rows, k, &wb).expect("f32 rows");
                gemm_with(Tier::Scalar, wq, &bytes(&x), n, &mut want, None).expect("scalar gemm");
                for p in [None, Some(&pool)] {
                    let mut got = vec![0f32; rows * n];
                    packed.gemm(&x, n, &mut got, p).expect("packed gemm");
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "rows {rows} k {k} n {n} pool {}",
                        p.is_some()
                    );
                }
            }
        }
    }
}

#[test]
fn bad_lengths_are_errors() {
    let w = bytes(&values(3 * 8, 1));
    assert!(matches!(
        PackedF32::pack(&w[1..], 3, 8),
        Err(KernelError::Length { .. })
    ));
    assert!(matches!(
        PackedF32::pack(&w, usize::MAX, 8),
        Err(KernelError::Overflow { .. })
    ));
    let p = PackedF32::pack(&w, 3, 8).expect("pack");
    let mut out = vec![0f32; 3];
    assert!(matches!(
        p.gemm(&[0.0; 7], 1, &mut out, None),
        Err(KernelError::Elements { .. })
    ));
    assert!(matches!(
        p.gemm(&[0.0; 8], 1, &mut out[..2], None),
        Err(KernelError::Elements { .. })
    ));
    assert!(p.gemm(&[], 0, &mut [], None).is_ok());
}
