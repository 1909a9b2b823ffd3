//! `nightshift-expert-node`: maps a GGUF, loads the experts the placement gives this node (hot
//! ones copied into node-local memory by pinned threads, cold ones left mapped and, with
//! `--cold-cache`, read whole into a staging cache when a call needs them, or ahead of it on the
//! coordinator's prefetch hints), and serves them over
//! gRPC until SIGINT/SIGTERM, then drains in-flight work (bounded) and exits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use nightshift_atlas_core::placement::Placement;
use nightshift_atlas_core::size::{parse_size, parse_size_or_auto};
use nightshift_expert_node::service::{NodeIdentity, NodeService};
use nightshift_expert_node::store::{model_shape, ExpertStore};
use nightshift_expert_node::{auth, numa, tls};
use nightshift_model::cold::ColdCache;
use nightshift_model::gguf::Gguf;
use nightshift_proto::v1::expert_service_server::ExpertServiceServer;

/// Serve one shard of a mixture-of-experts model's experts over gRPC.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The GGUF model (first shard of a split model is enough).
    #[arg(long)]
    model: PathBuf,
    /// Placement file saying which experts each node serves.
    #[arg(long)]
    placement: PathBuf,
    /// This node's name in the placement file.
    #[arg(long)]
    node: String,
    /// Address to listen on, host:port.
    #[arg(long)]
    listen: SocketAddr,
    /// Address of the framed data link (layer calls on one blocking thread per link, beside the
    /// gRPC service that stays the control plane; its port is reported by `Info`), or `off`.
    /// Default: --listen's address with a port the system picks.
    #[arg(long)]
    link_listen: Option<String>,
    /// NUMA node to pin worker threads and resident memory to.
    #[arg(long)]
    numa: Option<usize>,
    /// Worker threads (default: the cores of the NUMA node, or of the machine).
    #[arg(long)]
    threads: Option<usize>,
    /// Lock resident experts in RAM (needs CAP_IPC_LOCK or a high memlock limit).
    #[arg(long)]
    mlock: bool,
    /// Most bytes of resident expert copies on this node (123, 10G, 10GiB, or N% of the experts
    /// the placement gives it), instead of the placement's memory_bytes. The placement's
    /// resident experts beyond it (in its order: a plan lists the hottest first per layer) are
    /// served from the mapped file, as its cold ones are.
    #[arg(long)]
    memory_budget: Option<String>,
    /// Read the experts this node does not keep resident whole into a staging cache of this size
    /// (O_DIRECT, least recently used; `auto`: half of the memory the process may still
    /// take, cgroup limits included, at least two MoE layers' experts of a decode step; a size
    /// as for --memory-budget; `0`: fault them in from the mapped file through the page cache).
    /// Taken on top of the budget; the part of the budget (or of the placement's memory_bytes)
    /// the resident experts leave is lent to it as well, and taken back before a live load
    /// copies more. Default: `auto` with --memory-budget or a placement memory_bytes, else `0`.
    #[arg(long)]
    cold_cache: Option<String>,
    /// Cold experts the staging cache reads at once (its I/O threads, 1 to 64; 1 reads one at
    /// a time). Predictions and hints take all but one, so a call waiting for an expert never
    /// waits behind them.
    #[arg(long, default_value_t = nightshift_model::cold::DEFAULT_IO_DEPTH)]
    cold_io_depth: usize,
    /// File holding a shared token the coordinator must present (Bearer). Required unless
    /// --insecure-no-auth is given.
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// Serve without authentication: any process that can reach --listen may compute, load and
    /// drop experts. Only for a trusted, isolated network.
    #[arg(long, conflicts_with = "auth_token_file")]
    insecure_no_auth: bool,
    /// PEM certificate chain to present: serve gRPC over TLS (needs --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle: require the coordinator to present a certificate it signed (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Plan pinning from an hwloc XML export instead of the live machine (testing).
    #[arg(long, hide = true)]
    topology_xml: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    nightshift_model::error::cli_exit("nightshift-expert-node", run())
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    // The token first: a node that would refuse every coordinator must not load a model.
    let token = match &args.auth_token_file {
        None if !args.insecure_no_auth => bail!(
            "no --auth-token-file: a node without a token lets any process that reaches {} compute, \
             load and drop experts; give the file holding the coordinator's token, or \
             --insecure-no-auth on a trusted network",
            args.listen
        ),
        None => {
            tracing::warn!(
                "--insecure-no-auth: any process that reaches {} can drive this node",
                args.listen
            );
            None
        }
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .with_context(|| format!("reading the auth token file {}", p.display()))?;
            let t = t.trim().to_string();
            if t.is_empty() {
                bail!("auth token file {} is empty", p.display());
            }
            Some(t)
        }
    };
    let topo = Arc::new(numa::load_topology(args.topology_xml.as_deref())?);
    let plan = numa::plan(&topo, args.numa, args.threads)?;
    if let Some(note) = &plan.note {
        tracing::info!("{note}");
    }
    let pool = Arc::new(numa::pinned_pool(topo.clone(), &plan)?);

    let gguf = Arc::new(
        Gguf::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?,
    );
    let watched = Arc::downgrade(&gguf);
    nightshift_model::gguf::spawn_watchdog(Duration::from_secs(1), move || {
        watched.upgrade().map(|g| g.check_unchanged())
    })
    .context("starting the model file watchdog")?;
    let shape = model_shape(&gguf)?;
    let placement = Placement::load(&args.placement)?.resolve(&shape)?;
    let slots = placement.experts_on(&args.node)?;
    if slots.is_empty() {
        tracing::warn!(node = %args.node, "the placement gives this node no experts");
    }
    let slots_bytes = shape.expert_bytes * slots.len() as u64;
    // The node's memory_bytes (or --memory-budget) bounds its resident experts, now and in
    // every later live load.
    let capacity = match &args.memory_budget {
        Some(b) => parse_size(b, slots_bytes)
            .context("--memory-budget")?
            .max(1),
        None => placement
            .nodes
            .iter()
            .find(|n| n.name == args.node)
            .map_or(0, |n| n.memory_bytes),
    };
    // `--cold-cache` as N% is of the experts the placement gives this node, as --memory-budget.
    // `auto` by default when resident experts are bounded (a budget, or the placement's
    // memory_bytes): the budget they leave is lent to the cache.
    let cold_arg = args
        .cold_cache
        .as_deref()
        .unwrap_or(if capacity > 0 { "auto" } else { "0" });
    let cold_size = parse_size_or_auto(cold_arg, slots_bytes).context("--cold-cache")?;
    nightshift_model::cold::check_io_depth(args.cold_io_depth).context("--cold-io-depth")?;
    let store = ExpertStore::new(gguf.clone(), args.mlock).with_capacity(capacity);
    let mut hot: Vec<(u32, u32)> = slots
        .iter()
        .filter(|s| s.resident)
        .map(|s| (s.layer as u32, s.expert as u32))
        .collect();
    let mut cold: Vec<(u32, u32)> = slots
        .iter()
        .filter(|s| !s.resident)
        .map(|s| (s.layer as u32, s.expert as u32))
        .collect();
    if args.memory_budget.is_some() {
        let fit = store.fitting(&hot, capacity)?;
        if fit < hot.len() {
            tracing::info!(
                resident = fit,
                mapped = hot.len() - fit,
                budget_mib = capacity >> 20,
                "the memory budget keeps only part of the placement's resident experts"
            );
            cold.extend(hot.drain(fit..));
        }
    }
    store.load(&hot, true, &pool)?;
    store.load(&cold, false, &pool)?;
    // Sized after the resident copies are made: `auto` is a share of what is left beyond the
    // capacity the resident set leaves, which the store lends the cache (`with_cold_cache`),
    // never more than the memory the process may still take.
    let resident_now = store.resident_bytes();
    let store = match nightshift_model::weights::mem_available() {
        Some(free) => {
            if capacity > resident_now.saturating_add(free) {
                tracing::warn!(
                    capacity_mib = capacity >> 20,
                    resident_mib = resident_now >> 20,
                    available_mib = free >> 20,
                    "the node's memory for experts is more than it has: the staging cache is lent only the memory available"
                );
            }
            store.with_loan_bound(resident_now.saturating_add(free))
        }
        None => store,
    };
    let lent = store.spare(resident_now);
    let cold_cache = ColdCache::start(gguf.clone(), cold_size, args.cold_io_depth, lent)
        .context("starting the cold cache's I/O threads")?
        .map(Arc::new);
    let store = Arc::new(match &cold_cache {
        Some(c) => store.with_cold_cache(c.clone()),
        None => store,
    });
    let inv = store.inventory();
    let resident: u64 = inv.iter().filter(|h| h.resident).map(|h| h.bytes).sum();
    let mapped: u64 = inv.iter().filter(|h| !h.resident).map(|h| h.bytes).sum();
    let n_embd = gguf
        .tensors()
        .find(|t| t.name.ends_with("ffn_gate_exps.weight"))
        .and_then(|t| t.dims.first().copied())
        .context("model has no ffn_gate_exps tensor")? as usize;

    let identity = NodeIdentity {
        name: args.node.clone(),
        numa_node: plan.numa_node.map(|n| n as u32),
        cores: plan.threads as u32,
        kernel_tier: format!("{:?}", nightshift_kernels::dispatch::active_tier()),
    };
    let mut service = NodeService::new(store.clone(), pool, identity, n_embd);
    if let (Some(node), Some(&cpu)) = (plan.numa_node, plan.worker_cpus.first()) {
        // A shared-memory link thread computes like worker 0: pin it where worker 0 runs.
        let topo = topo.clone();
        service = service.with_link_pin(Arc::new(move || {
            if let Err(e) = numa::bind_current_thread(&topo, cpu, node) {
                tracing::warn!("pinning a link thread failed, running unpinned: {e}");
            }
        }));
    }
    let tls_files = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.tls_client_ca.clone(),
        }),
        _ => None,
    };
    let link_addr =
        match args.link_listen.as_deref() {
            Some("off") => None,
            Some(a) => Some(a.parse::<SocketAddr>().with_context(|| {
                format!("--link-listen: expected host:port or off, found {a:?}")
            })?),
            None => Some(SocketAddr::new(args.listen.ip(), 0)),
        };
    if let Some(addr) = link_addr {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("binding the data link on {addr}"))?;
        let port = listener.local_addr()?.port();
        let link_tls = tls_files.as_ref().map(tls::link_config).transpose()?;
        service = service.with_link_port(port);
        service
            .link_server(token.clone(), link_tls)
            .spawn(listener)
            .context("starting the data link's thread")?;
        tracing::info!("data link on {}", SocketAddr::new(addr.ip(), port));
    }
    let stop = service.stop_flag();
    let server = tonic::service::interceptor::InterceptedService::new(
        ExpertServiceServer::new(service)
            .max_decoding_message_size(512 << 20)
            .max_encoding_message_size(512 << 20),
        auth::Interceptor::new(token),
    );

    let tls = tls_files.as_ref().map(tls::server_config).transpose()?;

    if let Some(c) = &cold_cache {
        spawn_cold_cache_log(c.clone(), store.clone())?;
    }
    let cold_at_exit = cold_cache.clone().map(|c| (c, store.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let served = rt.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down: draining in-flight work");
            stop.store(true, std::sync::atomic::Ordering::Release);
            let _ = stop_tx.send(());
        });
        let mut builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_stream_window_size(nightshift_proto::h2::STREAM_WINDOW)
            .initial_connection_window_size(nightshift_proto::h2::CONN_WINDOW)
            .max_frame_size(nightshift_proto::h2::MAX_FRAME);
        if let Some(cfg) = tls {
            builder = builder.tls_config(cfg).context("TLS configuration")?;
        }
        // Bound before "ready" is logged: a node that says it is ready accepts connections.
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(
            node = %args.node, experts = inv.len(), resident_mib = resident >> 20, mapped_mib = mapped >> 20,
            cold_cache_kib = cold_cache.as_ref().map_or(0, |c| c.capacity() >> 10),
            cold_cache_lent_kib = cold_cache.as_ref().map_or(0, |c| c.lent() >> 10),
            threads = plan.threads, numa = ?plan.numa_node, tls = args.tls_cert.is_some(), mtls = args.tls_client_ca.is_some(), tier = ?nightshift_kernels::dispatch::active_tier(),
            "expert node ready on {}", args.listen
        );
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let serve = builder
            .add_service(server)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_rx.await;
            });
        tokio::pin!(serve);
        // Long-lived compute streams keep the server open: bound the drain once shutdown starts.
        tokio::select! {
            r = &mut serve => r.context("grpc server")?,
            _ = async { shutdown_signal().await; tokio::time::sleep(Duration::from_secs(10)).await } => {
                tracing::warn!("drain timed out after 10 s");
            }
        }
        anyhow::Ok(())
    });
    if let Some((c, store)) = cold_at_exit {
        tracing::info!("{}", c.stats().summary());
        tracing::info!("{}", store.hint_stats().summary());
    }
    served
}

/// Logs the cold cache's counters (`ColdStats::summary`) and those of the coordinator's
/// prefetch hints (`HintStats::summary`) every minute in which they changed.
fn spawn_cold_cache_log(cache: Arc<ColdCache>, store: Arc<ExpertStore>) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("cold-cache-log".into())
        .spawn(move || {
            let mut last = (cache.stats(), store.hint_stats());
            loop {
                std::thread::sleep(Duration::from_secs(60));
                let now = (cache.stats(), store.hint_stats());
                if now != last {
                    tracing::info!(held_mib = cache.held_bytes() >> 20, "{}", now.0.summary());
                    tracing::info!("{}", now.1.summary());
                    last = now;
                }
            }
        })
        .context("starting the cold cache's log thread")?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
