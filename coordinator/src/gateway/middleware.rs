//! Middleware: a request id per request (tracing span, `x-request-id` header, request metrics)
//! and Bearer API-key auth compared in constant time (`subtle`).

use super::{ApiError, AppState, RequestId};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;
use subtle::ConstantTimeEq;
use tracing::Instrument;

/// Tags the request with an id, logs and counts it.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let id = uuid::Uuid::new_v4().simple().to_string();
    req.extensions_mut().insert(RequestId(id.clone()));
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let span = tracing::info_span!("request", request_id = %id, %method, %path);
    let t0 = Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    span.in_scope(|| tracing::info!(status, ms = t0.elapsed().as_millis() as u64, "response"));
    // Fixed label set: known paths only, so clients cannot blow up the series count.
    let route = match path.as_str() {
        "/v1/chat/completions"
        | "/v1/responses"
        | "/v1/messages"
        | "/v1/completions"
        | "/v1/models"
        | "/health"
        | "/ready"
        | "/metrics" => path,
        _ => "other".to_string(),
    };
    metrics::counter!("nightshift_http_requests_total", "path" => route.clone(), "status" => status.to_string())
        .increment(1);
    metrics::histogram!("nightshift_http_response_seconds", "path" => route)
        .record(t0.elapsed().as_secs_f64());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// Checks `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) when a key is
/// configured.
pub async fn auth(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(next.run(req).await);
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()));
    match given {
        None => Err(ApiError::unauthorized(
            "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
        )),
        Some(g) if bool::from(g.trim().as_bytes().ct_eq(key.as_bytes())) => Ok(next.run(req).await),
        Some(_) => Err(ApiError::unauthorized("incorrect API key provided")),
    }
}
