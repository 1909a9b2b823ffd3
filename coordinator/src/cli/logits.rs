//! `nightshift logits`: evaluates prompt ids as one batch, then decode ids one at a time through the
//! KV cache, and writes one row of f32 little-endian logits per token (the layout of the llama.cpp
//! fixtures' `.logits.bin`), so parity can be checked from the command line.

use anyhow::Context;
use nightshift_model::{Engine, EngineOptions};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `nightshift logits`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (first split of a split set).
    #[arg(long)]
    pub model: PathBuf,
    /// Comma-separated token ids evaluated as one batch.
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Comma-separated token ids evaluated one at a time after the prompt.
    #[arg(long, value_delimiter = ',')]
    pub decode_ids: Vec<u32>,
    /// Output file: one row of n_vocab f32 (little-endian) per token.
    #[arg(long)]
    pub out: PathBuf,
    /// Threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Where the experts run (--nodes, --placement, --auth-token-file, ...); in process by default.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = crate::cluster::load_model(&args.model, &args.cluster)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let pool = nightshift_model::build_pool(args.threads)?;
    // Keeps spawned expert nodes alive until the end of the command.
    let experts = crate::cluster::build(&args.cluster, &model, &args.model, Some(pool.clone()))
        .context("setting up the experts")?;
    let backend = experts.backend();
    let opts = EngineOptions {
        pool: Some(pool),
        ..EngineOptions::default()
    };
    let mut engine = Engine::new(model, backend, opts)?;
    let seq = engine.add_sequence()?;
    let mut rows = engine.prefill_all(seq, &args.prompt_ids)?;
    for &t in &args.decode_ids {
        rows.push(engine.prefill(seq, &[t])?);
    }
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    for r in &rows {
        for v in r {
            w.write_all(&v.to_le_bytes())?;
        }
    }
    w.flush()?;
    eprintln!(
        "wrote {} rows of {} logits to {}",
        rows.len(),
        rows.first().map_or(0, |r| r.len()),
        args.out.display()
    );
    Ok(())
}
