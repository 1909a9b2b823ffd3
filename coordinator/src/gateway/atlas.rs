//! ExpertAtlas endpoints: `GET /v1/atlas` (the live atlas as JSON), `GET /v1/admin/placement`
//! (the placement routing follows, as TOML) and `POST /v1/admin/placement` (a placement TOML
//! body; validated, then a live rebalance of the expert nodes; a failed one rolls back). Both sit behind
//! the /v1 API-key auth. `serve` registers what they act on once per process with `install`
//! (the gateway's `AppState` stays as it is); without it both answer 409.

use super::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nightshift_atlas::placement::{ModelShape, Placement};
use nightshift_coordinator::atlas_rec::AtlasRecorder;
use nightshift_coordinator::cluster::rebalance::RebalanceError;
use nightshift_coordinator::cluster::RemoteExperts;
use std::sync::{Arc, OnceLock};

/// What the atlas endpoints act on.
pub struct AtlasAdmin {
    pub recorder: Arc<AtlasRecorder>,
    /// The expert nodes; None when experts run in process.
    pub remote: Option<Arc<RemoteExperts>>,
    pub shape: ModelShape,
    /// One rebalance at a time.
    pub busy: tokio::sync::Mutex<()>,
}

static ADMIN: OnceLock<Arc<AtlasAdmin>> = OnceLock::new();

/// Registers the recorder and nodes of this process (first call wins).
pub fn install(admin: AtlasAdmin) {
    let _ = ADMIN.set(Arc::new(admin));
}

fn admin() -> Result<Arc<AtlasAdmin>, ApiError> {
    ADMIN.get().cloned().ok_or_else(|| {
        ApiError::route(
            StatusCode::CONFLICT,
            "the expert atlas is not recorded by this server",
        )
    })
}

/// `GET /v1/atlas`.
pub async fn get_atlas() -> Result<Response, ApiError> {
    let a = admin()?;
    let atlas = tokio::task::spawn_blocking(move || a.recorder.snapshot())
        .await
        .map_err(|e| ApiError::unavailable(format!("atlas snapshot failed: {e}")))?;
    Ok(axum::Json(atlas).into_response())
}

/// `GET /v1/admin/placement`: the placement routing follows now, as placement TOML (what
/// `POST` takes; node addresses are those the coordinator dials).
pub async fn get_placement() -> Result<Response, ApiError> {
    let a = admin()?;
    let Some(remote) = a.remote.clone() else {
        return Err(ApiError::route(
            StatusCode::CONFLICT,
            "experts run in process: there is no placement",
        ));
    };
    let text = remote.placement().to_toml_string();
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/toml")],
        text,
    )
        .into_response())
}

/// `POST /v1/admin/placement`: body = placement TOML.
pub async fn post_placement(body: String) -> Result<Response, ApiError> {
    let a = admin()?;
    let Some(remote) = a.remote.clone() else {
        return Err(ApiError::route(
            StatusCode::CONFLICT,
            "experts run in process: there are no expert nodes to rebalance",
        ));
    };
    let placement = Placement::from_toml_str(&body)
        .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
    placement
        .validate(&a.shape)
        .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
    let _one = a.busy.lock().await;
    let shape = a.shape.clone();
    // The rebalance blocks on its own gRPC runtime: off the async workers.
    let result = tokio::task::spawn_blocking(move || remote.rebalance(placement, &shape))
        .await
        .map_err(|e| ApiError::unavailable(format!("rebalance task failed: {e}")))?;
    match result {
        Ok(report) => {
            tracing::info!(?report, "placement applied");
            Ok(axum::Json(report).into_response())
        }
        Err(
            e @ (RebalanceError::Placement(_)
            | RebalanceError::Capacity(_)
            | RebalanceError::NodesChanged { .. }),
        ) => Err(ApiError::invalid("placement", e.to_string())),
        Err(e) => Err(ApiError::unavailable(e.to_string())),
    }
}
