//! `nightshift tokenize`: prints the model tokenizer's ids for a text as a JSON array.

use anyhow::Context;
use nightshift_model::gguf::Gguf;
use nightshift_model::tokenizer::Tokenizer;
use std::path::PathBuf;

/// Arguments of `nightshift tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// Text to tokenize.
    #[arg(long)]
    pub text: String,
    /// Treat special-token text (e.g. `<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_special: bool,
    /// Do not add the BOS token even if the model asks for it.
    #[arg(long)]
    pub no_bos: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let g = Gguf::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(&g)?;
    let ids = tok.encode(&args.text, !args.no_bos, !args.no_special);
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    println!("[{}]", list.join(","));
    Ok(())
}
