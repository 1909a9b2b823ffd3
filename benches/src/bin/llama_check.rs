//! `llama-check FILE...`: loads each GGUF (e.g. written by `nightshift gen-model`) in llama.cpp,
//! feeds a fixed token sequence one token at a time, and — when our engine loads the file too —
//! compares our logits with llama.cpp's at every step (max |diff| relative to the logit range,
//! and whether the argmax agrees). Proves the generated files are valid llama.cpp models.
//!
//! `--fixtures DIR` also writes, per file, what llama.cpp computes on it in the format of the
//! parity fixtures (`model/tests/data/NAME.expected.json` + `NAME.logits.bin`, as
//! shared/tools/make_models.py writes them): its tokenization of the test strings, and the logits
//! of every position of each test prompt (the prompt in one batch, then its greedy continuation
//! one token at a time through the F32 KV cache, one thread).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use nightshift_benches::argmax;
use nightshift_benches::llama::{FlashAttn, Llama};
use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::{
    build_pool, BatchToken, Engine, EngineOptions, KvType, LocalExperts, Model,
};
use serde_json::json;

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
    /// Also generate tiny qwen3moe, deepseek2, qwen3 and llama models in every mix into this
    /// folder and check them.
    #[arg(long)]
    gen_tiny: Option<PathBuf>,
    /// Write each file's llama.cpp expectations (NAME.expected.json, NAME.logits.bin) here.
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// K and V cache type of both engines (f32, f16, q8_0: llama.cpp's -ctk/-ctv, with flash
    /// attention for q8_0); other than f32 the fixtures are named NAME.kv-TYPE.*.
    #[arg(long, default_value = "f32", value_parser = KvType::parse)]
    kv_type: KvType,
    /// Write llama.cpp's graph tensors named in `--dump-names` (comma-separated ggml names,
    /// e.g. `kv_cmpr-2,kqv-2`) to this folder as they are computed (`llama::dump_tensors`).
    #[arg(long, requires = "dump_names")]
    dump_dir: Option<PathBuf>,
    #[arg(long, value_delimiter = ',', requires = "dump_dir")]
    dump_names: Vec<String>,
}

/// make_models.py's TEST_STRINGS: tokenized with BOS and special tokens.
const TEST_STRINGS: [&str; 7] = [
    "Hello world",
    " the quick brown fox jumps over the lazy dog",
    "def route(hidden, experts, top_k=8):\n    return experts[:top_k]",
    "getUserName and parseHTTPResponse in 12345 lines",
    "tabs\tand\n\nnewlines   and  spaces",
    "unicode: café naïve — “quotes” 東京 深度学习 😀",
    "<|im_start|>user\nhi<|im_end|>",
];
/// make_models.py's PROMPTS.
const PROMPTS: [&str; 2] = [
    "The coordinator runs attention and routing",
    "def main():\n    print(42)",
];
/// Greedy tokens after each prompt (make_models.py's `a_greedy`).
const GREEDY: usize = 16;

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if let Some(dir) = &args.dump_dir {
        nightshift_benches::llama::dump_tensors(dir, args.dump_names.clone())
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    if let Some(dir) = &args.gen_tiny {
        std::fs::create_dir_all(dir)?;
        for arch in Arch::ALL {
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
    if let Some(dir) = &args.fixtures {
        std::fs::create_dir_all(dir)?;
        for f in &args.files {
            let (json, logits) = write_fixture(f, dir, args.verbose, args.kv_type)?;
            println!("wrote {} and {}", json.display(), logits.display());
        }
    }
    for f in &args.files {
        let mut l = Llama::load_kv(f, 256, 64, 2, args.verbose, args.kv_type, FlashAttn::Off)
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
        match ours(f, &ids, args.kv_type) {
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

fn ours(path: &PathBuf, ids: &[u32], kv: KvType) -> anyhow::Result<Vec<Vec<f32>>> {
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
    eng.set_kv_type(kv)?;
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

/// Runs make_models.py's `expected` on `path` in llama.cpp with a `kv` cache and writes
/// `dir/STEM.expected.json` and `dir/STEM.logits.bin` (rows of n_vocab little-endian f32, one per
/// token of each prompt's ids + greedy, the prompts one after the other; STEM gains `.kv-TYPE`
/// for a cache other than f32). Returns the two paths.
fn write_fixture(
    path: &Path,
    dir: &Path,
    verbose: bool,
    kv: KvType,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .context("expected a file name ending in .gguf")?;
    let stem = match kv {
        KvType::F32 => stem.to_string(),
        _ => format!("{stem}.kv-{}", kv.name()),
    };
    let name = path
        .file_name()
        .and_then(|s| s.to_str())
        .context("expected a file name")?;
    // one thread (and an F32 cache unless told), as make_models.py runs llama.cpp
    let mut l = Llama::load_kv(path, 256, 256, 1, verbose, kv, FlashAttn::Off)
        .with_context(|| format!("llama.cpp on {}", path.display()))?;
    let nv = l.n_vocab();
    let mut tokenize = Vec::new();
    for s in TEST_STRINGS {
        tokenize.push(json!({
            "text": s, "add_bos": true, "special": true, "ids": l.tokenize(s, true, true)?,
        }));
    }
    let mut prompts = Vec::new();
    let mut blob: Vec<u8> = Vec::new();
    let mut offset = 0usize;
    for p in PROMPTS {
        let ids = l.tokenize(p, true, true)?;
        l.clear();
        l.decode_all(&ids, 0)?;
        let mut rows: Vec<Vec<f32>> = (0..ids.len() as i32).map(|i| l.logits_ith(i)).collect();
        let mut greedy = Vec::new();
        for step in 0..GREEDY {
            let last = rows
                .last()
                .context("expected a prompt of at least one token")?;
            let next = argmax(last) as i32;
            greedy.push(next);
            l.decode_all(&[next], (ids.len() + step) as i32)?;
            rows.push(l.logits_ith(-1));
        }
        if let Some(r) = rows.iter().find(|r| r.len() != nv) {
            anyhow::bail!("expected rows of {nv} logits, found {}", r.len());
        }
        for r in &rows {
            for x in r {
                blob.extend_from_slice(&x.to_le_bytes());
            }
        }
        prompts.push(json!({
            "text": p,
            "ids": ids,
            "greedy": greedy,
            "logits_rows": "one per token of ids + greedy",
            "logits_offset_floats": offset,
            "logits_shape": [rows.len(), nv],
        }));
        offset += rows.len() * nv;
    }
    let logits_path = dir.join(format!("{stem}.logits.bin"));
    let json_path = dir.join(format!("{stem}.expected.json"));
    let rec = json!({
        "model": name,
        "kv_cache": kv.name(),
        "tokenize": tokenize,
        "prompts": prompts,
        "logits_file": format!("{stem}.logits.bin"),
    });
    std::fs::write(&logits_path, &blob)?;
    std::fs::write(&json_path, serde_json::to_string_pretty(&rec)? + "\n")?;
    Ok((json_path, logits_path))
}
