//! `RemoteExperts`: the `ExpertBackend` that sends each MoE layer's work to expert nodes over one
//! long-lived gRPC `Compute` stream per node. Per layer call (`layer_call`) it picks, for every
//! routed expert, the live replica with the least estimated work (rows; longest expert first,
//! see `balance`), sends each node ONE message holding only the activation rows it needs, waits
//! for all nodes concurrently, hedges a call on another replica when its node is much slower than
//! its recent p99 (`hedge`), and on a node error or stall retries that node's experts on another
//! replica. This file holds the links: connecting, the stream reader, marking nodes down and
//! reconnecting them. With a predictor (`send_hints`) a decode step's call also tells nodes
//! with a staging cache which experts the next MoE layer will probably ask for (`hints`).
//! Outputs come back unweighted
//! and in pair order, so the engine sums them in top-k order exactly as in process: results are
//! bit-identical whatever the placement. Dead nodes are reconnected in the background with
//! exponential backoff; a restarted node rejoins without restarting the coordinator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nightshift_atlas_core::placement::{NodeId, Placement};
use nightshift_model::prefetch::NextLayer;
use nightshift_proto::v1::expert_service_client::ExpertServiceClient;
use nightshift_proto::v1::{compute_response, ComputeRequest, InfoRequest};
use nightshift_proto::{AUTH_HEADER, FINGERPRINT_HEADER, PROTOCOL_HEADER, PROTOCOL_VERSION};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

pub mod balance;
mod call;
mod errors;
mod hedge;
mod held;
mod hints;
mod layer_call;
mod net_link;
mod shared_call;
mod shm_link;
mod stats;

pub use stats::{CallLegs, LegsSummary, RpcStats};

use errors::{error_chain, link_hint, status_chain};

/// Settings of the remote backend.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// Deadline of one layer call on one node.
    pub deadline: Duration,
    /// Connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Longest wait between reconnect attempts to a dead node.
    pub max_backoff: Duration,
    /// Shared auth token presented to nodes.
    pub auth_token: Option<String>,
    /// TLS to nodes (`None`: plaintext h2c).
    pub tls: Option<super::tls::ClientTls>,
    /// Most (expert, row) pairs per layer call that a node on this machine takes through
    /// shared memory (`shm_link`); larger calls, and nodes elsewhere, use the stream. 0: never.
    pub shm_pairs: usize,
    /// Nodes on this machine that all hold a call's experts split it as they go, through a
    /// claim board (`shared_call`), rather than by shares fixed in advance.
    pub share_work: bool,
    /// A stream call unanswered after this many times its node's recent p99 (for its size) is
    /// sent again to another replica, and the node is suspect until it answers (`hedge`).
    pub hedge_factor: f64,
    /// No call is hedged sooner than this.
    pub hedge_min: Duration,
    /// A call unanswered after this many times its node's recent p99 fails (without a replica:
    /// the requests get HTTP 503) and the node is marked down until it answers again.
    pub stall_factor: f64,
    /// No call fails as stalled sooner than this (nor later than `deadline`).
    pub stall_min: Duration,
    /// Let the engine compute a layer's shared expert while its routed experts are out on
    /// nodes reached over streams (`ExpertBackend::overlaps`).
    pub overlap: bool,
    /// With `overlap`: run a step of several sequences as two micro-batches whose layer calls
    /// alternate (`ExpertBackend::micro_batches`).
    pub micro_batches: bool,
    /// With `overlap`: use it in every step, instead of only in the step shapes where measured
    /// steps say it pays (`ExpertBackend::overlap_always`).
    pub overlap_always: bool,
    /// Framed data links (`net_link`) opened to each node that reports one and is not reached
    /// through shared memory: layer calls go over them on the caller's thread, the stream
    /// taking a call only when every link is busy. 0: calls go over the stream.
    pub net_links: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            deadline: Duration::from_secs(10),
            connect_timeout: Duration::from_millis(1500),
            max_backoff: Duration::from_secs(5),
            auth_token: None,
            tls: None,
            shm_pairs: 1024,
            share_work: true,
            hedge_factor: 4.0,
            hedge_min: Duration::from_millis(20),
            stall_factor: 50.0,
            stall_min: Duration::from_secs(2),
            overlap: true,
            micro_batches: true,
            overlap_always: false,
            net_links: 2,
        }
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<call::Answer, String>>>>>;

/// A live compute stream to a node.
pub(super) struct Conn {
    /// Unary calls (inventory, load/drop experts) share the stream's connection.
    pub(super) client: ExpertServiceClient<Channel>,
    tx: mpsc::Sender<ComputeRequest>,
    pending: Pending,
    /// Bumped when the stream dies, so a late failure does not kill a newer stream.
    generation: u64,
    /// The shared-memory link beside the stream, when the node runs on this machine.
    shm: Option<Arc<shm_link::ShmLink>>,
    /// The framed data links beside the stream (`net_link`), when the node serves them and
    /// there is no shared-memory link.
    net: Vec<Arc<net_link::NetLink>>,
}

pub(super) enum LinkState {
    Up(Conn),
    Down {
        since: Instant,
        retry_at: Instant,
        backoff: Duration,
        reason: String,
        /// The node answered and refused this coordinator (wrong token, another model): retrying
        /// cannot help until someone changes a configuration, so startup fails at once.
        refused: bool,
    },
}

/// One expert node as the coordinator sees it.
pub(super) struct NodeLink {
    pub(super) name: String,
    addr: String,
    pub(super) state: Mutex<LinkState>,
    /// Estimated work of the calls in flight on this node (`balance::expert_cost` units).
    outstanding: AtomicUsize,
    generation: AtomicU64,
    /// Much slower than its recent p99 lately: new work goes to other replicas (`hedge`).
    suspect: std::sync::atomic::AtomicBool,
    /// Its recently answered calls (`hedge`).
    window: Mutex<hedge::LatencyWindow>,
    /// It reported a staging cache of cold experts: it takes prefetch hints (`hints`).
    takes_hints: std::sync::atomic::AtomicBool,
}

/// Health of one node, for `/ready`, metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub name: String,
    pub addr: String,
    pub up: bool,
    pub detail: String,
    /// The node refused this coordinator (auth token, model or protocol), not just unreachable.
    pub refused: bool,
    /// Up but much slower than its recent p99 lately: given no new work while a replica exists.
    pub suspect: bool,
}

pub(super) struct Shared {
    stats: Mutex<RpcStats>,
    pub(super) nodes: Vec<NodeLink>,
    placement: RwLock<Arc<Placement>>,
    fingerprint: u64,
    n_embd: usize,
    pub(super) opts: RemoteOptions,
    next_id: AtomicU64,
    /// The claim board of shared calls (nodes on this machine, `share_work`).
    board: Option<nightshift_proto::shm::board::ClaimBoard>,
    /// Held by the shared call using the board.
    board_busy: std::sync::atomic::AtomicBool,
    next_tag: std::sync::atomic::AtomicU32,
    /// The next MoE layer's router, for prefetch hints to nodes (`hints`); unset: no hints.
    predictor: std::sync::OnceLock<Arc<NextLayer>>,
    /// Per MoE layer, the node each expert the last hints for it named was hinted to: a shared
    /// call of that layer leaves those experts' groups to those nodes (`hints`).
    hinted: Mutex<HashMap<u32, HashMap<u32, NodeId>>>,
}

/// The remote expert backend.
pub struct RemoteExperts {
    pub(super) shared: Arc<Shared>,
    /// Always Some until drop (taken there to shut it down without blocking).
    rt: Option<tokio::runtime::Runtime>,
}

/// Errors of setting the backend up.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("node {node} has no address in the placement")]
    NoAddress { node: String },
    #[error("cannot start the client runtime: {0}")]
    Runtime(String),
}

impl Drop for RemoteExperts {
    fn drop(&mut self) {
        // Dropping a runtime blocks; the owner may be inside another runtime (serve's shutdown).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl RemoteExperts {
    pub(super) fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime lives until drop")
    }

    /// Runs `fut` on the client runtime and waits for it from any thread, async context or not
    /// (`Runtime::block_on` would panic inside another runtime, e.g. in an HTTP handler).
    pub(super) fn block<F>(&self, fut: F) -> Option<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        self.rt().spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
    }

    /// Connects to every node of a resolved placement (nodes that are down are retried in the
    /// background; they do not fail construction).
    pub fn connect(
        placement: Placement,
        fingerprint: u64,
        n_embd: usize,
        opts: RemoteOptions,
    ) -> Result<RemoteExperts, RemoteError> {
        let mut nodes = Vec::new();
        for n in &placement.nodes {
            let addr = n.addr.clone().ok_or_else(|| RemoteError::NoAddress {
                node: n.name.clone(),
            })?;
            let now = Instant::now();
            nodes.push(NodeLink {
                name: n.name.clone(),
                addr,
                state: Mutex::new(LinkState::Down {
                    since: now,
                    retry_at: now,
                    backoff: Duration::from_millis(100),
                    reason: "not connected yet".into(),
                    refused: false,
                }),
                outstanding: AtomicUsize::new(0),
                generation: AtomicU64::new(0),
                suspect: Default::default(),
                window: Default::default(),
                takes_hints: Default::default(),
            });
        }
        if opts.shm_pairs > 0 {
            let dir = std::path::Path::new(nightshift_proto::shm::SHM_DIR);
            let n = nightshift_proto::shm::sweep_stale(dir);
            if n > 0 {
                tracing::info!("removed {n} shared-memory files left by coordinators that died");
            }
        }
        let board = if opts.shm_pairs > 0 && opts.share_work {
            nightshift_proto::shm::board::ClaimBoard::create()
                .map_err(|e| tracing::debug!("no claim board, calls are split in advance: {e}"))
                .ok()
        } else {
            None
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("expert-client")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Runtime(e.to_string()))?;
        let shared = Arc::new(Shared {
            nodes,
            placement: RwLock::new(Arc::new(placement)),
            fingerprint,
            n_embd,
            opts,
            next_id: AtomicU64::new(1),
            stats: Mutex::new(RpcStats::default()),
            board,
            board_busy: std::sync::atomic::AtomicBool::new(false),
            next_tag: std::sync::atomic::AtomicU32::new(1),
            predictor: std::sync::OnceLock::new(),
            hinted: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        // First connection attempts, waited for without `block_on` (callers may be async).
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let tasks: Vec<_> = (0..s.nodes.len())
                .map(|i| reconnect(s.clone(), i))
                .collect();
            futures::future::join_all(tasks).await;
            let _ = done_tx.send(());
        });
        let _ = done_rx.recv();
        let s = shared.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                for i in 0..s.nodes.len() {
                    let due = matches!(&*lock(&s.nodes[i].state), LinkState::Down { retry_at, .. } if *retry_at <= Instant::now());
                    if due {
                        reconnect(s.clone(), i).await;
                    }
                }
            }
        });
        Ok(RemoteExperts {
            shared,
            rt: Some(rt),
        })
    }

    /// Sends the nodes that report a staging cache prefetch hints from `predictor` (the next
    /// MoE layer's router on each decode call's rows, `hints`). Set once; later calls are
    /// ignored. Outputs are the same with and without.
    pub fn send_hints(&self, predictor: Arc<NextLayer>) {
        let _ = self.shared.predictor.set(predictor);
    }

    /// Removes the files this backend keeps in `/dev/shm` for nodes still to attach (the claim
    /// board): when the command using it ends, since tasks of its runtime may outlive it.
    pub fn remove_files(&self) {
        if let Some(b) = &self.shared.board {
            b.unlink();
        }
    }

    /// Health of every node.
    pub fn status(&self) -> Vec<NodeStatus> {
        self.shared
            .nodes
            .iter()
            .map(|n| {
                let suspect = n.suspect.load(Ordering::Acquire);
                let (up, detail, refused) = match &*lock(&n.state) {
                    LinkState::Up(_) if suspect => (
                        true,
                        "suspect: much slower than its recent p99".to_string(),
                        false,
                    ),
                    LinkState::Up(_) => (true, "serving".to_string(), false),
                    LinkState::Down {
                        since,
                        reason,
                        refused,
                        ..
                    } => (
                        false,
                        format!("down for {:.1} s: {reason}", since.elapsed().as_secs_f32()),
                        *refused,
                    ),
                };
                NodeStatus {
                    name: n.name.clone(),
                    addr: n.addr.clone(),
                    up,
                    detail,
                    refused,
                    suspect,
                }
            })
            .collect()
    }

    /// Waits until every node is connected or `timeout` passes; returns whether all are up.
    /// Returns false at once when a node refused this coordinator (`NodeStatus::refused`).
    pub fn wait_all_up(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            let st = self.status();
            if st.iter().all(|s| s.up) {
                return true;
            }
            if st.iter().any(|s| s.refused) || start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Returns the call statistics gathered since the last call, and resets them.
    pub fn take_stats(&self) -> RpcStats {
        std::mem::take(&mut *lock(&self.shared.stats))
    }

    /// Replaces the routing placement (same nodes, already validated).
    pub(super) fn swap_placement(&self, placement: Placement) {
        *self
            .shared
            .placement
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(placement);
    }

    /// The placement routing currently follows.
    pub fn placement(&self) -> Arc<Placement> {
        self.shared
            .placement
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Opens a compute stream to node `i`; on failure schedules the next attempt with backoff.
async fn reconnect(s: Arc<Shared>, i: usize) {
    let node = &s.nodes[i];
    match open_stream(&s, i).await {
        Ok(conn) => {
            let was_down = matches!(&*lock(&node.state), LinkState::Down { .. });
            *lock(&node.state) = LinkState::Up(conn);
            hedge::set_suspect(&s, i, false, "reconnected");
            if was_down {
                tracing::info!(node = %node.name, addr = %node.addr, "expert node connected");
            }
        }
        Err(LinkFailure { reason, refused }) => {
            let mut st = lock(&node.state);
            if let LinkState::Down {
                retry_at,
                backoff,
                reason: r,
                refused: was_refused,
                ..
            } = &mut *st
            {
                *backoff = (*backoff * 2).min(s.opts.max_backoff);
                *retry_at = Instant::now() + *backoff;
                *was_refused = refused;
                if *r != reason {
                    tracing::warn!(node = %node.name, addr = %node.addr, "expert node unreachable: {reason}");
                    *r = reason;
                }
            }
        }
    }
}

/// Marks node `i` down (if `generation` is still its current stream) and fails its pending work.
fn mark_down(s: &Shared, i: usize, generation: u64, reason: String) {
    let node = &s.nodes[i];
    let mut st = lock(&node.state);
    if let LinkState::Up(conn) = &*st {
        if conn.generation != generation {
            return;
        }
        let pending: Vec<_> = lock(&conn.pending).drain().collect();
        for (_, tx) in pending {
            let _ = tx.send(Err(reason.clone()));
        }
        tracing::warn!(node = %node.name, "expert node lost: {reason}");
        let now = Instant::now();
        *st = LinkState::Down {
            since: now,
            retry_at: now + Duration::from_millis(100),
            backoff: Duration::from_millis(100),
            reason,
            refused: false,
        };
    }
}

/// Why opening a link failed, and whether the node refused this coordinator outright.
struct LinkFailure {
    reason: String,
    refused: bool,
}

impl From<String> for LinkFailure {
    fn from(reason: String) -> LinkFailure {
        LinkFailure {
            reason,
            refused: false,
        }
    }
}

async fn open_stream(s: &Arc<Shared>, i: usize) -> Result<Conn, LinkFailure> {
    let node = &s.nodes[i];
    let scheme = if s.opts.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", node.addr))
        .map_err(|e| format!("bad address {}: {e}", node.addr))?;
    if let Some(tls) = &s.opts.tls {
        endpoint = endpoint
            .tls_config(tls.config())
            .map_err(|e| format!("TLS configuration: {}", error_chain(&e)))?;
    }
    let endpoint = endpoint
        .connect_timeout(s.opts.connect_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(nightshift_proto::h2::STREAM_WINDOW)
        .initial_connection_window_size(nightshift_proto::h2::CONN_WINDOW)
        .max_frame_size(nightshift_proto::h2::MAX_FRAME)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5));
    let channel: Channel = tokio::time::timeout(s.opts.connect_timeout, endpoint.connect())
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {}", error_chain(&e)))?;
    let mut client = ExpertServiceClient::new(channel)
        .max_decoding_message_size(512 << 20)
        .max_encoding_message_size(512 << 20);
    let mut info_req = tonic::Request::new(InfoRequest {});
    add_auth(&mut info_req, &s.opts.auth_token)?;
    // Every step of opening a link is bounded: a node that accepts the connection but never
    // answers (stopped, wedged, not a node) must fail the attempt, not hang it.
    let info = answered(s, "info", client.info(info_req))
        .await?
        .map_err(|e| LinkFailure {
            reason: format!("info: {}{}", status_chain(&e), link_hint(&s.opts, &e)),
            refused: matches!(
                e.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
        })?
        .into_inner();
    if info.model_fingerprint != s.fingerprint || info.protocol_version != PROTOCOL_VERSION {
        return Err(LinkFailure {
            reason: format!(
                "refused: node serves model {:016x} (protocol {}), coordinator runs {:016x} (protocol {PROTOCOL_VERSION})",
                info.model_fingerprint, info.protocol_version, s.fingerprint
            ),
            refused: true,
        });
    }
    node.takes_hints
        .store(info.cold_cache_bytes > 0, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel::<ComputeRequest>(64);
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    handshake(&mut req, s)?;
    let unary = client.clone();
    let mut inbound = answered(s, "compute stream", client.compute(req))
        .await?
        .map_err(|e| LinkFailure {
            reason: format!("compute stream: {}", e.message()),
            refused: matches!(
                e.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
        })?
        .into_inner();
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let generation = node.generation.fetch_add(1, Ordering::Relaxed) + 1;
    let (p, shared) = (pending.clone(), s.clone());
    tokio::spawn(async move {
        let reason = loop {
            match inbound.next().await {
                Some(Ok(resp)) => {
                    let arrived_ns = nightshift_proto::monotonic_ns();
                    let waiter = lock(&p).remove(&resp.request_id);
                    if let Some(w) = waiter {
                        let stamps = call::NodeStamps::of(&resp);
                        let r = match resp.result {
                            Some(compute_response::Result::Outputs(outputs)) => Ok(call::Answer {
                                outputs,
                                stamps,
                                arrived_ns,
                            }),
                            Some(compute_response::Result::Error(e)) => {
                                Err(format!("node error: {}", e.message))
                            }
                            None => Err("node sent an empty response".into()),
                        };
                        let _ = w.send(r);
                    }
                }
                Some(Err(status)) => break format!("stream error: {}", status.message()),
                None => break "stream closed by the node".to_string(),
            }
        };
        mark_down(&shared, i, generation, reason);
    });
    let shm = if s.opts.shm_pairs > 0 {
        match shm_link::attach(s, &mut unary.clone()).await {
            Ok(link) => {
                tracing::info!(node = %node.name, "expert node reached through shared memory");
                Some(Arc::new(link))
            }
            Err(why) => {
                tracing::debug!(node = %node.name, "no shared-memory link: {why}");
                None
            }
        }
    } else {
        None
    };
    let mut net = Vec::new();
    if shm.is_none() && s.opts.net_links > 0 && info.link_port > 0 {
        let port = u16::try_from(info.link_port).unwrap_or(0);
        for _ in 0..s.opts.net_links * usize::from(port > 0) {
            let (sh, addr) = (s.clone(), node.addr.clone());
            let opened = tokio::task::spawn_blocking(move || net_link::open(&sh, &addr, port))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            match opened {
                Ok(l) => net.push(Arc::new(l)),
                Err(why) => {
                    tracing::warn!(node = %node.name, "no data link, layer calls go over the stream: {why}");
                    break;
                }
            }
        }
        if !net.is_empty() {
            tracing::info!(node = %node.name, links = net.len(), "expert node reached through data links");
        }
    }
    Ok(Conn {
        client: unary,
        tx,
        pending,
        generation,
        shm,
        net,
    })
}

/// `call`, or an error naming `what` when the node has not answered within the connect timeout.
pub(super) async fn answered<F: std::future::Future>(
    s: &Shared,
    what: &str,
    call: F,
) -> Result<F::Output, String> {
    tokio::time::timeout(s.opts.connect_timeout, call)
        .await
        .map_err(|_| {
            format!(
                "{what}: no answer within {} ms",
                s.opts.connect_timeout.as_millis()
            )
        })
}

/// The metadata a node checks on `Compute` and `AttachShm`: protocol, fingerprint, auth.
pub(super) fn handshake<T>(req: &mut tonic::Request<T>, s: &Shared) -> Result<(), String> {
    let md = req.metadata_mut();
    md.insert(PROTOCOL_HEADER, MetadataValue::from(PROTOCOL_VERSION));
    md.insert(
        FINGERPRINT_HEADER,
        format!("{:016x}", s.fingerprint)
            .parse()
            .map_err(|_| "bad fingerprint header".to_string())?,
    );
    add_auth(req, &s.opts.auth_token)
}

pub(super) fn add_auth<T>(
    req: &mut tonic::Request<T>,
    token: &Option<String>,
) -> Result<(), String> {
    if let Some(t) = token {
        let v = format!("Bearer {t}")
            .parse()
            .map_err(|_| "auth token is not valid header text".to_string())?;
        req.metadata_mut().insert(AUTH_HEADER, v);
    }
    Ok(())
}
