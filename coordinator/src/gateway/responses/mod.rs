//! OpenAI's Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`), what
//! the `openai-agents` SDK and Codex-style agents speak by default. A request's input items
//! (messages, function calls and their outputs, reasoning) become a chat request, which goes
//! through the chat pipeline unchanged (template, tools, structured output, think split,
//! prefix cache); its pieces become output items (`build`), whole or as the API's stream
//! events. Stored responses (`store`) let `previous_response_id` continue a conversation.

mod build;
pub(crate) mod convert;
pub mod store;
pub mod types;

use super::error::ApiError;
use super::extract::ApiJson;
use super::handlers::{chat_job, submit, Submitted};
use super::openapi::{BodyErrors, GenerationErrors};
use super::output::{pieces, OutputParser};
use super::stream::{deadline, named_events, next_event, step_error};
use super::{AppState, RequestId};
use crate::scheduler::{Event, FinishReason};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use build::Builder;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use types::*;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `POST /v1/responses`.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream`, server-sent events (`event: response.created`, `response.output_text.delta`, ..., `response.completed`), each `data` one JSON event", content(
            (ResponseObject = "application/json"),
            (crate::gateway::types::StreamEvent = "text/event-stream"),
        )),
        BodyErrors,
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn create(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let plan = convert::Plan::new(&req)?;
    let mut history = match &req.previous_response_id {
        None => Vec::new(),
        Some(id) => st.responses.conversation(id).map_err(|m| match m {
            store::Missing::Unknown => ApiError::invalid(
                "previous_response_id",
                format!("no stored response has id `{id}`"),
            ),
            store::Missing::Ancestor(a) => ApiError::invalid(
                "previous_response_id",
                format!(
                    "response `{a}`, earlier in the conversation of `{id}`, is no longer stored"
                ),
            ),
        })?,
    };
    let own = plan.input.clone();
    history.extend(own.iter().cloned());
    // `truncation: auto` drops the oldest turns until the conversation fits
    let mut skip = 0;
    let sub = loop {
        let chat = plan.chat_request(&req, &convert::from_turn(&history, skip))?;
        let attempt = match chat_job(&st, &rid, &chat).await {
            Ok(job) => submit(&st, &rid, job.budget_is_upper_bound(), "resp_"),
            Err(e) => Err(e),
        };
        match attempt {
            Err(e) if plan.truncate && e.code == Some("context_length_exceeded") => {
                match convert::next_turn(&history, skip) {
                    Some(next) => skip = next,
                    None => return Err(convert::rename(e)),
                }
            }
            other => break other.map_err(convert::rename)?,
        }
    };
    let shell = plan.shell(&req, sub.meta.id.clone(), now_secs());
    let answer = Answer {
        st: st.clone(),
        shell,
        own,
        store: plan.store,
        logprobs: plan.logprobs,
        names: plan.names.clone(),
    };
    if sub.stream {
        return Ok(answer.stream(sub).into_response());
    }
    let deadline = st.request_timeout;
    match tokio::time::timeout(deadline, answer.collect(sub)).await {
        Ok(Ok(r)) => Ok(Json(r).into_response()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::timeout(deadline.as_secs())),
    }
}

/// `GET /v1/responses/{id}`: a stored response.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}",
    tag = "openai",
    params(("id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The stored response", body = ResponseObject),
        (status = 401, description = "Missing or wrong API key", body = crate::gateway::error::Body),
        (status = 404, description = "No stored response has this id", body = crate::gateway::error::Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn get(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ResponseObject>, ApiError> {
    st.responses
        .get(&id)
        .map(Json)
        .ok_or_else(|| not_found(&id))
}

/// `GET /v1/responses/{id}/input_items`: a stored response's own input items, paged.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}/input_items",
    tag = "openai",
    params(("id" = String, Path, description = "The response's id"), InputItemsQuery),
    responses(
        (status = 200, description = "A page of the input items", body = InputItemList),
        (status = 400, description = "A bad `limit`, `order` or `after`", body = crate::gateway::error::Body),
        (status = 401, description = "Missing or wrong API key", body = crate::gateway::error::Body),
        (status = 404, description = "No stored response has this id", body = crate::gateway::error::Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn input_items(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<InputItemsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<InputItemList>, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::invalid("", e.body_text()))?;
    let mut items = st.responses.input(&id).ok_or_else(|| not_found(&id))?;
    let limit = match q.limit {
        None => 20,
        Some(n @ 1..=100) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "limit",
                format!("`limit` must be between 1 and 100, found {n}"),
            ))
        }
    };
    match q.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "order",
                format!("expected `asc` or `desc`, found `{other}`"),
            ))
        }
    }
    let start = match &q.after {
        None => 0,
        Some(after) => match items.iter().position(|it| it.id() == Some(after.as_str())) {
            Some(i) => i + 1,
            None => {
                return Err(ApiError::invalid(
                    "after",
                    format!("no input item of `{id}` has id `{after}`"),
                ))
            }
        },
    };
    let page: Vec<Item> = items.iter().skip(start).take(limit).cloned().collect();
    Ok(Json(InputItemList {
        object: "list",
        first_id: page.first().and_then(|i| i.id()).map(String::from),
        last_id: page.last().and_then(|i| i.id()).map(String::from),
        has_more: start + page.len() < items.len(),
        data: page,
    }))
}

/// `DELETE /v1/responses/{id}`.
#[utoipa::path(
    delete,
    path = "/v1/responses/{id}",
    tag = "openai",
    params(("id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "Deleted", body = ResponseDeleted),
        (status = 401, description = "Missing or wrong API key", body = crate::gateway::error::Body),
        (status = 404, description = "No stored response has this id", body = crate::gateway::error::Body),
    ),
    security((), ("api_key" = []))
)]
pub async fn delete(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ResponseDeleted>, ApiError> {
    if !st.responses.delete(&id) {
        return Err(not_found(&id));
    }
    Ok(Json(ResponseDeleted {
        id,
        object: "response.deleted",
        deleted: true,
    }))
}

fn not_found(id: &str) -> ApiError {
    let mut e = ApiError::route(
        StatusCode::NOT_FOUND,
        format!("no stored response has id `{id}`"),
    );
    e.param = Some("id".into());
    e
}

/// What a finished response needs besides its output.
struct Answer {
    st: Arc<AppState>,
    /// The response object without output and usage.
    shell: ResponseObject,
    /// This request's own input items (stored with the response).
    own: Vec<Item>,
    store: bool,
    logprobs: bool,
    names: convert::CallNames,
}

impl Answer {
    /// The finished response (status, output, usage); stored when asked.
    fn finish(
        &self,
        b: &mut Builder,
        finish: FinishReason,
        usage: crate::scheduler::Usage,
    ) -> ResponseObject {
        b.close();
        let mut r = self.shell.clone();
        r.output = b.output.clone();
        if finish == FinishReason::Length {
            r.status = "incomplete";
            r.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens",
            });
        } else {
            r.status = "completed";
        }
        r.usage = Some(ResponseUsage {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: b.reasoning_tokens.min(usage.completion_tokens),
            },
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        });
        if self.store {
            self.st.responses.put(r.clone(), self.own.clone());
        }
        r
    }

    /// One scheduler event into the builder; Some(response) when it finished it.
    fn absorb(
        &self,
        b: &mut Builder,
        parser: &mut Option<OutputParser>,
        ev: Event,
    ) -> Result<Option<ResponseObject>, crate::scheduler::StepError> {
        match ev {
            Event::Token { text, logprob } => {
                let pieces = pieces(parser, &text);
                b.token(pieces, logprob.as_ref());
                Ok(None)
            }
            Event::Done {
                text,
                finish,
                usage,
                ..
            } => {
                let pieces = pieces(parser, &text);
                b.pieces(pieces, None);
                if let Some(p) = parser {
                    b.pieces(p.finish(), None);
                }
                Ok(Some(self.finish(b, finish, usage)))
            }
            Event::Failed(e) => Err(e),
        }
    }

    async fn collect(self, mut sub: Submitted) -> Result<ResponseObject, ApiError> {
        let mut b = Builder::new(false, self.logprobs, self.names.clone());
        loop {
            let ev = next_event(&mut sub.rx, &sub.meta, None).await?;
            match self.absorb(&mut b, &mut sub.output, ev) {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => return Err(step_error(&sub.meta, &e)),
            }
        }
    }

    /// The SSE stream: `response.created`, `response.in_progress`, the items' events, then
    /// `response.completed` (or `response.incomplete`); a failure sends `error` and
    /// `response.failed`. The server's stream timeout ends it the same way.
    fn stream(
        self,
        sub: Submitted,
    ) -> Sse<impl futures::Stream<Item = Result<SseEvent, Infallible>>> {
        let deadline = deadline(self.st.stream_timeout);
        let mut b = Builder::new(true, self.logprobs, self.names.clone());
        let mut shell = self.shell.clone();
        shell.status = "in_progress";
        b.event("response.created", json!({ "response": shell }));
        b.event("response.in_progress", json!({ "response": shell }));
        let first = b.take_events();
        let state = (self, sub, b, false);
        let rest = futures::stream::unfold(state, move |(ans, mut sub, mut b, done)| async move {
            if done {
                return None;
            }
            let ev = next_event(&mut sub.rx, &sub.meta, deadline).await;
            let absorbed = ev.and_then(|ev| {
                ans.absorb(&mut b, &mut sub.output, ev)
                    .map_err(|e| step_error(&sub.meta, &e))
            });
            let done = match absorbed {
                Ok(None) => false,
                Ok(Some(r)) => {
                    let kind = if r.status == "incomplete" {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    b.event(kind, json!({ "response": r }));
                    true
                }
                Err(e) => {
                    ans.failed(&mut b, e);
                    true
                }
            };
            let out = b.take_events();
            Some((out, (ans, sub, b, done)))
        });
        Sse::new(named_events(first, rest))
    }

    /// `error` then `response.failed` (status `failed`, the error in the response).
    fn failed(&self, b: &mut Builder, e: ApiError) {
        b.close();
        let code = e.code.unwrap_or(e.kind);
        b.event(
            "error",
            json!({"code": code, "message": e.message, "param": e.param}),
        );
        let mut r = self.shell.clone();
        r.status = "failed";
        r.output = b.output.clone();
        r.error = Some(json!({"code": code, "message": e.message}));
        b.event("response.failed", json!({ "response": r }));
    }
}
