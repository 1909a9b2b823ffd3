//! Where the experts run: in process (`LocalExperts`), on expert nodes this process spawns and
//! supervises (`--nodes N`: `launcher`), or on remote nodes named by a placement file
//! (`--placement`). Every command that runs the engine (`serve`, `generate`, `logits`) takes the
//! same `ClusterArgs` and calls `build`, so they all support the cluster the same way.

pub mod budget;
pub mod launcher;
pub mod netns;
pub mod rebalance;
pub mod remote;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::{LayerPlacement, ModelShape, NodeSpec, Placement};
use nightshift_model::cold::ColdCache;
use nightshift_model::prefetch::{NextLayer, Prefetcher};
use nightshift_model::resident::ExpertResidency;
use nightshift_model::{ExpertBackend, ExpertMemory, LoadOptions, LocalExperts, Model, ModelError};
use rayon::ThreadPool;

pub use launcher::{LaunchError, LaunchOptions, LocalCluster, NodeTls};
pub use remote::{CallLegs, LegsSummary, NodeStatus, RemoteExperts, RemoteOptions, RpcStats};
pub use tls::ClientTls;

/// Cluster flags shared by `serve`, `generate` and `logits`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// Spawn and supervise N local expert-node processes (0: experts run in process, unless
    /// --placement names remote nodes). Without --placement, nodes pinned one per NUMA domain
    /// split the experts round-robin (resident); unpinned nodes each serve every expert from the
    /// shared file mapping, and the coordinator splits each layer's experts evenly between them.
    #[arg(long, default_value_t = 0)]
    pub nodes: usize,
    /// Placement file (TOML): which node holds which expert. With --nodes > 0 its nodes are
    /// spawned locally; otherwise nodes are dialled at their `addr`.
    #[arg(long)]
    pub placement: Option<PathBuf>,
    /// Worker threads per spawned expert node (default: the cores of its NUMA domain when the
    /// nodes are pinned one per domain, otherwise this machine's cores split between the nodes).
    #[arg(long)]
    pub node_threads: Option<usize>,
    /// Shared token file presented to expert nodes (they must be started with the same file).
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// Deadline of one layer call on one node, in milliseconds; then the call is retried on
    /// another replica.
    #[arg(long, default_value_t = 10_000)]
    pub expert_deadline_ms: u64,
    /// A layer call unanswered for this long (or 50x its node's recent p99, if longer) fails as
    /// stalled when no other replica holds its experts (HTTP 503); with a replica it was hedged
    /// there long before (4x the node's recent p99, at least 20 ms).
    #[arg(long, default_value_t = 2_000)]
    pub expert_stall_ms: u64,
    /// Wait for each layer's routed experts before computing its shared expert, instead of
    /// computing it while they are out on nodes reached over the network.
    #[arg(long)]
    pub no_overlap: bool,
    /// Compute each layer's shared expert while its routed experts are out in every step. By
    /// default a step shape runs with and without the overlap first and keeps the faster (it
    /// loses when the nodes share the coordinator's cores).
    #[arg(long, conflicts_with = "no_overlap")]
    pub always_overlap: bool,
    /// Run every step as one batch instead of two micro-batches of sequences whose layer calls
    /// alternate (one half's attention while the other half's experts are out; with the overlap).
    #[arg(long)]
    pub no_micro_batches: bool,
    /// Dial expert nodes over TLS, trusting node certificates signed by this PEM CA bundle.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Name node certificates must carry (default: the host part of each node's address).
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
    /// PEM certificate the coordinator presents to nodes that require mutual TLS.
    #[arg(long, requires_all = ["tls_ca", "tls_client_key"])]
    pub tls_client_cert: Option<PathBuf>,
    /// PEM private key of --tls-client-cert.
    #[arg(long, requires = "tls_client_cert")]
    pub tls_client_key: Option<PathBuf>,
    /// With --nodes: the PEM certificate spawned nodes serve TLS with (needs --tls-ca; with
    /// --tls-client-cert the nodes also require a client certificate signed by --tls-ca).
    #[arg(long, requires_all = ["tls_ca", "node_tls_key"])]
    pub node_tls_cert: Option<PathBuf>,
    /// With --nodes: the PEM private key of --node-tls-cert.
    #[arg(long, requires = "node_tls_cert")]
    pub node_tls_key: Option<PathBuf>,
    /// Send every layer call over the nodes' gRPC streams, even to nodes on this machine
    /// (which otherwise take calls of up to 1024 pairs through shared memory).
    #[arg(long)]
    pub no_shm: bool,
    /// Send every layer call to nodes across the network over their gRPC streams, not over the
    /// framed data links they serve beside them (`nightshift_proto::link`: one blocking thread
    /// at each end, two wake-ups per call instead of six).
    #[arg(long)]
    pub no_data_link: bool,
    /// Split each layer call between nodes in advance (least estimated work per node) even
    /// when several nodes on this machine hold all its experts (which otherwise take its expert
    /// groups as they go, through a shared claim board).
    #[arg(long)]
    pub no_work_sharing: bool,
    /// Where experts computed in this process live: `resident` copies them to huge pages (and
    /// releases their file pages), `mapped` reads them from the file map, `auto` copies them
    /// when they take at most half of the available memory. Experts on nodes stay mapped here.
    #[arg(long, value_enum, default_value_t = ExpertMemoryArg::Auto)]
    pub expert_memory: ExpertMemoryArg,
    /// Keep at most this much of the routed experts resident in process (123, 10G, 10GiB, or
    /// N% of all routed experts); the others are read from the mapped file through the page
    /// cache. Dense weights stay resident on top. Expert nodes take their own
    /// (`nightshift-expert-node --memory-budget`).
    #[arg(long, conflicts_with_all = ["nodes", "placement", "expert_memory"])]
    pub memory_budget: Option<String>,
    /// With --memory-budget: the resident experts, from a placement file of one node
    /// (`nightshift-atlas plan --memory-budget`); default a seeded random set filling the budget.
    #[arg(long, requires = "memory_budget")]
    pub resident_set: Option<PathBuf>,
    /// Do not predict the next MoE layer's experts: with --memory-budget, read no cold experts
    /// ahead; with expert nodes, send them no prefetch hints (sent only to nodes with a staging
    /// cache, `nightshift-expert-node --cold-cache`). Outputs are the same either way.
    #[arg(long)]
    pub no_prefetch: bool,
    /// With --memory-budget: memory for experts outside the resident set, read whole from the
    /// file into a least-recently-used staging cache (`auto`: half of the memory this
    /// process may still take, cgroup limits included, at least two MoE layers' experts of a
    /// decode step; a size as for --memory-budget; `0`: read them through the page cache
    /// instead). Taken on top of the budget.
    #[arg(long, requires = "memory_budget", default_value = "auto")]
    pub cold_cache: String,
    /// With --memory-budget: cold experts the staging cache reads at once (its I/O threads, 1
    /// to 64; 1 reads one at a time). Predictions take all but one, so a layer waiting for an
    /// expert never waits behind them.
    #[arg(long, requires = "memory_budget", default_value_t = nightshift_model::cold::DEFAULT_IO_DEPTH)]
    pub cold_io_depth: usize,
}

/// `--expert-memory`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertMemoryArg {
    #[default]
    Auto,
    Resident,
    Mapped,
}

impl ClusterArgs {
    /// Whether these flags send the experts to nodes (spawned or remote).
    pub fn experts_elsewhere(&self) -> bool {
        self.nodes > 0 || self.placement.is_some()
    }
}

/// Loads `path` for the flags: routed experts computed here go where `--expert-memory` says,
/// experts served by nodes stay mapped (the coordinator's memory does not grow with them).
pub fn load_model(path: &Path, args: &ClusterArgs) -> Result<Arc<Model>, ModelError> {
    let experts = if args.experts_elsewhere() || args.memory_budget.is_some() {
        ExpertMemory::Mapped
    } else {
        match args.expert_memory {
            ExpertMemoryArg::Auto => ExpertMemory::Auto,
            ExpertMemoryArg::Resident => ExpertMemory::Resident,
            ExpertMemoryArg::Mapped => ExpertMemory::Mapped,
        }
    };
    Model::load_with(
        path,
        LoadOptions {
            experts,
            ..LoadOptions::default()
        },
    )
}

/// Errors of setting up where experts run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("the model has no routed experts, so it cannot be served by expert nodes")]
    NotMoe,
    #[error("placement: {0}")]
    Placement(#[from] nightshift_atlas_core::placement::PlacementError),
    #[error("{0}")]
    Launch(#[from] LaunchError),
    #[error("{0}")]
    Remote(#[from] remote::RemoteError),
    #[error("{0}")]
    Tls(#[from] nightshift_proto::tls::TlsError),
    #[error("--tls-ca is set but the spawned nodes have no certificate: add --node-tls-cert and --node-tls-key")]
    NodeTlsMissing,
    #[error("cannot read the auth token file {path}: {reason}")]
    Token { path: String, reason: String },
    #[error("expert nodes not reachable after {secs} s: {detail}")]
    NotReady { secs: u64, detail: String },
    #[error("expert nodes refused this coordinator: {detail}")]
    Refused { detail: String },
    #[error("{0}")]
    Budget(#[from] budget::BudgetError),
}

/// The experts of a running engine, and what keeps them alive.
pub struct Experts {
    backend: Arc<dyn ExpertBackend>,
    remote: Option<Arc<RemoteExperts>>,
    cluster: Option<LocalCluster>,
    /// In-process resident set under `--memory-budget`.
    residency: Option<Arc<ExpertResidency>>,
    /// Its one-layer-ahead prefetch of cold experts.
    prefetch: Option<Arc<Prefetcher>>,
    /// Its staging cache of cold experts (`--cold-cache`).
    cold: Option<Arc<ColdCache>>,
}

impl Drop for Experts {
    fn drop(&mut self) {
        // Clones of the backend may live on in runtime tasks until the process exits.
        if let Some(r) = &self.remote {
            r.remove_files();
        }
    }
}

impl Experts {
    /// The backend to hand to `Engine::new`.
    pub fn backend(&self) -> Arc<dyn ExpertBackend> {
        self.backend.clone()
    }

    /// The remote backend, when experts run on nodes.
    pub fn remote(&self) -> Option<&Arc<RemoteExperts>> {
        self.remote.as_ref()
    }

    /// The resident set of in-process experts under `--memory-budget`.
    pub fn residency(&self) -> Option<&Arc<ExpertResidency>> {
        self.residency.as_ref()
    }

    /// The cold-expert prefetch of in-process experts under `--memory-budget`.
    pub fn prefetch(&self) -> Option<&Arc<Prefetcher>> {
        self.prefetch.as_ref()
    }

    /// The staging cache of cold in-process experts under `--memory-budget`.
    pub fn cold_cache(&self) -> Option<&Arc<ColdCache>> {
        self.cold.as_ref()
    }

    /// The local cluster, when this process spawned the nodes.
    pub fn local_cluster(&self) -> Option<&LocalCluster> {
        self.cluster.as_ref()
    }

    /// Health of every node (empty when experts run in process).
    pub fn node_status(&self) -> Vec<NodeStatus> {
        self.remote.as_ref().map(|r| r.status()).unwrap_or_default()
    }

    /// One line per node for the startup banner.
    pub fn describe(&self) -> String {
        match &self.remote {
            None => "experts in process".to_string(),
            Some(r) => r
                .status()
                .iter()
                .map(|s| {
                    format!(
                        "{} {} ({})",
                        s.name,
                        s.addr,
                        if s.up { "up" } else { "down" }
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// The placement-validation shape of a model.
pub fn model_shape(model: &Model) -> Result<ModelShape, ClusterError> {
    let s = nightshift_model::shape::moe_shape(model.gguf()).ok_or(ClusterError::NotMoe)?;
    Ok(ModelShape {
        moe_layers: s.moe_layers,
        n_experts: s.n_experts,
        expert_bytes: s.expert_bytes,
    })
}

/// NUMA node per local expert node: node i on NUMA domain i when the machine has at least
/// `n` domains, otherwise unpinned.
fn numa_layout(n: usize) -> Vec<usize> {
    let domains = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with("node") && name[4..].parse::<usize>().is_ok()
                })
                .count()
        })
        .unwrap_or(1);
    if domains >= n && domains > 1 {
        (0..n).collect()
    } else {
        Vec::new()
    }
}

/// Worker threads of each of `n` local nodes: pinned nodes (`numa` not empty) take their
/// domain's cores (the node decides); unpinned ones split this machine's cores, since they share
/// them (a node per core on a small VM computes on its link thread, without waking a worker).
fn local_node_threads(n: usize, numa: &[usize]) -> Option<usize> {
    if !numa.is_empty() || n == 0 {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    Some((cores / n).max(1))
}

/// The placement of `serve --nodes N` without a placement file.
///
/// Nodes pinned to their own NUMA domains get expert `e` on node `e % N`, resident: each domain
/// reads its experts from its own memory. Unpinned nodes share one memory, so every node holds
/// every expert: every layer call is split evenly by the coordinator (a round-robin split of 8
/// routed experts is often 5/3, and the call waits for the node with 5), and any node can die
/// without failing a request. Their copies are resident (huge pages, as an in-process run keeps
/// them) when `copies_fit` (all N copies take at most half of the available memory), otherwise
/// served from the shared file mapping, which costs no memory per copy (one page cache).
pub fn default_placement(
    n: usize,
    shape: &ModelShape,
    pinned: bool,
    copies_fit: bool,
) -> Result<Placement, ClusterError> {
    let nodes: Vec<NodeSpec> = (0..n)
        .map(|i| NodeSpec::named(format!("node{i}")))
        .collect();
    if pinned {
        return Ok(Placement::round_robin(
            nodes,
            &shape.moe_layers,
            shape.n_experts,
        ));
    }
    let layers = shape
        .moe_layers
        .iter()
        .map(|&index| LayerPlacement {
            index,
            replicas: vec![(0..n).collect(); shape.n_experts],
            resident: vec![
                if copies_fit {
                    (0..n).collect()
                } else {
                    Vec::new()
                };
                shape.n_experts
            ],
        })
        .collect();
    Ok(Placement::from_layers(nodes, layers)?)
}

/// Sets up the experts for `model` as the flags say.
pub fn build(
    args: &ClusterArgs,
    model: &Arc<Model>,
    model_path: &Path,
    pool: Option<Arc<ThreadPool>>,
) -> Result<Experts, ClusterError> {
    if args.nodes == 0 && args.placement.is_none() {
        let residency = match &args.memory_budget {
            Some(b) => Some(budget::build_residency(
                model,
                b,
                args.resident_set.as_deref(),
                pool.as_deref(),
            )?),
            None => None,
        };
        let cold = match &residency {
            Some(r) => budget::build_cold_cache(model, &args.cold_cache, args.cold_io_depth, r)?,
            None => None,
        };
        let prefetch = match residency.is_some() && !args.no_prefetch {
            true => {
                let mut p = Prefetcher::new(model.clone()).map_err(budget::BudgetError::Thread)?;
                if let Some(c) = &cold {
                    p = p.with_cold_cache(c.clone());
                }
                Some(Arc::new(p))
            }
            false => None,
        };
        let mut local = LocalExperts::new(model.clone(), pool);
        if let Some(r) = &residency {
            local = local.with_residency(r.clone());
        }
        if let Some(c) = &cold {
            local = local.with_cold_cache(c.clone());
        }
        if let Some(p) = &prefetch {
            local = local.with_prefetch(p.clone());
        }
        return Ok(Experts {
            backend: Arc::new(local),
            remote: None,
            cluster: None,
            residency,
            prefetch,
            cold,
        });
    }
    let shape = model_shape(model)?;
    let file_placement = match &args.placement {
        Some(p) => Some(Placement::load(p)?.resolve(&shape)?),
        None => None,
    };
    let mut token = match &args.auth_token_file {
        None => None,
        Some(p) => {
            let err = |reason: String| ClusterError::Token {
                path: p.display().to_string(),
                reason,
            };
            let t = std::fs::read_to_string(p).map_err(|e| err(e.to_string()))?;
            let t = t.trim();
            if t.is_empty() {
                return Err(err("the file is empty".into()));
            }
            Some(t.to_string())
        }
    };
    let tls = match &args.tls_ca {
        None => None,
        Some(ca) => Some(tls::ClientTls::from_files(
            ca,
            args.tls_domain.clone(),
            args.tls_client_cert
                .as_deref()
                .zip(args.tls_client_key.as_deref()),
        )?),
    };
    let (placement, cluster) = if args.nodes > 0 {
        let node_tls = match (&args.node_tls_cert, &args.node_tls_key, &args.tls_ca) {
            (Some(cert), Some(key), ca) => Some(NodeTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_cert.as_ref().and(ca.clone()),
            }),
            (_, _, Some(_)) => return Err(ClusterError::NodeTlsMissing),
            _ => None,
        };
        let placement = match file_placement {
            Some(p) => p,
            None => {
                let all = (shape.moe_layers.len() * shape.n_experts) as u64 * shape.expert_bytes;
                default_placement(
                    args.nodes,
                    &shape,
                    !numa_layout(args.nodes).is_empty(),
                    nightshift_model::weights::fits_in_memory(
                        all.saturating_mul(args.nodes as u64),
                    ),
                )?
            }
        };
        let n = placement.nodes.len();
        let numa = numa_layout(n);
        let cluster = LocalCluster::start(LaunchOptions {
            model: model_path.to_path_buf(),
            placement,
            threads_per_node: args.node_threads.or(local_node_threads(n, &numa)),
            numa,
            auth_token_file: args.auth_token_file.clone(),
            tls: node_tls,
            exe: None,
            work_dir: std::env::temp_dir().join("nightshift"),
            start_timeout: Duration::from_secs(300),
            node_log: std::env::var("NIGHTSHIFT_NODE_LOG").unwrap_or_else(|_| "warn".into()),
        })?;
        // Without --auth-token-file the cluster made a fresh token for its nodes.
        token = Some(cluster.auth_token().to_string());
        (cluster.placement().clone(), Some(cluster))
    } else {
        let p = file_placement.ok_or(ClusterError::NotMoe)?;
        (p, None)
    };
    let opts = RemoteOptions {
        deadline: Duration::from_millis(args.expert_deadline_ms),
        auth_token: token,
        tls,
        shm_pairs: if args.no_shm {
            0
        } else {
            RemoteOptions::default().shm_pairs
        },
        share_work: !args.no_work_sharing,
        // 0 (a `ClusterArgs::default()`): the backend's default
        stall_min: match args.expert_stall_ms {
            0 => RemoteOptions::default().stall_min,
            ms => Duration::from_millis(ms),
        },
        overlap: !args.no_overlap,
        micro_batches: !args.no_micro_batches,
        overlap_always: args.always_overlap,
        net_links: if args.no_data_link {
            0
        } else {
            RemoteOptions::default().net_links
        },
        ..Default::default()
    };
    let remote = Arc::new(RemoteExperts::connect(
        placement,
        model.gguf().fingerprint(),
        model.config().n_embd,
        opts,
    )?);
    if !remote.wait_all_up(Duration::from_secs(30)) {
        let status = remote.status();
        let refused = status.iter().any(|s| s.refused);
        let detail: Vec<String> = status
            .iter()
            .filter(|s| !s.up && (s.refused || !refused))
            .map(|s| format!("{} {}: {}", s.name, s.addr, s.detail))
            .collect();
        let detail = detail.join("; ");
        return Err(if refused {
            ClusterError::Refused { detail }
        } else {
            ClusterError::NotReady { secs: 30, detail }
        });
    }
    if !args.no_prefetch {
        // used only while some node reports a staging cache (`remote::hints`)
        remote.send_hints(Arc::new(NextLayer::new(model.clone())));
    }
    let backend: Arc<dyn ExpertBackend> = remote.clone();
    Ok(Experts {
        backend,
        remote: Some(remote),
        cluster,
        residency: None,
        prefetch: None,
        cold: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_placement_replicates_unpinned_nodes_and_splits_pinned_ones() {
        let shape = ModelShape {
            moe_layers: vec![1, 2, 3],
            n_experts: 8,
            expert_bytes: 1000,
        };
        let shared = default_placement(3, &shape, false, false).expect("unpinned");
        let split = default_placement(3, &shape, true, false).expect("pinned");
        let resident = default_placement(3, &shape, false, true).expect("unpinned, fits");
        for &l in &shape.moe_layers {
            for e in 0..shape.n_experts {
                assert_eq!(shared.replicas(l, e), &[0, 1, 2], "layer {l} expert {e}");
                assert_eq!(resident.replicas(l, e), &[0, 1, 2], "layer {l} expert {e}");
                assert_eq!(split.replicas(l, e), &[e % 3], "layer {l} expert {e}");
                for n in 0..3 {
                    assert!(!shared.is_resident(l, e, n), "shared copies stay mapped");
                    assert_eq!(split.is_resident(l, e, n), n == e % 3);
                }
            }
        }
        // Mapped copies take none of the nodes' memory budgets; resident ones split the experts.
        assert_eq!(shared.resident_bytes(1000), vec![0, 0, 0]);
        assert_eq!(resident.resident_bytes(1000), vec![24000, 24000, 24000]);
        assert_eq!(split.resident_bytes(1000), vec![9000, 9000, 6000]);
        assert_eq!(
            shared
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>(),
            ["node0", "node1", "node2"]
        );
    }

    #[test]
    fn unpinned_local_nodes_split_the_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        assert_eq!(
            local_node_threads(2, &[0, 1]),
            None,
            "pinned: the node decides"
        );
        assert_eq!(local_node_threads(1, &[]), Some(cores));
        assert_eq!(local_node_threads(2, &[]), Some((cores / 2).max(1)));
        assert_eq!(local_node_threads(cores + 5, &[]), Some(1), "never zero");
    }
}
