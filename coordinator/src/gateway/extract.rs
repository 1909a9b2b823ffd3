//! `ApiJson<T>`: the JSON body extractor of the API. Unlike axum's `Json`, its rejection is an
//! `ApiError` in OpenAI's shape that names the offending field (`param`), found with
//! `serde_path_to_error`; a body over the limit is a 413, one that does not arrive within the
//! server's `body_timeout` a 408, and no content type is required (curl's `-d` sends
//! form-urlencoded by default).

use super::error::ApiError;
use super::AppState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// Default request body limit (bytes).
pub const BODY_LIMIT: usize = 4 << 20;

/// A JSON body deserialized into `T`.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        parse(&body_bytes(req, state).await?).map(ApiJson)
    }
}

/// A UTF-8 text body (`POST /v1/admin/placement` takes TOML); `param` names it in errors.
pub struct ApiText(pub String);

impl FromRequest<Arc<AppState>> for ApiText {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        match String::from_utf8(bytes.to_vec()) {
            Ok(s) => Ok(ApiText(s)),
            Err(e) => Err(ApiError::invalid(
                "body",
                format!(
                    "the body is not UTF-8 text: invalid byte at offset {}",
                    e.utf8_error().valid_up_to()
                ),
            )),
        }
    }
}

/// The whole body, within the limit and the time allowed: over the limit is a 413, too slow a
/// 408, in the API's error shape.
async fn body_bytes(req: Request, state: &Arc<AppState>) -> Result<Bytes, ApiError> {
    let limit = state.body_timeout;
    match tokio::time::timeout(limit, Bytes::from_request(req, state)).await {
        Err(_) => Err(ApiError::slow_body(limit.as_secs_f64())),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::too_large(BODY_LIMIT))
        }
        Ok(Err(e)) => Err(ApiError::malformed_json(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// Parses a body; errors name the field path (e.g. `messages[0].content`).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            use serde_json::error::Category;
            match inner.classify() {
                Category::Syntax | Category::Eof | Category::Io => Err(ApiError::malformed_json(
                    format!("the body is not valid JSON: {inner}"),
                )),
                Category::Data => {
                    // serde reports missing fields at the parent; name the field itself.
                    let msg = inner.to_string();
                    let param = match missing_field(&msg) {
                        Some(f) if path == "." || path.is_empty() => f.to_string(),
                        Some(f) => format!("{path}.{f}"),
                        None => path.clone(),
                    };
                    let param = if param == "." { String::new() } else { param };
                    let msg = strip_position(&msg);
                    let message = if param.is_empty() {
                        format!("invalid request body: {msg}")
                    } else {
                        format!("invalid value for `{param}`: {msg}")
                    };
                    Err(ApiError::invalid(param, message))
                }
            }
        }
    }
}

fn missing_field(msg: &str) -> Option<&str> {
    let rest = msg.strip_prefix("missing field `")?;
    rest.split('`').next()
}

/// Drops serde_json's " at line L column C" suffix (the field path says more).
fn strip_position(msg: &str) -> &str {
    match msg.rfind(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    }
}
