//! The Anthropic Messages API's JSON (`POST /v1/messages`, `POST /v1/messages/count_tokens`):
//! the request, its content blocks, the message answered and its usage. Requests ignore
//! unknown fields (`cache_control`, `anthropic-beta` features); `null` is the same as absent.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A message's content: a string or content blocks.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum BlocksField {
    Text(String),
    /// `text`, `tool_use` (assistant), `tool_result` (user), `thinking` (assistant) blocks.
    Blocks(#[schema(inline)] Vec<BlockIn>),
}

/// A content block of a request, read by its `type` (see `convert.rs`).
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct BlockIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `tool_use`: the call's id; `tool_result` answers it with `tool_use_id`.
    pub id: Option<String>,
    pub name: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    pub tool_use_id: Option<String>,
    /// `tool_result`: a string or text blocks.
    #[schema(value_type = Option<Object>)]
    pub content: Option<BlocksField>,
    pub is_error: Option<bool>,
    /// `thinking`: the reasoning text.
    pub thinking: Option<String>,
}

#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct MessageIn {
    #[schema(pattern = "^(user|assistant)$")]
    pub role: String,
    pub content: BlocksField,
}

#[derive(Deserialize, Debug, Clone, Default, ToSchema)]
pub struct Metadata {
    pub user_id: Option<String>,
}

/// `POST /v1/messages` (and, without `max_tokens`, `/v1/messages/count_tokens`).
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct MessagesRequest {
    /// The served model's id (`GET /v1/models`).
    #[schema(required = true, value_type = String)]
    pub model: Option<String>,
    /// Required by `/v1/messages`.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    #[schema(min_items = 1)]
    pub messages: Vec<MessageIn>,
    /// A string or text blocks.
    pub system: Option<BlocksField>,
    /// Client tools: `{"name", "description", "input_schema"}`.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name": .., "disable_parallel_tool_use": ..}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    pub stream: Option<bool>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f32>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub stop_sequences: Option<Vec<String>>,
    pub metadata: Option<Metadata>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`: sets the chat
    /// template's `enable_thinking` / `thinking`.
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
    /// Extension: the sampling seed.
    pub seed: Option<i64>,
}

/// A content block of the answer.
#[derive(Serialize, Debug, Clone, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockOut {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        /// Empty: the reasoning is the model's own plain text.
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

#[derive(Serialize, Debug, Clone, Copy, ToSchema)]
pub struct MessageUsage {
    /// Prompt tokens computed (not read from the prefix cache).
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens read from the prefix cache.
    pub cache_read_input_tokens: u32,
    pub cache_creation_input_tokens: u32,
}

/// The answer (`type: "message"`).
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct MessageOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<BlockOut>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (null while streaming).
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

/// `POST /v1/messages/count_tokens`.
#[derive(Serialize, Debug, Clone, Copy, ToSchema)]
pub struct TokenCount {
    pub input_tokens: u32,
}

/// An error in the Anthropic shape: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ErrorOut {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorDetailOut,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ErrorDetailOut {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}
