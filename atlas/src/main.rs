//! The `nightshift-atlas` command line: `report` on an atlas file (table + heatmap/coverage
//! pictures), `plan` a placement from it, `simulate` planner quality on synthetic Zipf atlases,
//! `synth` a synthetic atlas file, `record` an atlas by running prompts through the engine (in
//! process: `live.rs`; through a running coordinator and its nodes: `record_cluster.rs`), and
//! `apply` a placement to a running coordinator (live rebalance, `live.rs`; HTTP in `coord.rs`).

mod coord;
mod live;
mod prompts;
mod record_cluster;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use nightshift_atlas::placement::{ModelShape, NodeSpec, Placement};
use nightshift_atlas::plan::{plan, Plan, PlanRequest, ReplicaBudget};
use nightshift_atlas::report::Report;
use nightshift_atlas::synth::{kimi_k2_shape, zipf_atlas, zipf_counts};
use nightshift_atlas::trace::Atlas;
use nightshift_atlas_core::size::parse_size;

#[derive(Parser)]
#[command(
    name = "nightshift-atlas",
    version,
    about = "ExpertAtlas: record, report, plan, simulate and apply expert placements"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a JSONL prompt set (greedy) through the in-process engine (--model) or a running
    /// coordinator and its expert nodes (--coordinator), and write the atlas of its routing.
    #[command(group(clap::ArgGroup::new("engine").required(true).args(["model", "coordinator"])))]
    Record {
        /// GGUF model file: run the engine in this process.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Base URL of a running `nightshift serve`, e.g. http://127.0.0.1:8080: send the prompts
        /// through its OpenAI API, then write its recorded atlas (GET /v1/atlas).
        #[arg(long)]
        coordinator: Option<String>,
        /// Bearer API key of the coordinator.
        #[arg(long, env = "NIGHTSHIFT_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Seconds one request to the coordinator may take.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// Requests to the coordinator in flight at once (it batches them).
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// JSONL: one {"prompt": "..."} or {"messages": [{"role", "content"}, ...]} per line.
        #[arg(long)]
        prompts: PathBuf,
        /// Tokens to greedy-decode after each prompt.
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Apply a placement to a running coordinator: nodes load, routing switches, nodes drop.
    Apply {
        placement: PathBuf,
        /// Coordinator base URL, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        coordinator: String,
        /// Bearer API key of the coordinator.
        #[arg(long, env = "NIGHTSHIFT_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// Coverage, Gini and placement load imbalance of an atlas, with PNG/SVG pictures.
    Report {
        atlas: PathBuf,
        /// Placement whose expected per-node load to report.
        #[arg(long)]
        placement: Option<PathBuf>,
        /// Directory for heatmap.{png,svg} and coverage.{png,svg}.
        #[arg(long, default_value = "atlas-report")]
        out: PathBuf,
        /// Use the rolling-window counts instead of all-time.
        #[arg(long)]
        window: bool,
        /// The atlas's GGUF model: adds the byte bound on batching (bytes a decode step reads
        /// with one and with --sequences sequences, from the tensor sizes and the atlas).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Sequences of the batching bound.
        #[arg(long, default_value_t = 4)]
        sequences: u32,
    },
    /// Plan a placement (replicate hot experts, balance load under memory) and write it.
    Plan {
        #[arg(long)]
        atlas: PathBuf,
        /// TOML with [[node]] tables: name, addr, numa, memory_bytes, cores. Without it (and
        /// with --memory-budget): one node named `local`, the in-process engine.
        #[arg(long, required_unless_present = "memory_budget")]
        nodes: Option<PathBuf>,
        /// Bytes of resident experts per node (suffixes K, M, G, T, KiB, MiB, GiB, TiB; or N% of
        /// one copy of every expert): each node keeps the copies with the most expected bytes
        /// read per token resident up to it, the rest stay mapped (overrides memory_bytes).
        #[arg(long)]
        memory_budget: Option<String>,
        /// Current placement: prefer plans that move few bytes from it.
        #[arg(long)]
        previous: Option<PathBuf>,
        /// Extra copies per MoE layer.
        #[arg(long, conflicts_with = "replica_memory")]
        replicas: Option<usize>,
        /// Bytes for extra copies over all layers (suffixes K, M, G, T, KiB, MiB, GiB, TiB; or N%
        /// of the memory of one copy of every expert).
        #[arg(long)]
        replica_memory: Option<String>,
        /// Use the rolling-window counts instead of all-time.
        #[arg(long)]
        window: bool,
        /// With --memory-budget (the in-process engine's, or each node's with --nodes): the
        /// share of the budget kept as a fixed resident set, the rest left to the staging cache
        /// of cold experts, which keeps the most recently used (N%, or `auto`: replay the
        /// atlas's recorded decode routing against every eighth and keep the split that finds
        /// the most experts in memory; without a recorded trace, or with extra copies, 100%).
        #[arg(long, default_value = "auto")]
        resident_share: String,
        /// What the staging cache (the engine's, or each node's) holds beyond the budget
        /// (`--cold-cache auto` takes half of the memory the process may still take beyond it),
        /// for the replay: a size, or the default, what two MoE layers of a decode step use.
        #[arg(long)]
        cold_cache: Option<String>,
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Expected imbalance, ours vs round-robin, on a synthetic Zipf atlas (Kimi K2 shape by default).
    Simulate {
        #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
        nodes: Vec<usize>,
        /// Zipf exponent of expert popularity.
        #[arg(long, default_value_t = 1.0)]
        zipf: f64,
        /// Replica memory as a fraction of one copy of every expert.
        #[arg(long, default_value_t = 0.10)]
        replica_fraction: f64,
        #[arg(long, default_value_t = 60)]
        layers: usize,
        #[arg(long, default_value_t = 384)]
        experts: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Write a synthetic Zipf atlas (Kimi K2 shape by default) for trying report and plan.
    Synth {
        #[arg(long, default_value_t = 1.0)]
        zipf: f64,
        #[arg(long, default_value_t = 60)]
        layers: usize,
        #[arg(long, default_value_t = 384)]
        experts: usize,
        #[arg(long, default_value_t = 8)]
        top_k: usize,
        #[arg(long, default_value_t = 100_000)]
        tokens: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    nightshift_model::error::quiet_on_closed_pipe();
    nightshift_model::error::cli_exit("nightshift-atlas", run())
}

fn run() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Record {
            model,
            coordinator,
            api_key,
            timeout,
            concurrency,
            prompts,
            max_tokens,
            out,
        } => match (model, coordinator) {
            (Some(model), None) => live::record(&model, &prompts, max_tokens, &out),
            (None, Some(coordinator)) => record_cluster::record(&record_cluster::ClusterRecord {
                coordinator: &coordinator,
                api_key: api_key.as_deref(),
                prompts: &prompts,
                max_tokens,
                out: &out,
                timeout: std::time::Duration::from_secs(timeout.max(1)),
                concurrency,
            }),
            _ => bail!("record: expected exactly one of --model FILE and --coordinator URL"),
        },
        Cmd::Apply {
            placement,
            coordinator,
            api_key,
        } => live::apply(&placement, &coordinator, api_key.as_deref()),
        Cmd::Report {
            atlas,
            placement,
            out,
            window,
            model,
            sequences,
        } => report(atlas, placement, out, window, model, sequences),
        Cmd::Plan {
            atlas,
            nodes,
            memory_budget,
            previous,
            replicas,
            replica_memory,
            window,
            resident_share,
            cold_cache,
            out,
        } => plan_cmd(
            atlas,
            nodes,
            memory_budget,
            previous,
            replicas,
            replica_memory,
            window,
            Split {
                share: resident_share,
                cold_cache,
            },
            out,
        ),
        Cmd::Simulate {
            nodes,
            zipf,
            replica_fraction,
            layers,
            experts,
            seed,
        } => simulate(&nodes, zipf, replica_fraction, layers, experts, seed),
        Cmd::Synth {
            zipf,
            layers,
            experts,
            top_k,
            tokens,
            seed,
            out,
        } => {
            let shape = shape_of(layers, experts)?;
            if top_k == 0 || top_k > experts {
                bail!("--top-k: expected 1..={experts}, found {top_k}");
            }
            let atlas = zipf_atlas(shape, top_k, zipf, tokens, seed);
            atlas.save_atomic(&out)?;
            println!("wrote {}", out.display());
            Ok(())
        }
    }
}

fn shape_of(layers: usize, experts: usize) -> Result<ModelShape> {
    if layers == 0 || experts == 0 {
        bail!("expected at least one MoE layer and one expert, found {layers} layers and {experts} experts");
    }
    let k2 = kimi_k2_shape();
    Ok(ModelShape {
        moe_layers: (1..=layers).collect(),
        n_experts: experts,
        expert_bytes: k2.expert_bytes,
    })
}

fn report(
    atlas: PathBuf,
    placement: Option<PathBuf>,
    out: PathBuf,
    window: bool,
    model: Option<PathBuf>,
    sequences: u32,
) -> Result<()> {
    let a = Atlas::load(&atlas)?;
    let p = placement.as_deref().map(Placement::load).transpose()?;
    let r =
        Report::new(&a, window, p.as_ref()).context("placement does not fit the atlas's model")?;
    print!("{}", r.to_table());
    let counts = if window { &a.window } else { &a.all_time };
    if let Some(m) = model {
        if sequences == 0 {
            bail!("--sequences: expected at least 1, found 0");
        }
        let g = nightshift_model::gguf::Gguf::open(&m)
            .with_context(|| format!("reading {}", m.display()))?;
        let shape =
            nightshift_model::shape::moe_shape(&g).context("the model has no routed experts")?;
        if shape.moe_layers != a.shape.moe_layers || shape.n_experts != a.shape.n_experts {
            bail!(
                "--model {}: expected the atlas's model ({} MoE layers x {} experts), found {} x {}",
                m.display(),
                a.shape.moe_layers.len(),
                a.shape.n_experts,
                shape.moe_layers.len(),
                shape.n_experts
            );
        }
        let dense = nightshift_model::shape::dense_step_bytes(&g);
        let b = nightshift_atlas::report::BatchBound::new(
            counts,
            a.top_k,
            shape.expert_bytes,
            dense,
            sequences,
        );
        println!("\n{}", b.line());
    }
    let written = nightshift_atlas::plots::write_all(&out, &a.shape.moe_layers, counts, &a.model)?;
    for w in written {
        println!("wrote {}", w.display());
    }
    Ok(())
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

#[allow(clippy::too_many_arguments)]
fn plan_cmd(
    atlas: PathBuf,
    nodes: Option<PathBuf>,
    memory_budget: Option<String>,
    previous: Option<PathBuf>,
    replicas: Option<usize>,
    replica_memory: Option<String>,
    window: bool,
    split: Split,
    out: PathBuf,
) -> Result<()> {
    let a = Atlas::load(&atlas)?;
    let full = a.shape.expert_bytes * (a.shape.moe_layers.len() * a.shape.n_experts) as u64;
    let mut node_specs = match &nodes {
        Some(nodes) => {
            let text = std::fs::read_to_string(nodes)
                .with_context(|| format!("cannot read nodes file {}", nodes.display()))?;
            Placement::nodes_from_toml_str(&text)
                .with_context(|| format!("nodes file {}", nodes.display()))?
        }
        None => vec![NodeSpec::named("local")],
    };
    let budget_bytes = match &memory_budget {
        Some(b) => {
            let bytes = parse_size(b, full).context("--memory-budget")?;
            if bytes == 0 {
                bail!("--memory-budget: expected at least one byte, found {b:?} (0 means unlimited in a placement)");
            }
            for n in &mut node_specs {
                n.memory_bytes = bytes;
            }
            Some(bytes)
        }
        None => None,
    };
    let prev = previous.as_deref().map(Placement::load).transpose()?;
    let copies_asked = replicas.is_some_and(|n| n > 0) || replica_memory.is_some();
    let budget = match (replicas, replica_memory) {
        (Some(n), _) => ReplicaBudget::PerLayer(n),
        (None, Some(m)) => ReplicaBudget::Bytes(parse_size(&m, full).context("--replica-memory")?),
        (None, None) => ReplicaBudget::PerLayer(0),
    };
    let counts = if window { &a.window } else { &a.all_time };
    if counts.total_activations() == 0 {
        bail!(
            "atlas {} has no activations in its {} counts: nothing to plan from",
            atlas.display(),
            if window { "window" } else { "all-time" }
        );
    }
    let req = PlanRequest {
        shape: &a.shape,
        counts,
        nodes: node_specs,
        budget,
        previous: prev.as_ref(),
    };
    let fixed_share = split.share.trim() != "auto";
    if budget_bytes.is_none() && (fixed_share || split.cold_cache.is_some()) {
        bail!("--resident-share and --cold-cache split a memory budget: they take --memory-budget");
    }
    if copies_asked && fixed_share {
        bail!("--resident-share splits one copy of each expert's budget: drop --replicas / --replica-memory");
    }
    let mut p = plan(&req)?;
    if let Some(bytes) = budget_bytes {
        if copies_asked {
            println!("resident share: extra copies asked for (--replicas, --replica-memory): the whole budget stays resident");
        } else if let Some(chosen) = split_budget(&a, &req, bytes, &split)? {
            p = chosen;
        }
    }
    print_plan(&p, prev.is_some());
    p.placement.save_atomic(&out)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// `plan`'s choice between a fixed resident set and the staging cache (`--resident-share`).
struct Split {
    share: String,
    cold_cache: Option<String>,
}

/// The plan with `split.share` of each node's `budget` resident (`auto`: the share whose replay
/// of the atlas's decode trace finds the most experts in memory), every node's `memory_bytes`
/// the whole budget (the engine and the nodes lend their staging cache what the resident set
/// leaves); None keeps `req`'s plan (the whole budget resident).
fn split_budget(
    a: &Atlas,
    req: &PlanRequest<'_>,
    budget: u64,
    split: &Split,
) -> Result<Option<Plan>> {
    use nightshift_atlas::split::{
        best, holders, oracle_nodes, replay_nodes, resident_flags, SplitRow, SHARES,
    };
    let share = split.share.trim();
    let fixed = if share == "auto" {
        None
    } else {
        let bytes = parse_size(share, budget).context("--resident-share")?;
        if bytes > budget {
            bail!("--resident-share: expected at most 100% of the budget, found {share:?}");
        }
        Some(bytes)
    };
    let eb = a.shape.expert_bytes.max(1);
    let trace = a
        .temporal
        .as_ref()
        .map(|t| (&t.trace, t.trace_tokens(a.top_k)));
    let extra = match &split.cold_cache {
        Some(c) => parse_size(c, budget).context("--cold-cache")? / eb,
        None => 2 * a.top_k as u64,
    };
    let plan_with = |resident: u64| -> Result<Plan> {
        let mut nodes = req.nodes.clone();
        for n in &mut nodes {
            // memory_bytes 0 is "unlimited": a share below one expert keeps none resident
            n.memory_bytes = resident.max(1);
        }
        let mut p = plan(&PlanRequest {
            shape: req.shape,
            counts: req.counts,
            nodes,
            budget: ReplicaBudget::PerLayer(0),
            previous: req.previous,
        })?;
        for n in &mut p.placement.nodes {
            n.memory_bytes = budget;
        }
        Ok(p)
    };
    let Some((trace, tokens)) = trace.filter(|t| t.1 > 0) else {
        return match fixed {
            Some(bytes) => plan_with(bytes).map(Some),
            None => {
                println!("resident share: the atlas has no routing trace (record it with `nightshift-atlas record --model`): the whole budget stays resident");
                Ok(None)
            }
        };
    };
    let shares: Vec<u64> = match fixed {
        Some(bytes) => vec![bytes],
        None => (0..=SHARES as u128)
            .map(|i| (budget as u128 * i / SHARES as u128) as u64)
            .collect(),
    };
    println!(
        "replaying {tokens} recorded decode tokens against splits of the budget (staging cache beyond it: {extra} experts):"
    );
    println!(
        "  {:>9} {:>9} {:>12} {:>12} {:>14}",
        "resident", "experts", "cache", "in memory", "reads/token"
    );
    let mut rows = Vec::new();
    let mut plans = Vec::new();
    for (i, &bytes) in shares.iter().enumerate() {
        let p = plan_with(bytes)?;
        let flags = resident_flags(&p.placement, &a.shape.moe_layers, a.shape.n_experts);
        let holder = holders(&p.placement, &a.shape.moe_layers, a.shape.n_experts);
        // each node's cache: what its resident experts leave of its budget, plus what it has
        // beyond the budget
        let mut on_node = vec![0u64; p.placement.nodes.len()];
        let held = flags.iter().flatten().zip(holder.iter().flatten());
        for (_, &h) in held.filter(|(&f, _)| f) {
            if let Some(n) = on_node.get_mut(h) {
                *n += 1;
            }
        }
        let caches: Vec<usize> = on_node
            .iter()
            .map(|&r| (budget.saturating_sub(r * a.shape.expert_bytes) / eb + extra) as usize)
            .collect();
        let resident = on_node.iter().sum::<u64>() as usize;
        let cache = caches.iter().sum::<usize>();
        let r = replay_nodes(trace, a.top_k, &flags, Some(&holder), &caches);
        println!(
            "  {:>8.1}% {:>9} {:>12} {:>11.2}% {:>14.2}",
            100.0 * bytes as f64 / budget.max(1) as f64,
            resident,
            cache,
            100.0 * r.hit_rate(),
            r.misses_per_token(tokens)
        );
        rows.push(SplitRow {
            order: i,
            resident_experts: resident,
            cache_experts: cache,
            replay: r,
        });
        plans.push(p);
    }
    let chosen = best(&rows).map_or(0, |r| r.order);
    let row = &rows[chosen];
    // the bound: the same memory on each node, with the future known
    let holder = holders(
        &plans[chosen].placement,
        &a.shape.moe_layers,
        a.shape.n_experts,
    );
    let memory: Vec<usize> = plans[chosen]
        .placement
        .nodes
        .iter()
        .map(|_| (budget / eb + extra) as usize)
        .collect();
    let o = oracle_nodes(trace, a.top_k, Some(&holder), &memory);
    println!(
        "  {:>9} {:>9} {:>12} {:>11.2}% {:>14.2}   (oracle: knows the trace, evicts what is used furthest ahead; a bound, not a policy)",
        "oracle",
        "-",
        memory.iter().sum::<usize>(),
        100.0 * o.hit_rate(),
        o.misses_per_token(tokens)
    );
    println!(
        "resident share: {} experts resident, the staging cache gets the rest of the budget ({} experts with what it has beyond it, over all nodes)",
        row.resident_experts, row.cache_experts
    );
    Ok(Some(plans.swap_remove(chosen)))
}

fn print_plan(p: &Plan, has_previous: bool) {
    println!("extra copies per MoE layer: {}", p.extra_per_layer);
    println!("{:<34} {:>14} {:>14}", "", "planned", "round-robin");
    println!(
        "{:<34} {:>14.3} {:>14.3}",
        "expected max/mean load (per step)", p.ours.imbalance, p.round_robin.imbalance
    );
    println!(
        "{:<34} {:>14.3} {:>14.3}",
        "worst layer max/mean", p.ours.worst_layer, p.round_robin.worst_layer
    );
    if has_previous {
        println!(
            "{:<34} {:>14} {:>14}",
            "bytes to move from --previous",
            gib(p.ours.bytes_to_move),
            gib(p.round_robin.bytes_to_move)
        );
    }
    println!("per node: expected rows (all layers) / held / resident");
    for (i, node) in p.placement.nodes.iter().enumerate() {
        println!(
            "  {:<16} planned {:>12.0} {:>12} {:>12}   round-robin {:>12.0} {:>12}",
            node.name,
            p.ours.node_load[i],
            gib(p.ours.held_bytes[i]),
            gib(p.ours.resident_bytes[i]),
            p.round_robin.node_load[i],
            gib(p.round_robin.held_bytes[i]),
        );
    }
}

fn simulate(
    nodes: &[usize],
    zipf: f64,
    fraction: f64,
    layers: usize,
    experts: usize,
    seed: u64,
) -> Result<()> {
    let shape = shape_of(layers, experts)?;
    if !(0.0..=100.0).contains(&fraction) {
        bail!("--replica-fraction: expected 0..=100, found {fraction}");
    }
    let counts = zipf_counts(&shape, zipf, 1_000_000_000, seed);
    let full = shape.expert_bytes * (layers * experts) as u64;
    println!("synthetic Zipf({zipf}) atlas: {layers} MoE layers x {experts} experts, replica memory {:.0}% of one copy of every expert", fraction * 100.0);
    println!(
        "{:>6} {:>13} {:>13} {:>16} {:>12}",
        "nodes", "round-robin", "no replicas", "with replicas", "worst layer"
    );
    for &n in nodes {
        if n == 0 {
            bail!("--nodes: expected node counts >= 1, found 0");
        }
        let specs: Vec<_> = (0..n)
            .map(|i| nightshift_atlas::placement::NodeSpec::named(format!("node{i}")))
            .collect();
        let none = plan(&PlanRequest {
            shape: &shape,
            counts: &counts,
            nodes: specs.clone(),
            budget: ReplicaBudget::PerLayer(0),
            previous: None,
        })?;
        let budget = ReplicaBudget::Bytes((full as f64 * fraction) as u64);
        let budget = match budget {
            ReplicaBudget::Bytes(_) if n == 1 => ReplicaBudget::PerLayer(0),
            b => b,
        };
        let with = plan(&PlanRequest {
            shape: &shape,
            counts: &counts,
            nodes: specs,
            budget,
            previous: None,
        })?;
        println!(
            "{:>6} {:>13.4} {:>13.4} {:>16.4} {:>12.4}",
            n,
            with.round_robin.imbalance,
            none.ours.imbalance,
            with.ours.imbalance,
            with.ours.worst_layer
        );
    }
    println!("figures: expected max/mean node load per step (sum over layers of max / sum of mean); 1.000 = perfect");
    Ok(())
}
