//! F32 weight matrices repacked for SIMD, with ggml's generic F32 numerics kept bit for bit.
//!
//! `ggml_vec_dot_f32` (generic) multiplies in f32 and sums each dot product in f64, one element
//! after another ([`crate::scalar::float`]). That sum is a single dependency chain per (weight
//! row, activation row), so the only parallelism is across rows: the row-major layout would need
//! a transpose for every vector of elements. [`PackedF32`] stores the rows transposed once, in
//! tiles of [`PACK_ROWS`] rows (element `i` of the tile's rows is contiguous), so a step is one
//! load, one multiply by the broadcast activation and the f64 adds, 16 rows per step, and two
//! tiles run interleaved to cover the add latency. Each row's chain is the reference's, in the
//! same order, so the results equal `gemm(GgmlType::F32, ..)` bit for bit.
//!
//! Used for the MoE router (`ffn_gate_inp`, F32 in every llama.cpp quant mix), which the engine
//! runs for every token of every MoE layer: 128 x 2048 for Qwen3-30B-A3B, 384 x 7168 for Kimi K2.
//! x86-64 runs the same code compiled for AVX-512F or AVX2 as [`crate::dispatch::float_level`]
//! says; elsewhere the compiler's baseline vectors (NEON on aarch64).

use rayon::prelude::*;
use rayon::ThreadPool;

#[cfg(target_arch = "x86_64")]
use crate::dispatch::{self, FloatLevel};
use crate::KernelError;

/// Rows per tile.
pub const PACK_ROWS: usize = 16;

/// Products (rows x k x activation rows) from which [`PackedF32::gemm`] uses the pool.
const PARALLEL_MIN: usize = 1 << 18;

/// An F32 matrix of `rows` rows of `k` elements, transposed per tile of [`PACK_ROWS`] rows (the
/// last tile padded with zero rows, computed and dropped).
#[derive(Clone, Debug)]
pub struct PackedF32 {
    rows: usize,
    k: usize,
    /// `data[(t * k + i) * PACK_ROWS + r]` = element `i` of row `t * PACK_ROWS + r`.
    data: Vec<f32>,
}

impl PackedF32 {
    /// Packs `rows` little-endian F32 rows of `k` elements (`w` holds exactly `rows * k * 4`
    /// bytes).
    pub fn pack(w: &[u8], rows: usize, k: usize) -> Result<PackedF32, KernelError> {
        let expected = rows
            .checked_mul(k)
            .and_then(|e| e.checked_mul(4))
            .ok_or_else(|| KernelError::Overflow {
                what: "packed f32 matrix",
                detail: format!("{rows} rows of {k}"),
            })?;
        if w.len() != expected {
            return Err(KernelError::Length {
                what: "packed f32 weight rows",
                expected,
                found: w.len(),
            });
        }
        let tiles = rows.div_ceil(PACK_ROWS);
        let mut data = vec![0f32; tiles * k * PACK_ROWS];
        for (r, row) in w.chunks_exact((4 * k).max(1)).take(rows).enumerate() {
            let (t, lane) = (r / PACK_ROWS, r % PACK_ROWS);
            for (i, b) in row.chunks_exact(4).enumerate() {
                data[(t * k + i) * PACK_ROWS + lane] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Ok(PackedF32 { rows, k, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held (the padded, packed copy).
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// `out[j * rows + i] = W[i] . x[j]` for `n` activation rows `x` (`n * k` floats), each dot
    /// product as `ggml_vec_dot_f32` (generic) computes it. Splits the tiles over `pool` (None:
    /// the calling thread).
    pub fn gemm(
        &self,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        pool: Option<&ThreadPool>,
    ) -> Result<(), KernelError> {
        let (m, k) = (self.rows, self.k);
        count("packed f32 activations", n, k, x.len())?;
        let cells = count("packed f32 output", m, n, out.len())?;
        if cells == 0 {
            return Ok(());
        }
        let tiles = m.div_ceil(PACK_ROWS);
        let tile_len = k * PACK_ROWS;
        // Tile pairs are the unit of work; results come back per pair as [tile][j][lane].
        let run = |p: usize| -> Vec<f32> {
            let t0 = 2 * p;
            let pair = (tiles - t0).min(2);
            let mut res = vec![0f32; pair * n * PACK_ROWS];
            for j in 0..n {
                let xr = &x[j * k..(j + 1) * k];
                let a = &self.data[t0 * tile_len..(t0 + 1) * tile_len];
                // an odd last tile runs paired with itself (its second result is dropped)
                let b = &self.data[(t0 + pair - 1) * tile_len..(t0 + pair) * tile_len];
                let [ra, rb] = dot_tiles2(a, b, xr);
                res[j * PACK_ROWS..(j + 1) * PACK_ROWS].copy_from_slice(&ra);
                if pair == 2 {
                    res[(n + j) * PACK_ROWS..(n + j + 1) * PACK_ROWS].copy_from_slice(&rb);
                }
            }
            res
        };
        let pairs = tiles.div_ceil(2);
        // Below a quarter million products forking costs more than it saves. Qwen3-30B's
        // 128 x 2048 router for one token (1 MiB of weights, ~100 us on one core out of cache)
        // splits: the engine keeps its pool polling, so the fork costs microseconds (decode
        // router phase 0.58-0.62 -> 0.36-0.49 ms per step for 6 layers, in process and on nodes).
        let small = m.saturating_mul(k).saturating_mul(n) < PARALLEL_MIN;
        let results: Vec<Vec<f32>> = match pool {
            Some(p) if pairs > 1 && !small => {
                p.install(|| (0..pairs).into_par_iter().map(run).collect())
            }
            _ => (0..pairs).map(run).collect(),
        };
        for (p, res) in results.iter().enumerate() {
            for (ti, tile) in res.chunks_exact(n * PACK_ROWS).enumerate() {
                let r0 = (2 * p + ti) * PACK_ROWS;
                for (j, lanes) in tile.chunks_exact(PACK_ROWS).enumerate() {
                    for (lane, &v) in lanes.iter().enumerate().take(m.saturating_sub(r0)) {
                        out[j * m + r0 + lane] = v;
                    }
                }
            }
        }
        Ok(())
    }
}

/// [`dot_tiles2_body`] in the build [`crate::dispatch::float_level`] names.
fn dot_tiles2(a: &[f32], b: &[f32], x: &[f32]) -> [[f32; PACK_ROWS]; 2] {
    #[cfg(target_arch = "x86_64")]
    match dispatch::float_level() {
        // SAFETY: `float_level` names AVX-512 only when the CPU has AVX-512 F (and DQ).
        FloatLevel::Avx512 => return unsafe { dot_tiles2_avx512(a, b, x) },
        // SAFETY: `float_level` names AVX2 only when the CPU has it.
        FloatLevel::Avx2 => return unsafe { dot_tiles2_avx2(a, b, x) },
        FloatLevel::Baseline => {}
    }
    dot_tiles2_body(a, b, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_tiles2_avx512(a: &[f32], b: &[f32], x: &[f32]) -> [[f32; PACK_ROWS]; 2] {
    dot_tiles2_body(a, b, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_tiles2_avx2(a: &[f32], b: &[f32], x: &[f32]) -> [[f32; PACK_ROWS]; 2] {
    dot_tiles2_body(a, b, x)
}

/// Two tiles' dot products with `x`, each lane `acc += (w * x) as f64` over the elements in
/// order, then `as f32` (the generic `ggml_vec_dot_f32`); the two tiles are independent chains.
#[inline(always)]
fn dot_tiles2_body(a: &[f32], b: &[f32], x: &[f32]) -> [[f32; PACK_ROWS]; 2] {
    let mut acc_a = [0f64; PACK_ROWS];
    let mut acc_b = [0f64; PACK_ROWS];
    for ((wa, wb), &xi) in a
        .chunks_exact(PACK_ROWS)
        .zip(b.chunks_exact(PACK_ROWS))
        .zip(x)
    {
        for (acc, &wv) in acc_a.iter_mut().zip(wa) {
            *acc += (wv * xi) as f64;
        }
        for (acc, &wv) in acc_b.iter_mut().zip(wb) {
            *acc += (wv * xi) as f64;
        }
    }
    [acc_a.map(|v| v as f32), acc_b.map(|v| v as f32)]
}

/// `a * b` elements, checked against `found` (`what` names the buffer in the error).
fn count(what: &'static str, a: usize, b: usize, found: usize) -> Result<usize, KernelError> {
    let expected = a.checked_mul(b).ok_or_else(|| KernelError::Overflow {
        what,
        detail: format!("{a} x {b}"),
    })?;
    if found != expected {
        return Err(KernelError::Elements {
            what,
            expected,
            found,
        });
    }
    Ok(expected)
}
