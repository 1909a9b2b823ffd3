//! `kernel-report`: our single-thread expert GEMM vs ggml's (feature `ggml`) — or vs our own
//! scalar tier without it — at Kimi K2 expert shapes, Q2_K/Q4_K/Q6_K/Q8_0 plus Q3_K/Q5_K (llama.cpp's
//! Q2_K mix puts every ffn_down in Q3_K, MoE mixes use Q5_K for attn_output), batch 1..16, and the
//! i-quants (IQ1_S … IQ4_NL) and ternary types (TQ1_0, TQ2_0), random valid blocks, and MXFP4,
//! NVFP4, Q1_0, Q2_0 (quantized by ggml's reference quantizers), at batch 1, 4 and 16 (prefill). Prints one markdown table row per case: GFLOP/s of each side and the ratio. Also checks that both sides
//! agree on the results (ggml's SIMD sums differ from the exact reference by ~1e-6 relative).

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nightshift_benches::{time_best, Acts, Case, Weights, BATCHES, SHAPES, TYPES};
use nightshift_kernels::dispatch;
use nightshift_kernels::{gemm, GgmlType, QMatrix};

/// Ours vs ggml (or vs our scalar tier) on Kimi K2 expert GEMMs, one thread.
#[derive(Parser)]
struct Args {
    /// Seconds spent timing each side of each case.
    #[arg(long, default_value_t = 0.3)]
    budget: f64,
    /// Only cases whose type name contains this (e.g. Q4_K).
    #[arg(long)]
    only: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let budget = Duration::from_secs_f64(args.budget);
    let tier = dispatch::active_tier();
    #[cfg(feature = "ggml")]
    println!(
        "ggml compiled with: {}",
        nightshift_benches::ggml::compiled_features()
    );
    println!(
        "our tier: {tier:?} (available: {:?}), one thread\n",
        dispatch::available_tiers()
    );
    let other = if cfg!(feature = "ggml") {
        "ggml"
    } else {
        "scalar"
    };
    println!(
        "| type | batch | shape (m x k) | tier | ours GFLOP/s | {other} GFLOP/s | ours/{other} |"
    );
    println!("|---|---|---|---|---:|---:|---:|");
    let mut weights: Option<(Case, Weights)> = None;
    for c in cases() {
        if args
            .only
            .as_deref()
            .is_some_and(|o| !c.ty.name().contains(o))
        {
            continue;
        }
        if weights
            .as_ref()
            .is_none_or(|(w, _)| (w.ty, w.m, w.k) != (c.ty, c.m, c.k))
        {
            weights = Some((c, Weights::new(&c).context("quantizing weights")?));
        }
        let w = &weights.as_ref().context("weights")?.1;
        let x = Acts::new(&c).context("quantizing activations")?;
        let mut out = vec![0f32; c.m * c.n];
        let wq = QMatrix::new(c.ty, c.m, c.k, &w.q).context("weight rows")?;
        let ours = time_best(budget, 2, || {
            gemm(wq, &x.q, c.n, &mut out, None).expect("gemm");
        });
        let theirs = other_side(&c, w, &x, budget, &out)?;
        let gf = |s: f64| c.flops() / s / 1e9;
        println!(
            "| {} | {} | {} {}x{} | {:?} | {:.1} | {:.1} | {:.2} |",
            c.ty.name(),
            c.n,
            c.shape,
            c.m,
            c.k,
            tier,
            gf(ours),
            gf(theirs),
            theirs / ours
        );
    }
    Ok(())
}

/// The i-quants of Unsloth's dynamic quants (most used first) and the ternary types (`UD-TQ1_0`),
/// measured at batch 1, 4 and 16 (prefill: experts see tens of rows) on random valid blocks (this
/// crate has no i-quant quantizer).
const IQ_TYPES: [GgmlType; 11] = [
    GgmlType::IQ1_S,
    GgmlType::IQ2_XXS,
    GgmlType::IQ4_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_S,
    GgmlType::IQ4_NL,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

/// ggml's newest types (MXFP4: llama.cpp's `MXFP4_MOE` experts), at batch 1, 4 and 16.
const FP_TYPES: [GgmlType; 4] = [
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// The legacy types llama.cpp's quantizer falls back to for rows that are not whole 256-element
/// super-blocks (Q5_0: DeepSeek's 128-long MLA `attn_k_b` rows in a Q4_K mix).
const LEGACY_TYPES: [GgmlType; 1] = [GgmlType::Q5_0];

/// The shared Kimi K2 cases (`TYPES`) followed by the same shapes and batches for Q3_K and Q5_K,
/// then the i-quants, the `FP_TYPES` and the `LEGACY_TYPES` at batch 1, 4 and 16.
fn cases() -> Vec<Case> {
    let extra = [GgmlType::Q3_K, GgmlType::Q5_K];
    let mut v = Vec::new();
    for ty in TYPES.into_iter().chain(extra) {
        for (shape, m, k) in SHAPES {
            for n in BATCHES {
                v.push(Case { ty, m, k, n, shape });
            }
        }
    }
    for ty in IQ_TYPES.into_iter().chain(FP_TYPES).chain(LEGACY_TYPES) {
        for (shape, m, k) in SHAPES {
            for n in [1, 4, 16] {
                v.push(Case { ty, m, k, n, shape });
            }
        }
    }
    v
}

#[cfg(feature = "ggml")]
fn other_side(
    c: &Case,
    w: &Weights,
    x: &Acts,
    budget: Duration,
    ours: &[f32],
) -> anyhow::Result<f64> {
    use nightshift_benches::ggml::GgmlKernel;
    let g = GgmlKernel::new(c.ty)
        .with_context(|| format!("ggml has no CPU traits for {}", c.ty.name()))?;
    anyhow::ensure!(
        g.act_type() == c.ty.vec_dot_type(),
        "ggml pairs {} with {}, we with {}",
        c.ty.name(),
        g.act_type().name(),
        c.ty.vec_dot_type().name()
    );
    // ggml's activation blocks have our layout: feed both sides the same bytes (quantized once
    // by our ggml-exact reference quantizer), so any difference comes from the dot kernels alone
    let mut out = vec![0f32; c.m * c.n];
    let secs = time_best(budget, 2, || g.gemm(c.k, &w.q, c.m, &x.q, c.n, &mut out));
    let scale = ours.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let worst = ours
        .iter()
        .zip(&out)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    anyhow::ensure!(
        worst < 1e-4,
        "ours and ggml disagree on {c:?}: max |diff| / max |out| = {worst:e}"
    );
    Ok(secs)
}

#[cfg(not(feature = "ggml"))]
fn other_side(
    c: &Case,
    w: &Weights,
    x: &Acts,
    budget: Duration,
    ours: &[f32],
) -> anyhow::Result<f64> {
    let mut out = vec![0f32; c.m * c.n];
    let secs = time_best(budget, 1, || {
        let wq = QMatrix::new(c.ty, c.m, c.k, &w.q).expect("weight rows");
        dispatch::gemm_with(dispatch::Tier::Scalar, wq, &x.q, c.n, &mut out, None)
            .expect("scalar gemm");
    });
    anyhow::ensure!(
        out == ours,
        "scalar and {:?} tiers differ on {c:?}",
        dispatch::active_tier()
    );
    Ok(secs)
}
