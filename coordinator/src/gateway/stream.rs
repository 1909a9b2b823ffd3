//! Turning a request's scheduler events into OpenAI responses: collected into one JSON body, or
//! streamed as SSE chunks (`data: {...}` ... `data: [DONE]`) for chat and legacy completions.
//! Dropping the stream (client gone) drops the receiver, which cancels the sequence.
//! Chat text goes through an `OutputParser` first when the model thinks or the request has
//! tools: a leading think block as `message.reasoning_content` (`delta.reasoning_content`),
//! content as content, each parsed call as `message.tool_calls[]` (or, streaming, a
//! `delta.tool_calls` chunk with id, type and name, then one with the arguments), and
//! `finish_reason` `tool_calls`.

use super::error::ApiError;
use super::output::OutputParser;
use super::tools::Piece;
use super::types::*;
use crate::scheduler::{Event, FinishReason, StepError, TokenLogprob};
use axum::response::sse::{Event as SseEvent, Sse};
use futures::{stream, Stream, StreamExt};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

/// Which endpoint the response is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Chat,
    Completion,
}

/// The fixed parts of every response object.
#[derive(Clone, Debug)]
pub struct Meta {
    pub kind: Kind,
    pub id: String,
    pub request_id: String,
    pub created: u64,
    pub model: String,
    pub fingerprint: String,
    /// Some(n) when logprobs were asked (n alternatives).
    pub logprobs: Option<u32>,
    pub include_usage: bool,
}

impl Meta {
    /// A `chat.completion.chunk` with this request's identity.
    fn chat_chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Option<Usage>>) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices,
            usage,
        }
    }

    /// A `text_completion` (whole response or stream chunk) with this request's identity.
    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
    ) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices,
            usage,
        }
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(super) fn chat_logprob(t: &TokenLogprob) -> ChatTokenLogprob {
    ChatTokenLogprob {
        token: lossy(&t.bytes),
        logprob: t.logprob,
        bytes: t.bytes.clone(),
        top_logprobs: t
            .top
            .iter()
            .map(|(b, lp)| TopLogprob {
                token: lossy(b),
                logprob: *lp,
                bytes: b.clone(),
            })
            .collect(),
    }
}

/// Appends one token to legacy completion logprobs; `offset` = text length so far.
fn push_completion_logprob(lp: &mut CompletionLogprobs, t: &TokenLogprob, offset: &mut u32) {
    let tok = lossy(&t.bytes);
    lp.text_offset.push(*offset);
    *offset += tok.chars().count() as u32;
    lp.tokens.push(tok);
    lp.token_logprobs.push(t.logprob);
    let mut m = serde_json::Map::new();
    for (b, l) in &t.top {
        m.entry(lossy(b)).or_insert_with(|| serde_json::json!(l));
    }
    lp.top_logprobs.push(m);
}

/// Maps an engine failure to the client's error.
pub fn step_error(meta: &Meta, e: &StepError) -> ApiError {
    if e.unavailable {
        tracing::warn!(request_id = %meta.request_id, error = %e.message, "expert backend unavailable");
        ApiError::unavailable("the expert nodes are unavailable; retry later")
    } else {
        ApiError::internal(&meta.request_id, &e.message)
    }
}

/// When a stream gives up: the server's stream timeout from now (None = never).
pub fn deadline(timeout: Option<Duration>) -> Option<(Instant, Duration)> {
    timeout.and_then(|t| Instant::now().checked_add(t).map(|at| (at, t)))
}

/// The next event of a request, or the error that ends its answer: the stream's `deadline`
/// passed (logged and counted; the caller ends the stream, which drops the receiver and so
/// cancels the sequence), or the engine thread went away. Every endpoint, streamed or not,
/// waits through this.
pub async fn next_event(
    rx: &mut UnboundedReceiver<Event>,
    meta: &Meta,
    deadline: Option<(Instant, Duration)>,
) -> Result<Event, ApiError> {
    let ev = match deadline {
        Some((at, limit)) => match tokio::time::timeout_at(at, rx.recv()).await {
            Ok(ev) => ev,
            Err(_) => {
                let secs = limit.as_secs_f64();
                tracing::warn!(request_id = %meta.request_id, limit_secs = secs, "stream timed out; cancelling the sequence");
                metrics::counter!("nightshift_stream_timeouts_total").increment(1);
                return Err(ApiError::stream_timeout(secs));
            }
        },
        None => rx.recv().await,
    };
    ev.ok_or_else(|| {
        ApiError::internal(
            &meta.request_id,
            "engine thread ended without finishing the request",
        )
    })
}

/// Named server-sent events (`event: KIND`, `data: JSON`), how the Responses and Messages APIs
/// stream: the `first` batch at once, then each batch `rest` yields.
pub fn named_events(
    first: Vec<(&'static str, serde_json::Value)>,
    rest: impl Stream<Item = Vec<(&'static str, serde_json::Value)>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    stream::iter(vec![first]).chain(rest).flat_map(|evs| {
        stream::iter(
            evs.into_iter()
                .map(|(kind, body)| Ok(SseEvent::default().event(kind).data(body.to_string()))),
        )
    })
}

/// The finish reason: `tool_calls` when the model stopped after calling tools.
fn finish_reason(finish: FinishReason, calls: u32) -> &'static str {
    if calls > 0 && finish == FinishReason::Stop {
        "tool_calls"
    } else {
        finish.as_str()
    }
}

/// A whole response's message as it is assembled.
#[derive(Default)]
struct Whole {
    text: String,
    reasoning: Option<String>,
    calls: Vec<ToolCallOut>,
}

/// Adds text to the message, through the output parser when there is one.
fn absorb(parser: &mut Option<OutputParser>, t: &str, m: &mut Whole) {
    let pieces = match parser {
        Some(p) => p.push(t),
        None => {
            m.text.push_str(t);
            return;
        }
    };
    settle(pieces, m);
}

/// Pieces into the content, the reasoning and the calls of a whole response.
fn settle(pieces: Vec<Piece>, m: &mut Whole) {
    let (text, calls) = (&mut m.text, &mut m.calls);
    for p in pieces {
        match p {
            Piece::Content(s) => text.push_str(&s),
            Piece::Reasoning(s) => m.reasoning.get_or_insert_with(String::new).push_str(&s),
            Piece::Call { call, .. } | Piece::CallStart { call, .. } => calls.push(call),
            Piece::CallArgs { index, text: a } => {
                if let Some(c) = calls.get_mut(index as usize) {
                    c.function.arguments.push_str(&a);
                }
            }
        }
    }
}

/// Waits for the whole generation and builds the non-streaming response body.
pub async fn collect(
    meta: &Meta,
    mut rx: UnboundedReceiver<Event>,
    mut parser: Option<OutputParser>,
) -> Result<serde_json::Value, ApiError> {
    let mut m = Whole::default();
    let mut chat_lp = ChatLogprobs::default();
    let mut comp_lp = CompletionLogprobs::default();
    let mut offset = 0u32;
    loop {
        match next_event(&mut rx, meta, None).await? {
            Event::Token { text: t, logprob } => {
                absorb(&mut parser, &t, &mut m);
                if let Some(l) = logprob {
                    chat_lp.content.push(chat_logprob(&l));
                    push_completion_logprob(&mut comp_lp, &l, &mut offset);
                }
            }
            Event::Failed(e) => return Err(step_error(meta, &e)),
            Event::Done {
                text: t,
                finish,
                usage,
                ..
            } => {
                absorb(&mut parser, &t, &mut m);
                if let Some(p) = &mut parser {
                    settle(p.finish(), &mut m);
                }
                let Whole {
                    text,
                    reasoning,
                    calls,
                } = m;
                let usage = Usage::new(usage);
                let reason = finish_reason(finish, calls.len() as u32);
                let v = match meta.kind {
                    Kind::Chat => serde_json::to_value(ChatCompletion {
                        id: meta.id.clone(),
                        object: "chat.completion",
                        created: meta.created,
                        model: meta.model.clone(),
                        system_fingerprint: meta.fingerprint.clone(),
                        choices: vec![ChatChoice {
                            index: 0,
                            message: ChatMessageOut {
                                role: "assistant",
                                content: (calls.is_empty() || !text.is_empty()).then_some(text),
                                reasoning_content: reasoning,
                                tool_calls: calls,
                            },
                            logprobs: meta.logprobs.map(|_| chat_lp),
                            finish_reason: reason,
                        }],
                        usage,
                    }),
                    Kind::Completion => serde_json::to_value(meta.completion(
                        vec![CompletionChoice {
                            text,
                            index: 0,
                            logprobs: meta.logprobs.map(|_| comp_lp),
                            finish_reason: Some(finish.as_str()),
                        }],
                        Some(Some(usage)),
                    )),
                };
                return v.map_err(|e| ApiError::internal(&meta.request_id, e));
            }
        }
    }
}

/// Stream state.
struct St {
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    started: bool,
    done: bool,
    offset: u32,
    /// When the stream gives up (the server's stream timeout), if any.
    deadline: Option<(Instant, Duration)>,
    /// The output parser of a chat request (reasoning split, tool calls).
    parser: Option<OutputParser>,
}

impl St {
    fn data<T: serde::Serialize>(&self, v: &T) -> SseEvent {
        match serde_json::to_string(v) {
            Ok(s) => SseEvent::default().data(s),
            Err(e) => {
                SseEvent::default().data(ApiError::internal(&self.meta.request_id, e).body_json())
            }
        }
    }

    fn usage_field(&self, u: Option<Usage>) -> Option<Option<Usage>> {
        self.meta.include_usage.then_some(u)
    }

    /// A chunk carrying `text`, logprobs and/or the finish reason.
    fn chunk(
        &mut self,
        text: Option<String>,
        lp: Option<&TokenLogprob>,
        finish: Option<FinishReason>,
    ) -> SseEvent {
        let m = &self.meta;
        match m.kind {
            Kind::Chat => {
                let c = m.chat_chunk(
                    vec![ChunkChoice {
                        index: 0,
                        delta: Delta {
                            role: None,
                            content: text,
                            reasoning_content: None,
                            tool_calls: None,
                        },
                        logprobs: lp.map(|l| ChatLogprobs {
                            content: vec![chat_logprob(l)],
                        }),
                        finish_reason: finish.map(FinishReason::as_str),
                    }],
                    self.usage_field(None),
                );
                self.data(&c)
            }
            Kind::Completion => {
                let logprobs = lp.map(|l| {
                    let mut c = CompletionLogprobs::default();
                    push_completion_logprob(&mut c, l, &mut self.offset);
                    c
                });
                let c = m.completion(
                    vec![CompletionChoice {
                        text: text.unwrap_or_default(),
                        index: 0,
                        logprobs,
                        finish_reason: finish.map(FinishReason::as_str),
                    }],
                    self.usage_field(None),
                );
                self.data(&c)
            }
        }
    }

    /// The last chat chunk of a request that called tools (`finish_reason` `tool_calls`).
    fn finish_chunk(&self, reason: &'static str) -> SseEvent {
        let m = &self.meta;
        self.data(&m.chat_chunk(
            vec![ChunkChoice {
                index: 0,
                delta: Delta::default(),
                logprobs: None,
                finish_reason: Some(reason),
            }],
            self.usage_field(None),
        ))
    }

    fn first_chunk(&self) -> Option<SseEvent> {
        let m = &self.meta;
        (m.kind == Kind::Chat).then(|| {
            self.data(&m.chat_chunk(
                vec![ChunkChoice {
                    index: 0,
                    delta: Delta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        reasoning_content: None,
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                self.usage_field(None),
            ))
        })
    }

    /// One streamed tool call as OpenAI sends it: id, type and name with empty arguments,
    /// then the arguments.
    /// One chunk with one tool-call delta.
    fn call_delta(&self, d: ToolCallDelta) -> SseEvent {
        let m = &self.meta;
        self.data(&m.chat_chunk(
            vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    role: None,
                    content: None,
                    reasoning_content: None,
                    tool_calls: Some(vec![d]),
                },
                logprobs: None,
                finish_reason: None,
            }],
            self.usage_field(None),
        ))
    }

    /// A call's start as OpenAI sends it: index, id, type and name, empty arguments.
    fn call_start(&self, index: u32, call: ToolCallOut) -> SseEvent {
        self.call_delta(ToolCallDelta {
            index,
            id: Some(call.id),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(call.function.name),
                arguments: String::new(),
            },
        })
    }

    /// A piece of a call's arguments.
    fn call_args(&self, index: u32, arguments: String) -> SseEvent {
        self.call_delta(ToolCallDelta {
            index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments,
            },
        })
    }

    /// A chunk of reasoning.
    fn reasoning_chunk(&self, text: String, lp: Option<&TokenLogprob>) -> SseEvent {
        let m = &self.meta;
        self.data(&m.chat_chunk(
            vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    reasoning_content: Some(text),
                    ..Delta::default()
                },
                logprobs: lp.map(|l| ChatLogprobs {
                    content: vec![chat_logprob(l)],
                }),
                finish_reason: None,
            }],
            self.usage_field(None),
        ))
    }

    /// The events of some generated text (and its token's logprobs): through the output parser
    /// when there is one.
    fn text_events(&mut self, text: String, lp: Option<&TokenLogprob>, out: &mut Vec<SseEvent>) {
        let Some(ts) = &mut self.parser else {
            if !text.is_empty() || lp.is_some() {
                out.push(self.chunk(Some(text), lp, None));
            }
            return;
        };
        let pieces = ts.push(&text);
        self.piece_events(pieces, lp, out);
    }

    fn piece_events(
        &mut self,
        pieces: Vec<Piece>,
        mut lp: Option<&TokenLogprob>,
        out: &mut Vec<SseEvent>,
    ) {
        for p in pieces {
            match p {
                Piece::Content(s) => out.push(self.chunk(Some(s), lp.take(), None)),
                Piece::Reasoning(s) => out.push(self.reasoning_chunk(s, lp.take())),
                Piece::Call { index, call } => {
                    let args = call.function.arguments.clone();
                    out.push(self.call_start(index, call));
                    out.push(self.call_args(index, args));
                }
                Piece::CallStart { index, call } => out.push(self.call_start(index, call)),
                Piece::CallArgs { index, text } => out.push(self.call_args(index, text)),
            }
        }
        if let Some(l) = lp {
            out.push(self.chunk(Some(String::new()), Some(l), None));
        }
    }

    fn usage_chunk(&self, u: Usage) -> SseEvent {
        let m = &self.meta;
        match m.kind {
            Kind::Chat => self.data(&m.chat_chunk(vec![], Some(Some(u)))),
            Kind::Completion => self.data(&m.completion(vec![], Some(Some(u)))),
        }
    }

    /// The SSE events for one scheduler event, or the error event that ends the stream.
    fn next_events(&mut self, ev: Result<Event, ApiError>) -> Vec<SseEvent> {
        let mut out = Vec::new();
        match ev {
            Err(e) => {
                self.done = true;
                out.push(SseEvent::default().data(e.body_json()));
            }
            Ok(Event::Token { text, logprob }) => {
                self.text_events(text, logprob.as_ref(), &mut out);
            }
            Ok(Event::Failed(e)) => {
                self.done = true;
                out.push(SseEvent::default().data(step_error(&self.meta, &e).body_json()));
            }
            Ok(Event::Done {
                text,
                finish,
                usage,
                ..
            }) => {
                self.done = true;
                self.text_events(text, None, &mut out);
                let mut calls = 0;
                if let Some(ts) = &mut self.parser {
                    let pieces = ts.finish();
                    calls = ts.calls();
                    self.piece_events(pieces, None, &mut out);
                }
                let empty = (self.meta.kind == Kind::Completion).then(String::new);
                let mut last = self.chunk(empty, None, Some(finish));
                if calls > 0 {
                    last = self.finish_chunk(finish_reason(finish, calls));
                }
                out.push(last);
                if self.meta.include_usage {
                    out.push(self.usage_chunk(Usage::new(usage)));
                }
                out.push(SseEvent::default().data("[DONE]"));
            }
        }
        out
    }
}

/// The SSE response for a streaming request; after `timeout` (None = never) it sends an error
/// event and ends, which drops the receiver and so cancels the sequence.
pub fn sse(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    timeout: Option<Duration>,
    parser: Option<OutputParser>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let st = St {
        parser,
        rx,
        meta,
        started: false,
        done: false,
        offset: 0,
        deadline: deadline(timeout),
    };
    let s = stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        if !st.started {
            // The role chunk goes out at once, before the prefill finishes.
            st.started = true;
            if let Some(first) = st.first_chunk() {
                return Some((stream::iter(vec![Ok(first)]), st));
            }
        }
        let ev = next_event(&mut st.rx, &st.meta, st.deadline).await;
        let events = st.next_events(ev);
        Some((
            stream::iter(events.into_iter().map(Ok).collect::<Vec<_>>()),
            st,
        ))
    })
    .flatten();
    Sse::new(s)
}
