//! `constrain-report`: what constrained decoding costs. (1) The token mask of a forced tool
//! call (Qwen3's Hermes format with a realistic weather-tool schema) per constrained token, p50
//! and p99 in µs, on a synthetic vocabulary of `--vocab` tokens (default 163,840, Kimi K2's
//! size; byte-level words with and without a leading space, numbers, punctuation runs, the 256
//! bytes). (2) Decode tokens/s of a batch of 4 sequences on a `gen-model` file (Qwen3-30B-A3B
//! shape, `--layers` layers) with 0, 1 and 4 of them constrained, the masks computed on a helper
//! thread while the engine runs the step (as the server's scheduler does), rounds interleaved;
//! a grammar that completes starts over, so every step has that many constrained sequences.
//! Prints markdown tables; the ratios are against 0 constrained in the same run.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use nightshift_benches::percentile;
use nightshift_kernels::rng::SplitMix64;
use nightshift_model::constrain::{ConstraintVocab, Grammar, SeqConstraint};
use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::sampler::{Sampler, SamplerParams, TokenMask};
use nightshift_model::toolcall::grammar::{tool_grammar, CallChoice};
use nightshift_model::toolcall::{ToolFormat, ToolSpec};
use nightshift_model::{build_pool, BatchToken, Engine, EngineOptions, LocalExperts, Model};

/// Mask cost and decode throughput of constrained decoding.
#[derive(Parser)]
struct Args {
    /// Vocabulary size of the mask measurement (the decode part uses the model's).
    #[arg(long, default_value_t = 163_840)]
    vocab: usize,
    /// Masks timed in the mask measurement.
    #[arg(long, default_value_t = 2000)]
    masks: usize,
    /// Layers kept of Qwen3-30B-A3B's 48 for the decode measurement (0 = skip it).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Measure this model file instead of generating one.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where generated models are cached.
    #[arg(long, default_value = "target/bench-models")]
    models_dir: PathBuf,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Decode steps per round.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Rounds per configuration (interleaved 0, 1, 4, 0, 1, 4, ...).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// A byte-level vocabulary of `n` distinct tokens shaped like a BPE one; the last is the end.
fn synthetic_vocab(n: usize, seed: u64) -> Vec<(Vec<u8>, bool)> {
    let mut r = SplitMix64::new(seed);
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut out: Vec<(Vec<u8>, bool)> = Vec::with_capacity(n);
    for b in 0..=255u8 {
        seen.insert(vec![b]);
        out.push((vec![b], false));
    }
    const LETTERS: &[u8] = b"eeeeeeeeeeeetttttttttaaaaaaaaoooooooiiiiiiinnnnnnnsssssshhhhhhrrrrrrddddlllluuuccmmwwffggyyppbbvkjxqz";
    const PUNCT: &[u8] = b"\"{}[]:,.()<>/\\_-=+*#!?'\n ";
    while out.len() + 1 < n {
        let mut w = Vec::new();
        match r.below(10) {
            0 => {
                for _ in 0..1 + r.below(4) {
                    w.push(b'0' + r.below(10) as u8);
                }
            }
            1 => {
                for _ in 0..1 + r.below(3) {
                    w.push(PUNCT[r.below(PUNCT.len() as u64) as usize]);
                }
            }
            k => {
                if k < 7 {
                    w.push(b' ');
                }
                let len = 1 + r.below(6) + r.below(6);
                for i in 0..len {
                    let c = LETTERS[r.below(LETTERS.len() as u64) as usize];
                    w.push(if i == 0 && r.below(5) == 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    });
                }
            }
        }
        if seen.insert(w.clone()) {
            out.push((w, false));
        }
    }
    out.push((b"<|end|>".to_vec(), true));
    out
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name", "maxLength": 40},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "hourly": {"type": "boolean"}
            },
            "required": ["city", "days", "units"],
            "additionalProperties": false
        }),
        strict: true,
    }
}

fn grammar(vocab: &ConstraintVocab) -> anyhow::Result<Grammar> {
    choice_grammar(vocab, &CallChoice::Any)
}

/// The Hermes grammar of the weather tool under `choice` (`Auto`: text or a strict call).
fn choice_grammar(vocab: &ConstraintVocab, choice: &CallChoice) -> anyhow::Result<Grammar> {
    let tools = [weather_tool()];
    let g = tool_grammar(ToolFormat::Hermes, &tools, choice, true, vocab)
        .map_err(anyhow::Error::msg)?;
    Ok(Grammar::Lark(g))
}

/// Masks of a constrained sequence walked with random allowed tokens; µs per mask.
fn mask_cost(vocab: &ConstraintVocab, g: &Grammar, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut r = SplitMix64::new(11);
    let mut c = vocab.compile(g)?;
    let mut us = Vec::with_capacity(n);
    while us.len() < n {
        let t = Instant::now();
        let m = c.mask()?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
        let allowed: Vec<u32> = (0..vocab.vocab_size() as u32)
            .filter(|&t| TokenMask(&m).allows(t))
            .collect();
        let tok = allowed[r.below(allowed.len() as u64) as usize];
        c.accept(tok)?;
        if c.is_stopped() {
            c = vocab.compile(g)?;
        }
    }
    Ok(us)
}

fn ensure_model(dir: &Path, layers: usize) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("qwen3-30b-a3b-{layers}L-Q4_K_M.gguf"));
    if !path.exists() {
        let mut spec = GenSpec::new(Preset::Qwen3_30bA3b, Arch::Qwen3Moe, QuantMix::Q4KM);
        spec.layers = Some(layers);
        eprintln!("generating {} ...", path.display());
        generate(&spec, &path, &mut |_| {})?;
    }
    Ok(path)
}

/// One decode round: 4 sequences, `constrained` of them under the grammar; tokens/s and the
/// masks' µs.
fn round(
    eng: &mut Engine,
    vocab: &ConstraintVocab,
    g: &Grammar,
    constrained: usize,
    steps: usize,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let seqs: Vec<_> = (0..4)
        .map(|_| eng.add_sequence())
        .collect::<Result<_, _>>()?;
    let mut cons: Vec<Option<SeqConstraint>> = (0..4)
        .map(|i| (i < constrained).then(|| vocab.compile(g)).transpose())
        .collect::<Result<_, _>>()?;
    let mut samplers: Vec<Sampler> = (0..4)
        .map(|_| Sampler::new(SamplerParams::greedy(), &[]))
        .collect();
    let prompt: Vec<u32> = (0..16).map(|i| 100 + i).collect();
    let mut batch = Vec::new();
    for &s in &seqs {
        for (p, &t) in prompt.iter().enumerate() {
            batch.push(BatchToken {
                seq: s,
                token: t,
                pos: p as u32,
                want_logits: p + 1 == prompt.len(),
            });
        }
    }
    let mut logits = eng.forward(&batch)?;
    let mut mask_us = Vec::new();
    let mut masks: Vec<Option<Vec<u32>>> = cons
        .iter_mut()
        .map(|c| c.as_mut().map(|c| c.mask()).transpose())
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    for step in 0..steps {
        let mut next = Vec::with_capacity(4);
        for i in 0..4 {
            let tok = samplers[i].sample_masked(&logits[i], masks[i].as_deref().map(TokenMask));
            samplers[i].accept(tok);
            if let Some(c) = &mut cons[i] {
                c.accept(tok)?;
                if c.is_stopped() {
                    *c = vocab.compile(g)?;
                }
            }
            next.push(tok);
        }
        let batch: Vec<BatchToken> = seqs
            .iter()
            .zip(&next)
            .map(|(&s, &t)| BatchToken {
                seq: s,
                token: t,
                pos: (prompt.len() + step) as u32,
                want_logits: true,
            })
            .collect();
        // the masks of the next step while the engine runs this one
        let (l, m) = std::thread::scope(|scope| {
            let helper = scope.spawn(|| {
                cons.iter_mut()
                    .map(|c| {
                        c.as_mut().map(|c| {
                            let t = Instant::now();
                            let m = c.mask();
                            (m, t.elapsed().as_secs_f64() * 1e6)
                        })
                    })
                    .collect::<Vec<_>>()
            });
            let l = eng.forward(&batch);
            (l, helper.join())
        });
        logits = l?;
        let m = m.map_err(|_| anyhow::anyhow!("the mask thread panicked"))?;
        masks = Vec::with_capacity(4);
        for x in m {
            match x {
                Some((mask, us)) => {
                    mask_us.push(us);
                    masks.push(Some(mask?));
                }
                None => masks.push(None),
            }
        }
    }
    let tps = (steps * 4) as f64 / t0.elapsed().as_secs_f64();
    for s in seqs {
        eng.remove_sequence(s);
    }
    Ok((tps, mask_us))
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let t = Instant::now();
    let words = synthetic_vocab(a.vocab, 5);
    let eos = (words.len() - 1) as u32;
    let vocab = ConstraintVocab::new(words, eos)?;
    let g = grammar(&vocab)?;
    let build = t.elapsed().as_secs_f64();
    println!(
        "## Mask cost: the `get_weather` tool (Hermes format), {} tokens\n",
        a.vocab
    );
    println!("| grammar | vocab | masks | p50 µs | p99 µs | mean µs | vocab build s |");
    println!("|---|---|---|---|---|---|---|");
    // forced: every token inside the call; auto with a strict tool: mostly free text (a random
    // walk rarely spells the call's marker), the mask every token of a strict-tools request pays
    let auto = choice_grammar(&vocab, &CallChoice::Auto)?;
    for (name, g) in [("forced call", &g), ("auto, strict tool", &auto)] {
        let t = Instant::now();
        let mut us = mask_cost(&vocab, g, a.masks)?;
        let total = t.elapsed().as_secs_f64();
        let mean = us.iter().sum::<f64>() / us.len() as f64;
        println!(
            "| {name} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} |",
            a.vocab,
            us.len(),
            percentile(&mut us, 0.5),
            percentile(&mut us, 0.99),
            mean,
            build
        );
        eprintln!("({name}: mask walk took {total:.1} s)");
    }
    if a.layers == 0 && a.model.is_none() {
        return Ok(());
    }
    let path = match &a.model {
        Some(p) => p.clone(),
        None => ensure_model(&a.models_dir, a.layers)?,
    };
    let model = Model::load(&path)?;
    let n_vocab = model.config().n_vocab;
    let words = synthetic_vocab(n_vocab, 6);
    let dvocab = ConstraintVocab::new(words, (n_vocab - 1) as u32)?;
    let dg = grammar(&dvocab)?;
    let pool = build_pool(a.threads)?;
    let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
    let opts = EngineOptions {
        threads: a.threads,
        pool: Some(pool),
        max_seqs: 4,
        kv_budget_tokens: nightshift_model::KvLayout::budget_for(4, a.steps + 32),
        max_seq_len: a.steps + 32,
        ..Default::default()
    };
    let mut eng = Engine::new(model, backend, opts).context("engine")?;
    round(&mut eng, &dvocab, &dg, 0, 4)?; // warm-up
    let configs = [0usize, 1, 4];
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut dmask: Vec<f64> = Vec::new();
    for _ in 0..a.rounds {
        for (k, &c) in configs.iter().enumerate() {
            let (x, m) = round(&mut eng, &dvocab, &dg, c, a.steps)?;
            tps[k].push(x);
            dmask.extend(m);
        }
    }
    println!(
        "\n## Decode, batch of 4: {} ({} vocab, {} threads, {} steps x {} rounds interleaved)\n",
        path.display(),
        n_vocab,
        a.threads,
        a.steps,
        a.rounds
    );
    println!("| constrained | tok/s (median) | range | vs 0 constrained |");
    println!("|---|---|---|---|");
    let base = percentile(&mut tps[0].clone(), 0.5);
    for (k, &c) in configs.iter().enumerate() {
        let mut v = tps[k].clone();
        let med = percentile(&mut v, 0.5);
        let (lo, hi) = (v[0], v[v.len() - 1]);
        println!("| {c} | {med:.2} | {lo:.2}-{hi:.2} | {:.3} |", med / base);
    }
    if !dmask.is_empty() {
        let mean = dmask.iter().sum::<f64>() / dmask.len() as f64;
        println!(
            "\nmasks during decode: p50 {:.1} µs, p99 {:.1} µs, mean {:.1} µs ({} masks)",
            percentile(&mut dmask, 0.5),
            percentile(&mut dmask, 0.99),
            mean,
            dmask.len()
        );
    }
    Ok(())
}
