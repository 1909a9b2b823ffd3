//! `nightshift bench agent`: replays the two workloads the prefix cache exists for against a
//! running server, with the cache on and off in one run: (a) multi-turn agent sessions (each
//! turn resends the whole history plus new tool output and asks for an answer; several sessions
//! at once) and (b) a PR-review batch (reviews sharing a system prompt and repository context,
//! each with its own diff, a few at a time). Prompts are token ids on `/v1/completions`, so their
//! lengths are exact; "off" sets llama.cpp's `cache_prompt: false` and uses other token ids, so
//! neither mode feeds the other. Modes alternate (on, off, off, on, ...) over `--rounds`. Reports
//! TTFT per turn (p50/p99 over sessions and rounds), end-to-end time, the cached share of prompt
//! tokens and tokens/s, and the off/on ratios.

use super::bench_serve::{pct, served_model};
use anyhow::{bail, Context};
use std::time::{Duration, Instant};

/// Arguments of `nightshift bench agent`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Base URL of the server, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub url: String,
    /// Model id (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer API key.
    #[arg(long, env = "NIGHTSHIFT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Token ids are drawn below this (at most the model's vocabulary).
    #[arg(long, default_value_t = 32000)]
    pub vocab: u32,
    /// Agent sessions replayed at once.
    #[arg(long, default_value_t = 2)]
    pub sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 12)]
    pub turns: usize,
    /// Tokens of tool output or code each turn adds (the first turn's prompt too).
    #[arg(long, default_value_t = 1536)]
    pub turn_tokens: usize,
    /// Tokens each turn (and each review) asks for.
    #[arg(long, default_value_t = 128)]
    pub answer_tokens: u32,
    /// Reviews in the PR batch (0 = skip the batch).
    #[arg(long, default_value_t = 8)]
    pub reviews: usize,
    /// Reviews in flight at once.
    #[arg(long, default_value_t = 4)]
    pub review_concurrency: usize,
    /// Tokens of the shared system prompt + repository context of every review.
    #[arg(long, default_value_t = 2048)]
    pub shared_tokens: usize,
    /// Tokens of each review's own diff.
    #[arg(long, default_value_t = 4096)]
    pub diff_tokens: usize,
    /// Rounds of (cache on, cache off) replays, alternating which goes first.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Give up on one request after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// The server's process id, when it runs on this machine: its anonymous resident memory
    /// (`RssAnon`) is sampled beside `/v1/admin/kv` to measure what the KV cache really takes
    /// per position against the layout's theoretical bytes.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

/// The KV pool as `/v1/admin/kv` reports it, and the server's anonymous resident bytes.
#[derive(Clone, Copy, Debug, Default)]
struct KvSample {
    positions: u64,
    bytes_per_token: u64,
    allocated_bytes: u64,
    rss_anon: u64,
}

/// `RssAnon` of a process in bytes (Linux `/proc/PID/status`).
fn rss_anon(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (is --server-pid this machine's?)"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .with_context(|| format!("no RssAnon in /proc/{pid}/status"))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unreadable {line:?}"))?;
    Ok(kib * 1024)
}

/// What one request measured.
#[derive(Clone, Copy, Debug, Default)]
struct Req {
    ttft: f64,
    total: f64,
    prompt: u64,
    cached: u64,
    completion: u64,
}

/// One replay of one workload in one mode.
#[derive(Default)]
struct Replay {
    /// Per turn (agent) or one entry (reviews): the requests.
    turns: Vec<Vec<Req>>,
    wall: f64,
}

impl Replay {
    fn all(&self) -> impl Iterator<Item = &Req> {
        self.turns.iter().flatten()
    }
    fn sum(&self, f: impl Fn(&Req) -> u64) -> u64 {
        self.all().map(f).sum()
    }
}

/// Deterministic token ids: `n` of them for stream `seed`.
fn ids(n: usize, seed: u64, vocab: u32) -> Vec<u32> {
    let lo = 16u32.min(vocab.saturating_sub(1));
    let span = u64::from(vocab.saturating_sub(lo).max(1));
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (s % span) as u32
        })
        .collect()
}

struct Client {
    http: reqwest::Client,
    base: String,
    model: String,
    key: Option<String>,
}

impl Client {
    /// One streaming completion of `prompt` (token ids), `max` tokens, greedy, EOS ignored.
    async fn complete(&self, prompt: &[u32], max: u32, cache: bool) -> anyhow::Result<Req> {
        let body = serde_json::json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max,
            "temperature": 0,
            "ignore_eos": true,
            "cache_prompt": cache,
            // a chunk per token even when its text is empty: TTFT is the first token's time
            "logprobs": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let t0 = Instant::now();
        let mut r = self
            .http
            .post(format!("{}/v1/completions", self.base))
            .json(&body);
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        let mut resp = r.send().await.context("sending a completion")?;
        if !resp.status().is_success() {
            bail!(
                "HTTP {}: {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        let mut out = Req::default();
        let mut first = None;
        let mut buf = Vec::<u8>::new();
        while let Some(chunk) = resp.chunk().await.context("reading the stream")? {
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim_end().strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    out.total = t0.elapsed().as_secs_f64();
                    out.ttft = first.unwrap_or(out.total);
                    return Ok(out);
                }
                let v: serde_json::Value =
                    serde_json::from_str(data).with_context(|| format!("bad chunk {data:?}"))?;
                if v.get("error").is_some() {
                    bail!("error in stream: {data}");
                }
                if v["choices"].as_array().is_some_and(|c| !c.is_empty()) && first.is_none() {
                    first = Some(t0.elapsed().as_secs_f64());
                }
                let u = &v["usage"];
                if let Some(p) = u["prompt_tokens"].as_u64() {
                    out.prompt = p;
                    out.completion = u["completion_tokens"].as_u64().unwrap_or(0);
                    out.cached = u["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0);
                }
            }
        }
        bail!("stream ended without [DONE]")
    }
}

impl Client {
    /// The pool's figures from `/v1/admin/kv` and the server's `RssAnon`.
    async fn kv_sample(&self, pid: u32) -> anyhow::Result<KvSample> {
        let mut r = self.http.get(format!("{}/v1/admin/kv", self.base));
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().await.context("GET /v1/admin/kv")?;
        if !resp.status().is_success() {
            bail!("GET /v1/admin/kv: HTTP {}", resp.status());
        }
        let v: serde_json::Value = resp.json().await.context("/v1/admin/kv body")?;
        let field = |k: &str| {
            v[k].as_u64()
                .with_context(|| format!("/v1/admin/kv has no {k}"))
        };
        Ok(KvSample {
            positions: field("allocated_blocks")? * field("block_tokens")?,
            bytes_per_token: field("bytes_per_token")?,
            allocated_bytes: field("allocated_bytes")?,
            rss_anon: rss_anon(pid)?,
        })
    }
}

/// `sessions` agent sessions at once, `turns` turns each.
async fn agent(
    c: &std::sync::Arc<Client>,
    a: &Args,
    cache: bool,
    seed: u64,
) -> anyhow::Result<Replay> {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..a.sessions {
        let (c, a) = (c.clone(), a.clone());
        let base = seed * 1000 + s as u64 * 100;
        tasks.push(tokio::spawn(async move {
            let mut history: Vec<u32> = Vec::new();
            let mut reqs = Vec::new();
            for t in 0..a.turns {
                history.extend(ids(a.turn_tokens, base + t as u64, a.vocab));
                let r = c.complete(&history, a.answer_tokens, cache).await?;
                reqs.push(r);
                // the client's record of the answer joins the history
                history.extend(ids(a.answer_tokens as usize, base + 50 + t as u64, a.vocab));
            }
            anyhow::Ok(reqs)
        }));
    }
    let mut turns: Vec<Vec<Req>> = vec![Vec::new(); a.turns];
    for t in tasks {
        for (i, r) in t.await.context("agent session")??.into_iter().enumerate() {
            turns[i].push(r);
        }
    }
    Ok(Replay {
        turns,
        wall: t0.elapsed().as_secs_f64(),
    })
}

/// The PR-review batch: `reviews` prompts sharing their first `shared_tokens`.
async fn reviews(
    c: &std::sync::Arc<Client>,
    a: &Args,
    cache: bool,
    seed: u64,
) -> anyhow::Result<Replay> {
    let shared = ids(a.shared_tokens, seed * 1000 + 999, a.vocab);
    let t0 = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..a.review_concurrency.max(1) {
        let (c, a, next, shared) = (c.clone(), a.clone(), next.clone(), shared.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= a.reviews {
                    return anyhow::Ok(out);
                }
                let mut p = shared.clone();
                p.extend(ids(a.diff_tokens, seed * 1000 + 500 + i as u64, a.vocab));
                out.push(c.complete(&p, a.answer_tokens, cache).await?);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.context("review worker")??);
    }
    Ok(Replay {
        turns: vec![all],
        wall: t0.elapsed().as_secs_f64(),
    })
}

/// The summary line of a set of replays of one mode.
struct Summary {
    wall: f64,
    prefill: f64,
    ttft50: f64,
    ttft99: f64,
    cached_share: f64,
    prompt_tps: f64,
    gen_tps: f64,
}

fn summarize(rs: &[Replay]) -> Summary {
    let wall: f64 = rs.iter().map(|r| r.wall).sum::<f64>() / rs.len().max(1) as f64;
    let mut ttfts: Vec<f64> = rs.iter().flat_map(|r| r.all().map(|q| q.ttft)).collect();
    let prefill: f64 = ttfts.iter().sum::<f64>() / rs.len().max(1) as f64;
    let prompt: u64 = rs.iter().map(|r| r.sum(|q| q.prompt)).sum();
    let cached: u64 = rs.iter().map(|r| r.sum(|q| q.cached)).sum();
    let gen: u64 = rs.iter().map(|r| r.sum(|q| q.completion)).sum();
    let walls: f64 = rs.iter().map(|r| r.wall).sum();
    Summary {
        wall,
        prefill,
        ttft50: pct(&mut ttfts, 0.5),
        ttft99: pct(&mut ttfts, 0.99),
        cached_share: cached as f64 / prompt.max(1) as f64,
        prompt_tps: prompt as f64 / walls.max(1e-9),
        gen_tps: gen as f64 / walls.max(1e-9),
    }
}

fn print_summary(what: &str, on: &[Replay], off: &[Replay]) {
    let (s_on, s_off) = (summarize(on), summarize(off));
    println!(
        "{what}: {:>5} {:>9} {:>10} {:>10} {:>10} {:>8} {:>10} {:>9}",
        "cache", "wall s", "ttft sum s", "ttft p50", "ttft p99", "cached", "prompt t/s", "gen t/s"
    );
    for (name, s) in [("on", &s_on), ("off", &s_off)] {
        println!(
            "{:w$}  {name:>5} {:>9.2} {:>10.2} {:>9.3}s {:>9.3}s {:>7.1}% {:>10.1} {:>9.2}",
            "",
            s.wall,
            s.prefill,
            s.ttft50,
            s.ttft99,
            100.0 * s.cached_share,
            s.prompt_tps,
            s.gen_tps,
            w = what.len()
        );
    }
    println!(
        "{:w$}  off/on: wall {:.2}x, time to first tokens (summed) {:.2}x",
        "",
        s_off.wall / s_on.wall,
        s_off.prefill / s_on.prefill,
        w = what.len()
    );
}

/// Runs the subcommand.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.sessions == 0 || a.turns == 0 || a.turn_tokens == 0 || a.rounds == 0 || a.vocab < 32 {
        bail!("--sessions, --turns, --turn-tokens and --rounds must be at least 1, --vocab at least 32");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(a))
}

async fn bench(a: Args) -> anyhow::Result<()> {
    let base = a.url.trim_end_matches('/').to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(a.timeout))
        .build()?;
    let model = served_model(&http, &base, a.model.as_deref(), a.api_key.as_deref()).await?;
    let c = std::sync::Arc::new(Client {
        http,
        base: base.clone(),
        model: model.clone(),
        key: a.api_key.clone(),
    });
    let depth = a.turns * (a.turn_tokens + a.answer_tokens as usize);
    println!(
        "bench agent: {base} model {model}; agent: {} sessions x {} turns of {} + {} tokens (to {depth}); reviews: {} x ({} shared + {} diff), {} at a time; {} round(s)",
        a.sessions, a.turns, a.turn_tokens, a.answer_tokens, a.reviews, a.shared_tokens, a.diff_tokens, a.review_concurrency, a.rounds
    );
    let kv_start = match a.server_pid {
        Some(pid) => {
            // one request first, longer than a prefill chunk: the server's one-time
            // allocations (step buffers at full chunk size, worker arenas) are not the KV
            // cache's; its blocks go back to the pool uncached (cache off)
            c.complete(&ids(a.turn_tokens.max(1024), 999, a.vocab), 2, false)
                .await?;
            Some(c.kv_sample(pid).await?)
        }
        None => None,
    };
    let (mut ag_on, mut ag_off, mut rv_on, mut rv_off) = (vec![], vec![], vec![], vec![]);
    for round in 0..a.rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for cache in order {
            // seeds differ per mode and round: no replay finds another's prompts cached
            let seed = 1 + round as u64 * 4 + u64::from(cache) * 2;
            let r = agent(&c, &a, cache, seed).await?;
            eprintln!(
                "  round {round} agent cache {}: {:.1} s",
                if cache { "on" } else { "off" },
                r.wall
            );
            if cache {
                ag_on.push(r)
            } else {
                ag_off.push(r)
            }
            if a.reviews > 0 {
                let r = reviews(&c, &a, cache, seed + 1).await?;
                eprintln!(
                    "  round {round} reviews cache {}: {:.1} s",
                    if cache { "on" } else { "off" },
                    r.wall
                );
                if cache {
                    rv_on.push(r)
                } else {
                    rv_off.push(r)
                }
            }
        }
    }
    println!(
        "agent sessions, TTFT per turn (p50 / p99 over sessions and rounds), cache on vs off:"
    );
    println!(
        "{:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "turn", "prompt", "on p50", "on p99", "off p50", "off p99", "off/on", "cached"
    );
    for t in 0..a.turns {
        let col = |rs: &[Replay]| -> Vec<f64> {
            rs.iter()
                .flat_map(|r| r.turns[t].iter().map(|q| q.ttft))
                .collect()
        };
        let (mut on, mut off) = (col(&ag_on), col(&ag_off));
        let prompt = ag_on
            .first()
            .and_then(|r| r.turns[t].first())
            .map_or(0, |q| q.prompt);
        let cached: u64 = ag_on
            .iter()
            .flat_map(|r| r.turns[t].iter().map(|q| q.cached))
            .sum();
        let looked: u64 = ag_on
            .iter()
            .flat_map(|r| r.turns[t].iter().map(|q| q.prompt))
            .sum();
        let (p50on, p50off) = (pct(&mut on, 0.5), pct(&mut off, 0.5));
        println!(
            "{:>5} {:>8} {:>9.3}s {:>9.3}s {:>9.3}s {:>9.3}s {:>7.2}x {:>7.1}%",
            t + 1,
            prompt,
            p50on,
            pct(&mut on, 0.99),
            p50off,
            pct(&mut off, 0.99),
            p50off / p50on,
            100.0 * cached as f64 / looked.max(1) as f64
        );
    }
    print_summary("agent  ", &ag_on, &ag_off);
    if a.reviews > 0 {
        print_summary("reviews", &rv_on, &rv_off);
    }
    if let (Some(pid), Some(s0)) = (a.server_pid, kv_start) {
        let s1 = c.kv_sample(pid).await?;
        let grown = s1.positions.saturating_sub(s0.positions);
        let rss = s1.rss_anon.saturating_sub(s0.rss_anon);
        println!(
            "KV memory: the pool grew by {grown} positions ({:.1} MiB allocated); the server's RssAnon by {:.1} MiB",
            s1.allocated_bytes.saturating_sub(s0.allocated_bytes) as f64 / 1048576.0,
            rss as f64 / 1048576.0
        );
        if grown > 0 {
            let measured = rss as f64 / grown as f64;
            println!(
                "  per position: measured {measured:.0} B (RssAnon growth / positions), theoretical {} B (the layout's), measured/theoretical {:.3}",
                s1.bytes_per_token,
                measured / s1.bytes_per_token.max(1) as f64
            );
        }
    }
    Ok(())
}
