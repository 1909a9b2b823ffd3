//! `cluster-report`: decode speed of the same model with experts in process vs on N local expert
//! nodes (real processes, real gRPC on loopback), at batch 1 and 8 (`--batches`) side by side,
//! with the per-layer node round-trip latency (p50/p99) and the bytes on the wire per token. The
//! host's speed drifts minute to minute, so each batch size alternates in-process and cluster
//! runs `--repeats` times (A B A B ...) and reports the median cluster/in-process ratio with its
//! range. `--replicate-all` puts every expert on every node (mmap'd; `--resident`: copied to RAM),
//! so the coordinator's replica choice is exercised; "spread" is the slowest minus the fastest
//! node's round trip within one layer call (how uneven the shares were).
//!
//! `cargo run --release -p nightshift-benches --bin cluster-report -- --model FILE [--nodes 2]
//! [--repeats 5] [--batches 1,8] [--placement FILE | --replicate-all [--resident]]`, or across
//! network namespaces (root): `... --netns [--netns-nodes 2,3] [--delays-us 0,50,200]
//! [--rate 10gbit] [--replicate-all [--resident]]` (`cluster_report/netns.rs`)`
//! (build `nightshift-expert-node` in the same profile first: `cargo build --release -p nightshift-expert-node`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use nightshift_coordinator::cluster::{self, ClusterArgs, LegsSummary, RemoteExperts};
use nightshift_model::{
    BatchToken, Engine, EngineOptions, ExpertBackend, LocalExperts, Model, StepProfile,
};

#[derive(Parser)]
struct Args {
    /// GGUF model to serve (e.g. a `nightshift gen-model --preset qwen3-30b-a3b --layers 4` file).
    #[arg(long)]
    model: PathBuf,
    /// Placement for the cluster run (its nodes are spawned locally; default: what `nightshift
    /// serve --nodes N` uses).
    #[arg(long, conflicts_with = "replicate_all")]
    placement: Option<PathBuf>,
    /// Cluster run on a generated placement holding every expert on every node (mmap'd, not
    /// resident, so the page cache is shared), so the coordinator picks the replica per call.
    /// Also with `--netns` (every node in its namespace holds every expert).
    #[arg(long)]
    replicate_all: bool,
    /// With `--replicate-all`: every copy resident (copied to RAM on each node) instead.
    #[arg(long, requires = "replicate_all")]
    resident: bool,
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
    /// Decode steps run before the measured ones in every run (in process too): a cluster engine
    /// first tries each way of overlapping its calls (`ModePolicy`, 3 steps each), as a
    /// long-running server does once.
    #[arg(long, default_value_t = 12)]
    warmup_steps: usize,
    /// Prompt length prefilled before decoding.
    #[arg(long, default_value_t = 16)]
    prompt: usize,
    /// Decode batch sizes measured, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8])]
    batches: Vec<usize>,
    /// In-process / cluster run pairs per batch size (alternated, to average out host drift).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Cluster run over the nodes' gRPC streams only (no shared-memory link).
    #[arg(long)]
    no_shm: bool,
    /// Cluster run with each layer call split in advance (no claim board between the nodes).
    #[arg(long)]
    no_work_sharing: bool,
    /// The cluster across network namespaces instead (`netns.rs`; needs root): TCP + mutual
    /// TLS, a bandwidth cap per node link and added latency, with and without the overlap.
    #[arg(long)]
    netns: bool,
    /// With --netns: node counts measured.
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 3])]
    netns_nodes: Vec<usize>,
    /// With --netns: latency added one way on each node link, in microseconds.
    #[arg(long, value_delimiter = ',', default_values_t = [0u64, 50, 200])]
    delays_us: Vec<u64>,
    /// With --netns: each node link's cap each way (as `tc` takes it).
    #[arg(long, default_value = "10gbit")]
    rate: String,
    /// With --netns: layer calls over the nodes' gRPC streams instead of their framed data
    /// links (for A/B runs of the two transports).
    #[arg(long)]
    no_data_link: bool,
}

#[path = "cluster_report/netns.rs"]
mod netns;
#[path = "cluster_report/predict.rs"]
mod predict;

struct Run {
    tok_s: f64,
    p50_us: Option<u32>,
    p99_us: Option<u32>,
    /// Median of (slowest - fastest node round trip) over the layer calls.
    spread_us: Option<u32>,
    bytes_per_token: Option<f64>,
    /// Share of the layer calls that went through shared memory.
    shm_share: Option<f64>,
    /// Layer calls per decode step split between nodes as they went (claim board).
    shared_per_step: Option<f64>,
    /// The engine's phase times over the timed steps.
    profile: StepProfile,
    /// Where a stream call's round trip went (means), when the nodes report their stamps.
    legs: Option<LegsSummary>,
}

/// Decode `a.steps` steps (after `a.warmup_steps` not measured) at `batch` with the experts on
/// `remote`'s nodes, or in process (None).
fn decode(
    model: &Arc<Model>,
    remote: Option<&Arc<RemoteExperts>>,
    threads: usize,
    batch: usize,
    a: &Args,
) -> anyhow::Result<Run> {
    let pool = nightshift_model::build_pool(threads)?;
    // in process, the experts share the engine's pool, as `nightshift serve` runs them
    let backend: Arc<dyn ExpertBackend> = match remote {
        Some(r) => r.clone(),
        None => Arc::new(LocalExperts::new(model.clone(), Some(pool.clone()))),
    };
    let mut e = Engine::new(
        model.clone(),
        backend,
        EngineOptions {
            pool: Some(pool),
            ..Default::default()
        },
    )?;
    let n_vocab = model.config().n_vocab as u32;
    let mut seqs = Vec::new();
    for s in 0..batch {
        let seq = e.add_sequence()?;
        let prompt: Vec<u32> = (0..a.prompt)
            .map(|i| ((i * 7 + s * 13) as u32) % n_vocab)
            .collect();
        e.prefill(seq, &prompt)?;
        seqs.push(seq);
    }
    let mut start = Instant::now();
    for step in 0..a.warmup_steps + a.steps {
        if step == a.warmup_steps {
            if let Some(r) = remote {
                r.take_stats();
            }
            e.reset_profile();
            start = Instant::now();
        }
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
    let stats = remote.map(|r| r.take_stats());
    Ok(Run {
        tok_s: tokens / secs,
        p50_us: stats.as_ref().and_then(|s| s.latency_quantile_us(0.5)),
        p99_us: stats.as_ref().and_then(|s| s.latency_quantile_us(0.99)),
        spread_us: stats.as_ref().and_then(|s| s.spread_quantile_us(0.5)),
        bytes_per_token: stats
            .as_ref()
            .map(|s| (s.bytes_out + s.bytes_in) as f64 / tokens),
        shm_share: stats
            .as_ref()
            .map(|s| s.shm_calls as f64 / s.calls.max(1) as f64),
        shared_per_step: stats
            .as_ref()
            .map(|s| s.shared_rounds as f64 / a.steps.max(1) as f64),
        legs: stats.and_then(|s| s.legs_mean()),
        profile: e.profile(),
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// ms per decode step of each engine phase (medians over `profiles`, one per run): step,
/// attention, router, experts, ffn other, head, other, as table cells.
fn phase_cells(profiles: &[StepProfile]) -> String {
    let ms = |f: &dyn Fn(&StepProfile) -> f64| -> f64 {
        median(
            &profiles
                .iter()
                .map(|p| 1e3 * f(p) / p.steps.max(1) as f64)
                .collect::<Vec<_>>(),
        )
    };
    format!(
        "{:>9.2} | {:>9.2} | {:>9.2} | {:>9.2} | {:>9.2} | {:>9.2} | {:>9.2}",
        ms(&|p| p.total),
        ms(&|p| p.attention),
        ms(&|p| p.router),
        ms(&|p| p.experts),
        ms(&|p| p.ffn_other),
        ms(&|p| p.output),
        ms(&|p| p.other())
    )
}

/// The header of [`phase_cells`].
const PHASE_HEADER: &str =
    "     step | attention |    router |   experts | ffn other |      head |     other";

/// The header of [`legs_cells`].
const LEGS_HEADER: &str =
    "calls |  total |    out | node wait | compute | node reply |   back |   wake |   land";

/// One stream call's round trip by leg, means in us (`RpcStats::legs_mean`; they add up to total): out (request
/// handed to the stream -> decoded on the node), the node's wait for a worker, compute and reply,
/// back (node -> the coordinator's reader), wake (reader -> the waiting call), land (last answer
/// of a round -> the engine's thread). "-": not measured (legs across the link need one clock).
fn legs_cells(l: Option<&LegsSummary>) -> String {
    let Some(l) = l else {
        return "(no stream calls reported their timestamps)".into();
    };
    let o = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    let (calls, land_us, l) = (l.calls, l.land_us, &l.mean);
    format!(
        "{:>5} | {:>6} | {:>6} | {:>9} | {:>7} | {:>10} | {:>6} | {:>6} | {:>6}",
        calls,
        l.total_us,
        o(l.out_us),
        l.node_wait_us,
        l.compute_us,
        l.node_reply_us,
        o(l.back_us),
        l.wake_us,
        o(land_us)
    )
}

fn us(v: Option<u32>) -> String {
    v.map_or("-".into(), |v| format!("{v} us"))
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(a.repeats > 0, "expected --repeats of at least 1, found 0");
    anyhow::ensure!(
        !a.batches.is_empty() && !a.batches.contains(&0),
        "expected --batches of sizes >= 1, found {:?}",
        a.batches
    );
    if a.netns {
        return netns::run(&a);
    }
    let model = Model::load(&a.model).with_context(|| format!("loading {}", a.model.display()))?;
    let mut placement = a.placement.clone();
    let mut generated = None;
    if a.replicate_all {
        let shape = cluster::model_shape(&model)?;
        let path = std::env::temp_dir().join(format!(
            "nightshift-cluster-report-{}.toml",
            std::process::id()
        ));
        // what `serve --nodes N` gives unpinned nodes, copies resident or not as asked
        cluster::default_placement(a.nodes, &shape, false, a.resident)?
            .save_atomic(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        placement = Some(path.clone());
        generated = Some(path);
    }
    let args = ClusterArgs {
        nodes: a.nodes,
        placement: placement.clone(),
        node_threads: Some(a.node_threads),
        expert_deadline_ms: 60_000,
        no_shm: a.no_shm,
        no_work_sharing: a.no_work_sharing,
        ..Default::default()
    };
    let remote = cluster::build(&args, &model, &a.model, None);
    if let Some(p) = &generated {
        let _ = std::fs::remove_file(p);
    }
    let remote = remote?;
    println!(
        "model {} | {} expert nodes x {} threads ({}) vs in process ({} threads) | {} steps, {} repeats",
        a.model.display(),
        a.nodes,
        a.node_threads,
        if a.replicate_all {
            format!(
                "every expert on every node, {}",
                if a.resident { "resident" } else { "mmap'd" }
            )
        } else {
            placement.map_or("the default placement of serve --nodes N".into(), |p| {
                p.display().to_string()
            })
        },
        a.threads,
        a.steps,
        a.repeats
    );
    println!(
        "{:>5} | {:>3} | {:>12} | {:>12} | {:>6} | {:>10} | {:>10} | {:>10} | {:>12} | {:>5} | {:>11}",
        "batch",
        "run",
        "in-proc t/s",
        "cluster t/s",
        "ratio",
        "rtt p50",
        "rtt p99",
        "spread p50",
        "link B/token",
        "shm",
        "shared/step"
    );
    let mut summary = Vec::new();
    for &batch in &a.batches {
        let mut runs = Vec::new();
        for rep in 0..a.repeats {
            let base = decode(&model, None, a.threads, batch, &a)?;
            let dist = decode(&model, remote.remote(), a.threads, batch, &a)?;
            println!(
                "{:>5} | {:>3} | {:>12.2} | {:>12.2} | {:>6.3} | {:>10} | {:>10} | {:>10} | {:>12.0} | {:>4.0}% | {:>11.1}",
                batch,
                rep + 1,
                base.tok_s,
                dist.tok_s,
                dist.tok_s / base.tok_s,
                us(dist.p50_us),
                us(dist.p99_us),
                us(dist.spread_us),
                dist.bytes_per_token.unwrap_or(0.0),
                100.0 * dist.shm_share.unwrap_or(0.0),
                dist.shared_per_step.unwrap_or(0.0)
            );
            runs.push((base, dist));
        }
        summary.push((batch, runs));
    }
    println!();
    println!(
        "{:>5} | {:>12} | {:>12} | {:>12} | {:>13} | {:>10} | {:>10} | {:>10}",
        "batch",
        "in-proc t/s",
        "cluster t/s",
        "median ratio",
        "min-max",
        "rtt p50",
        "rtt p99",
        "spread p50"
    );
    for (batch, runs) in &summary {
        let ratios: Vec<f64> = runs.iter().map(|(b, d)| d.tok_s / b.tok_s).collect();
        let of = |f: &dyn Fn(&Run) -> Option<f64>| -> Vec<f64> {
            runs.iter().filter_map(|(_, d)| f(d)).collect()
        };
        let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "{:>5} | {:>12.2} | {:>12.2} | {:>12.3} | {:>5.3}-{:<7.3} | {:>7.0} us | {:>7.0} us | {:>7.0} us",
            batch,
            median(&runs.iter().map(|(b, _)| b.tok_s).collect::<Vec<_>>()),
            median(&runs.iter().map(|(_, d)| d.tok_s).collect::<Vec<_>>()),
            median(&ratios),
            min,
            max,
            median(&of(&|d| d.p50_us.map(f64::from))),
            median(&of(&|d| d.p99_us.map(f64::from))),
            median(&of(&|d| d.spread_us.map(f64::from)))
        );
    }
    println!();
    println!(
        "ms per decode step by engine phase (median over the runs; experts: the backend call,"
    );
    println!("in process the expert FFNs, in the cluster the round trips to the nodes)");
    println!("{:>5} | {:>10} | {PHASE_HEADER}", "batch", "run");
    for (batch, runs) in &summary {
        for (name, profiles) in [
            (
                "in-proc",
                runs.iter().map(|r| r.0.profile).collect::<Vec<_>>(),
            ),
            ("cluster", runs.iter().map(|r| r.1.profile).collect()),
        ] {
            println!("{:>5} | {:>10} | {}", batch, name, phase_cells(&profiles));
        }
    }
    println!();
    println!("one stream call's round trip by leg (us, means over its calls, adding up to total; see legs_cells)");
    println!("{:>5} | {:>3} | {LEGS_HEADER}", "batch", "run");
    for (batch, runs) in &summary {
        for (rep, (_, d)) in runs.iter().enumerate() {
            println!(
                "{:>5} | {:>3} | {}",
                batch,
                rep + 1,
                legs_cells(d.legs.as_ref())
            );
        }
    }
    Ok(())
}
