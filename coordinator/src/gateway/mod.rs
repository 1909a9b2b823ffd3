//! The OpenAI-compatible HTTP gateway (axum/tower): routes, shared state, the request-id /
//! auth / metrics middleware and the server loop with graceful shutdown. Only this module knows
//! OpenAI's JSON; it converts into the scheduler's types at the edge (`convert`).

pub mod anthropic;
pub mod atlas;
pub mod conn;
mod convert;
mod error;
mod extract;
mod handlers;
mod int;
mod middleware;
pub mod openapi;
mod output;
pub mod responses;
mod segments;
pub mod stream;
#[cfg(test)]
mod tests;
mod tools;
pub mod types;

pub use error::ApiError;
pub use extract::BODY_LIMIT;

use crate::scheduler::{Scheduler, TextModel};
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The id of one HTTP request (also returned as `x-request-id`).
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// Health of the expert backend: Ok, or why nodes are unreachable.
pub type NodesCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Everything the handlers share.
pub struct AppState {
    /// The id clients pass as `model`.
    pub model_id: String,
    /// Other names accepted as `model` (`--model-alias`).
    pub model_aliases: Vec<String>,
    pub created: u64,
    /// `system_fingerprint` in responses (model identity).
    pub fingerprint: String,
    pub scheduler: Scheduler,
    pub text: Arc<dyn TextModel>,
    /// Bearer key; None = no auth.
    pub api_key: Option<String>,
    /// Non-streaming requests fail with 504 after this.
    pub request_timeout: Duration,
    /// A request body must have arrived within this (else 408): a client trickling its body
    /// cannot hold a connection and its worker indefinitely.
    pub body_timeout: Duration,
    /// Streaming requests end with a timeout error event after this (None = no limit); the
    /// stream's end drops its receiver, which cancels the sequence and frees its KV cache.
    pub stream_timeout: Option<Duration>,
    pub metrics: Option<PrometheusHandle>,
    /// Serve `/metrics` without the API key (`--metrics-public`); otherwise it needs the key
    /// like `/v1/*` when one is set.
    pub metrics_public: bool,
    pub nodes_ok: NodesCheck,
    /// `/ready` answers 503 while one engine step has run longer than this (a stuck engine
    /// shows to load balancers and supervisors instead of only as requests timing out).
    pub stall_after: Duration,
    /// Set on shutdown: new generations get 503.
    pub draining: AtomicBool,
    /// What the ExpertAtlas endpoints act on; None when nothing is recorded (they answer 409).
    pub atlas: Option<Arc<atlas::AtlasAdmin>>,
    /// Stored responses of `/v1/responses` (`store`, `previous_response_id`).
    pub responses: responses::store::ResponseStore,
}

/// The whole API as a router.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/apply-template", post(handlers::apply_template))
        .route("/v1/models", get(handlers::models))
        .route("/v1/admin/kv", get(handlers::admin_kv))
        .route("/v1/atlas", get(atlas::get_atlas))
        .route(
            "/v1/admin/placement",
            post(atlas::post_placement).get(atlas::get_placement),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    let mut metrics = Router::new().route("/metrics", get(handlers::metrics));
    if !state.metrics_public {
        metrics = metrics.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    }
    Router::new()
        .merge(v1)
        .merge(metrics)
        .route("/health", get(handlers::health))
        .route("/ready", get(handlers::ready))
        .route("/openapi.json", get(openapi::openapi_json))
        .fallback(|| async { ApiError::route(StatusCode::NOT_FOUND, "unknown path") })
        .method_not_allowed_fallback(|| async {
            ApiError::route(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed for this path",
            )
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(middleware::request_id))
        .with_state(state)
}

/// Installs the global Prometheus recorder once; later calls return the same handle.
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
            let latency = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
            let b = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("nightshift_sequence_tokens_per_second".into()),
                        &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0],
                    )
                });
            match b.and_then(|b| b.install_recorder()) {
                Ok(h) => {
                    // Histogram samples pile up until drained: drain them every 5 s even when
                    // nobody scrapes /metrics, so memory stays flat.
                    let upkeep = h.clone();
                    let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    });
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "metrics upkeep thread not started");
                    }
                    Some(h)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "prometheus recorder not installed; /metrics disabled");
                    None
                }
            }
        })
        .clone()
}

/// Serves until `shutdown` resolves, then stops accepting, lets running requests finish for at
/// most `drain` and returns (default connection limits).
#[allow(dead_code)] // the unit tests' entry point
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    serve_with(
        listener,
        state,
        shutdown,
        drain,
        conn::ConnLimits::default(),
    )
    .await
}

/// `serve` with these connection limits (`conn`: header and idle timeouts, connection cap).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
    limits: conn::ConnLimits,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let st = state.clone();
    tokio::spawn(async move {
        shutdown.await;
        st.draining.store(true, Ordering::SeqCst);
        tracing::info!(
            drain_secs = drain.as_secs(),
            "shutting down: refusing new requests, draining running ones"
        );
        let _ = stop_tx.send(true);
    });
    let mut rx2 = stop_rx.clone();
    let server = std::pin::pin!(conn::serve(listener, app, limits, stop_rx));
    tokio::select! {
        () = server => Ok(()),
        _ = async {
            let _ = rx2.wait_for(|v| *v).await;
            tokio::time::sleep(drain).await;
        } => {
            tracing::warn!(in_flight = state.scheduler.in_flight(), "drain timeout reached; closing remaining connections");
            Ok(())
        }
    }
}
