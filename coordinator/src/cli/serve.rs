//! `nightshift serve`: loads the model (or the cached demo model), starts the engine thread
//! with the continuous-batching scheduler and serves the OpenAI-compatible API until Ctrl-C /
//! SIGTERM, then drains running streams for a bounded time. Prints the URL, the model, the
//! nodes and ready-to-paste curl / Python snippets.

use crate::gateway::{self, AppState};
use crate::scheduler::{Scheduler, SchedulerOptions, StepEngine, TextModel};
use anyhow::{bail, Context};
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
    /// Placement file (TOML): which expert node holds which experts.
    #[arg(long)]
    pub placement: Option<PathBuf>,
    /// Spawn and supervise N local expert-node processes; 0 = experts in process.
    #[arg(long, default_value_t = 0)]
    pub nodes: usize,
    /// Address to bind; use 0.0.0.0 only behind a firewall and with --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 = any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/*.
    #[arg(long, env = "NIGHTSHIFT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sequences decoded together at most.
    #[arg(long, default_value_t = 8)]
    pub max_seqs: usize,
    /// Context length per sequence (prompt + completion).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Token file shared with the expert nodes (gRPC auth).
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// Write the expert activation atlas (trace) here.
    #[arg(long)]
    pub atlas_out: Option<PathBuf>,
    /// Requests waiting for a slot before new ones get HTTP 429.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Tokens per engine step (decode tokens + prefill chunks).
    #[arg(long, default_value_t = 256)]
    pub step_tokens: usize,
    /// Non-streaming requests fail with 504 after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// On shutdown, wait at most this many seconds for running streams.
    #[arg(long, default_value_t = 30)]
    pub drain: u64,
    /// Model id clients pass as `model` (default: the file name without .gguf).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Serve a deterministic byte-level toy model instead of a GGUF (tests the HTTP layer only).
    #[arg(long, hide = true)]
    pub mock: bool,
}

/// A loaded backend: the engine (moved to its thread), the text side and a description.
struct Loaded {
    engine: Box<dyn FnOnce(Arc<dyn TextModel>, SchedulerOptions) -> std::io::Result<Scheduler>>,
    text: Arc<dyn TextModel>,
    model_id: String,
    fingerprint: String,
    nodes: String,
}

fn spawn_with<E: StepEngine>(
    engine: E,
) -> Box<dyn FnOnce(Arc<dyn TextModel>, SchedulerOptions) -> std::io::Result<Scheduler>> {
    Box::new(move |text, opts| Scheduler::spawn(engine, text, opts))
}

fn load(args: &Args) -> anyhow::Result<Loaded> {
    if args.nodes > 0 {
        bail!(
            "--nodes {} is not available yet: the local cluster launcher is not built; run with --nodes 0 (experts in process)",
            args.nodes
        );
    }
    if args.placement.is_some() {
        bail!("--placement is not available yet: the remote expert client is not built; run without it (experts in process)");
    }
    if args.auth_token_file.is_some() {
        bail!("--auth-token-file is only used with expert nodes, which are not available yet");
    }
    if args.atlas_out.is_some() {
        bail!("--atlas-out is not available yet: the atlas recorder is not built");
    }
    if args.mock {
        return Ok(Loaded {
            engine: spawn_with(crate::scheduler::mock::MockEngine::new(args.max_seqs)),
            text: Arc::new(crate::scheduler::mock::MockText),
            model_id: args.model_name.clone().unwrap_or_else(|| "mock".into()),
            fingerprint: "fp_mock".into(),
            nodes: "none (toy model in process)".into(),
        });
    }
    let _path = match &args.model {
        Some(p) => p.clone(),
        None => bail!(
            "no --model given and the demo model generator (nightshift_model::gen::generate) is not built yet; pass --model FILE.gguf"
        ),
    };
    bail!(
        "serving a GGUF needs the model engine (nightshift_model::Engine), which is not built yet"
    )
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    init_tracing();
    if args.max_seqs == 0 || args.ctx == 0 || args.queue == 0 || args.step_tokens == 0 {
        bail!("--max-seqs, --ctx, --queue and --step-tokens must be at least 1");
    }
    let loaded = load(&args)?;
    let opts = SchedulerOptions {
        queue_capacity: args.queue,
        max_seqs: args.max_seqs,
        step_tokens: args.step_tokens,
        n_ctx: args.ctx,
    };
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
        metrics: gateway::metrics_handle(),
        nodes_ok: Arc::new(|| Ok(())),
        draining: AtomicBool::new(false),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| format!("[{}]:{}", args.host, args.port).parse())
            .with_context(|| format!("--host {:?} is not an IP address", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        banner(
            &local,
            &loaded.model_id,
            &loaded.nodes,
            args.api_key.is_some(),
        );
        gateway::serve(
            listener,
            state,
            shutdown_signal(),
            Duration::from_secs(args.drain),
        )
        .await
        .context("serving HTTP")
    })?;
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

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

fn banner(addr: &SocketAddr, model: &str, nodes: &str, auth: bool) {
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
    println!("nightshift serve: listening on {url}");
    println!("  model : {model}");
    println!("  nodes : {nodes}");
    println!(
        "  auth  : {}",
        if auth {
            "Bearer API key required on /v1/*"
        } else {
            "none (bind is local only unless --host says otherwise)"
        }
    );
    println!("  health: {url}/health  ready: {url}/ready  metrics: {url}/metrics");
    println!();
    println!("curl {url}/v1/chat/completions -H 'Content-Type: application/json'{key_hdr} \\");
    println!("  -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'");
    println!();
    println!("python3 - <<'PY'");
    println!("import os");
    println!("from openai import OpenAI");
    println!("client = OpenAI(base_url=\"{url}/v1\", api_key={key_py})");
    println!("r = client.chat.completions.create(model=\"{model}\", messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}])");
    println!("print(r.choices[0].message.content)");
    println!("PY");
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
