//! The element-wise and row operations of the forward pass, each written to follow ggml's CPU
//! implementation (accumulation width, order of float operations), plus `matmul`: quantize the
//! activation rows to the weight's `vec_dot_type` exactly as ggml's `mul_mat` does, then `gemm`.

use crate::error::ModelError;
use crate::weights::W;
use nightshift_kernels::{gemm, quantize_row, GgmlType};
use rayon::ThreadPool;

/// ggml_rms_norm followed by ggml_mul with `w`, on every row of `x` (row length `w.len()`).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, yr) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mut sum = 0.0f64;
        for &v in xr {
            sum += (v * v) as f64;
        }
        let mean = (sum / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        for ((y, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
            *y = (v * scale) * g;
        }
    }
}

/// In-place rms_norm * w on each row of `x` (row length `w.len()`).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let mut sum = 0.0f64;
        for &v in xr.iter() {
            sum += (v * v) as f64;
        }
        let mean = (sum / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// ggml_soft_max_ext on one row: `x*scale`, max, exp, f64 sum, multiply by 1/sum.
pub fn softmax(x: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for v in x.iter_mut() {
        *v *= scale;
        if *v > max {
            max = *v;
        }
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        let e = (*v - max).exp();
        *v = e;
        sum += e as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// ggml's silu.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// swiglu: `silu(gate) * up`, in place into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// Quantizes `n` rows of `k` floats to `ty` (the activation side of a dot product).
pub fn quantize_rows(ty: GgmlType, x: &[f32], k: usize) -> Result<Vec<u8>, ModelError> {
    let rb = ty.row_bytes(k)?;
    let n = x.len() / k;
    let mut out = vec![0u8; rb * n];
    for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        quantize_row(ty, src, dst)?;
    }
    Ok(out)
}

/// `out[j*m + i] = W[mat][i] . x[j]`: ggml_mul_mat with activations quantized to the weight's
/// vec_dot_type. `x` holds `n` rows of `w.ne[0]` floats; `out` gets `n` rows of `w.ne[1]`.
pub fn matmul(
    w: &W,
    mat: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ModelError> {
    let k = w.ne[0];
    let xq = quantize_rows(w.ty.vec_dot_type(), &x[..n * k], k)?;
    matmul_q(w, mat, &xq, n, out, pool)
}

/// `matmul` with activation rows already quantized to `w.ty.vec_dot_type()`.
pub fn matmul_q(
    w: &W,
    mat: usize,
    xq: &[u8],
    n: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ModelError> {
    let (k, m) = (w.ne[0], w.ne[1]);
    gemm(w.ty, k, w.matrix(mat), m, xq, n, &mut out[..n * m], pool)?;
    Ok(())
}

/// Adds `b` into `a` element-wise (ggml_add).
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}
