//! `nightshift`: the coordinator binary. One clap subcommand per module in `cli/`; each module owns
//! its `Args` and `run`, so this file only lists them.

use clap::{Parser, Subcommand};
use nightshift_coordinator::cli;

/// NightShift: serve trillion-parameter mixture-of-experts models from Arm CPUs.
#[derive(Parser)]
#[command(version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it, and print prefill/decode speed.
    Generate(cli::generate::Args),
    /// Tokenize text with the model's tokenizer and print the ids as JSON.
    Tokenize(cli::tokenize::Args),
    /// Evaluate token ids and write one row of f32 logits per token (the parity tool).
    Logits(cli::logits::Args),
    /// Write a random-weight GGUF in llama.cpp's layout (demo and benchmark models).
    GenModel(cli::gen_model::Args),
    /// Serve the OpenAI-compatible API (chat, completions, streaming) with continuous batching.
    Serve(cli::serve::Args),
    /// Predict VMs, speed, network traffic, memory and cost of a cluster for a MoE model.
    PlanCluster(cli::plan_cluster::Args),
    /// Benchmarks and load tools (`bench serve`).
    Bench(cli::bench_serve::BenchArgs),
}

fn main() -> std::process::ExitCode {
    nightshift_model::error::cli_exit("nightshift", run())
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // a report piped into `head` ends quietly; a server keeps running when its log pipe closes
    if !matches!(cli.command, Command::Serve(_)) {
        nightshift_model::error::quiet_on_closed_pipe();
    }
    match cli.command {
        Command::Generate(a) => cli::generate::run(a),
        Command::Tokenize(a) => cli::tokenize::run(a),
        Command::Logits(a) => cli::logits::run(a),
        Command::GenModel(a) => cli::gen_model::run(a),
        Command::Serve(a) => cli::serve::run(a),
        Command::PlanCluster(a) => cli::plan_cluster::run(a),
        Command::Bench(a) => cli::bench_serve::run(a),
    }
}
