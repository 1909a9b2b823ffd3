//! `nightshift plan-cluster`: the capacity planner (`crate::plan`) on the command line. Takes a
//! model (GGUF file or `gen-model` preset and quant), the VM table, the routing (atlas, Zipf
//! skew or uniform), the round trip and batch; calibrates on this machine (or loads a saved
//! calibration) and prints, per VM size, the nodes needed and the predicted decode and prefill
//! speed, network bytes per token, memory per VM and costs.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args as ClapArgs;

use crate::plan::{
    Calibration, ModelCost, PlanError, Routing, Scenario, VmTable, REVIEW_IN, REVIEW_OUT,
};

#[derive(ClapArgs, Debug)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["model", "preset"])))]
pub struct Args {
    /// GGUF model file (only its header is read).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A gen-model preset with a real model's shape: kimi-k2, deepseek-v3, qwen3-30b-a3b.
    #[arg(long)]
    preset: Option<String>,
    /// With --preset: the quant mix (UD-Q2_K_XL, UD-IQ1_S, UD-IQ2_XXS, Q2_K, Q4_K_M, Q8_0).
    #[arg(long, default_value = "UD-Q2_K_XL", requires = "preset")]
    quant: String,
    /// VM table (TOML, the format of coordinator/data/vms.toml; default: the built-in one).
    #[arg(long)]
    vms: Option<PathBuf>,
    /// Node VM size (default: every size of the table, one row each).
    #[arg(long)]
    vm: Option<String>,
    /// Coordinator VM size (default: the node's).
    #[arg(long)]
    coordinator_vm: Option<String>,
    /// Expert nodes (default: the fewest whose memory holds every expert once).
    #[arg(long)]
    nodes: Option<usize>,
    /// Routing from a recorded atlas (`nightshift-atlas record`).
    #[arg(long, conflicts_with = "zipf")]
    atlas: Option<PathBuf>,
    /// Routing skew as a Zipf exponent over experts (0: uniform, the default without --atlas).
    #[arg(long)]
    zipf: Option<f64>,
    /// Round trip coordinator <-> node, microseconds.
    #[arg(long, default_value_t = 100.0)]
    rtt_us: f64,
    /// Software cost of one layer call (gRPC, TLS, node dispatch), microseconds; `cluster-report
    /// --netns` measures it on this machine.
    #[arg(long, default_value_t = 50.0)]
    call_overhead_us: f64,
    /// Decode batch (sequences decoded together).
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Context length of each sequence (KV cache read per step and held in memory).
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// KV cache type (as `serve --kv-type`): f32 or f16.
    #[arg(long, default_value = "f32", value_parser = super::serve::parse_kv_type)]
    kv_type: nightshift_model::KvType,
    /// Rows per prefill chunk.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Predict without the overlap of the shared expert with the routed experts' call.
    #[arg(long)]
    no_overlap: bool,
    /// Predict without the two micro-batches whose layer calls alternate (batch >= 2).
    #[arg(long)]
    no_micro_batches: bool,
    /// Load the calibration from this file instead of measuring.
    #[arg(long, conflicts_with = "save_calibration")]
    calibration: Option<PathBuf>,
    /// Measure and save the calibration here.
    #[arg(long)]
    save_calibration: Option<PathBuf>,
    /// Threads the calibration measures with (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// MiB of expert copies the from-memory calibration pass sweeps (more than the LLC).
    #[arg(long, default_value_t = 256)]
    calibration_mib: usize,
}

fn gib(b: f64) -> f64 {
    b / (1u64 << 30) as f64
}

/// Runs the subcommand.
pub fn run(a: Args) -> anyhow::Result<()> {
    let model = match (&a.model, &a.preset) {
        (Some(p), _) => ModelCost::from_gguf(p)?,
        (None, Some(p)) => ModelCost::from_preset(p, &a.quant)?,
        (None, None) => {
            return Err(PlanError::Input("expected --model FILE or --preset NAME".into()).into())
        }
    };
    let table = match &a.vms {
        Some(p) => VmTable::load(p)?,
        None => VmTable::builtin()?,
    };
    for (what, x) in [
        ("--rtt-us", a.rtt_us),
        ("--call-overhead-us", a.call_overhead_us),
    ] {
        if !(x.is_finite() && x >= 0.0) {
            return Err(
                PlanError::Input(format!("{what}: expected microseconds >= 0, found {x}")).into(),
            );
        }
    }
    if a.batch == 0 || a.prefill_chunk == 0 || a.nodes == Some(0) {
        return Err(PlanError::Input(
            "--batch, --prefill-chunk and --nodes: expected at least 1, found 0".into(),
        )
        .into());
    }
    // Q8_0: 34 bytes per 32 elements
    let kv_elem_bytes = a.kv_type.bytes(1 << 10) as f64 / f64::from(1u32 << 10);
    let routing = match (&a.atlas, a.zipf) {
        (Some(p), _) => Routing::from_atlas(p, model.n_expert, model.n_used)?,
        (None, Some(s)) => Routing::zipf(model.n_expert, model.n_used, s)?,
        (None, None) => Routing::uniform(model.n_expert, model.n_used),
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cal = match &a.calibration {
        Some(p) => Calibration::load(p, &model)?,
        None => {
            eprintln!(
                "calibrating on this machine ({threads} threads, {} MiB of {} experts)...",
                a.calibration_mib,
                Calibration::key(&model)
            );
            let c = Calibration::measure(&model, threads, a.calibration_mib)?;
            if let Some(p) = &a.save_calibration {
                c.save(p)
                    .with_context(|| format!("saving the calibration to {}", p.display()))?;
            }
            c
        }
    };
    println!(
        "model {}: {} layers ({} MoE) x {} experts (top {}), {:.1} GiB ({:.1} GiB experts, {:.2} GiB dense, {:.2} GiB embedding), expert {:.1} MiB, activation row {} B, KV {} values/position",
        model.name,
        model.n_layer,
        model.moe_layers,
        model.n_expert,
        model.n_used,
        gib(model.total_bytes() as f64),
        gib(model.all_expert_bytes() as f64),
        gib(model.dense_bytes as f64),
        gib(model.embd_bytes as f64),
        model.expert_bytes as f64 / (1u64 << 20) as f64,
        model.act_row_bytes,
        model.kv_floats_per_pos
    );
    println!(
        "calibration ({} experts, {} threads): plain read {:.1} GB/s, expert FFN from memory {:.1} GB/s (efficiency {:.2}), FFN on cached weights {:.2} GB-rows/s per core",
        cal.expert,
        cal.threads,
        cal.stream_gbs,
        cal.ffn_gbs,
        cal.efficiency(),
        cal.ffn_byte_rows_per_core / 1e9
    );
    println!(
        "{} | batch {} | context {} ({} KV) | rtt {} us + {} us per call | prefill chunks of {} | overlap {}, micro-batches {} | review = {} in + {} out",
        routing.what,
        a.batch,
        a.context,
        a.kv_type.name(),
        a.rtt_us,
        a.call_overhead_us,
        a.prefill_chunk,
        if a.no_overlap { "off" } else { "on" },
        if a.no_overlap || a.no_micro_batches { "off" } else { "on" },
        REVIEW_IN,
        REVIEW_OUT
    );
    let vms: Vec<_> = match &a.vm {
        Some(n) => vec![table.get(n)?],
        None => table.vms.iter().collect(),
    };
    let coord_vm = a
        .coordinator_vm
        .as_deref()
        .map(|n| table.get(n))
        .transpose()?;
    println!(
        "{:>18} | {:>5} | {:>9} | {:>9} | {:>8} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>8} | {:>8} | {:>8} | {:>9} | {}",
        "node vm", "nodes", "node GiB", "coord GiB", "dec t/s", "step", "coord", "nodes", "network", "hidden", "pref t/s",
        "MB/token", "$/hour", "$/Mtok", "$/review", "fits"
    );
    for vm in vms {
        let coordinator = coord_vm.unwrap_or(vm);
        let nodes = a.nodes.unwrap_or_else(|| Scenario::min_nodes(&model, vm));
        let s = Scenario {
            model: &model,
            routing: &routing,
            cal: &cal,
            coordinator,
            node: vm,
            nodes,
            batch: a.batch,
            rtt: a.rtt_us * 1e-6,
            call_overhead: a.call_overhead_us * 1e-6,
            context: a.context,
            kv_elem_bytes,
            prefill_chunk: a.prefill_chunk,
            overlap: !a.no_overlap,
            micro_batches: !a.no_micro_batches,
            shared_cores: false,
        };
        let p = s.predict();
        println!(
            "{:>18} | {:>5} | {:>4.0}/{:<4.0} | {:>4.0}/{:<4.0} | {:>8.2} | {:>6.1} ms | {:>6.1} ms | {:>6.1} ms | {:>6.1} ms | {:>6.1} ms | {:>9.1} | {:>8.2} | {:>8.2} | {:>8.2} | {:>9.4} | {}",
            vm.name,
            nodes,
            gib(p.node_bytes),
            vm.memory_gib,
            gib(p.coordinator_bytes),
            coordinator.memory_gib,
            p.decode_tok_s,
            1e3 * p.step,
            1e3 * p.step_coordinator,
            1e3 * p.step_nodes,
            1e3 * p.step_network,
            1e3 * p.step_hidden,
            p.prefill_tok_s,
            p.bytes_per_token / 1e6,
            p.usd_per_hour,
            p.usd_per_mtok,
            p.usd_per_review,
            if p.fits { "yes" } else { "NO: memory" }
        );
    }
    println!("(step = coord + nodes + network - hidden: the decode step's parts and what the overlaps hide. VM figures: see the table's sources)");
    Ok(())
}
