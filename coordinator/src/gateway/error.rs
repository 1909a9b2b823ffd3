//! `ApiError`: the one error type of the HTTP API, rendered in OpenAI's shape
//! `{"error":{"message","type","param","code"}}`. Internal failures are logged with the request
//! id and answered with a generic message that names only that id.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429/503).
    pub retry_after: Option<u32>,
}

/// The error body every failure answers with.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorBody)]
pub struct Body<'a> {
    error: Inner<'a>,
}

/// What went wrong: OpenAI's `message`, `type`, `param` (the request field at fault) and `code`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorDetail)]
pub struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: a request field is missing, of the wrong type or out of range.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        let p: String = param.into();
        e.param = (!p.is_empty()).then_some(p);
        e
    }

    /// 400: the body is not JSON at all.
    pub fn malformed_json(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.code = Some("invalid_json");
        e
    }

    /// 404: the model named in the request is not served here.
    pub fn model_not_found(asked: &str, served: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{asked}` does not exist; this server serves `{served}`"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 400: the prompt (`param`: `messages` or `prompt`) cannot fit the context whatever it
    /// tokenizes to: `bytes` of text are at least `min_tokens` tokens. Decided before
    /// tokenizing, so a huge prompt costs nothing.
    pub fn prompt_too_long(param: &str, bytes: usize, min_tokens: usize, n_ctx: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!(
                "this model's maximum context length is {n_ctx} tokens, however the prompt is {bytes} bytes, at least {min_tokens} tokens; reduce the prompt"
            ),
        );
        e.param = Some(param.into());
        e.code = Some("context_length_exceeded");
        e
    }

    /// 400: prompt + max_tokens beyond the context (`param`: `messages` or `prompt`).
    pub fn context_overflow(
        param: &str,
        n_ctx: usize,
        prompt: usize,
        max_tokens: usize,
    ) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!(
                "this model's maximum context length is {n_ctx} tokens, however you requested {} tokens ({prompt} in the prompt, {max_tokens} for the completion); reduce the prompt or max_tokens",
                prompt + max_tokens
            ),
        );
        e.param = Some(param.into());
        e.code = Some("context_length_exceeded");
        e
    }

    /// 429: the queue is full.
    pub fn queue_full() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the server is at capacity (request queue full); retry after a moment",
        );
        e.code = Some("rate_limit_exceeded");
        e.retry_after = Some(1);
        e
    }

    /// 503: expert nodes down, shutting down, or the engine is not running.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.code = Some("service_unavailable");
        e.retry_after = Some(5);
        e
    }

    /// 401: bad or missing API key.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message);
        e.code = Some("invalid_api_key");
        e
    }

    /// 413: body over the limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body too large: expected at most {limit} bytes"),
        )
    }

    /// 404 for unknown paths, 405 for a wrong method.
    pub fn route(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError::new(status, "invalid_request_error", message)
    }

    /// 504: the request ran past the server's timeout.
    /// 408: the request body did not arrive within `--body-timeout`.
    pub fn slow_body(secs: f64) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("the request body did not arrive within {secs} s"),
        )
    }

    pub fn timeout(secs: u64) -> ApiError {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            format!("request timed out after {secs} s"),
        )
    }

    /// The error event that ends a stream which ran past the server's stream timeout.
    pub fn stream_timeout(secs: f64) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            format!("stream timed out after {secs} s (the server's --stream-timeout); generation stopped"),
        );
        e.code = Some("timeout");
        e
    }

    /// 500: logs `detail` with the request id; the client sees only the id.
    pub fn internal(request_id: &str, detail: impl std::fmt::Display) -> ApiError {
        tracing::error!(request_id, error = %detail, "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("internal server error (request id {request_id})"),
        )
    }

    /// 500 for a blocking task of the gateway that panicked or was cancelled: the cause is
    /// logged, the client learns only which operation failed.
    pub fn task_failed(what: &str, err: tokio::task::JoinError) -> ApiError {
        tracing::error!(task = what, error = %err, "gateway task failed");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("internal server error: the {what} task failed"),
        )
    }

    /// The JSON body (also used inside SSE streams).
    pub fn body_json(&self) -> String {
        let b = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&b).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body_json(),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// A failed live rebalance: the placement's own faults (invalid, over the nodes' memory, written
/// for other nodes) are the caller's 400; a node that is down or failed to load is a 503. The
/// message names the node and the cause (what an operator needs), never internals.
impl From<crate::cluster::rebalance::RebalanceError> for ApiError {
    fn from(e: crate::cluster::rebalance::RebalanceError) -> ApiError {
        use crate::cluster::rebalance::RebalanceError as R;
        match e {
            R::Placement(_) | R::Capacity(_) | R::NodesChanged { .. } => {
                ApiError::invalid("placement", e.to_string())
            }
            other => {
                tracing::warn!(error = %other, "rebalance failed and was rolled back");
                ApiError::unavailable(other.to_string())
            }
        }
    }
}
