//! `matmul_many` (the fused q/k/v projection) against separate `matmul` calls on a real fixture's
//! attention weights: the same bits for 1 and several activation rows, with and without a pool,
//! and mismatched inputs are errors.

use nightshift_model::build_pool;
use nightshift_model::ops::{matmul, matmul_many};
use nightshift_model::weights::AttnWeights;

mod fixture_util;
use fixture_util::model;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn fused_projections_have_the_bits_of_separate_matmuls() {
    let pool = build_pool(2).expect("pool");
    for name in [
        "tiny-qwen3moe-Q4_K_M.gguf",
        "tiny-qwen3moe-Q2_K.gguf",
        "tiny-deepseek2-Q4_K_M.gguf",
    ] {
        let m = model(name);
        // the projections of the normalised hidden rows each architecture fuses
        let (q, k, v) = match &m.weights().layers[0].attn {
            AttnWeights::Gqa { q, k, v, .. } => (q, k, v),
            AttnWeights::Mla {
                q_a, q_b, kv_a_mqa, ..
            } => (q_a.as_ref().map_or(q_b, |(w, _)| w), kv_a_mqa, kv_a_mqa),
        };
        let e = q.ne[0];
        for n in [1usize, 3] {
            let x: Vec<f32> = (0..n * e)
                .map(|i| (((i * 7919) % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 3) as f32))
                .collect();
            let sizes = [q.ne[1] * n, k.ne[1] * n, v.ne[1] * n];
            let mut want: Vec<Vec<f32>> = sizes.iter().map(|&s| vec![0f32; s]).collect();
            for (w, out) in [q, k, v].into_iter().zip(want.iter_mut()) {
                matmul(w, 0, &x, n, out, None).expect("matmul");
            }
            for p in [None, Some(&*pool)] {
                let mut got: Vec<Vec<f32>> = sizes.iter().map(|&s| vec![0f32; s]).collect();
                {
                    let [a, b, c] = &mut got[..] else {
                        unreachable!()
                    };
                    matmul_many(&[q, k, v], &x, n, &mut [a, b, c], p).expect("matmul_many");
                }
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(bits(g), bits(w), "{name} n={n} pool={}", p.is_some());
                }
            }
        }
        // two matrices, one output buffer
        let x = vec![0.5f32; e];
        let mut a = vec![0f32; q.ne[1]];
        assert!(matmul_many(&[q, k], &x, 1, &mut [&mut a], None).is_err());
        // an output too short for its matrix is refused before anything is written
        let (mut b, mut c) = (vec![7f32; q.ne[1]], vec![7f32; k.ne[1] - 1]);
        assert!(matmul_many(&[q, k], &x, 1, &mut [&mut b, &mut c], None).is_err());
        assert!(b.iter().chain(&c).all(|&v| v == 7.0));
    }
}
