//! `e2e-report`: end-to-end prefill / decode speed of nightshift next to llama.cpp (feature
//! `ggml`) on a `gen-model` file shaped like Qwen3-30B-A3B with fewer layers (generated once into
//! `--models-dir`), plus a STREAM triad bandwidth measurement and the decode roofline: bandwidth ÷
//! weight bytes read per decoded token (attention, router, the `used/experts` share of the expert
//! stacks, the output head, one embedding row). `--depth 4096,16384` adds prefill at depth as
//! `llama-bench -p N -d D` measures it: N prompt tokens in one batch on top of a cache already
//! holding D positions, both engines in the same run with the same threads and cache type, with
//! the attention share of our prefill step. Prints markdown tables.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use nightshift_benches::argmax;
use nightshift_benches::stream::triad_bandwidth;
use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::gguf::Gguf;
use nightshift_model::{build_pool, BatchToken, Engine, EngineOptions, LocalExperts, Model};
use nightshift_model::{KvLayout, KvType};

/// End-to-end tokens/s of nightshift vs llama.cpp, with bandwidth and roofline.
#[derive(Parser)]
struct Args {
    /// Quant mixes to generate and measure.
    #[arg(long, value_delimiter = ',', default_value = "Q4_K_M,Q2_K")]
    quant: Vec<String>,
    /// Layers kept of Qwen3-30B-A3B's 48 (6 gives 2.4 GB at Q4_K_M, 1.6 GB at Q2_K).
    #[arg(long, default_value_t = 6)]
    layers: usize,
    /// Where generated models are cached.
    #[arg(long, default_value = "target/bench-models")]
    models_dir: PathBuf,
    /// Measure this file instead of generating (repeatable).
    #[arg(long)]
    model: Vec<PathBuf>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// f64 elements per STREAM array (3 arrays).
    #[arg(long, default_value_t = 1 << 25)]
    stream_len: usize,
    /// Sequences decoding together in the phase table (each with a `--phase-context` prompt);
    /// the first entry is the baseline the others are compared with.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    seqs: Vec<usize>,
    /// Prompt tokens per sequence before the phase table's decode steps.
    #[arg(long, default_value_t = 128)]
    phase_context: usize,
    /// Decode steps timed per phase-table row.
    #[arg(long, default_value_t = 48)]
    phase_steps: usize,
    #[arg(long)]
    skip_ours: bool,
    #[arg(long)]
    skip_llama: bool,
    /// Cache depths of the prefill-at-depth table (none: no table).
    #[arg(long, value_delimiter = ',')]
    depth: Vec<usize>,
    /// Prompt tokens prefilled on top of each depth (one batch).
    #[arg(long, default_value_t = 512)]
    depth_prefill: usize,
    /// Runs of each engine per depth, alternating (the host drifts: ranges are printed).
    #[arg(long, default_value_t = 2)]
    depth_reps: usize,
    /// K/V cache type of both engines in the depth table (f32, f16, q8_0).
    #[arg(long, default_value = "f32", value_parser = KvType::parse)]
    kv_type: KvType,
    /// Only the depth table.
    #[arg(long)]
    depth_only: bool,
}

/// Tokens per wall-clock second and per CPU-second of the whole process (the latter barely moves
/// when other processes compete for the cores; with one thread it is the uncontended speed).
struct Speeds {
    prefill: f64,
    decode: f64,
    prefill_cpu: f64,
    decode_cpu: f64,
    /// Memory of this process after the run, when it is ours (one line).
    memory: Option<String>,
}

/// Wall and process-CPU clocks, started together.
struct Clock {
    wall: Instant,
    cpu: f64,
}

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

impl Clock {
    fn start() -> Clock {
        Clock {
            wall: Instant::now(),
            cpu: cpu_seconds(),
        }
    }

    /// (per wall second, per CPU second) rates of `n` items since start.
    fn rates(&self, n: usize) -> (f64, f64) {
        (
            n as f64 / self.wall.elapsed().as_secs_f64(),
            n as f64 / (cpu_seconds() - self.cpu),
        )
    }
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bw1 = triad_bandwidth(a.stream_len, 1, 5)?;
    let bw = triad_bandwidth(a.stream_len, a.threads, 5)?;
    println!(
        "STREAM triad ({} MiB per array): 1 thread {:.2} GB/s, {} threads {:.2} GB/s\n",
        (a.stream_len * 8) >> 20,
        bw1 / 1e9,
        a.threads,
        bw / 1e9
    );
    let mut files = a.model.clone();
    if files.is_empty() {
        for q in &a.quant {
            files.push(ensure_model(&a.models_dir, q.parse()?, a.layers)?);
        }
    }
    if !a.depth.is_empty() {
        depth_table(&a, &files)?;
        if a.depth_only {
            return Ok(());
        }
    }
    println!("threads {}, load average before: {}", a.threads, loadavg());
    println!(
        "| model | file GB | engine | prefill {} tok/s (per CPU-s) | decode {} tok/s (per CPU-s) | weight MB read / token | STREAM GB/s | roofline tok/s | decode % of roofline |",
        a.prefill, a.decode
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    // This host's bandwidth drifts (shared machines): the triad is measured again right after
    // each decode run, and the roofline divides by the best of that and the first measurement,
    // so a slow moment never inflates the fraction.
    let after_run =
        || -> anyhow::Result<f64> { Ok(triad_bandwidth(a.stream_len, a.threads, 5)?.max(bw)) };
    let mut memory: Vec<String> = Vec::new();
    for f in &files {
        let bytes_per_tok = bytes_per_token(f)?;
        let gb = std::fs::metadata(f)?.len() as f64 / 1e9;
        let prompt: Vec<u32> = (0..a.prefill as u32)
            .map(|i| 40 + (i * 7919) % 500)
            .collect();
        let name = f
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let row = |engine: &str, s: &Speeds, bw: f64| {
            let roof = bw / bytes_per_tok;
            println!(
                "| {name} | {gb:.2} | {engine} | {:.1} ({:.1}) | {:.2} ({:.2}) | {:.0} | {:.2} | {:.2} | {:.0}% |",
                s.prefill,
                s.prefill_cpu,
                s.decode,
                s.decode_cpu,
                bytes_per_tok / 1e6,
                bw / 1e9,
                roof,
                100.0 * s.decode / roof
            );
        };
        if !a.skip_ours {
            match ours(f, &prompt, a.decode, a.threads) {
                Ok(s) => {
                    row("nightshift", &s, after_run()?);
                    memory.extend(s.memory.map(|m| format!("{name}: {m}")));
                }
                Err(e) => println!("| {name} | {gb:.2} | nightshift | failed: {e:#} | | | | | |"),
            }
        }
        #[cfg(feature = "ggml")]
        if !a.skip_llama {
            match llama(f, &prompt, a.decode, a.threads) {
                Ok(s) => row("llama.cpp", &s, after_run()?),
                Err(e) => println!("| {name} | {gb:.2} | llama.cpp | failed: {e:#} | | | | | |"),
            }
        }
    }
    for m in &memory {
        println!("nightshift memory after its run, {m}");
    }
    if !a.skip_ours && !a.seqs.is_empty() {
        phase_table(&a, &files)?;
    }
    Ok(())
}

/// Where nightshift's decode time goes, by phase (the engine's `StepProfile`), for 1 and for
/// several sequences decoding together (the continuous-batching case: one step carries a token
/// of each, and the expert GEMMs see all of them).
fn phase_table(a: &Args, files: &[PathBuf]) -> anyhow::Result<()> {
    println!(
        "\nnightshift decode by phase (ms per step; {} prompt tokens per sequence, {} steps, {} threads)",
        a.phase_context, a.phase_steps, a.threads
    );
    println!("| model | sequences | aggregate tok/s | x first row | step ms | attention | router | experts | ffn other | output head | other |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for f in files {
        let name = f
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let model = Model::load(f)?;
        let mut base = None;
        for &n in &a.seqs {
            let (tok_s, p) = decode_together(&model, n.max(1), a)?;
            let base_tok_s = *base.get_or_insert(tok_s);
            let ms = |v: f64| 1e3 * v / p.steps.max(1) as f64;
            println!(
                "| {name} | {n} | {tok_s:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                tok_s / base_tok_s,
                ms(p.total),
                ms(p.attention),
                ms(p.router),
                ms(p.experts),
                ms(p.ffn_other),
                ms(p.output),
                ms(p.other())
            );
        }
    }
    Ok(())
}

/// `n` sequences with distinct prompts, then `phase_steps` greedy steps carrying one token of
/// each: aggregate tokens/s and the steps' profile.
fn decode_together(
    model: &Arc<Model>,
    n: usize,
    a: &Args,
) -> anyhow::Result<(f64, nightshift_model::StepProfile)> {
    let pool = build_pool(a.threads)?;
    let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
    let len = a.phase_context + a.phase_steps + 8;
    let opts = EngineOptions {
        threads: a.threads,
        pool: Some(pool),
        max_seqs: n,
        kv_budget_tokens: KvLayout::budget_for(n, len),
        max_seq_len: len,
        ..Default::default()
    };
    let mut eng = Engine::new(model.clone(), backend, opts)?;
    let mut seqs = Vec::with_capacity(n);
    let mut next = Vec::with_capacity(n);
    for s in 0..n as u32 {
        let seq = eng.add_sequence()?;
        let ctx = a.phase_context.max(1) as u32;
        let prompt: Vec<u32> = (0..ctx).map(|i| 40 + ((i + 31 * s) * 7919) % 500).collect();
        next.push(argmax(&eng.prefill(seq, &prompt)?) as u32);
        seqs.push(seq);
    }
    eng.reset_profile();
    let t = Instant::now();
    for step in 0..a.phase_steps {
        let pos = (a.phase_context.max(1) + step) as u32;
        let batch: Vec<BatchToken> = seqs
            .iter()
            .zip(&next)
            .map(|(&seq, &token)| BatchToken {
                seq,
                token,
                pos,
                want_logits: true,
            })
            .collect();
        let logits = eng.forward(&batch)?;
        for (t, l) in next.iter_mut().zip(&logits) {
            *t = argmax(l) as u32;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(((n * a.phase_steps) as f64 / secs, eng.profile()))
}

/// Generates (once) the Qwen3-30B-A3B-shaped model with `layers` layers.
fn ensure_model(dir: &Path, quant: QuantMix, layers: usize) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("qwen3-30b-a3b-{layers}L-{}.gguf", quant.name()));
    if path.exists() {
        return Ok(path);
    }
    let mut spec = GenSpec::new(Preset::Qwen3_30bA3b, Arch::Qwen3Moe, quant);
    spec.layers = Some(layers);
    eprintln!("generating {} ...", path.display());
    let t = Instant::now();
    let mut next = 0.0;
    generate(&spec, &path, &mut |p| {
        let f = p.bytes_done as f64 / p.bytes_total as f64;
        if f >= next {
            eprintln!("  {:>3.0}% {}", f * 100.0, p.tensor);
            next += 0.1;
        }
    })?;
    eprintln!("  done in {:.0} s", t.elapsed().as_secs_f64());
    Ok(path)
}

/// Weight bytes a decoded token reads.
fn bytes_per_token(path: &Path) -> anyhow::Result<f64> {
    let g = Gguf::open(path)?;
    let arch = g.arch()?.to_string();
    let m = g.metadata();
    let used = m
        .get_u32(&format!("{arch}.expert_used_count"))?
        .context("expert_used_count")? as f64;
    let experts = m
        .get_u32(&format!("{arch}.expert_count"))?
        .context("expert_count")? as f64;
    let mut total = 0f64;
    for t in g.tensors() {
        let size = t.size() as f64;
        total += if t.name.contains("_exps") {
            size * used / experts
        } else if t.name == "token_embd.weight" {
            size / t.ne(1) as f64
        } else {
            size
        };
    }
    Ok(total)
}

fn ours(path: &Path, prompt: &[u32], n_decode: usize, threads: usize) -> anyhow::Result<Speeds> {
    let model = Model::load(path)?;
    let pool = build_pool(threads)?;
    let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
    let opts = EngineOptions {
        threads,
        pool: Some(pool),
        max_seqs: 2,
        kv_budget_tokens: KvLayout::budget_for(2, prompt.len() + n_decode + 64),
        max_seq_len: prompt.len() + n_decode + 64,
        ..Default::default()
    };
    let mut eng = Engine::new(model, backend, opts)?;
    // warm-up: page the weights in, touch every expert the prompt routes to
    let w = eng.add_sequence()?;
    eng.prefill(w, &prompt[..prompt.len().min(64)])?;
    eng.remove_sequence(w);
    let seq = eng.add_sequence()?;
    let t = Clock::start();
    let mut last = eng.prefill(seq, prompt)?;
    let (prefill, prefill_cpu) = t.rates(prompt.len());
    let t = Clock::start();
    for _ in 0..n_decode {
        let next = argmax(&last) as u32;
        last = eng.prefill(seq, &[next])?;
    }
    let (decode, decode_cpu) = t.rates(n_decode);
    let memory = Some(memory_line(eng.model()));
    Ok(Speeds {
        prefill,
        decode,
        prefill_cpu,
        decode_cpu,
        memory,
    })
}

#[cfg(feature = "ggml")]
fn llama(path: &Path, prompt: &[u32], n_decode: usize, threads: usize) -> anyhow::Result<Speeds> {
    use nightshift_benches::llama::Llama;
    let n_ctx = (prompt.len() + n_decode + 64) as u32;
    let mut l = Llama::load(path, n_ctx, prompt.len() as u32, threads as i32, false)?;
    let toks: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    l.decode(&toks[..toks.len().min(64)])?;
    l.clear();
    let t = Clock::start();
    l.decode(&toks)?;
    let mut next = argmax(&l.last_logits()) as i32;
    let (prefill, prefill_cpu) = t.rates(toks.len());
    let t = Clock::start();
    for _ in 0..n_decode {
        l.decode(&[next])?;
        next = argmax(&l.last_logits()) as i32;
    }
    let (decode, decode_cpu) = t.rates(n_decode);
    Ok(Speeds {
        prefill,
        decode,
        prefill_cpu,
        decode_cpu,
        memory: None,
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// This process's resident memory (from /proc/self/status) and what the model copied to huge
/// pages: anonymous memory is the dense-weight copy plus KV and scratch; file-backed memory is the
/// mapped tensors touched (in process, the routed experts too).
fn memory_line(model: &Model) -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    };
    let mib = |v: Option<f64>| v.map_or_else(|| "?".to_string(), |k| format!("{:.0}", k / 1024.0));
    format!(
        "RSS {} MiB (anonymous {} MiB, of which {:.0} MiB weights on huge pages; file-mapped {} MiB)",
        mib(kib("VmRSS:")),
        mib(kib("RssAnon:")),
        model.resident_bytes() as f64 / (1024.0 * 1024.0),
        mib(kib("RssFile:"))
    )
}

/// Positions a depth's cache is filled with per call (llama-bench's default ubatch).
const FILL_CHUNK: usize = 512;

/// The depth filler and the timed prompt: token ids spread over the trained vocabulary.
fn depth_tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 40 + ((i + salt) * 7919) % 500)
        .collect()
}

/// Prefill tok/s at each `--depth`: ours and llama.cpp's, alternating `--depth-reps` times, with
/// the attention share of our timed prefill (the engine's `StepProfile`).
fn depth_table(a: &Args, files: &[PathBuf]) -> anyhow::Result<()> {
    println!(
        "\nprefill of {} tokens on top of a cache of depth D (llama-bench -p {} -d D), {} threads, {} kv cache, {} runs each alternating",
        a.depth_prefill,
        a.depth_prefill,
        a.threads,
        a.kv_type.name(),
        a.depth_reps
    );
    println!("| model | depth | nightshift tok/s | llama.cpp tok/s | ratio | nightshift attention share |");
    println!("|---|---:|---:|---:|---:|---:|");
    let range = |v: &[f64]| -> String {
        let (lo, hi) = v
            .iter()
            .fold((f64::INFINITY, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
        if v.is_empty() {
            "-".into()
        } else if (hi - lo) < 0.005 * hi {
            format!("{hi:.1}")
        } else {
            format!("{lo:.1}-{hi:.1}")
        }
    };
    for f in files {
        let name = f
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let model = Model::load(f)?;
        for &d in &a.depth {
            let (mut ours_v, mut share) = (Vec::new(), Vec::new());
            // filled only with the `ggml` feature
            #[allow(unused_mut)]
            let mut theirs: Vec<f64> = Vec::new();
            for _ in 0..a.depth_reps.max(1) {
                if !a.skip_ours {
                    let (tok_s, sh) = ours_at_depth(&model, d, a)?;
                    ours_v.push(tok_s);
                    share.push(100.0 * sh);
                }
                #[cfg(feature = "ggml")]
                if !a.skip_llama {
                    theirs.push(llama_at_depth(f, d, a)?);
                }
            }
            let best = |v: &[f64]| v.iter().cloned().fold(0f64, f64::max);
            let ratio = if theirs.is_empty() || ours_v.is_empty() {
                "-".to_string()
            } else {
                let lo = ours_v.iter().cloned().fold(f64::INFINITY, f64::min) / best(&theirs);
                let hi = best(&ours_v) / theirs.iter().cloned().fold(f64::INFINITY, f64::min);
                format!("{lo:.2}-{hi:.2}x")
            };
            println!(
                "| {name} | {d} | {} | {} | {ratio} | {}% |",
                range(&ours_v),
                range(&theirs),
                range(&share)
            );
        }
    }
    Ok(())
}

/// Our prefill tok/s of `--depth-prefill` tokens at depth `d`, and the attention share of it.
fn ours_at_depth(model: &Arc<Model>, d: usize, a: &Args) -> anyhow::Result<(f64, f64)> {
    let pool = build_pool(a.threads)?;
    let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
    let len = d + a.depth_prefill + 8;
    let opts = EngineOptions {
        threads: a.threads,
        pool: Some(pool),
        max_seqs: 1,
        kv_budget_tokens: KvLayout::budget_for(1, len),
        max_seq_len: len,
        prefix_cache: false,
        ..Default::default()
    };
    let mut eng = Engine::new(model.clone(), backend, opts)?;
    eng.set_kv_type(a.kv_type)?;
    let seq = eng.add_sequence()?;
    for chunk in depth_tokens(d, 0).chunks(FILL_CHUNK) {
        eng.prefill(seq, chunk)?;
    }
    eng.reset_profile();
    let t = Instant::now();
    eng.prefill(seq, &depth_tokens(a.depth_prefill, 17))?;
    let secs = t.elapsed().as_secs_f64();
    let p = eng.profile();
    Ok((
        a.depth_prefill as f64 / secs,
        p.attention / p.total.max(1e-12),
    ))
}

/// llama.cpp's prefill tok/s of `--depth-prefill` tokens on top of `d` cached positions.
#[cfg(feature = "ggml")]
fn llama_at_depth(path: &Path, d: usize, a: &Args) -> anyhow::Result<f64> {
    use nightshift_benches::llama::{FlashAttn, Llama};
    let n_ctx = (d + a.depth_prefill + 8) as u32;
    let n_batch = a.depth_prefill.max(FILL_CHUNK) as u32;
    let mut l = Llama::load_kv(
        path,
        n_ctx,
        n_batch,
        a.threads as i32,
        false,
        a.kv_type,
        FlashAttn::Default,
    )?;
    let ids = |v: Vec<u32>| v.into_iter().map(|t| t as i32).collect::<Vec<i32>>();
    for chunk in ids(depth_tokens(d, 0)).chunks(FILL_CHUNK) {
        l.decode(chunk)?;
    }
    let prompt = ids(depth_tokens(a.depth_prefill, 17));
    let t = Instant::now();
    l.decode(&prompt)?;
    Ok(a.depth_prefill as f64 / t.elapsed().as_secs_f64())
}
