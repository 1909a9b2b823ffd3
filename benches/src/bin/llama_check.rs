//! `llama-check FILE...`: loads each GGUF (e.g. written by `nightshift gen-model`) in llama.cpp,
//! feeds a fixed token sequence one token at a time, and — when our engine loads the file too —
//! compares our logits with llama.cpp's at every step (max |diff| relative to the logit range,
//! and whether the argmax agrees). Proves the generated files are valid llama.cpp models.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use nightshift_benches::argmax;
use nightshift_benches::llama::Llama;
use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::{build_pool, BatchToken, Engine, EngineOptions, LocalExperts, Model};

/// Load GGUF files in llama.cpp and compare its logits with ours.
#[derive(Parser)]
struct Args {
    /// GGUF files.
    files: Vec<PathBuf>,
    /// Tokens fed (ids spread over the trained BPE vocabulary).
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    /// Show llama.cpp's own log.
    #[arg(long)]
    verbose: bool,
    /// Also generate tiny qwen3moe and deepseek2 models in every mix into this folder and check them.
    #[arg(long)]
    gen_tiny: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if let Some(dir) = &args.gen_tiny {
        std::fs::create_dir_all(dir)?;
        for arch in [Arch::Qwen3Moe, Arch::Deepseek2] {
            for quant in [QuantMix::Q2K, QuantMix::Q4KM, QuantMix::Q8_0, QuantMix::F16] {
                let path = dir.join(format!("gen-tiny-{}-{}.gguf", arch.name(), quant.name()));
                generate(&GenSpec::new(Preset::Tiny, arch, quant), &path, &mut |_| {})?;
                args.files.push(path);
            }
        }
    }
    let ids: Vec<u32> = (0..args.tokens as u32)
        .map(|i| 40 + (i * 97) % 500)
        .collect();
    for f in &args.files {
        let mut l = Llama::load(f, 256, 64, 2, args.verbose)
            .with_context(|| format!("llama.cpp on {}", f.display()))?;
        let mut theirs = Vec::new();
        for &t in &ids {
            l.decode(&[t as i32])?;
            theirs.push(l.last_logits());
        }
        let greedy: Vec<usize> = theirs.iter().map(|r| argmax(r)).collect();
        println!(
            "{}: llama.cpp loaded it (n_vocab {}), argmax per step {:?}",
            f.display(),
            l.n_vocab(),
            greedy
        );
        match ours(f, &ids) {
            Ok(rows) => {
                let mut worst = 0f32;
                let mut agree = 0;
                for (a, b) in rows.iter().zip(&theirs) {
                    let range = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
                    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    worst = worst.max(d / range);
                    agree += usize::from(argmax(a) == argmax(b));
                }
                println!("  nightshift: max |logit diff| / max |logit| = {worst:.2e}, argmax agrees {agree}/{}", ids.len());
            }
            Err(e) => println!("  nightshift could not run it: {e:#}"),
        }
    }
    Ok(())
}

fn ours(path: &PathBuf, ids: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
    let model = Model::load(path)?;
    let pool = build_pool(2)?;
    let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
    let opts = EngineOptions {
        threads: 2,
        pool: Some(pool),
        max_seqs: 1,
        kv_budget_tokens: 1024,
        max_seq_len: 256,
        ..Default::default()
    };
    let mut eng = Engine::new(model, backend, opts)?;
    let seq = eng.add_sequence()?;
    let mut rows = Vec::new();
    for (pos, &token) in ids.iter().enumerate() {
        let mut out = eng.forward(&[BatchToken {
            seq,
            token,
            pos: pos as u32,
            want_logits: true,
        }])?;
        rows.push(out.pop().context("no logits returned")?);
    }
    Ok(rows)
}
