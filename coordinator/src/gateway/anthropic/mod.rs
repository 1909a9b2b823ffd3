//! The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), what
//! Claude Code and the `anthropic` SDK speak (`ANTHROPIC_BASE_URL`). A request becomes a chat
//! request (`convert.rs`) and runs the chat pipeline unchanged; the answer is content blocks
//! (`thinking`, `text`, `tool_use`) from the same blocks the Responses API uses
//! (`segments`), whole or as Anthropic's stream events. Errors answer in Anthropic's shape.

mod convert;
pub mod types;

use super::error::ApiError;
use super::extract::ApiJson;
use super::handlers::{chat_job, submit, Submitted};
use super::openapi::GenerationErrors;
use super::output::{pieces, OutputParser};
use super::segments::{Block, Seg, Segmenter};
use super::stream::{deadline, named_events, next_event, step_error};
use super::tools::Piece;
use super::{AppState, RequestId};
use crate::scheduler::{Event, FinishReason};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{extract::State, Extension, Json};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use types::*;

/// An `ApiError` answered in Anthropic's error shape.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

fn error_body(e: &ApiError) -> ErrorOut {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    ErrorOut {
        kind: "error",
        error: ErrorDetailOut {
            kind: error_type(e.status),
            message,
        },
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut r = (self.0.status, Json(error_body(&self.0))).into_response();
        if let Some(s) = self.0.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// Errors of the Anthropic endpoints (the document's list; the bodies are `ErrorOut`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum MessagesErrors {
    /// A request field is missing, malformed or out of range
    #[response(status = 400)]
    Invalid(ErrorOut),
    /// Missing or wrong API key (`x-api-key` or `Authorization: Bearer`)
    #[response(status = 401)]
    Unauthorized(super::error::Body<'static>),
    /// The body did not arrive within --body-timeout
    #[response(status = 408)]
    SlowBody(super::error::Body<'static>),
    /// The body is larger than the server takes
    #[response(status = 413)]
    TooLarge(super::error::Body<'static>),
}

/// `POST /v1/messages`.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "The message; with `stream`, server-sent events (`message_start`, `content_block_start`, `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`)", content(
            (MessageOut = "application/json"),
            (crate::gateway::types::StreamEvent = "text/event-stream"),
        )),
        MessagesErrors,
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn messages(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    body: Result<ApiJson<MessagesRequest>, ApiError>,
) -> Result<Response, AnthropicError> {
    let ApiJson(req) = body?;
    let chat = convert::chat_request(&req, false)?;
    let job = chat_job(&st, &rid, &chat).await?;
    let sub = submit(&st, &rid, job.budget_is_upper_bound(), "msg_")?;
    let shell = MessageOut {
        id: sub.meta.id.clone(),
        kind: "message",
        role: "assistant",
        model: st.model_id.clone(),
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage: MessageUsage {
            input_tokens: sub.prompt_tokens,
            output_tokens: 0,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
        },
    };
    if sub.stream {
        return Ok(stream(shell, sub, st.stream_timeout).into_response());
    }
    let deadline = st.request_timeout;
    match tokio::time::timeout(deadline, collect(shell, sub)).await {
        Ok(Ok(m)) => Ok(Json(m).into_response()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ApiError::timeout(deadline.as_secs()).into()),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's length as the chat template renders it.
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    tag = "anthropic",
    request_body = CountTokensRequest,
    responses(
        (status = 200, description = "The prompt's tokens", body = TokenCount),
        MessagesErrors,
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    body: Result<ApiJson<CountTokensRequest>, ApiError>,
) -> Result<Json<TokenCount>, AnthropicError> {
    let ApiJson(CountTokensRequest(req)) = body?;
    let chat = convert::chat_request(&req, true)?;
    let job = chat_job(&st, &rid, &chat).await?;
    Ok(Json(TokenCount {
        input_tokens: job.prompt.len() as u32,
    }))
}

/// The answer's content blocks as they are generated, with the stream's events.
struct Builder {
    content: Vec<BlockOut>,
    /// The open tool_use block's arguments text (its `input` once closed).
    args: String,
    seg: Segmenter,
    events: Vec<(&'static str, Value)>,
    emit: bool,
}

impl Builder {
    fn new(emit: bool) -> Builder {
        Builder {
            content: Vec::new(),
            args: String::new(),
            seg: Segmenter::default(),
            events: Vec::new(),
            emit,
        }
    }

    fn event(&mut self, kind: &'static str, mut body: Value) {
        if !self.emit {
            return;
        }
        if let Some(m) = body.as_object_mut() {
            m.insert("type".into(), json!(kind));
        }
        self.events.push((kind, body));
    }

    fn pieces(&mut self, pieces: Vec<Piece>) {
        let segs = self.seg.push(pieces);
        self.apply(segs);
    }

    fn close(&mut self) {
        let segs = self.seg.finish();
        self.apply(segs);
    }

    fn apply(&mut self, segs: Vec<Seg>) {
        for s in segs {
            let index = self.content.len().saturating_sub(1);
            match s {
                Seg::Open(b) => {
                    let block = match b {
                        Block::Text => BlockOut::Text {
                            text: String::new(),
                        },
                        Block::Reasoning => BlockOut::Thinking {
                            thinking: String::new(),
                            signature: String::new(),
                        },
                        Block::Call { id, name } => BlockOut::ToolUse {
                            id,
                            name,
                            input: json!({}),
                        },
                    };
                    self.args.clear();
                    let shown = serde_json::to_value(&block).unwrap_or(Value::Null);
                    self.content.push(block);
                    self.event(
                        "content_block_start",
                        json!({"index": self.content.len() - 1, "content_block": shown}),
                    );
                }
                Seg::Text(t) => {
                    let delta = match self.content.last_mut() {
                        Some(BlockOut::Text { text }) => {
                            text.push_str(&t);
                            json!({"type": "text_delta", "text": t})
                        }
                        Some(BlockOut::Thinking { thinking, .. }) => {
                            thinking.push_str(&t);
                            json!({"type": "thinking_delta", "thinking": t})
                        }
                        Some(BlockOut::ToolUse { .. }) => {
                            self.args.push_str(&t);
                            json!({"type": "input_json_delta", "partial_json": t})
                        }
                        None => continue,
                    };
                    self.event(
                        "content_block_delta",
                        json!({"index": index, "delta": delta}),
                    );
                }
                Seg::Close => {
                    if let Some(BlockOut::ToolUse { input, .. }) = self.content.last_mut() {
                        // the parser's arguments are a JSON object; anything else is kept as
                        // the one field a client can still read
                        *input = match serde_json::from_str::<Value>(&self.args) {
                            Ok(v @ Value::Object(_)) => v,
                            _ => json!({ "arguments": self.args }),
                        };
                    }
                    if let Some(BlockOut::Thinking { .. }) = self.content.last() {
                        self.event(
                            "content_block_delta",
                            json!({"index": index,
                                "delta": {"type": "signature_delta", "signature": ""}}),
                        );
                    }
                    self.event("content_block_stop", json!({ "index": index }));
                }
            }
        }
    }
}

/// How a message ended.
struct Finished {
    reason: &'static str,
    /// The stop sequence that ended it (`stop_sequence`).
    stop: Option<String>,
    usage: MessageUsage,
}

/// Feeds one event; Some when the generation finished.
fn absorb(
    b: &mut Builder,
    parser: &mut Option<OutputParser>,
    ev: Event,
) -> Result<Option<Finished>, crate::scheduler::StepError> {
    match ev {
        Event::Token { text, .. } => {
            let p = pieces(parser, &text);
            b.pieces(p);
            Ok(None)
        }
        Event::Done {
            text,
            finish,
            usage,
            stop,
        } => {
            let p = pieces(parser, &text);
            b.pieces(p);
            if let Some(parser) = parser {
                b.pieces(parser.finish());
            }
            b.close();
            let calls = b
                .content
                .iter()
                .any(|c| matches!(c, BlockOut::ToolUse { .. }));
            let reason = match finish {
                FinishReason::Length => "max_tokens",
                FinishReason::Stop if calls => "tool_use",
                FinishReason::Stop if stop.is_some() => "stop_sequence",
                FinishReason::Stop => "end_turn",
            };
            let usage = MessageUsage {
                input_tokens: usage.prompt_tokens - usage.cached_tokens.min(usage.prompt_tokens),
                output_tokens: usage.completion_tokens,
                cache_read_input_tokens: usage.cached_tokens,
                cache_creation_input_tokens: 0,
            };
            Ok(Some(Finished {
                reason,
                stop: stop.filter(|_| reason == "stop_sequence"),
                usage,
            }))
        }
        Event::Failed(e) => Err(e),
    }
}

async fn collect(mut m: MessageOut, mut sub: Submitted) -> Result<MessageOut, ApiError> {
    let mut b = Builder::new(false);
    loop {
        let ev = next_event(&mut sub.rx, &sub.meta, None).await?;
        match absorb(&mut b, &mut sub.output, ev) {
            Ok(None) => {}
            Ok(Some(f)) => {
                m.content = b.content;
                m.stop_reason = Some(f.reason);
                m.stop_sequence = f.stop;
                m.usage = f.usage;
                return Ok(m);
            }
            Err(e) => return Err(step_error(&sub.meta, &e)),
        }
    }
}

/// The event stream: `message_start`, each block's `content_block_start` / `_delta` /
/// `_stop`, then `message_delta` (stop reason, usage) and `message_stop`; a failure or the
/// server's stream timeout sends an `error` event and ends it (which cancels the sequence).
fn stream(
    shell: MessageOut,
    sub: Submitted,
    timeout: Option<std::time::Duration>,
) -> Sse<impl futures::Stream<Item = Result<SseEvent, Infallible>>> {
    let deadline = deadline(timeout);
    let mut b = Builder::new(true);
    b.event("message_start", json!({ "message": shell }));
    let first = std::mem::take(&mut b.events);
    let rest = futures::stream::unfold((sub, b, false), move |(mut sub, mut b, done)| async move {
        if done {
            return None;
        }
        let ev = next_event(&mut sub.rx, &sub.meta, deadline).await;
        let absorbed = ev.and_then(|ev| {
            absorb(&mut b, &mut sub.output, ev).map_err(|e| step_error(&sub.meta, &e))
        });
        let done = match absorbed {
            Ok(None) => false,
            Ok(Some(f)) => {
                b.event(
                    "message_delta",
                    json!({"delta": {"stop_reason": f.reason, "stop_sequence": f.stop},
                        "usage": f.usage}),
                );
                b.event("message_stop", json!({}));
                true
            }
            Err(e) => {
                b.event("error", json!({"error": error_body(&e).error}));
                true
            }
        };
        let out = std::mem::take(&mut b.events);
        Some((out, (sub, b, done)))
    });
    Sse::new(named_events(first, rest)).keep_alive(
        KeepAlive::new().event(
            SseEvent::default()
                .event("ping")
                .data("{\"type\": \"ping\"}"),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::segments::test_call;

    #[test]
    fn blocks_and_their_events() {
        let mut b = Builder::new(true);
        b.pieces(vec![
            Piece::Reasoning("hm".into()),
            Piece::Content("Hi".into()),
            Piece::CallStart {
                index: 0,
                call: test_call("c", "f", ""),
            },
            Piece::CallArgs {
                index: 0,
                text: "{\"a\":".into(),
            },
            Piece::CallArgs {
                index: 0,
                text: "1}".into(),
            },
        ]);
        b.close();
        let shown = serde_json::to_value(&b.content).unwrap();
        assert_eq!(
            shown,
            json!([{"type": "thinking", "thinking": "hm", "signature": ""},
                   {"type": "text", "text": "Hi"},
                   {"type": "tool_use", "id": "c", "name": "f", "input": {"a": 1}}])
        );
        let kinds: Vec<&str> = b.events.iter().map(|e| e.0).collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "content_block_start")
                .count(),
            3
        );
        assert_eq!(
            kinds.iter().filter(|k| **k == "content_block_stop").count(),
            3
        );
        let json: String = b
            .events
            .iter()
            .filter_map(|e| e.1["delta"]["partial_json"].as_str())
            .collect();
        assert_eq!(json, "{\"a\":1}");
        for e in &b.events {
            assert_eq!(e.1["type"], e.0);
        }
    }
}
