//! `nightshift serve`: loads the model (or the cached demo model), starts the engine thread
//! with the continuous-batching scheduler and serves the OpenAI-compatible API until Ctrl-C /
//! SIGTERM, then drains running streams for a bounded time. Prints the URL, the model, the
//! nodes and ready-to-paste curl / Python snippets.

use crate::atlas_rec::{AtlasRecorder, SnapshotWriter};
use crate::cluster::{self, ClusterArgs, Experts};
use crate::gateway::atlas as atlas_admin;
use crate::gateway::{self, AppState, NodesCheck};
use crate::scheduler::model_backend::{engine_with, EngineLimits};
use crate::scheduler::spec::Speculator;
use crate::scheduler::{Scheduler, SchedulerOptions, StepEngine, TextModel};
use anyhow::{bail, Context};
use nightshift_model::cold::ColdStats;
use nightshift_model::prefetch::PrefetchStats;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `nightshift serve` (the flags are a contract, see notes/cluster-api.md).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file (first split of a split set). Without it, the demo model is generated
    /// once under ./demo/ and served.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Where the experts run (--nodes, --placement, --auth-token-file, ...).
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Speculative decoding (--speculative, --draft-max, --draft-model).
    #[command(flatten)]
    pub spec: crate::cli::spec_args::SpecArgs,
    /// Address to bind; use 0.0.0.0 only behind a firewall and with --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 = any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics.
    #[arg(long, env = "NIGHTSHIFT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Serve /metrics without the API key (for a scraper on a trusted network).
    #[arg(long)]
    pub metrics_public: bool,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sequences decoded together at most.
    #[arg(long, default_value_t = 8)]
    pub max_seqs: usize,
    /// Context length per sequence (prompt + completion).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Write the expert activation atlas (trace) here, atomically, every --atlas-every seconds
    /// and at shutdown (the atlas is recorded always; also served at GET /v1/atlas).
    #[arg(long)]
    pub atlas_out: Option<PathBuf>,
    /// Seconds between atlas snapshots written to --atlas-out.
    #[arg(long, default_value_t = 30)]
    pub atlas_every: u64,
    /// Requests waiting for a slot before new ones get HTTP 429.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Memory of the KV cache: `GiB` (e.g. `8` or `8GiB`, `512MiB`) or a share of the memory
    /// available at startup (`25%`). Taken as the cache fills; at least one --ctx context.
    /// Admission promises each request the blocks its prompt + max_tokens may need.
    #[arg(long, default_value = "25%", value_parser = parse_kv_memory)]
    pub kv_memory: KvMemory,
    /// Element type of the KV cache: f32 (the llama.cpp parity reference), f16 (half the
    /// memory) or q8_0 (34 bytes per 32 elements, llama.cpp's `-ctk q8_0 -ctv q8_0`).
    #[arg(long, default_value = "f32", value_parser = parse_kv_type)]
    pub kv_type: nightshift_model::KvType,
    /// Turn automatic prefix caching off (every prompt is computed from its first token).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Keep the prefix cache's full blocks on disk in this directory too (written once in the
    /// background, read back on a hit): prefixes evicted from memory, or cached before a
    /// restart, are not computed again. Files are checked (model, cache type, layout,
    /// checksum); bad ones are skipped with a warning.
    #[arg(long)]
    pub kv_cache_dir: Option<PathBuf>,
    /// Most bytes of block files in --kv-cache-dir (`GiB`: 8, 8GiB, 512MiB); the least
    /// recently used are deleted first.
    #[arg(long, default_value = "8GiB", value_parser = parse_size)]
    pub kv_cache_dir_max: u64,
    /// Prompt tokens computed per engine step, over all prefilling sequences (decode tokens
    /// ride on top): a long prompt is prefilled in chunks of this size, so running decodes
    /// keep producing a token every step. `--step-tokens` is an alias.
    #[arg(long, alias = "step-tokens", default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Non-streaming requests fail with 504 after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// A request body must arrive within this many seconds once its head has (else 408).
    #[arg(long, default_value_t = 60)]
    pub body_timeout: u64,
    /// Streaming requests get an error event and end after this many seconds (0 = no limit);
    /// the sequence is cancelled and its KV cache freed.
    #[arg(long, default_value_t = 600)]
    pub stream_timeout: u64,
    /// `/ready` answers 503 ("engine stalled") while one engine step has run longer than this
    /// many seconds: a supervisor or load balancer sees a stuck engine. A step is one prefill
    /// chunk (--prefill-chunk) plus the decode rows, so it normally takes well under a second.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout: u64,
    /// On shutdown, wait at most this many seconds for running streams.
    #[arg(long, default_value_t = 30)]
    pub drain: u64,
    /// Model id clients pass as `model` (default: the file name without .gguf).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Another name requests may pass as `model` for the same model (repeatable): e.g. the
    /// names an agent sends without asking (Claude Code's `claude-*` models).
    #[arg(long = "model-alias", value_name = "NAME")]
    pub model_aliases: Vec<String>,
    /// Tool-call format of the model's output: hermes (Qwen3), qwen3_coder, kimi_k2,
    /// deepseek_v31, deepseek_v3 (V3 and R1's fenced JSON), deepseek_v32 (V3.2's DSML) or glm45
    /// (GLM-4.5 and 4.6's `<arg_key>`/`<arg_value>` pairs)
    /// (default: found from the chat template's markers).
    #[arg(long, value_parser = parse_tool_format)]
    pub tool_format: Option<nightshift_model::toolcall::ToolFormat>,
    /// Where a thinking model's leading `<think>` block goes (llama-server's flag): deepseek
    /// (as `reasoning_content`, when the chat template writes think blocks) or none (left in
    /// the content).
    #[arg(long, default_value = "deepseek", value_parser = ["deepseek", "none"])]
    pub reasoning_format: String,
    /// Seconds a connection may take to send a request head, and may stay idle between
    /// requests, before it is closed.
    #[arg(long, default_value_t = 10)]
    pub header_timeout: u64,
    /// Open HTTP connections at most (also capped by the file-descriptor limit); at the cap the
    /// oldest idle connection is closed for a new one, or new ones wait when all are busy.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Let special-token texts in chat message contents (`<|im_start|>`, ...) become special
    /// tokens, as before contents were plain text: anyone who writes a message can then forge
    /// system, tool or assistant turns.
    #[arg(long)]
    pub allow_special_in_content: bool,
    /// Serve a deterministic byte-level toy model instead of a GGUF (tests the HTTP layer only).
    #[arg(long, hide = true)]
    pub mock: bool,
    /// With --mock: milliseconds each engine step takes (makes batching and draining visible).
    #[arg(long, hide = true, default_value_t = 0)]
    pub mock_step_ms: u64,
}

/// `--kv-memory`: bytes, or a share of the memory available at startup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvMemory {
    Bytes(u64),
    Percent(f64),
}

fn parse_kv_memory(s: &str) -> Result<KvMemory, String> {
    let t = s.trim();
    let bad = || format!("expected GiB (8, 8GiB, 512MiB) or a share of memory (25%), found {s:?}");
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| bad())?;
        return if v > 0.0 && v <= 100.0 {
            Ok(KvMemory::Percent(v))
        } else {
            Err(format!("expected a share between 0 and 100%, found {s:?}"))
        };
    }
    parse_size(t).map(KvMemory::Bytes).map_err(|_| bad())
}

/// A size in bytes: `GiB` by default (`8`, `8GiB`, `1.5g`) or `MiB` (`512MiB`).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("expected a size in GiB (8, 8GiB) or MiB (512MiB), found {s:?}");
    let lower = t.to_ascii_lowercase();
    let (num, unit) = match lower.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => lower.split_at(i),
        None => (lower.as_str(), "gib"),
    };
    let scale: f64 = match unit.trim() {
        "gib" | "g" | "gb" => (1u64 << 30) as f64,
        "mib" | "m" | "mb" => (1u64 << 20) as f64,
        _ => return Err(bad()),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if v.is_finite() && v > 0.0 {
        Ok((v * scale) as u64)
    } else {
        Err(bad())
    }
}

pub(crate) fn parse_kv_type(s: &str) -> Result<nightshift_model::KvType, String> {
    nightshift_model::KvType::parse(s)
}

/// The KV cache's size: positions from `--kv-memory` (at least one context) and the line the
/// banner prints.
fn kv_budget(args: &Args, layout: nightshift_model::KvLayout, n_ctx: usize) -> (usize, String) {
    let per_token = layout.token_bytes(args.kv_type).max(1) as u64;
    let (bytes, how) = match args.kv_memory {
        KvMemory::Bytes(b) => (b, String::new()),
        KvMemory::Percent(p) => {
            let avail = nightshift_model::weights::mem_available().unwrap_or(8 << 30);
            (
                (avail as f64 * p / 100.0) as u64,
                format!(" ({p}% of available memory)"),
            )
        }
    };
    let tokens = ((bytes / per_token) as usize).max(n_ctx);
    let blocks = layout.blocks_for(tokens);
    let line = format!(
        "{:.2} GiB{how}: {blocks} blocks of {} positions ({} tokens, {} B per token, {}), prefix cache {}",
        (blocks * layout.block_bytes(args.kv_type)) as f64 / (1u64 << 30) as f64,
        layout.block,
        blocks * layout.block,
        per_token,
        args.kv_type.name(),
        match (&args.kv_cache_dir, args.no_prefix_cache) {
            (_, true) => "off".to_string(),
            (None, false) => "on".to_string(),
            (Some(d), false) => format!(
                "on, disk tier {} (at most {:.2} GiB)",
                d.display(),
                args.kv_cache_dir_max as f64 / (1u64 << 30) as f64
            ),
        }
    );
    (tokens, line)
}

/// A loaded backend: the engine (moved to its thread), the text side and a description.
struct Loaded {
    engine: SpawnFn,
    text: Arc<dyn TextModel>,
    model_id: String,
    fingerprint: String,
    nodes: String,
    /// The KV cache line of the banner.
    kv: String,
    n_ctx: usize,
    /// Keeps spawned expert nodes alive; None for the toy model.
    experts: Option<Experts>,
    /// The ExpertAtlas recorder installed in the engine; None for the toy model.
    atlas: Option<Arc<AtlasRecorder>>,
    /// What the atlas endpoints act on (the recorder, the nodes, the model's shape).
    atlas_admin: Option<Arc<atlas_admin::AtlasAdmin>>,
}

type SpawnFn = Box<dyn FnOnce(Arc<dyn TextModel>, SchedulerOptions) -> std::io::Result<Scheduler>>;

fn spawn_with<E: StepEngine>(engine: E, spec: Option<Speculator>) -> SpawnFn {
    Box::new(move |text, opts| Scheduler::spawn_speculative(engine, text, opts, spec))
}

/// The demo model: generated once (tiny qwen3moe, Q4_K_M) and cached under ./demo/.
fn demo_model() -> anyhow::Result<PathBuf> {
    use nightshift_model::gen::{self, Arch, GenSpec, Preset, QuantMix};
    let spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
    let path = PathBuf::from("demo").join("tiny-qwen3moe-Q4_K_M.gguf");
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all("demo").context("creating ./demo")?;
    eprintln!(
        "nightshift serve: no --model given; generating the demo model {} (once)",
        path.display()
    );
    gen::generate(&spec, &path, &mut |_| {})
        .with_context(|| format!("generating {}", path.display()))?;
    Ok(path)
}

fn load(args: &Args) -> anyhow::Result<Loaded> {
    if args.mock {
        if args.cluster.nodes > 0 || args.cluster.placement.is_some() {
            bail!("--mock runs no experts; drop --nodes and --placement");
        }
        if args.atlas_out.is_some() {
            bail!("--mock runs no experts, so there is no atlas to record; drop --atlas-out");
        }
        let spec = args.spec.build(None, None)?;
        return Ok(Loaded {
            engine: spawn_with(
                {
                    let mut e = crate::scheduler::mock::MockEngine::new(args.max_seqs);
                    e.step_delay = Duration::from_millis(args.mock_step_ms);
                    e.prefix = !args.no_prefix_cache;
                    e
                },
                spec,
            ),
            text: Arc::new(crate::scheduler::mock::MockText),
            model_id: args.model_name.clone().unwrap_or_else(|| "mock".into()),
            fingerprint: "fp_mock".into(),
            nodes: "none (toy model in process)".into(),
            kv: format!(
                "toy model, prefix cache {}",
                if args.no_prefix_cache { "off" } else { "on" }
            ),
            n_ctx: args.ctx,
            experts: None,
            atlas: None,
            atlas_admin: None,
        });
    }
    let path = match &args.model {
        Some(p) => p.clone(),
        None => demo_model()?,
    };
    let model = cluster::load_model(&path, &args.cluster)
        .with_context(|| format!("loading {}", path.display()))?;
    // A model file truncated under the running server stops it with the reason, not a SIGBUS.
    let watched = Arc::downgrade(&model);
    nightshift_model::gguf::spawn_watchdog(Duration::from_secs(1), move || {
        watched.upgrade().map(|m| m.gguf().check_unchanged())
    })
    .context("starting the model file watchdog")?;
    let n_ctx_train = model.config().n_ctx_train;
    let n_ctx = if n_ctx_train > 0 && args.ctx > n_ctx_train {
        eprintln!("nightshift serve: --ctx {} is beyond the model's training context; using {n_ctx_train}", args.ctx);
        n_ctx_train
    } else {
        args.ctx
    };
    let text = load_text(
        &model,
        args.tool_format,
        args.allow_special_in_content,
        args.reasoning_format == "deepseek",
    )?;
    let (kv_tokens, kv) = kv_budget(
        args,
        nightshift_model::KvLayout::for_model(model.config()),
        n_ctx,
    );
    let limits = EngineLimits {
        threads: args.threads.unwrap_or(0),
        max_seqs: args.max_seqs,
        kv_budget_tokens: kv_tokens,
        max_seq_len: n_ctx,
        kv_type: args.kv_type,
        prefix_cache: !args.no_prefix_cache,
        kv_disk: args
            .kv_cache_dir
            .as_ref()
            .map(|dir| nightshift_model::kv::KvDiskOptions {
                dir: dir.clone(),
                max_bytes: args.kv_cache_dir_max,
            }),
    };
    let fingerprint = format!("fp_{:016x}", model.gguf().fingerprint());
    let pool = nightshift_model::build_pool(limits.threads).context("building the thread pool")?;
    let experts = cluster::build(&args.cluster, &model, &path, Some(pool.clone()))
        .context("setting up the expert nodes")?;
    let model_id = args.model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let atlas = match AtlasRecorder::for_model(&model, model_id.clone(), experts.remote().cloned())
    {
        Ok(r) => Some(Arc::new(r)),
        Err(e) if args.atlas_out.is_none() => {
            tracing::debug!(error = %e, "no expert atlas for this model");
            None
        }
        Err(e) => bail!("--atlas-out: {e}"),
    };
    let atlas_admin = match (&atlas, cluster::model_shape(&model)) {
        (Some(rec), Ok(shape)) => Some(Arc::new(atlas_admin::AtlasAdmin {
            recorder: rec.clone(),
            remote: experts.remote().cloned(),
            residency: experts.residency().cloned().map(|r| (r, model.clone())),
            shape,
            busy: tokio::sync::Mutex::new(()),
        })),
        _ => None,
    };
    let spec = args.spec.build(Some(&model), Some(pool.clone()))?;
    eprintln!(
        "nightshift serve: speculative decoding {}",
        args.spec.describe()
    );
    let mut engine =
        engine_with(model, experts.backend(), pool, &limits).context("starting the engine")?;
    if let Some(rec) = &atlas {
        engine.set_route_observer(Some(rec.clone() as Arc<dyn nightshift_model::RouteObserver>));
    }
    Ok(Loaded {
        engine: spawn_with(engine, spec),
        text,
        model_id,
        fingerprint,
        nodes: experts.describe(),
        kv,
        n_ctx,
        experts: Some(experts),
        atlas,
        atlas_admin,
    })
}

/// Serving is possible while at least one expert node is up (replicas fail over); in process
/// always.
/// `/metrics` series of the cold-expert staging cache (`--cold-cache`).
fn publish_cold_cache(s: &ColdStats, held: u64) {
    metrics::counter!("nightshift_cold_cache_hits_total").absolute(s.hits);
    metrics::counter!("nightshift_cold_cache_misses_total").absolute(s.misses);
    metrics::counter!("nightshift_cold_cache_prefetched_total").absolute(s.prefetched);
    metrics::counter!("nightshift_cold_cache_dropped_total").absolute(s.dropped);
    metrics::counter!("nightshift_cold_cache_evicted_total").absolute(s.evicted);
    metrics::counter!("nightshift_cold_cache_read_bytes_total").absolute(s.bytes_read);
    metrics::counter!("nightshift_cold_cache_wait_microseconds_total").absolute(s.wait_us);
    metrics::gauge!("nightshift_cold_cache_bytes").set(held as f64);
}

/// `/metrics` series of the one-layer-ahead prefetch under `--memory-budget`
/// (`nightshift_model::prefetch`): requests, how they fared, and the prediction's quality.
fn publish_prefetch(s: &PrefetchStats) {
    metrics::counter!("nightshift_prefetch_issued_total").absolute(s.issued);
    metrics::counter!("nightshift_prefetch_in_time_total").absolute(s.in_time);
    metrics::counter!("nightshift_prefetch_late_total").absolute(s.late);
    metrics::counter!("nightshift_prefetch_wasted_total").absolute(s.wasted);
    metrics::counter!("nightshift_prefetch_demand_total").absolute(s.demand);
    metrics::counter!("nightshift_prefetch_cold_needed_total").absolute(s.cold_needed);
    metrics::counter!("nightshift_prefetch_predicted_total").absolute(s.predicted);
    metrics::counter!("nightshift_prefetch_predicted_used_total").absolute(s.predicted_used);
    metrics::counter!("nightshift_prefetch_used_total").absolute(s.used);
    if let Some(x) = s.precision() {
        metrics::gauge!("nightshift_prefetch_precision").set(x);
    }
    if let Some(x) = s.recall() {
        metrics::gauge!("nightshift_prefetch_recall").set(x);
    }
}

fn nodes_check(experts: Option<&Experts>) -> NodesCheck {
    match experts.and_then(|e| e.remote()).cloned() {
        None => Arc::new(|| Ok(())),
        Some(remote) => Arc::new(move || {
            let st = remote.status();
            if st.iter().any(|n| n.up) {
                Ok(())
            } else {
                let detail: Vec<String> = st
                    .iter()
                    .map(|n| format!("{} {}: {}", n.name, n.addr, n.detail))
                    .collect();
                Err(format!("no expert node is up ({})", detail.join("; ")))
            }
        }),
    }
}

fn parse_tool_format(s: &str) -> Result<nightshift_model::toolcall::ToolFormat, String> {
    use nightshift_model::toolcall::ToolFormat;
    ToolFormat::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = ToolFormat::ALL.iter().map(|(_, n)| *n).collect();
        format!("expected one of {}, found `{s}`", names.join(", "))
    })
}

fn load_text(
    model: &nightshift_model::Model,
    tool_format: Option<nightshift_model::toolcall::ToolFormat>,
    special_in_content: bool,
    split_reasoning: bool,
) -> anyhow::Result<Arc<dyn TextModel>> {
    let mut t = crate::scheduler::model_text::ModelText::from_model(model, tool_format)
        .map_err(anyhow::Error::msg)?
        .with_special_in_content(special_in_content);
    if !split_reasoning {
        t = t.without_reasoning_split();
    }
    Ok(Arc::new(t))
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    init_tracing();
    if args.max_seqs == 0 || args.ctx == 0 || args.queue == 0 || args.prefill_chunk == 0 {
        bail!("--max-seqs, --ctx, --queue and --prefill-chunk must be at least 1");
    }
    if args.header_timeout == 0 || args.max_connections == 0 {
        bail!("--header-timeout and --max-connections must be at least 1");
    }
    if args.atlas_every == 0 {
        bail!("--atlas-every: expected at least 1 second, found 0");
    }
    let loaded = load(&args)?;
    let atlas_writer = match (&args.atlas_out, &loaded.atlas) {
        (Some(path), Some(rec)) => Some(
            // A first (empty) snapshot now: an unwritable path fails at startup, not later.
            rec.save(path)
                .with_context(|| format!("--atlas-out {}", path.display()))
                .and_then(|()| {
                    SnapshotWriter::start(
                        rec.clone(),
                        path.clone(),
                        Duration::from_secs(args.atlas_every),
                    )
                    .context("starting the atlas snapshot thread")
                })?,
        ),
        _ => None,
    };
    let opts = SchedulerOptions {
        queue_capacity: args.queue,
        max_seqs: args.max_seqs,
        prefill_chunk: args.prefill_chunk,
        n_ctx: loaded.n_ctx,
    };
    // The recorder first: the engine thread registers its series as it starts.
    let metrics = gateway::metrics_handle();
    let scheduler =
        (loaded.engine)(loaded.text.clone(), opts).context("starting the engine thread")?;
    let state = Arc::new(AppState {
        model_id: loaded.model_id.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        fingerprint: loaded.fingerprint,
        scheduler,
        text: loaded.text,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        request_timeout: Duration::from_secs(args.request_timeout),
        body_timeout: Duration::from_secs(args.body_timeout.max(1)),
        stream_timeout: (args.stream_timeout > 0).then(|| Duration::from_secs(args.stream_timeout)),
        metrics,
        metrics_public: args.metrics_public,
        nodes_ok: nodes_check(loaded.experts.as_ref()),
        stall_after: Duration::from_secs(args.stall_timeout),
        draining: AtomicBool::new(false),
        atlas: loaded.atlas_admin.clone(),
        responses: Default::default(),
        model_aliases: args.model_aliases.clone(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let experts = loaded.experts;
    let remote = experts.as_ref().and_then(|e| e.remote()).cloned();
    let prefetch = experts.as_ref().and_then(|e| e.prefetch()).cloned();
    let cold = experts.as_ref().and_then(|e| e.cold_cache()).cloned();
    rt.block_on(async move {
        if prefetch.is_some() || cold.is_some() {
            // The cold path's counters, refreshed every 2 s.
            tokio::spawn(async move {
                loop {
                    if let Some(p) = &prefetch {
                        publish_prefetch(&p.stats());
                    }
                    if let Some(c) = &cold {
                        publish_cold_cache(&c.stats(), c.held_bytes());
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            });
        }
        if let Some(remote) = remote {
            // Expert-node health as gauges, refreshed every 2 s: up (connected) and suspect
            // (much slower than its recent p99, its calls hedged on replicas).
            tokio::spawn(async move {
                let flag = |b: bool| if b { 1.0 } else { 0.0 };
                loop {
                    for n in remote.status() {
                        metrics::gauge!("nightshift_expert_node_up", "node" => n.name.clone())
                            .set(flag(n.up));
                        metrics::gauge!("nightshift_expert_node_suspect", "node" => n.name.clone())
                            .set(flag(n.suspect));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            });
        }
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| format!("[{}]:{}", args.host, args.port).parse())
            .with_context(|| format!("--host {:?} is not an IP address", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let shutdown = shutdown_signal();
        banner(
            &local,
            &loaded.model_id,
            &loaded.nodes,
            &loaded.kv,
            args.api_key.is_some(),
        );
        let limits = gateway::conn::ConnLimits {
            header_timeout: Duration::from_secs(args.header_timeout),
            max_connections: args.max_connections,
        };
        gateway::serve_with(
            listener,
            state,
            shutdown,
            Duration::from_secs(args.drain),
            limits,
        )
        .await
        .context("serving HTTP")
    })?;
    if let Some(w) = atlas_writer {
        w.finish().context("writing the final atlas snapshot")?;
    }
    drop(experts);
    eprintln!("nightshift serve: stopped");
    Ok(())
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called (inside the
/// runtime, before the server announces itself), so a signal sent as soon as the server is up
/// stops it gracefully instead of killing it.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut int) = (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        );
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! { _ = wait(term.take()) => {}, _ = wait(int.take()) => {} }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn banner(addr: &SocketAddr, model: &str, nodes: &str, kv: &str, auth: bool) {
    let url = format!("http://{addr}");
    let key_hdr = if auth {
        " -H \"Authorization: Bearer $NIGHTSHIFT_API_KEY\""
    } else {
        ""
    };
    let key_py = if auth {
        "os.environ[\"NIGHTSHIFT_API_KEY\"]"
    } else {
        "\"none\""
    };
    // A closed stdout (the reader went away) must not take the server down: ignore write errors.
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "nightshift serve: listening on {url}");
    let _ = writeln!(out, "  model : {model}");
    let _ = writeln!(out, "  nodes : {nodes}");
    let _ = writeln!(out, "  kv    : {kv}");
    let _ = writeln!(
        out,
        "  auth  : {}",
        if auth {
            "Bearer API key required on /v1/* and /metrics"
        } else {
            "none (bind is local only unless --host says otherwise)"
        }
    );
    let _ = writeln!(
        out,
        "  health: {url}/health  ready: {url}/ready  metrics: {url}/metrics"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "curl {url}/v1/chat/completions -H 'Content-Type: application/json'{key_hdr} \\"
    );
    let _ = writeln!(out, "  -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'");
    let _ = writeln!(out);
    let _ = writeln!(out, "python3 - <<'PY'");
    let _ = writeln!(out, "import os");
    let _ = writeln!(out, "from openai import OpenAI");
    let _ = writeln!(
        out,
        "client = OpenAI(base_url=\"{url}/v1\", api_key={key_py})"
    );
    let _ = writeln!(out, "r = client.chat.completions.create(model=\"{model}\", messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}])");
    let _ = writeln!(out, "print(r.choices[0].message.content)");
    let _ = writeln!(out, "PY");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::{parse_kv_memory, KvMemory};

    #[test]
    fn kv_memory_takes_sizes_and_shares() {
        assert_eq!(parse_kv_memory("8"), Ok(KvMemory::Bytes(8 << 30)));
        assert_eq!(parse_kv_memory("1.5GiB"), Ok(KvMemory::Bytes(3 << 29)));
        assert_eq!(parse_kv_memory("512MiB"), Ok(KvMemory::Bytes(512 << 20)));
        assert_eq!(parse_kv_memory("25%"), Ok(KvMemory::Percent(25.0)));
        for bad in ["", "0", "-1", "12TB", "150%", "0%", "lots"] {
            assert!(parse_kv_memory(bad).is_err(), "{bad:?} accepted");
        }
    }
}
