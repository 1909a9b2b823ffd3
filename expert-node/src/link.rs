//! The node's end of the framed data link (`nightshift_proto::link`): a listener thread accepts
//! coordinators' links on `--link-listen` (TLS with the gRPC server's certificate, and its client
//! CA when mutual), and each link gets one thread, pinned like the pool's workers, that checks
//! the coordinator's hello (protocol, model fingerprint, auth token — as the gRPC service does),
//! then reads a request, validates and computes it with the same code as the gRPC stream
//! (`NodeService::handle`: on this thread when the pool has one worker, so a layer call wakes one
//! thread here; one request at a time then, across all links, as the pool would), and writes
//! the answer with the node's timestamps. A malformed request gets an
//! error answer and the link goes on; a frame that breaks the framing (too long, unknown kind)
//! or a refused hello ends the link (a short, malformed or over-long hello gets its refusal
//! first). Nothing from the peer can panic the node, and before its hello is accepted a peer
//! cannot make it reserve more than `link::HELLO_MAX` bytes.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_proto::link::{self, Framed, Hello, LinkError, Stream};
use nightshift_proto::v1::ComputeRequest;
use nightshift_proto::PROTOCOL_VERSION;
use prost::Message;
use tonic::Code;

use crate::service::{answer, lock, NodeService};
use crate::store::ExpertStore;

/// Most links a node serves at once (each holds a thread).
pub const MAX_LINKS: u32 = 32;
/// How long a new connection has for its TLS handshake and hello.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing an answer may wait for the coordinator to read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What every link thread of a node shares.
pub struct LinkServer {
    pub(crate) store: Arc<ExpertStore>,
    pub(crate) pool: Arc<rayon::ThreadPool>,
    pub(crate) n_embd: usize,
    pub(crate) fingerprint: u64,
    pub(crate) in_flight: Arc<AtomicU32>,
    pub(crate) requests: Arc<AtomicU64>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) pin: Option<Arc<dyn Fn() + Send + Sync>>,
    /// `Bearer <token>` a hello must carry (None: no authentication).
    pub(crate) token: Option<Vec<u8>>,
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    pub(crate) links: AtomicU32,
    /// `NodeService::alone`: held while a link thread computes a request itself.
    pub(crate) alone: Arc<std::sync::Mutex<()>>,
}

impl LinkServer {
    /// Accepts links on `listener` on a thread of its own until the node stops.
    pub fn spawn(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("expert-link-accept".into())
            .spawn(move || self.accept(listener))
            .map(|_| ())
    }

    fn accept(self: Arc<Self>, listener: TcpListener) {
        for conn in listener.incoming() {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let sock = match conn {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("link accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if self.links.fetch_add(1, Ordering::AcqRel) >= MAX_LINKS {
                self.links.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!("refusing a link: this node already serves {MAX_LINKS}");
                continue;
            }
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("expert-link".into())
                .spawn(move || {
                    let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                    match me.serve(sock) {
                        Ok(()) => tracing::info!(%peer, "link closed"),
                        Err(e) => tracing::info!(%peer, "link closed: {e}"),
                    }
                    me.links.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                self.links.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!("cannot start a link thread: {e}");
            }
        }
    }

    /// Opens the link (TLS, hello) and answers its requests until the coordinator leaves or the
    /// node stops.
    fn serve(&self, sock: TcpStream) -> Result<(), LinkError> {
        if let Some(pin) = &self.pin {
            pin();
        }
        sock.set_nodelay(true)?;
        let io = match &self.tls {
            Some(cfg) => Stream::accept_tls(cfg.clone(), sock, OPEN_TIMEOUT)?,
            None => Stream::Plain(sock),
        };
        let mut f = Framed::new(io);
        let stop = self.stop.clone();
        let mut running = move || !stop.load(Ordering::Acquire);
        let refusal = match f.recv(Instant::now() + OPEN_TIMEOUT, &mut running) {
            Ok((link::HELLO, payload)) => match Hello::decode(payload) {
                Ok(h) => self.check_hello(&h),
                Err(e) => Some((Code::InvalidArgument, e.to_string())),
            },
            Ok((kind, _)) => Some((
                Code::InvalidArgument,
                format!("expected a hello, found frame kind {kind}"),
            )),
            // too long a frame for a hello: refused from its header, the rest never read
            Err(LinkError::Malformed(e)) => Some((Code::InvalidArgument, e)),
            Err(e) => return Err(e),
        };
        if let Some((code, reason)) = refusal {
            let _ = f.send(link::REFUSED, OPEN_TIMEOUT, |o| {
                link::encode_refusal(code as u32, &reason, o)
            });
            return Err(LinkError::Refused(reason));
        }
        f.send(link::WELCOME, OPEN_TIMEOUT, |_| {})?;
        f.opened();
        tracing::info!("link opened");
        // One worker: compute here rather than wake it (it would run the same code).
        let pool = (self.pool.current_num_threads() > 1).then_some(&*self.pool);
        let forever = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
        loop {
            let (kind, payload) = match f.recv(forever, &mut running) {
                Ok(frame) => frame,
                Err(LinkError::Closed) => return Ok(()),
                Err(e) => return Err(e),
            };
            let received_ns = nightshift_proto::monotonic_ns();
            if kind != link::REQUEST {
                return Err(LinkError::Malformed(format!(
                    "expected a request, found frame kind {kind}"
                )));
            }
            let decoded = ComputeRequest::decode(payload);
            self.requests.fetch_add(1, Ordering::Relaxed);
            let (request_id, result, started_ns) = match decoded {
                Err(e) => (
                    0,
                    Err(tonic::Status::invalid_argument(format!(
                        "undecodable compute request: {e}"
                    ))),
                    received_ns,
                ),
                Ok(msg) => {
                    if let Some(h) = &msg.prefetch {
                        self.store.hint(h.layer, &h.experts);
                    }
                    let id = msg.request_id;
                    self.in_flight.fetch_add(1, Ordering::Relaxed);
                    let alone = pool.is_none().then(|| lock(&self.alone));
                    let started_ns = nightshift_proto::monotonic_ns();
                    let r = if msg.parts {
                        self.in_parts(&mut f, pool, msg)
                    } else {
                        Ok(NodeService::handle(&self.store, pool, self.n_embd, msg))
                    };
                    drop(alone);
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                    // a part the link could not take: the link is gone
                    (id, r?, started_ns)
                }
            };
            let ended_ns = nightshift_proto::monotonic_ns();
            let resp = answer(request_id, result, [received_ns, started_ns, ended_ns]);
            f.send(link::RESPONSE, WRITE_TIMEOUT, |o| resp.encode_raw(o))?;
        }
    }

    /// Computes a request that allows parts (`parts.rs`), sending the rows of each finished
    /// chunk but the last in a `PART` frame; the answer's rows are the rest. `Err`: the link
    /// broke while a part was written.
    fn in_parts(
        &self,
        f: &mut Framed,
        pool: Option<&rayon::ThreadPool>,
        msg: ComputeRequest,
    ) -> Result<Result<Vec<u8>, tonic::Status>, LinkError> {
        let id = msg.request_id;
        let work =
            match NodeService::guarded(|| NodeService::validate(&self.store, self.n_embd, msg)) {
                Ok(w) => w,
                Err(status) => return Ok(Err(status)),
            };
        crate::parts::run(&self.store, pool, self.n_embd, &work, |idx, rows| {
            f.send(link::PART, WRITE_TIMEOUT, |o| {
                link::encode_part(id, idx, rows, o)
            })
        })
    }

    /// Why a hello is refused (as the gRPC service would refuse its stream), if it is.
    fn check_hello(&self, h: &Hello) -> Option<(Code, String)> {
        if let Some(want) = &self.token {
            if !h.token_is(want) {
                return Some((
                    Code::Unauthenticated,
                    "missing or wrong node auth token".into(),
                ));
            }
        }
        if h.protocol != PROTOCOL_VERSION {
            return Some((
                Code::FailedPrecondition,
                format!(
                    "protocol: expected version {PROTOCOL_VERSION}, found {}",
                    h.protocol
                ),
            ));
        }
        if h.fingerprint != self.fingerprint {
            return Some((
                Code::FailedPrecondition,
                format!(
                    "model fingerprint: this node serves {:016x}, the coordinator runs {:016x}",
                    self.fingerprint, h.fingerprint
                ),
            ));
        }
        None
    }
}
