//! The subcommands of `nightshift-atlas` that need a live engine or coordinator: `record --model`
//! runs a JSONL prompt set through the in-process engine (nightshift-model), one sequence at a
//! time, and writes the atlas its routing produced (with temporal locality) (`record --coordinator` lives in `record_cluster.rs`); `apply` posts a placement file to a running coordinator's
//! `/v1/admin/placement` (live rebalance) and prints what moved. Only the binary depends on
//! nightshift-model; the library does not.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nightshift_atlas::placement::{ModelShape, Placement};
use nightshift_atlas::trace::{Recorder, RecorderConfig, TemporalTracker};
use nightshift_model::chat::{encode_conversation, ChatMessage, ChatTemplate};
use nightshift_model::sampler::argmax;
use nightshift_model::{Engine, EngineOptions, ExpertPair, LocalExperts, Model, RouteObserver};

use crate::coord::Coordinator;
use crate::prompts::{read_prompts, PromptLine};

/// `apply`: validates `file` locally, posts it, prints the report.
pub fn apply(file: &Path, coordinator: &str, api_key: Option<&str>) -> Result<()> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read placement file {}", file.display()))?;
    let p = Placement::from_toml_str(&text)
        .with_context(|| format!("placement file {}", file.display()))?;
    let c = Coordinator::new(coordinator, api_key, Duration::from_secs(900))?;
    let t0 = Instant::now();
    let answer = c.post("/v1/admin/placement", "application/toml", text)?;
    if !answer.status.is_success() {
        bail!(
            "the coordinator refused the placement (HTTP {}): {}",
            answer.status,
            answer.error_message()
        );
    }
    let json = answer.json();
    println!(
        "applied {} ({} nodes) in {:.1} s",
        file.display(),
        p.nodes.len(),
        t0.elapsed().as_secs_f64()
    );
    for (what, key) in [("loaded", "loaded"), ("dropped", "dropped")] {
        let rows = json
            .as_ref()
            .and_then(|v| v.get(key))
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default();
        if rows.is_empty() {
            println!("  {what}: nothing");
        }
        for r in rows {
            let name = r.get(0).and_then(|v| v.as_str()).unwrap_or("?");
            let n = r.get(1).and_then(|v| v.as_u64()).unwrap_or(0);
            println!("  {what}: {name} {n} experts");
        }
    }
    Ok(())
}

/// What the observer feeds: the recorder, temporal locality (one sequence runs at a time, in
/// token order), the MoE slot of each layer, and scratch ids reused.
struct Observed {
    rec: Recorder,
    temporal: TemporalTracker,
    slot_of: Vec<Option<usize>>,
    ids: Vec<usize>,
}

/// The recorder as the engine's route observer (one mutex).
struct Observer {
    inner: Mutex<Observed>,
}

impl RouteObserver for Observer {
    fn observe(&self, layer: usize, pairs: &[ExpertPair], weights: &[f32]) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let o = &mut *g;
        o.ids.clear();
        o.ids.extend(pairs.iter().map(|p| p.expert as usize));
        if let Err(e) = o.rec.record(layer, &o.ids, weights) {
            eprintln!("nightshift-atlas record: routing not recorded: {e}");
            return;
        }
        if let Some(&Some(slot)) = o.slot_of.get(layer) {
            o.temporal.observe(slot, &o.ids);
        }
    }
}

/// `record`: runs every prompt of `prompts` through the engine, greedy-decodes `max_tokens`,
/// writes the atlas to `out`.
pub fn record(model_path: &Path, prompts: &Path, max_tokens: usize, out: &Path) -> Result<()> {
    // Parse every line before loading anything: a bad file fails fast.
    let lines = read_prompts(prompts)?;
    let model =
        Model::load(model_path).with_context(|| format!("loading {}", model_path.display()))?;
    let s = nightshift_model::shape::moe_shape(model.gguf())
        .context("the model has no routed experts: there is nothing to record")?;
    let shape = ModelShape {
        moe_layers: s.moe_layers,
        n_experts: s.n_experts,
        expert_bytes: s.expert_bytes,
    };
    // The model id `nightshift serve` gives it, so atlases of both kinds of record compare.
    let name = model_path
        .file_stem()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let top_k = model.config().n_expert_used;
    let mut slot_of = vec![None; shape.moe_layers.iter().max().map_or(0, |&l| l + 1)];
    for (s, &l) in shape.moe_layers.iter().enumerate() {
        slot_of[l] = Some(s);
    }
    let observer = Arc::new(Observer {
        inner: Mutex::new(Observed {
            temporal: TemporalTracker::new(shape.moe_layers.len(), top_k),
            rec: Recorder::new(shape, RecorderConfig::new(name, top_k)),
            slot_of,
            ids: Vec::new(),
        }),
    });
    let tok = model.tokenizer();
    let template = ChatTemplate::from_gguf(model.gguf()).context("reading the chat template")?;
    let pool = nightshift_model::build_pool(0)?;
    let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
    let opts = EngineOptions {
        pool: Some(pool),
        ..EngineOptions::default()
    };
    let mut engine = Engine::new(model.clone(), backend, opts)?;
    engine.set_route_observer(Some(observer.clone() as Arc<dyn RouteObserver>));
    let t0 = Instant::now();
    let (mut prefilled, mut generated) = (0usize, 0usize);
    for (i, line) in lines.iter().enumerate() {
        let ids = match line {
            PromptLine::Raw(p) => tok.encode(p, tok.add_bos(), false),
            PromptLine::Chat(msgs) => {
                let msgs: Vec<ChatMessage> = msgs
                    .iter()
                    .map(|m| ChatMessage::new(&m.role, &m.content))
                    .collect();
                encode_conversation(tok, template.as_ref(), &msgs)?
            }
        };
        if ids.is_empty() {
            bail!("prompt {} tokenized to nothing", i + 1);
        }
        observer
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .temporal
            .reset();
        let seq = engine.add_sequence()?;
        let n = ids.len();
        let mut logits = engine.prefill(seq, &ids)?;
        prefilled += n;
        for step in 0..max_tokens {
            let next = argmax(&logits);
            if tok.is_eog(next) || step + 1 == max_tokens {
                break;
            }
            logits = engine.prefill(seq, &[next])?;
            generated += 1;
        }
        engine.remove_sequence(seq);
    }
    let atlas = {
        let o = observer.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut atlas = o.rec.snapshot();
        atlas.temporal = Some(o.temporal.snapshot());
        atlas
    };
    atlas.save_atomic(out)?;
    println!(
        "recorded {} prompts: {} prompt tokens + {} generated tokens = {} tokens ({} activations over {} MoE layers x {} experts) in {:.1} s",
        lines.len(),
        prefilled,
        generated,
        atlas.all_time.tokens,
        atlas.all_time.total_activations(),
        atlas.shape.moe_layers.len(),
        atlas.shape.n_experts,
        t0.elapsed().as_secs_f64()
    );
    println!("wrote {}", out.display());
    Ok(())
}
