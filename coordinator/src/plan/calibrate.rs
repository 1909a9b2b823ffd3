//! The planner's machine terms, measured here rather than typed in: the memory bandwidth a
//! plain parallel read reaches (a STREAM-like sum), the bandwidth the expert FFN itself reaches
//! when its weights come from memory (batch 1 over more expert copies than any cache holds),
//! and the FFN's compute rate when the weights are cached (a 32-row batch over one expert),
//! all on the model's own expert types and shape through `model::expert::expert_ffn`, the one
//! FFN nodes run. Times are the process's CPU time divided by its threads, not wall time, so a
//! machine shared with other work (whose threads wait for a core) still measures what its cores
//! do while they run. The planner carries the kernel's *efficiency* (its bandwidth over the plain
//! read's) to a VM's memory bandwidth, and the compute rate per core to its cores.

use std::path::Path;

use nightshift_kernels::{quantize_row, GgmlType, QMatrix};
use nightshift_model::expert::{expert_ffn, ActRows, ExpertWeights};
use nightshift_model::gen::iq_mix;
use serde::{Deserialize, Serialize};

use super::{ModelCost, PlanError};

/// What the calibration measured (saved and reloaded as TOML).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// The expert types and shape measured, e.g. "Q2_K/Q3_K 7168x2048".
    pub expert: String,
    pub threads: usize,
    /// Plain parallel read, GB/s.
    pub stream_gbs: f64,
    /// The expert FFN at batch 1 with its weights from memory, weight GB/s.
    pub ffn_gbs: f64,
    /// The expert FFN over cached weights: weight bytes x rows per second, per core.
    pub ffn_byte_rows_per_core: f64,
}

impl Calibration {
    /// The FFN's share of the plain read's bandwidth (applied to a VM's memory bandwidth).
    pub fn efficiency(&self) -> f64 {
        (self.ffn_gbs / self.stream_gbs).min(1.0)
    }

    /// The key naming what a calibration measured, to match a saved one against a model.
    pub fn key(m: &ModelCost) -> String {
        format!(
            "{}/{} {}x{}",
            m.expert_type.name(),
            m.expert_down_type.name(),
            m.n_embd,
            m.expert_ff
        )
    }

    pub fn load(path: &Path, m: &ModelCost) -> Result<Calibration, PlanError> {
        let bad = |msg: String| PlanError::Calibration(format!("{}: {msg}", path.display()));
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let c: Calibration = toml::from_str(&text).map_err(|e| bad(e.message().to_string()))?;
        let key = Self::key(m);
        if c.expert != key {
            return Err(bad(format!(
                "expected a calibration of {key} experts, found one of {}",
                c.expert
            )));
        }
        for (field, x) in [
            ("stream_gbs", c.stream_gbs),
            ("ffn_gbs", c.ffn_gbs),
            ("ffn_byte_rows_per_core", c.ffn_byte_rows_per_core),
        ] {
            if !(x.is_finite() && x > 0.0) {
                return Err(bad(format!("expected {field} > 0, found {x}")));
            }
        }
        if c.threads == 0 {
            return Err(bad("expected threads >= 1, found 0".into()));
        }
        Ok(c)
    }

    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        let text = toml::to_string(self).map_err(|e| PlanError::Calibration(e.to_string()))?;
        std::fs::write(path, text)
            .map_err(|e| PlanError::Calibration(format!("writing {}: {e}", path.display())))
    }

    /// Measures on `threads` threads, with at least `memory_mib` MiB of expert copies for the
    /// from-memory pass (more than the last-level cache).
    pub fn measure(
        m: &ModelCost,
        threads: usize,
        memory_mib: usize,
    ) -> Result<Calibration, PlanError> {
        let err = |e: &dyn std::fmt::Display| PlanError::Calibration(e.to_string());
        let pool = nightshift_model::build_pool(threads.max(1)).map_err(|e| err(&e))?;
        let (e, f) = (m.n_embd, m.expert_ff);
        let gate_bytes = m.expert_type.row_bytes(e).map_err(|x| err(&x))? * f;
        let down_bytes = m.expert_down_type.row_bytes(f).map_err(|x| err(&x))? * e;
        let one = 2 * gate_bytes + down_bytes;
        let copies = ((memory_mib << 20) / one).max(2);
        // one expert quantized from Gaussian values, then copied: every copy is separate memory
        let mut expert = Vec::with_capacity(one);
        expert.extend(matrix_bytes(m.expert_type, f, e, 1)?);
        expert.extend(matrix_bytes(m.expert_type, f, e, 2)?);
        expert.extend(matrix_bytes(m.expert_down_type, e, f, 3)?);
        let all: Vec<u8> = expert.repeat(copies);
        let weights = |i: usize| expert_at(m, &all[i * one..(i + 1) * one], gate_bytes);
        let act_ty = nightshift_model::expert::act_type_for(m.expert_type, m.expert_type);
        let mut rng = nightshift_kernels::rng::SplitMix64::new(11);
        let x: Vec<f32> = (0..32 * e).map(|_| rng.gaussian()).collect();
        let acts = ActRows::quantize(act_ty, &x, e).map_err(|x| err(&x))?;
        let mut out = vec![0f32; 32 * e];
        // from memory: batch 1 over every copy in turn, best of 3 sweeps
        let busy = |t0: f64| (cpu_seconds() - t0) / threads.max(1) as f64;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = cpu_seconds();
            for i in 0..copies {
                expert_ffn(&weights(i)?, &acts, &[0], &mut out[..e], Some(&pool))
                    .map_err(|x| err(&x))?;
            }
            best = best.min(busy(t));
        }
        let ffn_gbs = (one * copies) as f64 / best / 1e9;
        // cached: 32 rows over one copy, best of 5 after a warm-up
        let w = weights(0)?;
        let rows: Vec<u32> = (0..32).collect();
        expert_ffn(&w, &acts, &rows, &mut out, Some(&pool)).map_err(|x| err(&x))?;
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = cpu_seconds();
            expert_ffn(&w, &acts, &rows, &mut out, Some(&pool)).map_err(|x| err(&x))?;
            best = best.min(busy(t));
        }
        let ffn_byte_rows_per_core = (one * 32) as f64 / best / threads.max(1) as f64;
        drop(all);
        let stream_gbs = stream_read_gbs(&pool, threads.max(1), memory_mib.max(64));
        Ok(Calibration {
            expert: Self::key(m),
            threads: threads.max(1),
            stream_gbs,
            ffn_gbs,
            ffn_byte_rows_per_core,
        })
    }
}

/// The expert whose gate, up and down matrices are `b` (gate and up `gate_bytes` each).
fn expert_at<'a>(
    m: &ModelCost,
    b: &'a [u8],
    gate_bytes: usize,
) -> Result<ExpertWeights<'a>, PlanError> {
    let err = |e: &dyn std::fmt::Display| PlanError::Calibration(e.to_string());
    let (e, f) = (m.n_embd, m.expert_ff);
    let g = QMatrix::new(m.expert_type, f, e, &b[..gate_bytes]).map_err(|x| err(&x))?;
    let u =
        QMatrix::new(m.expert_type, f, e, &b[gate_bytes..2 * gate_bytes]).map_err(|x| err(&x))?;
    let d = QMatrix::new(m.expert_down_type, e, f, &b[2 * gate_bytes..]).map_err(|x| err(&x))?;
    ExpertWeights::new(g, u, d).map_err(|x| err(&x))
}

/// A `rows x cols` matrix of `ty` from Gaussian values (quantized, or random valid i-quant
/// blocks where NightShift has no quantizer, as `gen-model` writes them).
fn matrix_bytes(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Result<Vec<u8>, PlanError> {
    let err =
        |e: &dyn std::fmt::Display| PlanError::Calibration(format!("{} matrix: {e}", ty.name()));
    let rb = ty.row_bytes(cols).map_err(|e| err(&e))?;
    let mut out = vec![0u8; rb * rows];
    let mut rng = nightshift_kernels::rng::SplitMix64::new(seed);
    let mut vals = vec![0f32; cols];
    for dst in out.chunks_exact_mut(rb) {
        for v in vals.iter_mut() {
            *v = rng.gaussian() / (cols as f32).sqrt();
        }
        if ty.has_quantizer() {
            quantize_row(ty, &vals, dst).map_err(|e| err(&e))?;
        } else {
            iq_mix::random_row(ty, &vals, &mut rng, dst).map_err(|e| err(&e))?;
        }
    }
    Ok(out)
}

/// CPU seconds this process has used (all threads).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_PROCESS_CPUTIME_ID is a clock every Linux kernel this runs on provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// A parallel sum over `mib` MiB of u64s on `pool` (`threads` threads), best of 3, in GB/s
/// per CPU second of each thread.
fn stream_read_gbs(pool: &rayon::ThreadPool, threads: usize, mib: usize) -> f64 {
    use rayon::prelude::*;
    let words: Vec<u64> = (0..(mib << 20) / 8).map(|i| i as u64).collect();
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..3 {
        let t = cpu_seconds();
        sink = sink.wrapping_add(pool.install(|| {
            words
                .par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))
                .reduce(|| 0, u64::wrapping_add)
        }));
        best = best.min((cpu_seconds() - t) / threads as f64);
    }
    std::hint::black_box(sink);
    (words.len() * 8) as f64 / best / 1e9
}
