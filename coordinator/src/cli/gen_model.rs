//! `nightshift gen-model`: writes a random-weight GGUF in llama.cpp's exact layout (qwen3moe,
//! deepseek2, dense qwen3 or llama; tiny / Qwen3-30B-A3B / Kimi K2 / Qwen3-0.6B shapes; Q2_K /
//! Q4_K_M / Q8_0 / F16 / UD i-quant mixes) with an
//! indicatif progress bar. The work is `nightshift_model::gen::generate`; this file parses
//! arguments and shows progress.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use nightshift_model::gen::{self, Arch, GenSpec, Preset, QuantMix};

/// Arguments of `nightshift gen-model`.
#[derive(clap::Args)]
pub struct Args {
    /// Architecture: qwen3moe, deepseek2, qwen3 or llama (default: the preset's; required for
    /// `tiny`).
    #[arg(long)]
    arch: Option<String>,
    /// Shape preset: tiny, qwen3-30b-a3b, kimi-k2, deepseek-v3 or qwen3-0.6b.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Keep only the first N layers (deepseek2 keeps its leading dense layer).
    #[arg(long)]
    layers: Option<usize>,
    /// Number of routed experts per MoE layer (experts used per token is capped to it).
    #[arg(long)]
    experts: Option<usize>,
    /// Vocabulary size (the trained BPE padded with unused tokens; default: the preset's).
    #[arg(long)]
    vocab: Option<usize>,
    /// Seed of the random weights (same arguments and seed, same bytes).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Quant mix: llama.cpp's Q2_K, Q4_K_M, Q8_0, F16 or MXFP4_MOE, or Unsloth-shaped UD-IQ1_S,
    /// UD-IQ2_XXS (i-quant experts as random valid blocks) or UD-Q2_K_XL.
    #[arg(long, default_value = "Q4_K_M")]
    quant: String,
    /// Keep output.weight in F32 (llama-quantize --leave-output-tensor, as the fixtures do).
    #[arg(long)]
    leave_output_tensor: bool,
    /// general.name of the model.
    #[arg(long)]
    name: Option<String>,
    /// Embed this chat template (a Jinja file, e.g. a model's published template) instead of
    /// the architecture's own; its special markers (`<|...|>`, `<｜...｜>`, `<tool_call>`, ...)
    /// are added to the vocabulary.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Context length written to the file (default: the preset's).
    #[arg(long)]
    ctx: Option<u32>,
    /// How routers are drawn: `uniform` (i.i.d., every expert equally likely; the fixtures'
    /// weights) or `published` (the skew and temporal locality measured on real MoE models:
    /// the hottest half of experts take ~75% of a layer's activations, ~45% of a token's
    /// experts were the previous token's; see model/src/gen/skew.rs).
    #[arg(long, default_value = "uniform", value_name = "uniform|published")]
    routing_skew: String,
    /// Only print the plan (tensors, types, size) without writing.
    #[arg(long)]
    dry_run: bool,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let preset: Preset = args.preset.parse()?;
    let arch: Arch = match (&args.arch, preset.arch()) {
        (Some(a), _) => a.parse()?,
        (None, Some(a)) => a,
        (None, None) => {
            anyhow::bail!("preset `tiny` needs --arch qwen3moe, deepseek2, qwen3 or llama")
        }
    };
    let quant: QuantMix = args.quant.parse()?;
    let spec = GenSpec {
        arch,
        preset,
        layers: args.layers,
        experts: args.experts,
        vocab: args.vocab,
        seed: args.seed,
        quant,
        leave_output: args.leave_output_tensor,
        name: args.name.clone(),
        chat_template: match &args.chat_template {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading the chat template {}", p.display()))?,
            ),
            None => None,
        },
        ctx: args.ctx,
        routing: args.routing_skew.parse()?,
    };
    let plan = gen::plan(&spec)?;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    eprintln!(
        "{} {} {} ({} routing): {} layers, {} experts, vocab {}, {:.2} B params, {:.2} GiB of tensor data",
        arch.name(),
        preset.name(),
        quant.name(),
        spec.routing.name(),
        plan.dims.n_layer,
        plan.dims.n_expert,
        plan.n_vocab,
        plan.n_params() as f64 / 1e9,
        gib(plan.data_bytes())
    );
    if args.dry_run {
        for (t, _) in &plan.tensors {
            println!("{:<32} {:<6} {:?}", t.name, t.ty.name(), t.dims);
        }
        return Ok(());
    }
    let Some(out) = args.output else {
        anyhow::bail!("expected an output file (-o FILE), found none");
    };
    let bar = ProgressBar::new(plan.data_bytes());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .context("progress bar template")?,
    );
    let start = Instant::now();
    let written = gen::generate(&spec, &out, &mut |p| {
        bar.set_position(p.bytes_done);
        bar.set_message(p.tensor.to_string());
    })
    .with_context(|| format!("generating {}", out.display()))?;
    bar.finish_and_clear();
    if let Some(c) = &written.calibration {
        eprint!("{}", c.summary());
    }
    eprintln!(
        "wrote {} in {:.1} s",
        out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
