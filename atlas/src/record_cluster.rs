//! `nightshift-atlas record --coordinator URL`: runs a JSONL prompt set through a running
//! `nightshift serve` (experts in process, on local nodes or on remote ones) via its OpenAI API
//! (`/v1/completions` for raw prompts, `/v1/chat/completions` for messages; greedy,
//! `max_tokens` each, `--concurrency` at a time), then fetches the atlas the coordinator recorded
//! (`GET /v1/atlas`) and writes it atomically. The atlas is the coordinator's all-time record:
//! when it had already served traffic before this run, that is included (and said so).

use std::path::Path;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;

use crate::coord::Coordinator;
use crate::prompts::{read_prompts, PromptLine};

/// Options of a recording through a coordinator.
pub struct ClusterRecord<'a> {
    pub coordinator: &'a str,
    pub api_key: Option<&'a str>,
    pub prompts: &'a Path,
    pub max_tokens: usize,
    pub out: &'a Path,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Requests in flight at once (at least 1).
    pub concurrency: usize,
}

/// Token counts the gateway reported for one request.
fn usage(v: &serde_json::Value) -> (u64, u64) {
    let n = |k: &str| v.pointer(k).and_then(|x| x.as_u64()).unwrap_or(0);
    (n("/usage/prompt_tokens"), n("/usage/completion_tokens"))
}

/// Sends prompt `i` (0-based) and returns the gateway's (prompt, completion) token counts.
fn send_one(
    c: &Coordinator,
    model: &str,
    i: usize,
    line: &PromptLine,
    o: &ClusterRecord<'_>,
) -> Result<(u64, u64)> {
    let (path, body) = match line {
        PromptLine::Raw(p) => (
            "/v1/completions",
            json!({"model": model, "prompt": p, "max_tokens": o.max_tokens, "temperature": 0}),
        ),
        PromptLine::Chat(msgs) => {
            let msgs: Vec<_> = msgs
                .iter()
                .map(|m| json!({"role": m.role, "content": m.content}))
                .collect();
            (
                "/v1/chat/completions",
                json!({"model": model, "messages": msgs, "max_tokens": o.max_tokens, "temperature": 0}),
            )
        }
    };
    let v = c
        .post_json_ok(path, &body, &format!("prompt {}", i + 1))
        .with_context(|| format!("{}", o.prompts.display()))?;
    Ok(usage(&v))
}

/// Sends every prompt, `o.concurrency` at a time (the coordinator batches them); stops at the
/// first failure (requests already running finish) and returns the summed token counts.
fn send_all(
    c: &Coordinator,
    model: &str,
    lines: &[PromptLine],
    o: &ClusterRecord<'_>,
) -> Result<(u64, u64)> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let workers = o.concurrency.clamp(1, lines.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<(u64, u64)> {
                    let mut sum = (0u64, 0u64);
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(line) = lines.get(i) else { break };
                        match send_one(c, model, i, line, o) {
                            Ok((p, g)) => sum = (sum.0 + p, sum.1 + g),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(sum)
                })
            })
            .collect();
        let mut total = (0u64, 0u64);
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok((p, g))) => total = (total.0 + p, total.1 + g),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow!("a request thread panicked"));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    })
}

/// Runs the prompt set through the coordinator and writes its atlas to `out`.
pub fn record(o: &ClusterRecord<'_>) -> Result<()> {
    if o.max_tokens == 0 {
        bail!("--max-tokens: expected at least 1 with --coordinator, found 0");
    }
    let lines = read_prompts(o.prompts)?;
    let c = Coordinator::new(o.coordinator, o.api_key, o.timeout)?;
    let model = c.model_id()?;
    // Before anything is sent: the coordinator records an atlas at all, and how much it had.
    let before = c.atlas()?;
    let t0 = Instant::now();
    let (prompt_tokens, completion_tokens) = send_all(&c, &model, &lines, o)?;
    let after = c.atlas()?;
    if after.shape != before.shape || after.model != before.model {
        bail!(
            "the coordinator's atlas changed model during the run (restarted?): expected {} {:?}, found {} {:?}",
            before.model,
            before.shape.moe_layers,
            after.model,
            after.shape.moe_layers
        );
    }
    if after.all_time.tokens < before.all_time.tokens {
        bail!(
            "the coordinator's atlas went backwards during the run (restarted?): expected at least {} tokens, found {}",
            before.all_time.tokens,
            after.all_time.tokens
        );
    }
    after.save_atomic(o.out)?;
    let added = after.all_time.tokens - before.all_time.tokens;
    println!(
        "sent {} prompts to {}: {} prompt tokens + {} generated tokens (as the gateway counted them) in {:.1} s",
        lines.len(),
        c.url(""),
        prompt_tokens,
        completion_tokens,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "the coordinator's atlas grew by {added} tokens to {} tokens ({} activations over {} MoE layers x {} experts, {} nodes)",
        after.all_time.tokens,
        after.all_time.total_activations(),
        after.shape.moe_layers.len(),
        after.shape.n_experts,
        after.nodes.len()
    );
    if before.all_time.tokens > 0 {
        println!(
            "note: the coordinator had already recorded {} tokens before this run; they are in the atlas too (start a fresh serve for an atlas of this prompt set alone)",
            before.all_time.tokens
        );
    }
    println!("wrote {}", o.out.display());
    Ok(())
}
