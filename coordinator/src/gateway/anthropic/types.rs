//! The Anthropic Messages API's JSON (`POST /v1/messages`, `POST /v1/messages/count_tokens`):
//! the request, its content blocks, the message answered and its usage. Requests ignore
//! unknown fields (`cache_control`, `anthropic-beta` features); `null` is the same as absent.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A message's content: a string or content blocks (documented by role: `UserContent`,
/// `AssistantContent`, `AnthropicText`).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum BlocksField {
    Text(String),
    /// `text`, `tool_use` (assistant), `tool_result` (user), `thinking` (assistant) blocks.
    Blocks(Vec<BlockIn>),
}

/// A content block of a request, read by its `type` (see `convert.rs`; documented as the
/// block types below).
#[derive(Deserialize, Debug, Clone)]
pub struct BlockIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `tool_use`: the call's id; `tool_result` answers it with `tool_use_id`.
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    pub tool_use_id: Option<String>,
    /// `tool_result`: a string or text blocks.
    pub content: Option<BlocksField>,
    pub is_error: Option<bool>,
    /// `thinking`: the reasoning text.
    pub thinking: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct MessageIn {
    pub role: String,
    pub content: BlocksField,
}

// ---- the request's shapes as documented ----
//
// `convert.rs` reads blocks, tools, `tool_choice` and `thinking` from loosely typed fields (so
// that each error names its field as Anthropic's do); these types say what it accepts, for the
// OpenAPI document only.

/// A message: a user's text and `tool_result` blocks, or an assistant's text, thinking and
/// `tool_use` blocks.
#[derive(ToSchema)]
#[serde(tag = "role", rename_all = "lowercase")]
#[allow(dead_code)]
pub enum AnthropicMessage {
    User { content: UserContent },
    Assistant { content: AssistantContent },
}

/// A user message's content: a string or `text` and `tool_result` blocks.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum UserContent {
    Text(String),
    Blocks(Vec<UserBlock>),
}

/// An assistant message's content: a string or `text`, `thinking`, `redacted_thinking` and
/// `tool_use` blocks.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum AssistantContent {
    Text(String),
    Blocks(Vec<AssistantBlock>),
}

/// `system` and a `tool_result`'s content: a string or `text` blocks.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum AnthropicText {
    Text(String),
    Blocks(Vec<TextBlock>),
}

/// A `text` block.
#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[allow(dead_code)]
pub enum TextBlock {
    Text { text: String },
}

#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(dead_code)]
pub enum UserBlock {
    Text {
        text: String,
    },
    /// Answers the `tool_use` block of the same `id`.
    ToolResult {
        tool_use_id: String,
        content: Option<AnthropicText>,
        is_error: Option<bool>,
    },
}

#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(dead_code)]
pub enum AssistantBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: Option<String>,
        signature: Option<String>,
    },
    /// Dropped: encrypted elsewhere.
    RedactedThinking {
        data: Option<String>,
    },
    ToolUse {
        id: String,
        name: String,
        /// The call's arguments (`{}` when absent).
        #[schema(value_type = Option<Object>)]
        input: Option<Value>,
    },
}

/// A tool: a client tool (`type` absent or `custom`: `name`, `description`, `input_schema`),
/// or a server or Anthropic-defined tool (`web_search_20250305`, `bash_20250124`, ...), which
/// is accepted and left out of the prompt.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AnthropicTool {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// 1 to 64 letters, digits, `_`, `-` or `.`, each name once (client tools).
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema object (default: any object), at most 64 KiB as JSON.
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<Value>,
}

/// `tool_choice`: `tool` names one of `tools` (without client tools it is ignored).
#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[allow(dead_code)]
pub enum AnthropicToolChoice {
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    None {},
}

/// `thinking`: the chat template's thinking switch (`budget_tokens` is accepted and not used).
#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[allow(dead_code)]
pub enum AnthropicThinking {
    Enabled { budget_tokens: Option<u32> },
    Disabled {},
}

#[derive(Deserialize, Debug, Clone, Default, ToSchema)]
pub struct Metadata {
    pub user_id: Option<String>,
}

/// `POST /v1/messages` (`/v1/messages/count_tokens` takes it without `max_tokens`:
/// `CountTokensRequest`).
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct MessagesRequest {
    /// The served model's id (`GET /v1/models`).
    #[schema(required = true, value_type = String)]
    pub model: Option<String>,
    /// An upper bound: generation stops where the context ends.
    #[schema(required = true, value_type = u32, minimum = 1)]
    #[serde(default, deserialize_with = "crate::gateway::int::opt")]
    pub max_tokens: Option<u32>,
    #[schema(min_items = 1, value_type = Vec<AnthropicMessage>)]
    pub messages: Vec<MessageIn>,
    /// A string or text blocks.
    #[schema(value_type = Option<AnthropicText>)]
    pub system: Option<BlocksField>,
    /// At most 128 (`tools.rs`' `MAX_TOOLS`).
    #[schema(value_type = Option<Vec<AnthropicTool>>, max_items = 128)]
    pub tools: Option<Vec<Value>>,
    #[schema(value_type = Option<AnthropicToolChoice>)]
    pub tool_choice: Option<Value>,
    pub stream: Option<bool>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f32>,
    /// Nucleus sampling: the most probable tokens whose probabilities sum to `top_p`, never
    /// fewer than one (llama.cpp's top-p), so 0 keeps only the most probable token (greedy).
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    #[serde(default, deserialize_with = "crate::gateway::int::opt")]
    pub top_k: Option<u32>,
    /// At most 16 (chat's `stop`).
    #[schema(max_items = 16)]
    pub stop_sequences: Option<Vec<String>>,
    pub metadata: Option<Metadata>,
    /// Sets the chat template's `enable_thinking` / `thinking`.
    #[schema(value_type = Option<AnthropicThinking>)]
    pub thinking: Option<Value>,
    /// Extension: the sampling seed.
    #[serde(default, deserialize_with = "crate::gateway::int::opt")]
    pub seed: Option<i64>,
}

/// `POST /v1/messages/count_tokens`: a Messages request without `max_tokens` (one given is
/// not used).
#[derive(Deserialize, Debug, Clone)]
#[serde(transparent)]
pub struct CountTokensRequest(pub MessagesRequest);

impl utoipa::PartialSchema for CountTokensRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        use utoipa::openapi::{RefOr, Schema};
        let mut s = MessagesRequest::schema();
        if let RefOr::T(Schema::Object(o)) = &mut s {
            o.required.retain(|f| f != "max_tokens");
            o.description = Some(
                "`POST /v1/messages/count_tokens`: a Messages request; `max_tokens` is not \
                 needed (one given is not used)."
                    .into(),
            );
        }
        s
    }
}

impl ToSchema for CountTokensRequest {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <MessagesRequest as ToSchema>::schemas(schemas);
    }
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
