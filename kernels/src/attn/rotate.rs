//! The attention rotation llama.cpp applies to a quantized K/V cache (its default since the
//! Hadamard rotation of `llama-kv-cache.cpp`; `LLAMA_ATTN_ROT_DISABLE=1` turns it off there):
//! on grouped-query attention with a quantized cache, q and k are multiplied by an orthonormal
//! Walsh-Hadamard matrix before k is stored (chunks of `n_rot_k` along each head), v by one of
//! order 64 before it is stored, and the attention output by that same matrix again (it is its
//! own inverse), so the result is the unrotated one up to rounding while the quantized rows hold
//! values with their outliers spread over the chunk — less quantization error.
//!
//! ggml computes the product as a fast Walsh-Hadamard transform (`ggml_compute_forward_fwht`,
//! taken for a `mul_mat` hinted `GGML_HINT_SRC0_IS_HADAMARD`): each element is first multiplied
//! by `1 / sqrtf(n)`, then butterflies of width 1, 2, 4, ..., n/2 replace each pair `(u, v)` by
//! `(u + v, u - v)` in place, the natural (Sylvester) order. Every operation here is the same
//! and in the same order, so the rotated rows are ggml's bit for bit (its SIMD passes compute
//! `u - v` as `fma(v, -1, u)`, which is exact and equal).

/// Rotates each consecutive chunk of `n` floats of `x` by the orthonormal Walsh-Hadamard matrix
/// of order `n` (a power of two; `x.len()` a multiple of it), as ggml does (module docs).
pub fn hadamard_chunks(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "expected chunks of a power of two, found {} floats in chunks of {n}",
        x.len()
    );
    let scale = 1.0f32 / (n as f32).sqrt();
    for c in x.chunks_exact_mut(n) {
        c.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for pair in c.chunks_exact_mut(2 * len) {
                let (a, b) = pair.split_at_mut(len);
                for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                    let (s, d) = (*u + *v, *u - *v);
                    *u = s;
                    *v = d;
                }
            }
            len *= 2;
        }
    }
}

/// The chunk llama.cpp rotates K (and q) by for heads of `head_k` floats: the largest power of
/// two from 64 up that divides it; 0 (no rotation) when 64 does not.
pub fn k_chunk(head_k: usize) -> usize {
    if head_k == 0 || !head_k.is_multiple_of(64) {
        return 0;
    }
    let mut n = 64;
    while head_k.is_multiple_of(2 * n) {
        n *= 2;
    }
    n
}

/// The chunk llama.cpp rotates V (and the attention output) by for heads of `head_v` floats: 64
/// when it divides them (llama.cpp found smaller V rotations better), otherwise 0.
pub fn v_chunk(head_v: usize) -> usize {
    if head_v != 0 && head_v.is_multiple_of(64) {
        64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        crate::rng::SplitMix64::new(seed).signed_units(len)
    }

    /// ggml_gen_hadamard's matrix: H[0][0] = 1/sqrt(n), doubled block by block.
    fn matrix(n: usize) -> Vec<f64> {
        let mut h = vec![0.0f64; n * n];
        h[0] = 1.0 / (n as f64).sqrt();
        let mut s = 1;
        while s < n {
            for i in 0..s {
                for j in 0..s {
                    let v = h[i * n + j];
                    h[(i + s) * n + j] = v;
                    h[i * n + j + s] = v;
                    h[(i + s) * n + j + s] = -v;
                }
            }
            s *= 2;
        }
        h
    }

    #[test]
    fn the_transform_is_the_hadamard_product_per_chunk() {
        for n in [64usize, 128, 256] {
            let x = values(3 * n, n as u64);
            let mut y = x.clone();
            hadamard_chunks(&mut y, n);
            let h = matrix(n);
            for (xc, yc) in x.chunks_exact(n).zip(y.chunks_exact(n)) {
                for i in 0..n {
                    let want: f64 = (0..n).map(|j| h[i * n + j] * xc[j] as f64).sum();
                    assert!(
                        (yc[i] as f64 - want).abs() < 1e-5,
                        "n {n} row {i}: {} vs {want}",
                        yc[i]
                    );
                }
            }
        }
    }

    #[test]
    fn rotating_twice_gives_the_input_back_up_to_rounding() {
        let x = values(256, 7);
        let mut y = x.clone();
        hadamard_chunks(&mut y, 64);
        assert!(x.iter().zip(&y).any(|(a, b)| a != b));
        hadamard_chunks(&mut y, 64);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn the_butterflies_run_in_ggmls_order() {
        // Two chunks of 64 of values whose sums round differently under another order: the
        // first output of each chunk is ((x0 + x1) + (x2 + x3)) + ..., pairs at width 1 first.
        let mut x = vec![0.0f32; 128];
        x[0] = 1.0e8;
        x[1] = 1.0;
        x[2] = -1.0e8;
        x[3] = 1.0;
        x[64..].copy_from_slice(&values(64, 3));
        let mut y = x.clone();
        hadamard_chunks(&mut y, 64);
        let s = 1.0f32 / 8.0;
        // width 1: (x0 + x1), (x2 + x3); width 2: their sum; all scaled first
        let want = (1.0e8f32 * s + 1.0 * s) + (-1.0e8f32 * s + 1.0 * s);
        assert_eq!(y[0], want);
    }

    #[test]
    fn chunks_follow_llama_cpp() {
        assert_eq!(k_chunk(64), 64);
        assert_eq!(k_chunk(128), 128);
        assert_eq!(k_chunk(192), 64);
        assert_eq!(k_chunk(576), 64);
        assert_eq!(k_chunk(96), 0);
        assert_eq!(k_chunk(48), 0);
        assert_eq!(v_chunk(128), 64);
        assert_eq!(v_chunk(512), 64);
        assert_eq!(v_chunk(32), 0);
    }
}
