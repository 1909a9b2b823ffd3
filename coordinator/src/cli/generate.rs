//! `nightshift generate`: loads a model and runs one request through the same scheduler `serve`
//! uses (the prompt evaluated as one batch, then decode steps, speculative when the flags say
//! so), streaming the text to stdout; prefill and decode speeds and the draft acceptance go to
//! stderr at the end.

use crate::scheduler::model_backend::{engine_with, EngineLimits};
use crate::scheduler::model_text::ModelText;
use crate::scheduler::{Event, GenRequest, Scheduler, SchedulerOptions, TextModel};
use anyhow::Context;
use nightshift_model::chat::ChatMessage;
use nightshift_model::SamplerParams;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `nightshift generate`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (first split of a split set).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text (a user message with --chat).
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    pub n_predict: usize,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// Threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Where the experts run (--nodes, --placement, --auth-token-file, ...); in process by default.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
    /// Element type of the KV cache, as `serve --kv-type`: f32 (the llama.cpp parity
    /// reference), f16 (half the memory) or q8_0 (llama.cpp's `-ctk q8_0 -ctv q8_0`).
    #[arg(long, default_value = "f32", value_parser = super::serve::parse_kv_type)]
    pub kv_type: nightshift_model::KvType,
    /// The same as `--kv-type f16` (kept for existing scripts).
    #[arg(long, conflicts_with = "kv_type")]
    pub kv_f16: bool,
    /// Speculative decoding (--speculative, --draft-max, --draft-model).
    #[command(flatten)]
    pub spec: crate::cli::spec_args::SpecArgs,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = crate::cluster::load_model(&args.model, &args.cluster)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let tok = model.tokenizer();
    // With --chat the prompt is a user message rendered as `serve` renders one (the same
    // `ModelText`): its text is plain, only the template's markup makes special tokens.
    let ids = if args.chat {
        use crate::scheduler::ChatPrompt;
        let text = ModelText::from_model(&model, None).map_err(anyhow::Error::msg)?;
        let prompt = ChatPrompt {
            messages: vec![ChatMessage::new("user", args.prompt.clone())],
            tools: None,
            extra: None,
        };
        text.tokenize_chat(&prompt)
            .map_err(|e| anyhow::anyhow!("rendering the chat template: {e}"))?
    } else {
        tok.encode(&args.prompt, true, false)
    };
    anyhow::ensure!(!ids.is_empty(), "the prompt tokenized to nothing");
    let pool = nightshift_model::build_pool(args.threads)?;
    // Keeps spawned expert nodes alive until the end of the command.
    let experts = crate::cluster::build(&args.cluster, &model, &args.model, Some(pool.clone()))
        .context("setting up the experts")?;
    let n_ctx = ids.len() + args.n_predict;
    let limits = EngineLimits {
        threads: args.threads,
        max_seqs: 1,
        kv_budget_tokens: n_ctx,
        max_seq_len: 0,
        kv_type: if args.kv_f16 {
            nightshift_model::KvType::F16
        } else {
            args.kv_type
        },
        prefix_cache: false,
        kv_disk: None,
    };
    let spec = args.spec.build(Some(&model), Some(pool.clone()))?;
    let text: Arc<dyn TextModel> =
        Arc::new(ModelText::from_model(&model, None).map_err(anyhow::Error::msg)?);
    let engine = engine_with(model.clone(), experts.backend(), pool, &limits)?;
    // one sequence; its prompt is evaluated as one batch
    let opts = SchedulerOptions {
        queue_capacity: 1,
        max_seqs: 1,
        prefill_chunk: ids.len(),
        n_ctx,
    };
    let scheduler = Scheduler::spawn_speculative(engine, text, opts, spec)
        .context("starting the engine thread")?;
    let params = SamplerParams {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplerParams::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let n = ids.len();
    let t0 = Instant::now();
    let submitted = scheduler.submit(GenRequest {
        id: "generate".into(),
        prompt: ids,
        max_tokens: args.n_predict as u32,
        sampling: params,
        stop: Vec::new(),
        logprobs: None,
        ignore_eos: false,
        constraint: None,
        cache_prompt: false,
        speculative: true,
        prediction: Vec::new(),
        events: tx,
        enqueued: t0,
    });
    anyhow::ensure!(submitted.is_ok(), "the engine thread is not running");
    let mut out = std::io::stdout().lock();
    let mut first: Option<Instant> = None;
    let usage = loop {
        match rx.blocking_recv() {
            Some(Event::Token { text, .. }) => {
                // the first token comes with the prompt's step: prefill ends there
                first.get_or_insert_with(Instant::now);
                write!(out, "{text}")?;
                out.flush()?;
            }
            Some(Event::Done { text, usage, .. }) => {
                writeln!(out, "{text}")?;
                break usage;
            }
            Some(Event::Failed(e)) => anyhow::bail!("generation failed: {}", e.message),
            None => anyhow::bail!("the engine thread stopped"),
        }
    };
    let end = Instant::now();
    let prefill = first.unwrap_or(end).duration_since(t0);
    let decode = end.duration_since(first.unwrap_or(end));
    // the first token is sampled from the prefill step's logits; the rest are decode
    let decoded = usage.completion_tokens.saturating_sub(1);
    eprintln!(
        "prefill: {n} tokens in {:.3}s ({:.2} tok/s); decode: {decoded} tokens in {:.3}s ({:.2} tok/s)",
        prefill.as_secs_f64(),
        n as f64 / prefill.as_secs_f64().max(1e-9),
        decode.as_secs_f64(),
        decoded as f64 / decode.as_secs_f64().max(1e-9)
    );
    if let Some(r) = experts.residency() {
        eprintln!(
            "memory budget: {} MiB of {} MiB resident ({} experts)",
            r.resident_bytes() >> 20,
            r.budget() >> 20,
            r.experts().len()
        );
    }
    if let Some(p) = experts.prefetch() {
        eprintln!("{}", p.stats().summary());
    }
    if let Some(r) = experts.remote() {
        let st = r.take_stats();
        if st.hints > 0 {
            eprintln!(
                "prefetch hints: {} sent to nodes, naming {} experts (how they fared: each node's log)",
                st.hints, st.hint_experts
            );
        }
    }
    if let Some(c) = experts.cold_cache() {
        eprintln!(
            "{} (capacity {} MiB)",
            c.stats().summary(),
            c.capacity() >> 20
        );
    }
    let drafted = usage.accepted_prediction_tokens + usage.rejected_prediction_tokens;
    eprintln!(
        "speculative ({}): {} of {drafted} draft tokens accepted ({:.1}%)",
        args.spec.describe(),
        usage.accepted_prediction_tokens,
        100.0 * usage.accepted_prediction_tokens as f64 / drafted.max(1) as f64
    );
    drop(scheduler);
    Ok(())
}
