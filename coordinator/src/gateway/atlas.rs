//! ExpertAtlas endpoints: `GET /v1/atlas` (the live atlas as JSON), `GET /v1/admin/placement`
//! (the placement routing follows, as TOML) and `POST /v1/admin/placement` (a placement TOML
//! body; validated, then a live rebalance of the expert nodes, a failed one rolling back; in
//! process under `--memory-budget`, the placement's node names the new resident set). Both sit
//! behind the /v1 API-key auth and act on `AppState::atlas`; without it (no recorder: the toy
//! model, or a model without MoE layers) they answer 409.

use super::error::Body;
use super::extract::ApiText;
use super::openapi::BodyErrors;
use super::{ApiError, AppState};
use crate::atlas_rec::AtlasRecorder;
use crate::cluster::budget::resident_keys;
use crate::cluster::rebalance::RebalanceReport;
use crate::cluster::RemoteExperts;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nightshift_atlas_core::placement::{ModelShape, Placement};
use nightshift_model::resident::ExpertResidency;
use nightshift_model::Model;
use std::sync::Arc;

/// What the atlas endpoints act on.
pub struct AtlasAdmin {
    pub recorder: Arc<AtlasRecorder>,
    /// The expert nodes; None when experts run in process.
    pub remote: Option<Arc<RemoteExperts>>,
    /// In process under `--memory-budget`: the resident set a placement replaces, and the model
    /// its copies come from.
    pub residency: Option<(Arc<ExpertResidency>, Arc<Model>)>,
    pub shape: ModelShape,
    /// One rebalance at a time.
    pub busy: tokio::sync::Mutex<()>,
}

fn admin(state: &AppState) -> Result<Arc<AtlasAdmin>, ApiError> {
    state.atlas.clone().ok_or_else(|| {
        ApiError::route(
            StatusCode::CONFLICT,
            "the expert atlas is not recorded by this server",
        )
    })
}

/// `GET /v1/atlas`.
#[utoipa::path(
    get,
    path = "/v1/atlas",
    tag = "admin",
    responses(
        (status = 200, description = "The expert atlas recorded so far (the atlas file format)", body = Object),
        (status = 401, description = "Missing or wrong API key", body = Body),
        (status = 409, description = "This server records no atlas", body = Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn get_atlas(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let a = admin(&state)?;
    let atlas = tokio::task::spawn_blocking(move || a.recorder.snapshot())
        .await
        .map_err(|e| ApiError::task_failed("atlas snapshot", e))?;
    Ok(axum::Json(atlas).into_response())
}

/// `GET /v1/admin/placement`: the placement routing follows now, as placement TOML (what
/// `POST` takes; node addresses are those the coordinator dials).
#[utoipa::path(
    get,
    path = "/v1/admin/placement",
    tag = "admin",
    responses(
        (status = 200, description = "The placement in force", content_type = "application/toml", body = String),
        (status = 401, description = "Missing or wrong API key", body = Body),
        (status = 409, description = "No atlas, or experts run in process", body = Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn get_placement(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let a = admin(&state)?;
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
#[utoipa::path(
    post,
    path = "/v1/admin/placement",
    tag = "admin",
    request_body(description = "A placement file (TOML)", content(
        (String = "application/toml"),
        (String = "text/plain"),
    )),
    responses(
        (status = 200, description = "The rebalance report", body = Object),
        BodyErrors,
        (status = 409, description = "No atlas, or experts run in process", body = Body),
        (status = 503, description = "The rebalance failed and was rolled back", body = Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn post_placement(
    State(state): State<Arc<AppState>>,
    ApiText(body): ApiText,
) -> Result<Response, ApiError> {
    let a = admin(&state)?;
    let placement = Placement::from_toml_str(&body)
        .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
    placement
        .validate(&a.shape)
        .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
    let Some(remote) = a.remote.clone() else {
        let Some((residency, model)) = a.residency.clone() else {
            return Err(ApiError::route(
                StatusCode::CONFLICT,
                "experts run in process without --memory-budget: there is nothing to move",
            ));
        };
        // in process: the placement's one node names the resident set
        let resolved = placement
            .resolve(&a.shape)
            .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
        let keys = resident_keys(&resolved)
            .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
        let node = resolved.nodes[0].name.clone();
        let _one = a.busy.lock().await;
        let moved = tokio::task::spawn_blocking(move || residency.set(model.gguf(), &keys, None))
            .await
            .map_err(|e| ApiError::task_failed("resident set", e))?
            .map_err(|e| ApiError::invalid("placement", format!("placement: {e}")))?;
        tracing::info!(?moved, "resident set applied");
        let report = RebalanceReport {
            loaded: vec![(node.clone(), moved.loaded)],
            dropped: vec![(node, moved.dropped)],
        };
        return Ok(axum::Json(report).into_response());
    };
    let _one = a.busy.lock().await;
    let shape = a.shape.clone();
    // The rebalance blocks on its own gRPC runtime: off the async workers.
    let result = tokio::task::spawn_blocking(move || remote.rebalance(placement, &shape))
        .await
        .map_err(|e| ApiError::task_failed("rebalance", e))?;
    let report = result?;
    tracing::info!(?report, "placement applied");
    Ok(axum::Json(report).into_response())
}
