//! `nightshift bench serve`: a load tool for any OpenAI-compatible server. For each concurrency
//! level it keeps C streaming chat requests in flight until N have completed, then reports
//! aggregate completion throughput, time to first token and inter-token latency (p50/p99) and
//! errors (429s counted apart; a 429 waits its `Retry-After` before the worker goes on). For
//! soaks (`--duration`), it prints a progress line every `--report-every` seconds and, with
//! `--rss-pid`, samples the server's resident memory (/proc/PID/status) so a leak shows as RSS
//! growing after warm-up. Only talks to the URL it is given.

use anyhow::{bail, Context};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `nightshift bench ...`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Load-test a running `nightshift serve` (or any OpenAI-compatible server).
    Serve(Args),
    /// Replay multi-turn agent sessions and a PR-review batch with the prefix cache on and off.
    Agent(super::bench_agent::Args),
    /// Speculative decoding against none, in process, A/B interleaved (quoting, predicted,
    /// noisy predictions, no overlap, 4 sessions) and the step-time curve by rows.
    Spec(super::bench_spec::Args),
}

/// Arguments of `nightshift bench serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Base URL of the server, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub url: String,
    /// Concurrency levels, comma separated.
    #[arg(long, default_value = "1,4,8", value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Requests per concurrency level.
    #[arg(long, default_value_t = 16)]
    pub requests: usize,
    /// max_tokens of every request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Prompt (each request appends its number so prompts differ).
    #[arg(long, default_value = "Write a short story about a lighthouse keeper.")]
    pub prompt: String,
    /// JSONL prompt set (`{"prompt": ...}` or `{"messages": [...]}` per line, as
    /// `nightshift-atlas record` reads): request i sends line i (cycling) instead of --prompt,
    /// so concurrent sessions talk about different things.
    #[arg(long)]
    pub prompts: Option<std::path::PathBuf>,
    /// Internal: the lines of --prompts, read once.
    #[arg(skip)]
    pub prompt_lines: Vec<serde_json::Value>,
    /// Model id (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer API key.
    #[arg(long, env = "NIGHTSHIFT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Give up on one request after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Endpoint: chat (/v1/chat/completions) or completions (/v1/completions).
    #[arg(long, default_value = "chat")]
    pub endpoint: String,
    /// Ask the server not to stop at end-of-generation tokens (llama.cpp's `ignore_eos`), so
    /// every request generates max_tokens (random-weight models end early otherwise).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Stop a level after this many seconds even if fewer requests completed (soak runs:
    /// pair with a large --requests).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Also print the results as one JSON line per level.
    #[arg(long)]
    pub json: bool,
    /// Sample the resident memory (VmRSS) of this process id (the server) during each level.
    #[arg(long)]
    pub rss_pid: Option<u32>,
    /// Seconds between progress lines (and RSS samples) while a level runs (0 = none).
    #[arg(long, default_value_t = 60)]
    pub report_every: u64,
    /// With --rss-pid: the first sample at or after this many seconds is the after-warm-up
    /// reference that the end of the level is compared with.
    #[arg(long, default_value_t = 60)]
    pub warmup: u64,
}

/// Running totals of a level, shared by its workers (for progress lines).
#[derive(Default)]
struct Progress {
    done: AtomicUsize,
    errors: AtomicUsize,
    limited: AtomicUsize,
    tokens: AtomicUsize,
}

/// Resident memory of `pid` in KiB from /proc/PID/status: (VmRSS, RssAnon). The anonymous
/// part is the heap; the rest is file pages (the mmap'd model, the binary's code).
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")?, field("RssAnon:").unwrap_or(0)))
}

/// What one request measured.
#[derive(Default, Debug)]
struct One {
    ttft: Option<f64>,
    gaps: Vec<f64>,
    tokens: u64,
    error: Option<String>,
    rate_limited: bool,
    /// Seconds the server asked to wait (`Retry-After` of a 429).
    retry_after: Option<u64>,
}

/// Runs the subcommand.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let a = match args.what {
        BenchCommand::Serve(a) => a,
        BenchCommand::Agent(a) => return super::bench_agent::run(a),
        BenchCommand::Spec(a) => return super::bench_spec::run(a),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(a))
}

async fn bench(a: Args) -> anyhow::Result<()> {
    if a.concurrency.contains(&0) || a.requests == 0 {
        bail!("--concurrency levels and --requests must be at least 1");
    }
    if a.endpoint != "chat" && a.endpoint != "completions" {
        bail!(
            "--endpoint: expected chat or completions, found {:?}",
            a.endpoint
        );
    }
    let mut a = a;
    if let Some(p) = &a.prompts {
        let text = std::fs::read_to_string(p)
            .with_context(|| format!("--prompts: cannot read {}", p.display()))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("--prompts line {}: not JSON", n + 1))?;
            if !(v.get("prompt").is_some_and(|x| x.is_string())
                || v.get("messages").is_some_and(|x| x.is_array()))
            {
                bail!(
                    "--prompts line {}: expected {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}",
                    n + 1
                );
            }
            a.prompt_lines.push(v);
        }
        if a.prompt_lines.is_empty() {
            bail!(
                "--prompts {}: expected at least one prompt, found none",
                p.display()
            );
        }
    }
    let base = a.url.trim_end_matches('/').to_string();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(a.timeout))
        .build()?;
    let model = served_model(&client, &base, a.model.as_deref(), a.api_key.as_deref()).await?;
    println!(
        "bench serve: {base} model {model}, {} requests per level, max_tokens {}",
        a.requests, a.max_tokens
    );
    println!(
        "{:>5} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>5}",
        "conc", "requests", "tok/s", "ttft p50", "ttft p99", "itl p50", "itl p99", "errors", "429s"
    );
    let a = Arc::new(a);
    for &c in &a.concurrency {
        let next = Arc::new(AtomicUsize::new(0));
        let prog = Arc::new(Progress::default());
        let t0 = Instant::now();
        let deadline = a.duration.map(|d| t0 + Duration::from_secs(d));
        let mut workers = Vec::new();
        for _ in 0..c {
            let (client, a, next, base, model, prog) = (
                client.clone(),
                a.clone(),
                next.clone(),
                base.clone(),
                model.clone(),
                prog.clone(),
            );
            workers.push(tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= a.requests || deadline.is_some_and(|d| Instant::now() >= d) {
                        return out;
                    }
                    let o = one(&client, &a, &base, &model, i).await;
                    prog.done.fetch_add(1, Ordering::Relaxed);
                    prog.tokens.fetch_add(o.tokens as usize, Ordering::Relaxed);
                    if o.rate_limited {
                        prog.limited.fetch_add(1, Ordering::Relaxed);
                        // a deliberate 429: wait as told instead of hammering the server
                        tokio::time::sleep(Duration::from_secs(o.retry_after.unwrap_or(1))).await;
                    } else if o.error.is_some() {
                        prog.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    out.push(o);
                }
            }));
        }
        // progress lines and RSS samples until the workers are done
        let rss_first = a.rss_pid.and_then(rss_kib);
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let reporter = {
            let (a, prog) = (a.clone(), prog.clone());
            tokio::spawn(async move {
                let mut samples: Vec<(f64, (u64, u64))> = Vec::new();
                if a.report_every == 0 {
                    let _ = stop_rx.await;
                    return samples;
                }
                let every = Duration::from_secs(a.report_every);
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => return samples,
                        _ = tick.tick() => {}
                    }
                    let t = t0.elapsed().as_secs_f64();
                    let rss = a.rss_pid.and_then(rss_kib);
                    if let Some(r) = rss {
                        samples.push((t, r));
                    }
                    let tokens = prog.tokens.load(Ordering::Relaxed);
                    println!(
                        "  [{t:>6.0}s] conc {c}: {} done, {} errors, {} 429s, {:.1} tok/s{}",
                        prog.done.load(Ordering::Relaxed),
                        prog.errors.load(Ordering::Relaxed),
                        prog.limited.load(Ordering::Relaxed),
                        tokens as f64 / t,
                        rss.map(|(r, an)| format!(
                            ", server RSS {:.1} MiB (anon {:.1})",
                            r as f64 / 1024.0,
                            an as f64 / 1024.0
                        ))
                        .unwrap_or_default()
                    );
                }
            })
        };
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await.context("bench worker")?);
        }
        let _ = stop_tx.send(());
        let samples = reporter.await.context("bench reporter")?;
        let rss_last = a.rss_pid.and_then(rss_kib);
        let wall = t0.elapsed().as_secs_f64();
        let tokens: u64 = all.iter().map(|o| o.tokens).sum();
        let mut ttft: Vec<f64> = all.iter().filter_map(|o| o.ttft).collect();
        let mut gaps: Vec<f64> = all.iter().flat_map(|o| o.gaps.iter().copied()).collect();
        let errors = all
            .iter()
            .filter(|o| o.error.is_some() && !o.rate_limited)
            .count();
        let limited = all.iter().filter(|o| o.rate_limited).count();
        if let Some(e) = all.iter().find_map(|o| o.error.as_ref()) {
            eprintln!("bench serve: first error at concurrency {c}: {e}");
        }
        let tps = tokens as f64 / wall;
        let (t50, t99) = (pct(&mut ttft, 0.50) * 1e3, pct(&mut ttft, 0.99) * 1e3);
        let (g50, g99) = (pct(&mut gaps, 0.50) * 1e3, pct(&mut gaps, 0.99) * 1e3);
        // "-" where nothing was measured: a stream that carried no text (a random-weight model's
        // tokens can decode to nothing) has no first-token or inter-token time
        let ms = |v: f64| {
            if v.is_finite() {
                format!("{v:.1}ms")
            } else {
                "-".to_string()
            }
        };
        println!(
            "{c:>5} {:>9} {tps:>10.1} {:>9} {:>9} {:>9} {:>9} {errors:>7} {limited:>5}",
            all.len(),
            ms(t50),
            ms(t99),
            ms(g50),
            ms(g99)
        );
        // RSS: at the start, after warm-up and at the end (total and anonymous)
        let mib = |k: Option<u64>| k.map(|k| k as f64 / 1024.0);
        let warm = samples
            .iter()
            .find(|s| s.0 + 0.5 >= a.warmup as f64)
            .map(|s| s.1);
        let rss_max = samples
            .iter()
            .map(|s| s.1 .0)
            .chain(rss_last.map(|r| r.0))
            .max();
        if a.rss_pid.is_some() {
            let f = |k: Option<(u64, u64)>| {
                k.map(|(r, an)| {
                    format!(
                        "{:.1} MiB (anon {:.1})",
                        r as f64 / 1024.0,
                        an as f64 / 1024.0
                    )
                })
                .unwrap_or_else(|| "-".into())
            };
            println!(
                "      server RSS: start {}, after {} s warm-up {}, end {}, max {:.1} MiB",
                f(rss_first),
                a.warmup,
                f(warm),
                f(rss_last),
                mib(rss_max).unwrap_or(f64::NAN)
            );
        }
        if a.json {
            println!(
                "{}",
                serde_json::json!({"concurrency": c, "requests": all.len(), "completion_tokens": tokens, "wall_s": wall,
                    "tokens_per_s": tps, "ttft_ms_p50": t50, "ttft_ms_p99": t99, "itl_ms_p50": g50, "itl_ms_p99": g99,
                    "errors": errors, "rate_limited": limited, "rss_mib_start": mib(rss_first.map(|r| r.0)),
                    "rss_mib_warm": mib(warm.map(|r| r.0)), "rss_mib_end": mib(rss_last.map(|r| r.0)), "rss_mib_max": mib(rss_max),
                    "anon_mib_warm": mib(warm.map(|r| r.1)), "anon_mib_end": mib(rss_last.map(|r| r.1))})
            );
        }
    }
    Ok(())
}

/// The model to ask for: `asked`, or the first one the server lists at `/v1/models`.
pub(crate) async fn served_model(
    client: &reqwest::Client,
    base: &str,
    asked: Option<&str>,
    api_key: Option<&str>,
) -> anyhow::Result<String> {
    if let Some(m) = asked {
        return Ok(m.to_string());
    }
    let mut r = client.get(format!("{base}/v1/models"));
    if let Some(k) = api_key {
        r = r.bearer_auth(k);
    }
    let v: serde_json::Value = r
        .send()
        .await
        .context("GET /v1/models")?
        .json()
        .await
        .context("reading /v1/models")?;
    match v["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => bail!("expected a model in {base}/v1/models, found {v}"),
    }
}

/// Nearest-rank percentile (NaN when empty); sorts `v`.
pub(crate) fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// One streaming chat request.
async fn one(client: &reqwest::Client, a: &Args, base: &str, model: &str, i: usize) -> One {
    let mut body = serde_json::json!({
        "model": model,
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let line = (!a.prompt_lines.is_empty()).then(|| &a.prompt_lines[i % a.prompt_lines.len()]);
    // a line's text, or its user turns joined, for the completions endpoint
    let text = |v: &serde_json::Value| -> String {
        if let Some(p) = v.get("prompt").and_then(|p| p.as_str()) {
            return p.to_string();
        }
        v.get("messages")
            .and_then(|m| m.as_array())
            .map(|m| {
                m.iter()
                    .filter_map(|x| x.get("content").and_then(|c| c.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    };
    let prompt = match line {
        Some(v) => text(v),
        None => format!("{} ({i})", a.prompt),
    };
    match (a.endpoint == "chat", line.and_then(|v| v.get("messages"))) {
        (true, Some(m)) => body["messages"] = m.clone(),
        (true, None) => {
            body["messages"] = serde_json::json!([{"role": "user", "content": prompt}]);
        }
        (false, _) => body["prompt"] = serde_json::json!(prompt),
    }
    if a.ignore_eos {
        body["ignore_eos"] = serde_json::json!(true);
    }
    let mut out = One::default();
    let t0 = Instant::now();
    let path = if a.endpoint == "chat" {
        "chat/completions"
    } else {
        "completions"
    };
    let mut r = client.post(format!("{base}/v1/{path}")).json(&body);
    if let Some(k) = &a.api_key {
        r = r.bearer_auth(k);
    }
    let mut resp = match r.send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("request failed: {e}"));
            return out;
        }
    };
    if !resp.status().is_success() {
        out.rate_limited = resp.status().as_u16() == 429;
        out.retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .map(|s: u64| s.min(60));
        out.error = Some(format!(
            "HTTP {}: {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        ));
        return out;
    }
    let mut buf = Vec::<u8>::new();
    let mut last: Option<Instant> = None;
    let mut counted = 0u64;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                out.error = Some(format!("stream broken: {e}"));
                return out;
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                out.tokens = out.tokens.max(counted);
                return out;
            }
            let v: serde_json::Value = match serde_json::from_str(data) {
                Ok(v) => v,
                Err(e) => {
                    out.error = Some(format!("bad chunk {data:?}: {e}"));
                    return out;
                }
            };
            if v.get("error").is_some() {
                out.error = Some(format!("error in stream: {data}"));
                return out;
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                out.tokens = n;
            }
            let c = &v["choices"][0];
            let has_text = c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .is_some_and(|s| !s.is_empty());
            if has_text {
                let now = Instant::now();
                counted += 1;
                match last {
                    None => out.ttft = Some(now.duration_since(t0).as_secs_f64()),
                    Some(p) => out.gaps.push(now.duration_since(p).as_secs_f64()),
                }
                last = Some(now);
            }
        }
    }
    out.error = Some("stream ended without [DONE]".into());
    out
}
