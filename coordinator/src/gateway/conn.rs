//! The HTTP connection loop: how connections are accepted, bounded and closed, so that clients
//! that connect and say nothing (slowloris) cannot lock everyone else out.
//!
//! - hyper's HTTP/1 `header_read_timeout` (with a tokio timer) closes a connection whose request
//!   head has not fully arrived in time. Hyper starts that timer whenever the connection waits
//!   for a request head, so it is also the idle keep-alive timeout between requests.
//! - At most `max_connections` are open (never more than the file-descriptor limit leaves room
//!   for): a permit is taken *before* accepting, so beyond the cap new connections wait in the
//!   kernel's backlog (backpressure) instead of failing `accept` with "too many open files".
//! - At the cap, the oldest connection that has no request in progress (idle, or still sending
//!   its head) is closed to make room, with a log line: a flood of silent connections cannot keep
//!   a real client waiting for their timeouts.
//!
//! HTTP/1.1 only (the OpenAI API's transport); streaming responses are chunked HTTP/1.1.

use axum::Router;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};

/// Connection limits of the gateway.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// A request head must arrive within this (also the idle keep-alive timeout).
    pub header_timeout: Duration,
    /// Open connections at most (further capped by the file-descriptor limit).
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// File descriptors kept free for everything but client connections (model files, node links,
/// logs, the runtime): a quarter of the limit, at least 32.
fn fd_reserve(limit: u64) -> u64 {
    (limit / 4).max(32)
}

/// `max` capped by what the soft `RLIMIT_NOFILE` leaves after the reserve (at least 1).
pub fn effective_cap(max: usize) -> usize {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes into the rlimit struct we own; no other memory is touched.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    if !ok || rl.rlim_cur == libc::RLIM_INFINITY {
        return max.max(1);
    }
    let limit = rl.rlim_cur;
    let room = limit.saturating_sub(fd_reserve(limit)).max(1);
    max.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
}

/// One open connection as the registry sees it.
struct Entry {
    /// Requests in progress (from the head read to the end of the response body).
    busy: Arc<AtomicUsize>,
    /// Woken to close the connection (evicted at the cap).
    close: Arc<Notify>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Registry {
    conns: Mutex<BTreeMap<u64, Entry>>,
    next: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the oldest connection without a request in progress; false when all are busy.
    fn evict_oldest_idle(&self) -> bool {
        let mut conns = self.lock();
        let victim = conns
            .iter()
            .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
            .map(|(&id, _)| id);
        match victim.and_then(|id| conns.remove(&id)) {
            Some(e) => {
                e.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counts a request in progress on its connection until the response body is dropped.
struct BusyGuard(Arc<AtomicUsize>);

impl BusyGuard {
    fn new(busy: &Arc<AtomicUsize>) -> BusyGuard {
        busy.fetch_add(1, Ordering::AcqRel);
        BusyGuard(busy.clone())
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Rate-limits the "cap reached" log line to one per 10 s.
struct CapLog {
    last: Mutex<Option<Instant>>,
}

impl CapLog {
    fn hit(&self, cap: usize, evicted: bool) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            return;
        }
        *last = Some(Instant::now());
        if evicted {
            tracing::warn!(
                cap,
                "connection cap reached: closing the oldest idle connection to accept a new one"
            );
        } else {
            tracing::warn!(cap, "connection cap reached and every connection is serving a request: new connections wait");
        }
    }
}

/// Resolves once `stop` turns true (or its sender is gone); holds no borrow of the value.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|v| *v).await;
}

/// True for accept errors caused by exhausted resources (retry after a pause).
fn resource_exhausted(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Serves `app` on `listener` until `stop` turns true, then stops accepting, lets open
/// connections finish their requests (graceful) and returns when all are closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let cap = effective_cap(limits.max_connections);
    if cap < limits.max_connections {
        tracing::info!(
            cap,
            asked = limits.max_connections,
            "open connections capped by the file-descriptor limit (ulimit -n)"
        );
    }
    let permits = Arc::new(Semaphore::new(cap));
    let registry = Arc::new(Registry::default());
    let cap_log = CapLog {
        last: Mutex::new(None),
    };
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let evicted = registry.evict_oldest_idle();
                cap_log.hit(cap, evicted);
                tokio::select! {
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = stopped(&mut stop) => break,
                }
            }
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopped(&mut stop) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                if resource_exhausted(&e) {
                    tracing::warn!(error = %e, "accept failed: out of resources; retrying shortly");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                } else {
                    tracing::debug!(error = %e, "accept failed");
                }
                continue;
            }
        };
        // Streams send one small SSE event per token: no Nagle delay.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let id = registry.next.fetch_add(1, Ordering::Relaxed);
        let busy = Arc::new(AtomicUsize::new(0));
        let close = Arc::new(Notify::new());
        registry.lock().insert(
            id,
            Entry {
                busy: busy.clone(),
                close: close.clone(),
            },
        );
        let (app, registry, stop) = (app.clone(), registry.clone(), stop.clone());
        tokio::spawn(async move {
            serve_one(tcp, app, limits, busy, close, stop).await;
            registry.lock().remove(&id);
            drop(permit);
        });
    }
    // Stopped: wait until every connection has finished (the caller bounds the wait).
    let _ = permits.acquire_many(cap as u32).await;
}

/// Serves one connection until it closes, is evicted, or (after `stop`) finishes gracefully.
async fn serve_one(
    tcp: tokio::net::TcpStream,
    app: Router,
    limits: ConnLimits,
    busy: Arc<AtomicUsize>,
    close: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let guard = BusyGuard::new(&busy);
        let app = app.clone();
        async move {
            let resp = app.oneshot(req.map(axum::body::Body::new)).await?;
            // The request counts as in progress until its response body is gone (SSE streams).
            Ok::<_, std::convert::Infallible>(resp.map(|b| {
                axum::body::Body::new(b.map_frame(move |f| {
                    let _ = &guard;
                    f
                }))
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = close.notified() => {}
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
        }
    }
}
