//! `nightshift generate`: loads a model, evaluates the prompt as one batch, then samples tokens one
//! at a time, streaming the text to stdout; prefill and decode speeds go to stderr at the end.

use anyhow::Context;
use nightshift_model::chat::ChatMessage;
use nightshift_model::tokenizer::StreamDecoder;
use nightshift_model::{Engine, EngineOptions, Sampler, SamplerParams};
use std::io::Write;
use std::path::PathBuf;
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
    /// Keep the KV cache in f16 (half the memory; F32 is the llama.cpp parity reference).
    #[arg(long)]
    pub kv_f16: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = crate::cluster::load_model(&args.model, &args.cluster)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let tok = model.tokenizer();
    // With --chat the prompt is a user message rendered as `serve` renders one (the same
    // `ModelText`): its text is plain, only the template's markup makes special tokens.
    let ids = if args.chat {
        use crate::scheduler::{ChatPrompt, TextModel};
        let text = crate::scheduler::model_text::ModelText::from_model(&model, None)
            .map_err(anyhow::Error::msg)?;
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
    let backend = experts.backend();
    let opts = EngineOptions {
        pool: Some(pool),
        ..EngineOptions::default()
    };
    let mut engine = Engine::new(model.clone(), backend, opts)?;
    if args.kv_f16 {
        engine.set_kv_type(nightshift_model::KvType::F16)?;
    }
    let seq = engine.add_sequence()?;
    let params = SamplerParams {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplerParams::default()
    };
    let mut sampler = Sampler::new(params, &ids);

    let t0 = Instant::now();
    let n = ids.len();
    let mut logits = engine.prefill(seq, &ids)?;
    let prefill = t0.elapsed();

    let mut out = std::io::stdout().lock();
    let mut dec = StreamDecoder::new();
    let t1 = Instant::now();
    let mut generated = 0usize;
    for i in 0..args.n_predict {
        let next = sampler.sample(&logits);
        if tok.is_eog(next) {
            break;
        }
        sampler.accept(next);
        generated += 1;
        write!(out, "{}", dec.push(tok, next))?;
        out.flush()?;
        if i + 1 == args.n_predict {
            break;
        }
        logits = engine.prefill(seq, &[next])?;
    }
    writeln!(out, "{}", dec.flush())?;
    let decode = t1.elapsed();
    eprintln!(
        "prefill: {n} tokens in {:.3}s ({:.2} tok/s); decode: {generated} tokens in {:.3}s ({:.2} tok/s)",
        prefill.as_secs_f64(),
        n as f64 / prefill.as_secs_f64().max(1e-9),
        decode.as_secs_f64(),
        generated as f64 / decode.as_secs_f64().max(1e-9)
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
    Ok(())
}
