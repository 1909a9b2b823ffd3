//! A response's output assembled from the chat pipeline's pieces (`tools::Piece`: content,
//! reasoning, calls), with the Responses API's stream events as it goes: one output item per
//! run of reasoning, of content, and per function call, each opened (`output_item.added`),
//! filled (`*.delta`) and closed (`*.done`, `output_item.done`) in order. The non-streaming
//! answer runs the same builder and keeps only its output, so both carry the same items.

use super::convert::{custom_input, split_namespace, CallNames};
use super::types::{ContentPart, Item, MessageContent, ReasoningPart};
use crate::gateway::segments::{Block, Seg, Segmenter};
use crate::gateway::stream::chat_logprob as token_logprob;
use crate::gateway::tools::Piece;
use crate::gateway::types::ChatTokenLogprob as TokenLogprob;
use crate::scheduler;
use serde_json::{json, Value};

/// An SSE event of a streamed response: its `event` name and its JSON (`type` included).
pub type StreamEvent = (&'static str, Value);

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// The output items of one response as they are generated.
pub struct Builder {
    pub output: Vec<Item>,
    seg: Segmenter,
    /// Events not yet sent (only when streaming).
    events: Vec<StreamEvent>,
    emit: bool,
    seq: u64,
    /// Logprobs are wanted for the output text.
    logprobs: bool,
    /// Output tokens spent in reasoning.
    pub reasoning_tokens: u32,
    /// How calls map back to the request's tools.
    names: CallNames,
    /// The open custom tool call's arguments (its input once closed).
    custom_args: String,
}

impl Builder {
    /// `emit`: keep stream events; `logprobs`: the output text carries token logprobs;
    /// `names`: how calls map back to the request's tools.
    pub fn new(emit: bool, logprobs: bool, names: CallNames) -> Builder {
        Builder {
            names,
            custom_args: String::new(),
            output: Vec::new(),
            seg: Segmenter::default(),
            events: Vec::new(),
            emit,
            seq: 0,
            logprobs,
            reasoning_tokens: 0,
        }
    }

    /// Events produced since the last call.
    pub fn take_events(&mut self) -> Vec<StreamEvent> {
        std::mem::take(&mut self.events)
    }

    /// An event with its type and sequence number (dropped when not streaming).
    pub fn event(&mut self, kind: &'static str, mut body: Value) {
        if !self.emit {
            return;
        }
        if let Some(m) = body.as_object_mut() {
            m.insert("type".into(), json!(kind));
            m.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        self.events.push((kind, body));
    }

    /// The pieces one token's text became, with that token's logprobs.
    pub fn token(&mut self, pieces: Vec<Piece>, lp: Option<&scheduler::TokenLogprob>) {
        let reasoning = pieces.iter().any(|p| matches!(p, Piece::Reasoning(_)))
            || (pieces.is_empty() && self.seg.in_reasoning());
        if reasoning {
            self.reasoning_tokens += 1;
        }
        self.pieces(pieces, lp);
    }

    /// Pieces without a token of their own (the parser's last words), or a token's.
    pub fn pieces(&mut self, pieces: Vec<Piece>, lp: Option<&scheduler::TokenLogprob>) {
        let segs = self.seg.push(pieces);
        self.apply(segs, lp);
    }

    /// Closes the open item.
    pub fn close(&mut self) {
        let segs = self.seg.finish();
        self.apply(segs, None);
    }

    fn apply(&mut self, segs: Vec<Seg>, mut lp: Option<&scheduler::TokenLogprob>) {
        for s in segs {
            match s {
                Seg::Open(b) => self.open(b),
                Seg::Text(t) => {
                    let l = if self.seg.in_text() { lp.take() } else { None };
                    self.delta(t, l);
                }
                Seg::Close => self.close_item(),
            }
        }
        // a token that produced no text of its own still counts in the text's logprobs
        if let Some(l) = lp.filter(|_| self.seg.in_text()) {
            self.delta(String::new(), Some(l));
        }
    }

    fn last_index(&self) -> usize {
        self.output.len().saturating_sub(1)
    }

    fn open(&mut self, b: Block) {
        let item = match b {
            Block::Text => Item::Message {
                id: Some(new_id("msg")),
                role: "assistant".into(),
                content: MessageContent::Parts(vec![ContentPart::output_text(
                    String::new(),
                    self.logprobs.then(Vec::new),
                )]),
                status: Some("in_progress".into()),
            },
            Block::Reasoning => Item::Reasoning {
                id: Some(new_id("rs")),
                summary: Vec::new(),
                content: Some(vec![ReasoningPart {
                    kind: "reasoning_text".into(),
                    text: String::new(),
                }]),
                encrypted_content: None,
                status: Some("in_progress".into()),
            },
            Block::Call { id, name } if self.names.custom.contains(&name) => {
                self.custom_args.clear();
                let (namespace, name) = split_namespace(&name, &self.names.namespaces);
                Item::CustomToolCall {
                    id: Some(new_id("ctc")),
                    call_id: id,
                    name: name.to_string(),
                    namespace,
                    input: String::new(),
                    status: Some("in_progress".into()),
                }
            }
            Block::Call { id, name } => {
                let (namespace, name) = split_namespace(&name, &self.names.namespaces);
                Item::FunctionCall {
                    id: Some(new_id("fc")),
                    call_id: id,
                    name: name.to_string(),
                    namespace,
                    arguments: String::new(),
                    status: Some("in_progress".into()),
                }
            }
        };
        self.output.push(item);
        let (i, item, id) = (self.last_index(), self.item_json(), self.item_id());
        self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        let part = match self.output.last() {
            Some(Item::Message { .. }) => {
                json!({"type": "output_text", "text": "", "annotations": []})
            }
            Some(Item::Reasoning { .. }) => json!({"type": "reasoning_text", "text": ""}),
            _ => return,
        };
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
        );
    }

    fn delta(&mut self, text: String, lp: Option<&scheduler::TokenLogprob>) {
        let lp = lp.filter(|_| self.logprobs).map(token_logprob);
        let (i, id) = (self.last_index(), self.item_id());
        let (kind, body) = match self.output.last_mut() {
            Some(Item::Message {
                content: MessageContent::Parts(parts),
                ..
            }) => {
                let Some(part) = parts.first_mut() else {
                    return;
                };
                part.text.get_or_insert_with(String::new).push_str(&text);
                if let (Some(all), Some(l)) = (&mut part.logprobs, &lp) {
                    all.push(l.clone());
                }
                let lps: Vec<TokenLogprob> = lp.into_iter().collect();
                (
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                        "delta": text, "logprobs": lps}),
                )
            }
            Some(Item::Reasoning {
                content: Some(parts),
                ..
            }) => {
                let Some(p) = parts.first_mut() else {
                    return;
                };
                p.text.push_str(&text);
                (
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "delta": text}),
                )
            }
            // a custom call's input is known once its arguments close
            Some(Item::CustomToolCall { .. }) => {
                self.custom_args.push_str(&text);
                return;
            }
            Some(Item::FunctionCall { arguments, .. }) => {
                arguments.push_str(&text);
                (
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": i, "delta": text}),
                )
            }
            _ => return,
        };
        self.event(kind, body);
    }

    fn item_id(&self) -> Option<String> {
        match self.output.last()? {
            Item::Message { id, .. }
            | Item::FunctionCall { id, .. }
            | Item::FunctionCallOutput { id, .. }
            | Item::CustomToolCall { id, .. }
            | Item::CustomToolCallOutput { id, .. }
            | Item::Reasoning { id, .. } => id.clone(),
        }
    }

    fn item_json(&self) -> Value {
        self.output
            .last()
            .and_then(|it| serde_json::to_value(it).ok())
            .unwrap_or(Value::Null)
    }

    /// The last item's `done` events, status `completed`.
    fn close_item(&mut self) {
        let (i, id) = (self.last_index(), self.item_id());
        let done: Vec<(&'static str, Value)> = match self.output.last_mut() {
            Some(Item::Message {
                content: MessageContent::Parts(p),
                status,
                ..
            }) => {
                *status = Some("completed".into());
                let part = p.first().cloned();
                let text = part
                    .as_ref()
                    .and_then(|p| p.text.clone())
                    .unwrap_or_default();
                let lps = part
                    .as_ref()
                    .and_then(|p| p.logprobs.clone())
                    .unwrap_or_default();
                vec![
                    (
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0,
                            "text": text, "logprobs": lps}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0,
                            "part": part}),
                    ),
                ]
            }
            Some(Item::Reasoning {
                content, status, ..
            }) => {
                *status = Some("completed".into());
                let text = content
                    .as_ref()
                    .and_then(|c| c.first())
                    .map(|p| p.text.clone())
                    .unwrap_or_default();
                vec![
                    (
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0,
                            "text": text}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0,
                            "part": {"type": "reasoning_text", "text": text}}),
                    ),
                ]
            }
            Some(Item::FunctionCall {
                name,
                arguments,
                status,
                ..
            }) => {
                *status = Some("completed".into());
                vec![(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": i, "name": name,
                        "arguments": arguments}),
                )]
            }
            Some(Item::CustomToolCall { input, status, .. }) => {
                *status = Some("completed".into());
                *input = custom_input(&self.custom_args);
                vec![
                    (
                        "response.custom_tool_call_input.delta",
                        json!({"item_id": id, "output_index": i, "delta": input}),
                    ),
                    (
                        "response.custom_tool_call_input.done",
                        json!({"item_id": id, "output_index": i, "input": input}),
                    ),
                ]
            }
            _ => return,
        };
        for (k, b) in done {
            self.event(k, b);
        }
        let item = self.item_json();
        self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::segments::test_call as call;

    /// Reasoning, content, then two streamed calls: four items in order, each opened, filled
    /// and closed once, and the deltas add up to what the items hold.
    #[test]
    fn items_open_fill_and_close_in_order() {
        let mut b = Builder::new(true, false, CallNames::default());
        b.token(vec![Piece::Reasoning("think".into())], None);
        b.token(vec![Piece::Reasoning(" more".into())], None);
        b.token(vec![Piece::Content("Hi".into())], None);
        b.token(
            vec![Piece::CallStart {
                index: 0,
                call: call("call_a", "f", ""),
            }],
            None,
        );
        b.token(
            vec![Piece::CallArgs {
                index: 0,
                text: "{\"x\":".into(),
            }],
            None,
        );
        b.token(
            vec![Piece::CallArgs {
                index: 0,
                text: "1}".into(),
            }],
            None,
        );
        b.pieces(
            vec![Piece::Call {
                index: 1,
                call: call("call_b", "g", "{}"),
            }],
            None,
        );
        b.close();
        let kinds: Vec<&str> = b
            .output
            .iter()
            .map(|i| match i {
                Item::Reasoning { .. } => "reasoning",
                Item::Message { .. } => "message",
                Item::FunctionCall { .. } => "function_call",
                other => panic!("the builder made {other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            ["reasoning", "message", "function_call", "function_call"]
        );
        match &b.output[2] {
            Item::FunctionCall {
                call_id,
                arguments,
                status,
                ..
            } => {
                assert_eq!(call_id, "call_a");
                assert_eq!(arguments, "{\"x\":1}");
                assert_eq!(status.as_deref(), Some("completed"));
            }
            other => panic!("{other:?}"),
        }
        let ev = b.take_events();
        let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
        let added = names
            .iter()
            .filter(|n| **n == "response.output_item.added")
            .count();
        let done = names
            .iter()
            .filter(|n| **n == "response.output_item.done")
            .count();
        assert_eq!((added, done), (4, 4), "{names:?}");
        // sequence numbers count up from 0 without gaps
        for (k, e) in ev.iter().enumerate() {
            assert_eq!(e.1["sequence_number"], k as u64);
            assert_eq!(e.1["type"], e.0);
        }
        let args: String = ev
            .iter()
            .filter(|e| e.0 == "response.function_call_arguments.delta" && e.1["output_index"] == 2)
            .map(|e| e.1["delta"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(args, "{\"x\":1}");
        let reasoning: String = ev
            .iter()
            .filter(|e| e.0 == "response.reasoning_text.delta")
            .map(|e| e.1["delta"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(reasoning, "think more");
        // every item is closed before the next one opens
        let mut open = 0i32;
        for n in &names {
            match *n {
                "response.output_item.added" => open += 1,
                "response.output_item.done" => open -= 1,
                _ => {}
            }
            assert!((0..=1).contains(&open), "{names:?}");
        }
        assert_eq!(b.reasoning_tokens, 2, "the two reasoning tokens");
    }

    #[test]
    fn without_streaming_no_events_are_kept() {
        let mut b = Builder::new(false, false, CallNames::default());
        b.token(vec![Piece::Content("x".into())], None);
        b.close();
        assert!(b.take_events().is_empty());
        assert_eq!(b.output.len(), 1);
    }
}
