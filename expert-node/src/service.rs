//! The gRPC service of an expert node (`nightshift.v1.ExpertService`). Every message is
//! untrusted: `validate` checks row counts, byte lengths, activation types and that every expert
//! is held here before any work starts, and all failures become `tonic::Status` in one place
//! (`status_of`). Work runs on the node's pinned rayon pool (spawned straight onto a worker, the
//! result sent back on a oneshot), with `expert_ffn` — the same function the coordinator runs in
//! process. A stream's requests are handed to the pool as they arrive (at most `STREAM_PIPELINE`
//! ahead) and answered in request order. Every answer carries the node's timestamps (request
//! decoded, compute started and ended, answer handed to the stream) so the coordinator can tell
//! where a round trip went.
//!
//! A coordinator on the same machine may also hand over a shared-memory region (`AttachShm`,
//! `nightshift_proto::shm`): a link thread, pinned like the workers, then takes that
//! coordinator's requests from the region, checks them with the same `validate` and answers
//! them with the same `run`. A node with one worker computes on the link thread itself, so a
//! layer call wakes one thread here instead of three (one request at a time across all links,
//! as the pool would compute them: `alone`). When the coordinator also handed over its
//! claim board, a *shared* call (one posted to several nodes at once) is computed group by group
//! as the board hands the groups out (`run_shared`), after the groups the request says are this
//! node's alone (the experts it was hinted to read ahead), and answered with the pairs done here.
//!
//! A request may carry a prefetch hint (`ComputeRequest.prefetch`, over the stream or in the
//! region): it goes to the store (`ExpertStore::hint`) before the request is computed, and is
//! never a reason to refuse the request. A stream request with no pairs and a hint is a hint
//! alone, and is not answered.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nightshift_kernels::GgmlType;
use nightshift_model::{ActRows, ExpertError, ExpertPair};
use nightshift_proto::shm::board::ClaimBoard;
use nightshift_proto::shm::{Incoming, ShmReply, ShmServer};
use nightshift_proto::v1::expert_service_server::ExpertService;
use nightshift_proto::v1::{
    compute_response, AttachShmRequest, AttachShmResponse, ComputeRequest, ComputeResponse,
    DropExpertsRequest, DropExpertsResponse, HealthRequest, HealthResponse, HeldExpert,
    InfoRequest, InfoResponse, LoadExpertsRequest, LoadExpertsResponse,
};
use nightshift_proto::{FINGERPRINT_HEADER, PROTOCOL_HEADER, PROTOCOL_VERSION};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::store::{ExpertStore, StoreError};

/// Static facts about the node, reported by `Info`.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    pub name: String,
    pub numa_node: Option<u32>,
    pub cores: u32,
    pub kernel_tier: String,
}

/// The service state shared by all connections.
pub struct NodeService {
    store: Arc<ExpertStore>,
    pool: Arc<rayon::ThreadPool>,
    identity: NodeIdentity,
    fingerprint: u64,
    n_embd: usize,
    in_flight: Arc<AtomicU32>,
    requests: Arc<AtomicU64>,
    /// Shared-memory links being served.
    links: Arc<AtomicU32>,
    /// Set at shutdown: link threads finish the request in hand and leave.
    stop: Arc<AtomicBool>,
    /// Run by each link thread first (pins it like the pool's workers).
    link_pin: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Port of the framed data link (`crate::link`) reported by `Info`; 0: none.
    link_port: u16,
    /// Held by a link thread (shared memory or data link) computing a request itself, when the
    /// pool has one worker: the node computes one request at a time, as its pool would, even
    /// when several links bring requests at once (a coordinator's two micro-batches).
    alone: Arc<std::sync::Mutex<()>>,
}

/// Most shared-memory links a node serves at once (each holds a thread).
pub const MAX_SHM_LINKS: u32 = 16;

/// A validated compute request, in the node's own types.
pub(crate) struct Work {
    pub(crate) layer: u32,
    pub(crate) acts: ActRows,
    pub(crate) pairs: Vec<ExpertPair>,
}

impl NodeService {
    /// A service over a loaded store.
    pub fn new(
        store: Arc<ExpertStore>,
        pool: Arc<rayon::ThreadPool>,
        identity: NodeIdentity,
        n_embd: usize,
    ) -> NodeService {
        let fingerprint = store.gguf().fingerprint();
        NodeService {
            store,
            pool,
            identity,
            fingerprint,
            n_embd,
            in_flight: Arc::new(AtomicU32::new(0)),
            requests: Arc::new(AtomicU64::new(0)),
            links: Arc::new(AtomicU32::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            link_pin: None,
            link_port: 0,
            alone: Arc::default(),
        }
    }

    /// Reports `port` as the framed data link's in `Info`.
    pub fn with_link_port(mut self, port: u16) -> NodeService {
        self.link_port = port;
        self
    }

    /// The state of the framed data link's threads (`crate::link`): this service's store, pool,
    /// counters and stop flag, the auth token hellos must carry and the link's TLS.
    pub fn link_server(
        &self,
        token: Option<String>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Arc<crate::link::LinkServer> {
        Arc::new(crate::link::LinkServer {
            store: self.store.clone(),
            pool: self.pool.clone(),
            n_embd: self.n_embd,
            fingerprint: self.fingerprint,
            in_flight: self.in_flight.clone(),
            requests: self.requests.clone(),
            stop: self.stop.clone(),
            pin: self.link_pin.clone(),
            token: token.map(|t| format!("Bearer {t}").into_bytes()),
            tls,
            links: AtomicU32::new(0),
            alone: self.alone.clone(),
        })
    }

    /// Runs `pin` at the start of every shared-memory link thread.
    pub fn with_link_pin(mut self, pin: Arc<dyn Fn() + Send + Sync>) -> NodeService {
        self.link_pin = Some(pin);
        self
    }

    /// Set it at shutdown: shared-memory links finish the request in hand and close.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Validates and runs one request, a panic included as an error (`pool` None: on this
    /// thread).
    pub(crate) fn handle(
        store: &ExpertStore,
        pool: Option<&rayon::ThreadPool>,
        n_embd: usize,
        msg: ComputeRequest,
    ) -> Result<Vec<u8>, Status> {
        NodeService::guarded(|| {
            NodeService::validate(store, n_embd, msg)
                .and_then(|work| NodeService::run(store, pool, n_embd, &work))
        })
    }

    /// Runs `f`, a panic in it becoming an internal error: nothing a request carries takes the
    /// node down.
    pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, Status>) -> Result<T, Status> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|_| Err(Status::internal("worker failed: it panicked")))
    }

    /// Checks a request as the node does before computing it (every field against the model
    /// and the store); for fuzzing and tests of the decoding edge.
    pub fn check_request(
        store: &ExpertStore,
        n_embd: usize,
        req: ComputeRequest,
    ) -> Result<(), Status> {
        NodeService::validate(store, n_embd, req).map(|_| ())
    }

    /// Checks a request against the model and the store, converting it into `Work`.
    pub(crate) fn validate(
        store: &ExpertStore,
        n_embd: usize,
        req: ComputeRequest,
    ) -> Result<Work, Status> {
        if req.n_embd as usize != n_embd {
            return Err(Status::invalid_argument(format!(
                "n_embd: expected {n_embd}, found {}",
                req.n_embd
            )));
        }
        let ty = GgmlType::from_id(req.act_type).ok_or_else(|| {
            Status::invalid_argument(format!(
                "act_type: expected a ggml type id, found {}",
                req.act_type
            ))
        })?;
        let row_bytes = ty
            .row_bytes(n_embd)
            .map_err(|e| Status::invalid_argument(format!("act_type {}: {e}", ty.name())))?;
        let n_rows = req.n_rows as usize;
        let want = row_bytes
            .checked_mul(n_rows)
            .ok_or_else(|| Status::invalid_argument("n_rows: too large"))?;
        if req.acts.len() != want {
            return Err(Status::invalid_argument(format!(
                "acts: expected {want} bytes for {n_rows} rows of {}, found {}",
                ty.name(),
                req.acts.len()
            )));
        }
        if req.experts.len() != req.rows.len() {
            return Err(Status::invalid_argument(format!(
                "pairs: expected as many rows as experts ({}), found {}",
                req.experts.len(),
                req.rows.len()
            )));
        }
        let mut pairs = Vec::with_capacity(req.experts.len());
        for (&expert, &row) in req.experts.iter().zip(&req.rows) {
            if row as usize >= n_rows {
                return Err(Status::invalid_argument(format!(
                    "rows: expected a row below {n_rows}, found {row}"
                )));
            }
            if !store.holds(req.layer, expert) {
                return Err(Status::not_found(format!(
                    "layer {} expert {expert} is not held by this node",
                    req.layer
                )));
            }
            pairs.push(ExpertPair { expert, row });
        }
        // The activation type must be what this layer's experts consume (or F32, converted here).
        if let Some(first) = pairs.first() {
            let expected = store
                .with_layer(req.layer, |w| w(first.expert).map(|w| w.act_type()))
                .map_err(status_of_store)?
                .map_err(status_of_expert)?;
            if ty != expected && ty != GgmlType::F32 {
                return Err(Status::invalid_argument(format!(
                    "act_type: expected {} (or F32) for layer {}, found {}",
                    expected.name(),
                    req.layer,
                    ty.name()
                )));
            }
        }
        Ok(Work {
            layer: req.layer,
            acts: ActRows {
                ty,
                n_rows,
                data: req.acts,
            },
            pairs,
        })
    }

    /// Runs validated work on the pool; returns the outputs as little-endian f32 bytes.
    fn run(
        store: &ExpertStore,
        pool: Option<&rayon::ThreadPool>,
        n_embd: usize,
        work: &Work,
    ) -> Result<Vec<u8>, Status> {
        let mut out = vec![0f32; work.pairs.len() * n_embd];
        NodeService::run_into(store, pool, n_embd, work, &mut out)?;
        Ok(nightshift_proto::f32s_to_le_bytes(&out))
    }

    /// Runs validated work into `out` (one `n_embd` row per pair).
    fn run_into(
        store: &ExpertStore,
        pool: Option<&rayon::ThreadPool>,
        n_embd: usize,
        work: &Work,
        out: &mut [f32],
    ) -> Result<(), Status> {
        store
            .run(work.layer, &work.acts, &work.pairs, n_embd, out, pool)
            .map_err(status_of_store)
    }

    /// Runs the first `owned` expert groups of validated work (this node's alone) and those
    /// after them that `board` hands this node under `tag` into their rows of `out`; returns
    /// the pairs computed (indices into the request's pairs).
    #[allow(clippy::too_many_arguments)]
    fn run_shared(
        store: &ExpertStore,
        pool: Option<&rayon::ThreadPool>,
        n_embd: usize,
        work: &Work,
        board: &ClaimBoard,
        tag: u32,
        owned: u32,
        out: &mut [f32],
    ) -> Result<Vec<u32>, Status> {
        let groups = nightshift_model::expert::expert_groups(&work.pairs).len();
        let owned = owned as usize;
        if owned > groups {
            return Err(Status::invalid_argument(format!(
                "a shared call owning {owned} expert groups of {groups}"
            )));
        }
        let taken = std::sync::atomic::AtomicUsize::new(0);
        let claim = |groups: usize| {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            if i < owned {
                return Some(i);
            }
            board
                .claim(tag, (groups - owned) as u32)
                .map(|g| owned + g as usize)
        };
        store
            .run_claimed(
                work.layer,
                &work.acts,
                &work.pairs,
                n_embd,
                out,
                pool,
                &claim,
            )
            .map_err(status_of_store)
    }

    fn check_handshake<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let md = req.metadata();
        let proto = md
            .get(PROTOCOL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                Status::failed_precondition(format!("missing {PROTOCOL_HEADER} metadata"))
            })?;
        if proto != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "protocol: expected version {PROTOCOL_VERSION}, found {proto}"
            )));
        }
        let fp = md
            .get(FINGERPRINT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(|| {
                Status::failed_precondition(format!("missing {FINGERPRINT_HEADER} metadata"))
            })?;
        if fp != self.fingerprint {
            return Err(Status::failed_precondition(format!(
                "model fingerprint: this node serves {:016x}, the coordinator runs {fp:016x}",
                self.fingerprint
            )));
        }
        Ok(())
    }
}

/// The one place store errors become statuses.
pub(crate) fn status_of_store(e: StoreError) -> Status {
    match e {
        StoreError::NoSuchExpert { .. } => Status::not_found(e.to_string()),
        StoreError::NotMoe => Status::failed_precondition(e.to_string()),
        StoreError::Expert(inner) => status_of_expert(inner),
        StoreError::Poisoned => Status::internal(e.to_string()),
        StoreError::OverCapacity { .. } | StoreError::Alloc(_) => {
            Status::resource_exhausted(e.to_string())
        }
    }
}

/// The one place expert errors become statuses.
fn status_of_expert(e: ExpertError) -> Status {
    match e {
        ExpertError::UnknownExpert { .. } => Status::not_found(e.to_string()),
        ExpertError::Shape(_) | ExpertError::Kernel(_) => Status::invalid_argument(e.to_string()),
        ExpertError::Backend(_) => Status::internal(e.to_string()),
    }
}

/// Locks `m`, whatever a panicking holder left (the guarded state is `()`).
pub(crate) fn lock(m: &std::sync::Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The answer to request `request_id`: its outputs or its error (logged), with the node's
/// timestamps (`received`, compute `started` and `ended`; replied is now).
pub(crate) fn answer(
    request_id: u64,
    result: Result<Vec<u8>, Status>,
    [received_ns, started_ns, ended_ns]: [u64; 3],
) -> ComputeResponse {
    let result = match result {
        Ok(bytes) => compute_response::Result::Outputs(bytes),
        Err(status) => {
            tracing::warn!(request_id, "compute request rejected: {}", status.message());
            compute_response::Result::Error(nightshift_proto::v1::Error {
                code: status.code() as i32,
                message: status.message().to_string(),
            })
        }
    };
    ComputeResponse {
        request_id,
        result: Some(result),
        received_ns,
        started_ns,
        ended_ns,
        replied_ns: nightshift_proto::monotonic_ns(),
    }
}

/// Requests of one compute stream handed to the pool ahead of their answers, at most (more wait
/// unread in the stream, which pushes back on the coordinator through HTTP/2 flow control).
const STREAM_PIPELINE: usize = 8;

type ComputeStream = Pin<Box<dyn Stream<Item = Result<ComputeResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExpertService for NodeService {
    async fn info(&self, _req: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let inv = self.store.inventory();
        let resident_bytes = inv.iter().filter(|h| h.resident).map(|h| h.bytes).sum();
        let mapped_bytes = inv.iter().filter(|h| !h.resident).map(|h| h.bytes).sum();
        Ok(Response::new(InfoResponse {
            protocol_version: PROTOCOL_VERSION,
            model_fingerprint: self.fingerprint,
            node_name: self.identity.name.clone(),
            numa_node: self.identity.numa_node.map(|n| n as i32).unwrap_or(-1),
            cores: self.identity.cores,
            build: format!("nightshift-expert-node {}", env!("CARGO_PKG_VERSION")),
            experts: inv
                .iter()
                .map(|h| HeldExpert {
                    layer: h.layer,
                    expert: h.expert,
                    bytes: h.bytes,
                    resident: h.resident,
                })
                .collect(),
            resident_bytes,
            mapped_bytes,
            kernel_tier: self.identity.kernel_tier.clone(),
            cold_cache_bytes: self.store.cold_cache().map_or(0, |c| c.capacity()),
            link_port: u32::from(self.link_port),
        }))
    }

    async fn health(
        &self,
        _req: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(HealthResponse {
            serving: true,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            requests_total: self.requests.load(Ordering::Relaxed),
        }))
    }

    type ComputeStream = ComputeStream;

    async fn compute(
        &self,
        req: Request<Streaming<ComputeRequest>>,
    ) -> Result<Response<Self::ComputeStream>, Status> {
        self.check_handshake(&req)?;
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<ComputeResponse, Status>>(16);
        let (store, pool, n_embd) = (self.store.clone(), self.pool.clone(), self.n_embd);
        let (in_flight, requests) = (self.in_flight.clone(), self.requests.clone());
        // Requests go to the pool as they are decoded and answers go back in request order: a
        // request that comes in while the one before it computes (the second micro-batch's)
        // waits in the pool's queue, not unread in the stream, and the worker takes it up as
        // soon as it is free instead of after the answer before it is sent and it is read.
        type Done = (Result<Vec<u8>, Status>, u64, u64);
        let (queued_tx, mut queued_rx) =
            tokio::sync::mpsc::channel::<(u64, u64, tokio::sync::oneshot::Receiver<Done>)>(
                STREAM_PIPELINE,
            );
        let intake = async move {
            while let Some(msg) = inbound.next().await {
                let msg = match msg {
                    Ok(m) => m,
                    Err(status) => {
                        tracing::debug!("compute stream ended: {status}");
                        break;
                    }
                };
                let received_ns = nightshift_proto::monotonic_ns();
                // A hint goes to the cache before the call it rides with is computed (that
                // call's reads still come first); a hint alone is not answered.
                if let Some(h) = &msg.prefetch {
                    store.hint(h.layer, &h.experts);
                    if msg.experts.is_empty() {
                        continue;
                    }
                }
                requests.fetch_add(1, Ordering::Relaxed);
                in_flight.fetch_add(1, Ordering::Relaxed);
                let request_id = msg.request_id;
                let (store, pool) = (store.clone(), pool.clone());
                // Straight onto a pinned pool worker (not via a blocking thread that would
                // hand over to the pool again): one wake-up each way per layer call.
                let (done_tx, done_rx) = tokio::sync::oneshot::channel();
                let worker_pool = pool.clone();
                worker_pool.spawn(move || {
                    // A panic must not abort the node (rayon aborts on a panicking spawn): it
                    // becomes this request's error status.
                    let started_ns = nightshift_proto::monotonic_ns();
                    let r = NodeService::handle(&store, Some(&pool), n_embd, msg);
                    let _ = done_tx.send((r, started_ns, nightshift_proto::monotonic_ns()));
                });
                if queued_tx
                    .send((request_id, received_ns, done_rx))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            // Dropping `queued_tx` ends the replies once the queued ones are sent.
        };
        let in_flight = self.in_flight.clone();
        let replies = async move {
            while let Some((request_id, received_ns, done_rx)) = queued_rx.recv().await {
                let (result, started_ns, ended_ns) = done_rx
                    .await
                    .unwrap_or_else(|_| (Err(Status::internal("worker failed: no result")), 0, 0));
                in_flight.fetch_sub(1, Ordering::Relaxed);
                let stamps = [received_ns, started_ns, ended_ns];
                if tx
                    .send(Ok(answer(request_id, result, stamps)))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            // Dropping `queued_rx` (the client went away) ends the intake at its next request.
        };
        tokio::spawn(async move {
            tokio::join!(intake, replies);
        });
        let out = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(out)))
    }

    async fn attach_shm(
        &self,
        req: Request<AttachShmRequest>,
    ) -> Result<Response<AttachShmResponse>, Status> {
        self.check_handshake(&req)?;
        let req = req.into_inner();
        let path = std::path::PathBuf::from(req.path);
        // The board first: a region once opened is closed when dropped, so a refused board
        // must not cost the coordinator its region.
        let board = if req.board.is_empty() {
            None
        } else {
            let b = ClaimBoard::open(std::path::Path::new(&req.board))
                .map_err(|e| Status::invalid_argument(format!("claim board: {e}")))?;
            Some(b)
        };
        let server = ShmServer::open(&path).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let links = self.links.clone();
        if links.fetch_add(1, Ordering::AcqRel) >= MAX_SHM_LINKS {
            links.fetch_sub(1, Ordering::AcqRel);
            return Err(Status::resource_exhausted(format!(
                "this node already serves {MAX_SHM_LINKS} shared-memory links"
            )));
        }
        let link = Link {
            store: self.store.clone(),
            pool: self.pool.clone(),
            n_embd: self.n_embd,
            in_flight: self.in_flight.clone(),
            requests: self.requests.clone(),
            stop: self.stop.clone(),
            pin: self.link_pin.clone(),
            board,
            alone: self.alone.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("expert-shm-link".into())
            .spawn(move || {
                link.serve(server);
                links.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.links.fetch_sub(1, Ordering::AcqRel);
            return Err(Status::resource_exhausted(format!(
                "cannot start a link thread: {e}"
            )));
        }
        tracing::info!(path = %path.display(), "shared-memory link attached");
        Ok(Response::new(AttachShmResponse {}))
    }

    async fn load_experts(
        &self,
        req: Request<LoadExpertsRequest>,
    ) -> Result<Response<LoadExpertsResponse>, Status> {
        let req = req.into_inner();
        let keys: Vec<(u32, u32)> = req.experts.iter().map(|e| (e.layer, e.expert)).collect();
        let (store, pool) = (self.store.clone(), self.pool.clone());
        let loaded = tokio::task::spawn_blocking(move || store.load(&keys, req.resident, &pool))
            .await
            .map_err(|e| Status::internal(format!("loader failed: {e}")))?
            .map_err(status_of_store)?;
        let resident_bytes = self
            .store
            .inventory()
            .iter()
            .filter(|h| h.resident)
            .map(|h| h.bytes)
            .sum();
        Ok(Response::new(LoadExpertsResponse {
            loaded: loaded as u32,
            resident_bytes,
        }))
    }

    async fn drop_experts(
        &self,
        req: Request<DropExpertsRequest>,
    ) -> Result<Response<DropExpertsResponse>, Status> {
        let keys: Vec<(u32, u32)> = req
            .into_inner()
            .experts
            .iter()
            .map(|e| (e.layer, e.expert))
            .collect();
        let store = self.store.clone();
        let dropped = tokio::task::spawn_blocking(move || store.drop_experts(&keys))
            .await
            .map_err(|e| Status::internal(format!("drop failed: {e}")))?
            .map_err(status_of_store)?;
        Ok(Response::new(DropExpertsResponse {
            dropped: dropped as u32,
        }))
    }
}

/// What a shared-memory link thread needs.
struct Link {
    store: Arc<ExpertStore>,
    pool: Arc<rayon::ThreadPool>,
    n_embd: usize,
    in_flight: Arc<AtomicU32>,
    requests: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    pin: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The coordinator's claim board, for shared calls.
    board: Option<ClaimBoard>,
    /// `NodeService::alone`.
    alone: Arc<std::sync::Mutex<()>>,
}

impl Link {
    /// Validates and runs the request just taken from the region straight into its row slots:
    /// in full (`None`), or as a shared call through the claim board (the pairs computed). A
    /// panic becomes an error.
    fn compute(
        &self,
        server: &mut ShmServer,
        pool: Option<&rayon::ThreadPool>,
        msg: ComputeRequest,
    ) -> Result<Option<Vec<u32>>, Status> {
        let (tag, owned) = (server.claim_tag(), server.owned_groups());
        let board = match (tag, &self.board) {
            (0, _) => None,
            (_, Some(b)) => Some(b),
            (_, None) => {
                return Err(Status::failed_precondition(
                    "a shared call, but this link has no claim board",
                ))
            }
        };
        NodeService::guarded(|| {
            let work = NodeService::validate(&self.store, self.n_embd, msg)?;
            let rows = server.rows_mut().ok_or_else(|| {
                Status::resource_exhausted("outputs exceed the shared response area")
            })?;
            let (store, n_embd) = (&self.store, self.n_embd);
            match board {
                None => NodeService::run_into(store, pool, n_embd, &work, rows).map(|()| None),
                Some(b) => NodeService::run_shared(store, pool, n_embd, &work, b, tag, owned, rows)
                    .map(Some),
            }
        })
    }

    /// Answers requests from the region until the coordinator leaves or the node stops.
    fn serve(self, mut server: ShmServer) {
        if let Some(pin) = &self.pin {
            pin();
        }
        // One worker: compute here rather than wake it (it would run the same code).
        let pool = (self.pool.current_num_threads() > 1).then_some(&*self.pool);
        while !self.stop.load(Ordering::Acquire) {
            let incoming = match server.next(Duration::from_millis(200)) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    tracing::info!("shared-memory link closed: {e}");
                    return;
                }
            };
            self.requests.fetch_add(1, Ordering::Relaxed);
            let (request_id, result) = match incoming {
                Incoming::Malformed { request_id, reason } => {
                    (request_id, Err(Status::invalid_argument(reason)))
                }
                Incoming::Request(msg) => {
                    if let Some(h) = &msg.prefetch {
                        self.store.hint(h.layer, &h.experts);
                    }
                    self.in_flight.fetch_add(1, Ordering::Relaxed);
                    let id = msg.request_id;
                    let out = {
                        let _alone = pool.is_none().then(|| lock(&self.alone));
                        self.compute(&mut server, pool, msg)
                    };
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                    (id, out)
                }
            };
            match result {
                Ok(answered) => server.reply_rows(request_id, answered.as_deref()),
                Err(status) => {
                    tracing::warn!(request_id, "compute request rejected: {}", status.message());
                    let reply = ShmReply::Error {
                        code: status.code() as i32,
                        message: status.message().to_string(),
                    };
                    server.reply(request_id, &reply);
                }
            }
        }
        tracing::info!("shared-memory link closed: the node is stopping");
    }
}
