//! nightshift-benches: shared helpers for the benchmarks and comparison binaries — the Kimi K2
//! expert GEMM cases, random quantized operands, a small timing loop, and (feature `ggml`) a thin
//! binding to ggml's CPU type traits so ours and ggml's kernels run side by side on the same data.

#[cfg(feature = "ggml")]
pub mod ggml;
#[cfg(feature = "ggml")]
pub mod llama;
pub mod stream;
pub mod tls;

use std::time::{Duration, Instant};

use nightshift_kernels::{quantize_row, GgmlType, KernelError};

/// One GEMM case: `m` weight rows of `k` elements times `n` activation rows.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub ty: GgmlType,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// "gate/up" or "down"
    pub shape: &'static str,
}

impl Case {
    /// Multiply-adds × 2.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }

    /// Weight elements × batch (criterion's `Throughput::Elements`).
    pub fn elements(&self) -> u64 {
        (self.m * self.k * self.n) as u64
    }
}

/// Weight types benchmarked (the ones Kimi K2 / Qwen3 GGUFs use for experts).
pub const TYPES: [GgmlType; 4] = [
    GgmlType::Q2_K,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
];
/// Batch sizes (rows routed to one expert).
pub const BATCHES: [usize; 5] = [1, 2, 4, 8, 16];
/// Kimi K2 expert shapes: (name, m weight rows, k row length).
pub const SHAPES: [(&str, usize, usize); 2] = [("gate/up", 2048, 7168), ("down", 7168, 2048)];

/// Every (type, shape, batch) case.
pub fn kimi_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for ty in TYPES {
        for (shape, m, k) in SHAPES {
            for n in BATCHES {
                v.push(Case { ty, m, k, n, shape });
            }
        }
    }
    v
}

/// A splitmix64-driven f32 vector, values roughly N(0, 1) (sum of four uniforms).
pub fn random_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut r = nightshift_kernels::rng::SplitMix64::new(seed);
    (0..len).map(|_| r.gaussian()).collect()
}

/// `rows` rows of `k` f32 quantized to `ty` with our (ggml-exact) reference quantizer.
pub fn quantize_rows(ty: GgmlType, f: &[f32], k: usize) -> Result<Vec<u8>, KernelError> {
    let rb = ty.row_bytes(k)?;
    let rows = f.len() / k;
    let mut out = vec![0u8; rows * rb];
    for (src, dst) in f.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        quantize_row(ty, src, dst)?;
    }
    Ok(out)
}

/// Weights of one case (f32 and quantized): depend on type and shape only, so they are shared
/// by every batch size.
pub struct Weights {
    pub f32: Vec<f32>,
    pub q: Vec<u8>,
}

impl Weights {
    /// Quantized from random floats; for the i-quants and ternary types (no quantizer here)
    /// random valid blocks instead ([`random_iq_blocks`]; `f32` then holds their dequantization).
    pub fn new(c: &Case) -> Result<Weights, KernelError> {
        if !c.ty.has_quantizer() {
            let q = random_iq_blocks(c.ty, c.m * c.k, 1 + c.m as u64)?;
            let mut f = vec![0f32; c.m * c.k];
            nightshift_kernels::dequantize_row(c.ty, &q, &mut f)?;
            return Ok(Weights { f32: f, q });
        }
        let f = random_f32(c.m * c.k, 1 + c.m as u64);
        let q = quantize_rows(c.ty, &f, c.k)?;
        Ok(Weights { f32: f, q })
    }
}

/// `len` elements of `ty` as random valid blocks: random index, sign and scale bytes, and a
/// super-block scale of about 1/64 (so products stay far from any float limit).
pub fn random_iq_blocks(ty: GgmlType, len: usize, seed: u64) -> Result<Vec<u8>, KernelError> {
    let mut q: Vec<u8> = random_f32(ty.row_bytes(len)?, seed)
        .iter()
        .map(|v| v.to_bits() as u8)
        .collect();
    let d = nightshift_kernels::formats::f32_to_f16(1.0 / 64.0);
    for blk in q.chunks_exact_mut(ty.block_bytes()) {
        nightshift_kernels::formats::set_iq_scale(ty, blk, d)?;
    }
    Ok(q)
}

/// Activations of one case: f32 and quantized to the weight type's vec_dot_type by our quantizer.
pub struct Acts {
    pub f32: Vec<f32>,
    pub q: Vec<u8>,
}

impl Acts {
    pub fn new(c: &Case) -> Result<Acts, KernelError> {
        let f = random_f32(c.n * c.k, 2 + c.n as u64);
        let q = quantize_rows(c.ty.vec_dot_type(), &f, c.k)?;
        Ok(Acts { f32: f, q })
    }
}

/// The `p` quantile of `v` (0..=1), the sample nearest to rank `p (n - 1)`; sorts `v`. NaN when
/// `v` is empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}

/// Runs `f` repeatedly for about `budget` (at least `min_iters` times) and returns the best
/// seconds per call (the least disturbed run on a shared machine). Each call is timed in this
/// thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so time spent waiting for a core that other
/// processes hold does not count (`f` must run on this thread); wall time if that clock fails.
pub fn time_best(budget: Duration, min_iters: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm caches and page in
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut iters = 0;
    while iters < min_iters || start.elapsed() < budget {
        let t = Instant::now();
        let c = thread_cpu_seconds();
        f();
        let secs = match (c, thread_cpu_seconds()) {
            (Some(a), Some(b)) => b - a,
            _ => t.elapsed().as_secs_f64(),
        };
        best = best.min(secs);
        iters += 1;
    }
    best
}

/// Seconds this thread has run on a CPU.
fn thread_cpu_seconds() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// Index of the largest value (greedy sampling in the end-to-end comparisons): the sampler's.
pub fn argmax(v: &[f32]) -> usize {
    nightshift_model::sampler::argmax(v) as usize
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentile_is_the_nearest_rank_sample() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 0.0), 1.0);
        assert_eq!(percentile(&mut v, 1.0), 5.0);
        // ranks 0.1 * 4 = 0.4 and 0.9 * 4 = 3.6 round to the ends
        assert_eq!(percentile(&mut v, 0.9), 5.0);
        assert_eq!(percentile(&mut v, 0.1), 1.0);
        assert!(percentile(&mut [], 0.5).is_nan());
    }
}
