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

/// ggml_soft_max_ext on one row (one home with attention's, in the kernels crate).
pub use nightshift_kernels::attn::softmax;

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
    let m = w.ne[1];
    gemm(w.matrix(mat)?, xq, n, &mut out[..n * m], pool)?;
    Ok(())
}

/// Several `matmul`s of the same activation rows (`x`: `n` rows of the common row length) as one
/// parallel region: the rows are quantized once per activation type and every matrix's rows are
/// split into chunks that all run in one fork-join (q/k/v projections: one instead of three,
/// and the small k/v matrices share the pool with q). `outs[i]` gets matrix `i`'s `n` rows of
/// `ws[i].ne[1]`, laid out as `matmul` lays them. Each output is the same kernel dot product
/// whatever the chunking, so the bits equal separate `matmul` calls.
pub fn matmul_many(
    ws: &[&W],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
    pool: Option<&ThreadPool>,
) -> Result<(), ModelError> {
    if ws.len() != outs.len() {
        return Err(ModelError::Batch(format!(
            "expected {} outputs, found {}",
            ws.len(),
            outs.len()
        )));
    }
    let Some(k) = ws.first().map(|w| w.ne[0]) else {
        return Ok(());
    };
    if let Some(w) = ws.iter().find(|w| w.ne[0] != k) {
        return Err(ModelError::Tensor {
            name: w.name.clone(),
            msg: format!(
                "expected rows of {k} like the other matrices, found {}",
                w.ne[0]
            ),
        });
    }
    for (w, out) in ws.iter().zip(outs.iter()) {
        if out.len() < n * w.ne[1] {
            return Err(ModelError::Batch(format!(
                "expected an output of {} floats for {}, found {}",
                n * w.ne[1],
                w.name,
                out.len()
            )));
        }
    }
    // one quantization per distinct activation type
    let mut acts: Vec<(GgmlType, Vec<u8>)> = Vec::new();
    for w in ws {
        let t = w.ty.vec_dot_type();
        if !acts.iter().any(|a| a.0 == t) {
            acts.push((t, quantize_rows(t, &x[..n * k], k)?));
        }
    }
    let total: usize = ws.iter().map(|w| w.ne[1]).sum();
    let threads = pool.map_or(1, |p| p.current_num_threads());
    // about four chunks per thread, whole 16-row multiples (kernel tiles stay whole)
    let chunk = (total.div_ceil(4 * threads).div_ceil(16) * 16).max(16);
    let mut jobs: Vec<(usize, usize, usize)> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let m = w.ne[1];
        for r0 in (0..m).step_by(chunk) {
            jobs.push((i, r0, chunk.min(m - r0)));
        }
    }
    let run = |&(i, r0, rows): &(usize, usize, usize)| -> Result<Vec<f32>, ModelError> {
        let w = ws[i];
        let t = w.ty.vec_dot_type();
        let xq = acts
            .iter()
            .find(|a| a.0 == t)
            .map(|a| a.1.as_slice())
            .unwrap_or_default();
        let mut tmp = vec![0f32; rows * n];
        gemm(w.matrix(0)?.row_range(r0, rows)?, xq, n, &mut tmp, None)?;
        Ok(tmp)
    };
    let results: Vec<Vec<f32>> = match pool {
        Some(p) if jobs.len() > 1 => p.install(|| {
            use rayon::prelude::*;
            jobs.par_iter().map(run).collect::<Result<_, _>>()
        })?,
        _ => jobs.iter().map(run).collect::<Result<_, _>>()?,
    };
    for (&(i, r0, rows), tmp) in jobs.iter().zip(&results) {
        let m = ws[i].ne[1];
        let out = &mut outs[i];
        for j in 0..n {
            out[j * m + r0..j * m + r0 + rows].copy_from_slice(&tmp[j * rows..(j + 1) * rows]);
        }
    }
    Ok(())
}

/// Adds `b` into `a` element-wise (ggml_add).
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}
