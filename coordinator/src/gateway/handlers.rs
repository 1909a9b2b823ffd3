//! The route handlers: `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//! `/v1/admin/kv`, `/health`, `/ready`, `/metrics`. Each validates at the edge (`convert`), submits one `GenRequest` to the
//! scheduler and answers with a JSON body or an SSE stream (`stream`).

use super::convert::{self, Checked, Prompt};
use super::error::{ApiError, Body};
use super::extract::ApiJson;
use super::openapi::{BodyErrors, GenerationErrors};
use super::output::OutputParser;
use super::stream::{self, Kind, Meta};
use super::tools;
use super::types::*;
use super::{AppState, RequestId};
use crate::scheduler::{ChatPrompt, GenRequest, SubmitError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nightshift_model::constrain::SeqConstraint;
use nightshift_model::reasoning::{ends_inside_think, ThinkSplit};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What differs between chat and completions once the prompt is tokenized.
pub(super) struct Job {
    kind: Kind,
    pub prompt: Vec<u32>,
    asked_max: Option<u32>,
    default_max: Option<u32>,
    logprobs: Option<u32>,
    checked: Checked,
    user: Option<String>,
    /// The grammar the output follows (tools forced, response_format).
    constraint: Option<SeqConstraint>,
    /// Splits the output into reasoning, content and tool calls (chat).
    output: Option<OutputParser>,
    /// OpenAI's `prediction`, tokenized (a drafter lookup source).
    prediction: Vec<u32>,
}

/// The fields every generating request shares, checked against this server's model.
fn check_common(st: &AppState, c: &Common) -> Result<Checked, ApiError> {
    convert::check_common(c, &st.model_id, &st.model_aliases, st.text.vocab_size())
}

impl Job {
    /// Takes the asked output budget as an upper bound: when the prompt leaves less room in the
    /// context, generation stops there (`max_tokens` reached) instead of the request failing.
    /// The Responses and Messages APIs' agents ask for a fixed large budget (Claude Code 32k)
    /// whatever the prompt's length, as llama-server allows.
    pub(super) fn budget_is_upper_bound(mut self) -> Job {
        if let Some(asked) = self.asked_max.filter(|&n| n > 0) {
            self.asked_max = None;
            self.default_max = Some(asked);
        }
        self
    }
}

/// `POST /v1/chat/completions`.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The completion; with `stream`, server-sent events of `ChatChunk`s ending in `[DONE]`", content(
            (ChatCompletion = "application/json"),
            (StreamEvent = "text/event-stream"),
        )),
        BodyErrors,
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn chat(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let job = chat_job(&st, &rid, &req).await?;
    run(st, rid, job).await
}

/// A chat request checked, rendered through the chat template and tokenized: the job both
/// `/v1/chat/completions` and `/v1/responses` (which converts its input into a chat request)
/// submit.
pub(super) async fn chat_job(
    st: &Arc<AppState>,
    rid: &RequestId,
    req: &ChatRequest,
) -> Result<Job, ApiError> {
    let checked = check_common(st.as_ref(), &req.common())?;
    let turns = convert::chat_turns(&req.messages)?;
    let plan = tools::plan(req)?;
    let format = tools::output_grammar(req.response_format.as_ref(), req.grammar.as_deref())?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(n)) if n > convert::MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!(
                    "`top_logprobs` must be between 0 and {}, found {n}",
                    convert::MAX_TOP_LOGPROBS
                ),
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs` set to true",
            ))
        }
        (true, n) => Some(n.unwrap_or(0)),
        (false, None) => None,
    };
    let chat = ChatPrompt {
        messages: turns,
        tools: plan.as_ref().map(|p| p.tools_json.clone()),
        extra: template_kwargs(req)?,
    };
    let has_format = format.is_some();
    // A JSON response format or a forced call constrains the output from its first token:
    // there is no think block to split off, and all of it is the answer.
    let structured = matches!(format, Some((_, "response_format")))
        || plan
            .as_ref()
            .is_some_and(|p| matches!(p.choice, tools::Choice::Required | tools::Choice::Named(_)));
    let asked = req.reasoning_format.and_then(ReasoningFormat::split);
    let think = st.text.splits_reasoning(asked) && !structured;
    let constraint = tools::constraint(plan.as_ref(), format, st.text.as_ref())?;
    let tool_stream = plan.as_ref().and_then(|p| {
        let constrained = tools::constrains_calls(p, has_format, st.text.as_ref());
        tools::ToolStream::new(p, st.text.tool_format(), constrained)
    });
    let bytes = chat.messages.iter().map(|m| m.content.len()).sum();
    convert::cheap_bound(
        "messages",
        bytes,
        st.text.max_token_bytes(),
        st.scheduler.options().n_ctx,
    )?;
    let predicted = convert::prediction_text(req.prediction.as_ref())?;
    convert::cheap_bound(
        "prediction",
        predicted.len(),
        st.text.max_token_bytes(),
        st.scheduler.options().n_ctx,
    )?;
    let text = st.text.clone();
    let (prompt, prediction) = off_runtime(rid, move || {
        let prediction = text.encode(&predicted, false);
        (text.tokenize_chat(&chat), prediction)
    })
    .await?;
    let prompt = prompt.map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("could not render the chat template: {e}"),
        )
    })?;
    // a template may open the think block in the prompt (DeepSeek-R1's `<think>\n`)
    let think = think.then(|| {
        let tail: Vec<u8> = prompt[prompt.len().saturating_sub(8)..]
            .iter()
            .flat_map(|&t| st.text.token_bytes(t))
            .collect();
        ThinkSplit::new(ends_inside_think(&String::from_utf8_lossy(&tail)))
    });
    let job = Job {
        kind: Kind::Chat,
        prompt,
        asked_max: req.max_completion_tokens.or(req.max_tokens),
        default_max: None,
        logprobs,
        checked,
        user: req.user.clone(),
        constraint,
        output: OutputParser::new(think, tool_stream),
        prediction,
    };
    Ok(job)
}

/// The chat template's extra variables: `chat_template_kwargs`, with `reasoning_effort`'s
/// thinking switch where it does not set one.
fn template_kwargs(
    req: &ChatRequest,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ApiError> {
    let effort = convert::effort_thinking("reasoning_effort", req.reasoning_effort.as_deref())?;
    Ok(match effort {
        None => req.chat_template_kwargs.clone(),
        Some(on) => Some(convert::with_thinking(req.chat_template_kwargs.clone(), on)),
    })
}

/// `POST /apply-template` (llama.cpp's extension): the prompt a chat request renders to, with
/// tools and tool messages, without generating.
#[utoipa::path(
    post,
    path = "/apply-template",
    tag = "extensions",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The prompt text: `{\"prompt\": ..}`", body = Object),
        BodyErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn apply_template(
    State(st): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let turns = convert::chat_turns(&req.messages)?;
    let plan = tools::plan(&req)?;
    let chat = ChatPrompt {
        messages: turns,
        tools: plan.as_ref().map(|p| p.tools_json.clone()),
        extra: template_kwargs(&req)?,
    };
    let prompt = st.text.render_chat(&chat).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("could not render the chat template: {e}"),
        )
    })?;
    Ok(Json(serde_json::json!({ "prompt": prompt })).into_response())
}

/// `POST /v1/completions`.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream`, server-sent events of `Completion` chunks ending in `[DONE]`", content(
            (Completion = "application/json"),
            (StreamEvent = "text/event-stream"),
        )),
        BodyErrors,
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn completions(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let checked = check_common(st.as_ref(), &req.common())?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "`echo` is not supported"));
    }
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    if let Some(n) = req.logprobs {
        if n > convert::MAX_COMPLETION_LOGPROBS {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "`logprobs` must be between 0 and {}, found {n}",
                    convert::MAX_COMPLETION_LOGPROBS
                ),
            ));
        }
    }
    // the prompt's tokens, and the text's length in bytes (None: token ids)
    let (prompt, text_len) = match convert::single_prompt(&req.prompt)? {
        Prompt::Text(t) => {
            convert::cheap_bound(
                "prompt",
                t.len(),
                st.text.max_token_bytes(),
                st.scheduler.options().n_ctx,
            )?;
            let (text, len) = (st.text.clone(), t.len());
            (
                off_runtime(&rid, move || text.encode(&t, false)).await?,
                Some(len),
            )
        }
        Prompt::Tokens(ids) => {
            let vocab = st.text.vocab_size() as u32;
            if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is out of range: the vocabulary has {vocab} tokens"),
                ));
            }
            (ids, None)
        }
    };
    if prompt.is_empty() {
        return Err(convert::empty_prompt(text_len));
    }
    let job = Job {
        kind: Kind::Completion,
        prompt,
        asked_max: req.max_tokens,
        default_max: Some(16),
        logprobs: req.logprobs,
        checked,
        user: req.user.clone(),
        constraint: None,
        output: None,
        prediction: Vec::new(),
    };
    run(st, rid, job).await
}

/// Runs tokenizing or template rendering of request data on tokio's blocking pool, at most as
/// many at a time as the machine has cores: hostile prompts never occupy the async workers that
/// answer `/health` and stream tokens.
async fn off_runtime<T: Send + 'static>(
    rid: &RequestId,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    let permits = PERMITS.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    });
    let _permit = permits
        .acquire()
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(&rid.0, format!("tokenizing task failed: {e}")))
}

/// Submits a job and answers it (stream or body).
async fn run(st: Arc<AppState>, rid: RequestId, job: Job) -> Result<Response, ApiError> {
    let prefix = if job.kind == Kind::Chat {
        "chatcmpl-"
    } else {
        "cmpl-"
    };
    let sub = submit(&st, &rid, job, prefix)?;
    if sub.stream {
        return Ok(stream::sse(sub.meta, sub.rx, st.stream_timeout, sub.output).into_response());
    }
    let collected = stream::collect(&sub.meta, sub.rx, sub.output);
    match tokio::time::timeout(st.request_timeout, collected).await {
        Ok(Ok(v)) => Ok(Json(v).into_response()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::timeout(st.request_timeout.as_secs())),
    }
}

/// A job in the scheduler's queue: the answer's identity and where its events arrive.
pub(super) struct Submitted {
    pub meta: Meta,
    pub rx: mpsc::UnboundedReceiver<crate::scheduler::Event>,
    pub output: Option<OutputParser>,
    pub stream: bool,
    /// The prompt's length in tokens.
    pub prompt_tokens: u32,
}

/// Checks the server can take a job, its token budget, and queues it; `prefix` starts the
/// answer's id (`chatcmpl-`, `cmpl-`, `resp_`).
pub(super) fn submit(
    st: &AppState,
    rid: &RequestId,
    job: Job,
    prefix: &str,
) -> Result<Submitted, ApiError> {
    if st.draining.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    if let Err(e) = (st.nodes_ok)() {
        tracing::warn!(request_id = %rid.0, error = %e, "refusing request: expert nodes unavailable");
        return Err(ApiError::unavailable(
            "the expert nodes are unavailable; retry later",
        ));
    }
    let n_ctx = st.scheduler.options().n_ctx;
    let param = if job.kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    let max_tokens = convert::max_tokens(
        param,
        job.asked_max,
        job.default_max,
        job.prompt.len(),
        n_ctx,
    )?;
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens = job.prompt.len() as u32;
    let meta = Meta {
        kind: job.kind,
        id: format!("{prefix}{}", uuid::Uuid::new_v4().simple()),
        request_id: rid.0.clone(),
        created: now_secs(),
        model: st.model_id.clone(),
        fingerprint: st.fingerprint.clone(),
        logprobs: job.logprobs,
        include_usage: job.checked.include_usage,
    };
    let output = job.output;
    tracing::info!(request_id = %rid.0, prompt_tokens = job.prompt.len(), max_tokens, stream = job.checked.stream, user = job.user.as_deref().unwrap_or(""), "generation queued");
    let req = GenRequest {
        id: rid.0.clone(),
        prompt: job.prompt,
        max_tokens,
        sampling: job.checked.sampling,
        stop: job.checked.stop,
        logprobs: job.logprobs,
        ignore_eos: job.checked.ignore_eos,
        constraint: job.constraint,
        cache_prompt: job.checked.cache_prompt,
        speculative: job.checked.speculative,
        prediction: job.prediction,
        events: tx,
        enqueued: Instant::now(),
    };
    match st.scheduler.submit(req) {
        Ok(()) => {}
        Err(SubmitError::QueueFull) => {
            metrics::counter!("nightshift_rejected_total", "reason" => "queue_full").increment(1);
            return Err(ApiError::queue_full());
        }
        Err(SubmitError::Stopped) => {
            return Err(ApiError::unavailable("the engine is not running"))
        }
    }
    Ok(Submitted {
        meta,
        rx,
        output,
        stream: job.checked.stream,
        prompt_tokens,
    })
}

/// `GET /v1/models`: the served model.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    responses(
        (status = 200, description = "The served model", body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn models(State(st): State<Arc<AppState>>) -> Json<ModelList> {
    let names = std::iter::once(&st.model_id).chain(&st.model_aliases);
    Json(ModelList {
        object: "list",
        data: names
            .map(|id| ModelCard {
                id: id.clone(),
                object: "model",
                created: st.created,
                owned_by: "nightshift",
            })
            .collect(),
    })
}

/// `GET /v1/admin/kv`: the KV cache's pool (blocks used, cached, free) and the prefix cache's
/// hits, as of the engine's last step.
#[utoipa::path(
    get,
    path = "/v1/admin/kv",
    tag = "admin",
    responses(
        (status = 200, description = "The KV cache and prefix cache statistics", body = Object),
        (status = 401, description = "Missing or wrong API key", body = Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn admin_kv(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let kv = st.scheduler.kv_stats();
    let hit_rate = if kv.lookup_tokens > 0 {
        kv.hit_tokens as f64 / kv.lookup_tokens as f64
    } else {
        0.0
    };
    // what the pool's buffers hold per position, next to the layout's theoretical figure
    let measured = if kv.allocated_blocks > 0 && kv.block > 0 {
        kv.allocated_bytes as f64 / (kv.allocated_blocks * kv.block) as f64
    } else {
        0.0
    };
    Json(serde_json::json!({
        "object": "kv_cache",
        "kv_type": kv.kv_type.name(),
        "block_tokens": kv.block,
        "bytes_per_token": kv.bytes_per_token,
        "bytes_per_block": kv.bytes_per_block,
        "capacity_blocks": kv.capacity_blocks,
        "capacity_bytes": kv.capacity_blocks * kv.bytes_per_block,
        "allocated_blocks": kv.allocated_blocks,
        "allocated_bytes": kv.allocated_bytes,
        "measured_bytes_per_token": measured,
        "used_blocks": kv.used_blocks,
        "cached_blocks": kv.cached_blocks,
        "free_blocks": kv.free_blocks,
        "reserved_blocks": kv.reserved_blocks,
        "sequences": kv.sequences,
        "positions": kv.positions,
        "prefix_cache": {
            "enabled": kv.prefix_cache,
            "lookups": kv.lookups,
            "lookup_tokens": kv.lookup_tokens,
            "hit_tokens": kv.hit_tokens,
            "hit_rate": hit_rate,
            "evictions": kv.evictions,
            "attached_tokens": kv.attached_tokens,
            "pending_blocks": kv.pending_blocks,
        },
        "disk": {
            "files": kv.disk.files,
            "bytes": kv.disk.bytes,
            "written_blocks": kv.disk.written,
            "loaded_blocks": kv.disk.loaded,
            "rejected_files": kv.disk.rejected,
            "removed_files": kv.disk.removed,
        },
    }))
}

/// `GET /health`: the process answers.
#[utoipa::path(
    get,
    path = "/health",
    tag = "ops",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Object))
)]
pub async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Ready = engine running and not stuck in one step, expert nodes reachable and not shutting
/// down.
#[utoipa::path(
    get,
    path = "/ready",
    tag = "ops",
    responses(
        (status = 200, description = "Ready: `{\"status\": \"ready\", \"model\": ..}`", body = Object),
        (status = 503, description = "Not ready: `{\"status\": \"not ready\", \"reason\": ..}`", body = Object),
    )
)]
pub async fn ready(State(st): State<Arc<AppState>>) -> Response {
    let problem = if st.draining.load(Ordering::Relaxed) {
        Some("shutting down".to_string())
    } else if !st.scheduler.is_running() {
        Some("engine not running".to_string())
    } else if let Some(d) = st
        .scheduler
        .step_running_for()
        .filter(|d| *d > st.stall_after)
    {
        Some(format!(
            "engine stalled: one step has run for {:.0} s (--stall-timeout {} s)",
            d.as_secs_f64(),
            st.stall_after.as_secs()
        ))
    } else {
        (st.nodes_ok)().err()
    };
    match problem {
        None => {
            Json(serde_json::json!({ "status": "ready", "model": st.model_id })).into_response()
        }
        Some(p) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": "not ready", "reason": p })),
        )
            .into_response(),
    }
}

/// `GET /metrics`: Prometheus text.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "ops",
    responses(
        (status = 200, description = "Prometheus exposition text", content_type = "text/plain", body = String),
        (status = 401, description = "Missing or wrong API key (unless --metrics-public)", body = Body),
        (status = 404, description = "Metrics are not enabled", body = Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    match &st.metrics {
        Some(h) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            h.render(),
        )
            .into_response(),
        None => ApiError::route(StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}
