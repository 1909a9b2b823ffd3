//! `cluster-report`: decode speed of the same model with experts in process vs on N local expert
//! nodes (real processes, real gRPC on loopback), at batch 1 and batch 8, side by side, with the
//! per-layer node round-trip latency (p50/p99) and the bytes on the wire per token.
//!
//! `cargo run --release -p nightshift-benches --bin cluster-report -- --model FILE [--nodes 2]`
//! (build `nightshift-expert-node` in the same profile first: `cargo build --release -p nightshift-expert-node`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use nightshift_coordinator::cluster::{self, ClusterArgs, Experts};
use nightshift_model::{BatchToken, Engine, EngineOptions, Model};

#[derive(Parser)]
struct Args {
    /// GGUF model to serve (e.g. a `nightshift gen-model --preset qwen3-30b-a3b --layers 4` file).
    #[arg(long)]
    model: PathBuf,
    /// Placement for the cluster run (its nodes are spawned locally; default: round-robin).
    #[arg(long)]
    placement: Option<PathBuf>,
    /// Local expert nodes for the cluster run.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Engine threads in the coordinator (in-process run: also the expert threads).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Worker threads per expert node.
    #[arg(long, default_value_t = 1)]
    node_threads: usize,
    /// Decode steps measured per configuration.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Prompt length prefilled before decoding.
    #[arg(long, default_value_t = 16)]
    prompt: usize,
}

struct Run {
    tok_s: f64,
    p50_us: Option<u32>,
    p99_us: Option<u32>,
    bytes_per_token: Option<f64>,
}

fn decode(
    model: &Arc<Model>,
    experts: &Experts,
    threads: usize,
    batch: usize,
    a: &Args,
) -> anyhow::Result<Run> {
    let pool = nightshift_model::build_pool(threads)?;
    let mut e = Engine::new(
        model.clone(),
        experts.backend(),
        EngineOptions {
            pool: Some(pool),
            ..Default::default()
        },
    )?;
    let n_vocab = model.config().n_vocab as u32;
    let mut seqs = Vec::new();
    for s in 0..batch {
        let seq = e.add_sequence()?;
        let prompt: Vec<BatchToken> = (0..a.prompt)
            .map(|i| BatchToken {
                seq,
                token: ((i * 7 + s * 13) as u32) % n_vocab,
                pos: i as u32,
                want_logits: i + 1 == a.prompt,
            })
            .collect();
        e.forward(&prompt)?;
        seqs.push(seq);
    }
    if let Some(r) = experts.remote() {
        r.take_stats();
    }
    let start = Instant::now();
    for step in 0..a.steps {
        let toks: Vec<BatchToken> = seqs
            .iter()
            .enumerate()
            .map(|(s, &seq)| BatchToken {
                seq,
                token: ((step * 31 + s * 17) as u32) % n_vocab,
                pos: (a.prompt + step) as u32,
                want_logits: true,
            })
            .collect();
        e.forward(&toks)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let tokens = (a.steps * batch) as f64;
    let stats = experts.remote().map(|r| r.take_stats());
    Ok(Run {
        tok_s: tokens / secs,
        p50_us: stats.as_ref().and_then(|s| s.latency_quantile_us(0.5)),
        p99_us: stats.as_ref().and_then(|s| s.latency_quantile_us(0.99)),
        bytes_per_token: stats.map(|s| (s.bytes_out + s.bytes_in) as f64 / tokens),
    })
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let model = Model::load(&a.model).with_context(|| format!("loading {}", a.model.display()))?;
    let local = cluster::build(
        &ClusterArgs::default(),
        &model,
        &a.model,
        Some(nightshift_model::build_pool(a.threads)?),
    )?;
    let args = ClusterArgs {
        nodes: a.nodes,
        placement: a.placement.clone(),
        node_threads: Some(a.node_threads),
        expert_deadline_ms: 60_000,
        ..Default::default()
    };
    let remote = cluster::build(&args, &model, &a.model, None)?;
    println!(
        "model {} | {} expert nodes x {} threads vs in process ({} threads)",
        a.model.display(),
        a.nodes,
        a.node_threads,
        a.threads
    );
    println!(
        "{:>5} | {:>12} | {:>12} | {:>6} | {:>10} | {:>10} | {:>12}",
        "batch", "in-proc t/s", "cluster t/s", "ratio", "rtt p50", "rtt p99", "wire B/token"
    );
    for batch in [1usize, 8] {
        let base = decode(&model, &local, a.threads, batch, &a)?;
        let dist = decode(&model, &remote, a.threads, batch, &a)?;
        println!(
            "{:>5} | {:>12.2} | {:>12.2} | {:>6.3} | {:>8} us | {:>8} us | {:>12.0}",
            batch,
            base.tok_s,
            dist.tok_s,
            dist.tok_s / base.tok_s,
            dist.p50_us.map_or("-".into(), |v| v.to_string()),
            dist.p99_us.map_or("-".into(), |v| v.to_string()),
            dist.bytes_per_token.unwrap_or(0.0)
        );
    }
    Ok(())
}
