//! OpenAI's Responses API JSON (`POST /v1/responses`): the request, its input items, the
//! response object with its output items, and usage. Input items and output items are one
//! type (`Item`): a stored response's output is the next request's input
//! (`previous_response_id`), as OpenAI treats them. Requests ignore unknown fields; `null` is
//! the same as absent.

use crate::gateway::types::ChatTokenLogprob as TokenLogprob;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// `input`: a user message as a string, or a list of items (read one by one with
/// [`Item::from_value`], so an error names the item; a message may come without its `type`).
#[derive(Serialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<Item>),
}

impl<'de> Deserialize<'de> for ResponseInput {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(s) => Ok(ResponseInput::Text(s)),
            Value::Array(v) => v
                .into_iter()
                .enumerate()
                .map(|(i, it)| {
                    Item::from_value(it).map_err(|e| D::Error::custom(format!("input[{i}]: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(ResponseInput::Items),
            other => Err(D::Error::custom(format!(
                "`input` is a string or a list of items, found {}",
                kind_of(&other)
            ))),
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `text`: the output's format.
#[derive(Deserialize, Debug, Clone, Default, ToSchema)]
pub struct TextConfig {
    /// `text` (default), `json_object`, or `json_schema`; not with `grammar`.
    #[schema(value_type = Option<ResponsesTextFormat>)]
    pub format: Option<Value>,
}

// ---- the request's shapes as documented ----
//
// `convert.rs` reads tools, `tool_choice` and `text.format` from loosely typed fields (so that
// each error names its field); these types say what it accepts, for the OpenAPI document only.

/// `text.format`.
#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(dead_code)]
pub enum ResponsesTextFormat {
    Text {},
    JsonObject {},
    JsonSchema {
        /// Default `response`.
        #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
        name: Option<String>,
        /// A JSON Schema (default: any object), at most 64 KiB as JSON.
        #[schema(value_type = Option<Object>)]
        schema: Option<Value>,
        description: Option<String>,
        strict: Option<bool>,
    },
}

/// A tool: a function, a custom (free-form text) tool, or a namespace of them. Hosted tools
/// (`web_search`, `file_search`, ...) are accepted too and left out of the prompt.
#[derive(ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(dead_code)]
pub enum ResponsesTool {
    Function {
        /// Each name once; inside a namespace, `{namespace}.{name}` is what must fit.
        #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
        name: String,
        description: Option<String>,
        /// A JSON Schema object, at most 64 KiB as JSON.
        #[schema(value_type = Option<Object>)]
        parameters: Option<Value>,
        strict: Option<bool>,
    },
    Custom {
        #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
        name: String,
        description: Option<String>,
        /// `{"type": "grammar", "syntax": .., "definition": ..}` (shown to the model).
        #[schema(value_type = Option<Object>)]
        format: Option<Value>,
    },
    Namespace {
        name: String,
        /// Its function and custom tools.
        #[schema(value_type = Vec<Object>)]
        tools: Vec<Value>,
    },
}

/// `tool_choice`: a mode, or a tool to call (which must be in `tools`). `required` and a named
/// tool need a tool the model can call.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ResponsesToolChoice {
    Mode(ResponsesToolChoiceMode),
    Named(ResponsesNamedToolChoice),
}

#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum ResponsesToolChoiceMode {
    None,
    Auto,
    Required,
}

/// A function or custom tool to call.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ResponsesNamedToolChoice {
    #[serde(rename = "type")]
    #[schema(pattern = "^(function|custom)$")]
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
}

/// `reasoning`: `effort` switches a hybrid model's thinking (`none`/`minimal` off, `low` to
/// `xhigh` on); `summary` is accepted.
#[derive(Deserialize, Serialize, Debug, Clone, Default, ToSchema)]
pub struct ReasoningConfig {
    #[schema(pattern = "^(none|minimal|low|medium|high|xhigh)$")]
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// `POST /v1/responses`.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ResponsesRequest {
    /// The served model's id (`GET /v1/models`).
    #[schema(required = true, value_type = String)]
    pub model: Option<String>,
    /// Required unless `previous_response_id` continues a stored conversation; the
    /// conversation must have a message (not only reasoning).
    pub input: Option<ResponseInput>,
    /// A system message before the input (not carried over by `previous_response_id`).
    pub instructions: Option<String>,
    /// At most 128 the model can call (`tools.rs`' `MAX_TOOLS`).
    #[schema(value_type = Option<Vec<ResponsesTool>>, max_items = 128)]
    pub tools: Option<Vec<Value>>,
    #[schema(value_type = Option<ResponsesToolChoice>)]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// An upper bound: generation stops where the context ends.
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "crate::gateway::int::opt")]
    pub max_output_tokens: Option<u32>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f32>,
    /// Nucleus sampling: the most probable tokens whose probabilities sum to `top_p`, never
    /// fewer than one (llama.cpp's top-p), so 0 keeps only the most probable token (greedy).
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    pub stream: Option<bool>,
    pub text: Option<TextConfig>,
    pub reasoning: Option<ReasoningConfig>,
    /// Continue the conversation of a stored response (its input and output come first): the
    /// id of a response still stored (an unknown one is a 400).
    #[schema(pattern = "^resp_[0-9a-f]{32}$")]
    pub previous_response_id: Option<String>,
    /// Keep the response for `previous_response_id` and `GET /v1/responses/{id}` (default
    /// true, as OpenAI's).
    pub store: Option<bool>,
    /// Up to 16 string pairs (keys up to 64 characters, values up to 512), returned with
    /// the response.
    #[schema(schema_with = metadata_schema)]
    pub metadata: Option<Map<String, Value>>,
    pub user: Option<String>,
    /// Extra output: `message.output_text.logprobs` (with `top_logprobs`); others are ignored.
    pub include: Option<Vec<String>>,
    /// Only with `include: ["message.output_text.logprobs"]` when above 0 (otherwise a 400).
    #[schema(minimum = 0, maximum = 20)]
    #[serde(default, deserialize_with = "crate::gateway::int::opt")]
    pub top_logprobs: Option<u32>,
    /// `disabled` (default: too long an input is a 400) or `auto` (the oldest turns are dropped
    /// until the input fits).
    #[schema(pattern = "^(auto|disabled)$")]
    pub truncation: Option<String>,
    /// Extension: the sampling seed.
    #[serde(default, deserialize_with = "crate::gateway::int::opt")]
    pub seed: Option<i64>,
    /// Extension: a Lark grammar (llguidance's dialect) the content must follow, at most
    /// 64 KiB of UTF-8; one that does not compile is a 400. Not with a JSON `text.format`.
    pub grammar: Option<String>,
    /// Extension (vLLM's): extra chat template variables (`enable_thinking`, ...).
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// A content part of a message: text in (`input_text`), text out (`output_text`), or a
/// refusal. Images and files are refused with a 400. A text part needs `text`, a refusal
/// `refusal`.
#[derive(Deserialize, Serialize, Debug, Clone, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    #[schema(pattern = "^(input_text|output_text|text|refusal)$")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// `output_text`'s annotations (always empty here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub annotations: Option<Vec<Value>>,
    /// `output_text`'s token logprobs (with `include: ["message.output_text.logprobs"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

impl ContentPart {
    pub fn output_text(text: String, logprobs: Option<Vec<TokenLogprob>>) -> ContentPart {
        ContentPart {
            kind: "output_text".into(),
            text: Some(text),
            refusal: None,
            annotations: Some(Vec::new()),
            logprobs,
        }
    }
}

/// A message's content: a string or parts.
#[derive(Deserialize, Serialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A reasoning item's text (`summary_text` or `reasoning_text`).
#[derive(Deserialize, Serialize, Debug, Clone, ToSchema)]
pub struct ReasoningPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

/// One item of a conversation: a message, a function call, its output, or reasoning.
#[derive(Deserialize, Serialize, Debug, Clone, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[schema(pattern = "^(system|developer|user|assistant)$")]
        role: String,
        content: MessageContent,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
    },
    FunctionCall {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        call_id: String,
        name: String,
        /// The namespace tool the function belongs to, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        /// JSON text.
        arguments: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
    },
    /// A call of a custom (free-form) tool: its input is plain text.
    CustomToolCall {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        call_id: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        input: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
    },
    CustomToolCallOutput {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        call_id: String,
        output: MessageContent,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
    },
    FunctionCallOutput {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        call_id: String,
        output: MessageContent,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
    },
    Reasoning {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default)]
        summary: Vec<ReasoningPart>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Vec<ReasoningPart>>,
        /// Accepted from clients that send it back; never produced (reasoning is plain text).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
    },
}

impl Item {
    /// The item's id, if it has one.
    pub fn id(&self) -> Option<&str> {
        match self {
            Item::Message { id, .. }
            | Item::FunctionCall { id, .. }
            | Item::FunctionCallOutput { id, .. }
            | Item::CustomToolCall { id, .. }
            | Item::CustomToolCallOutput { id, .. }
            | Item::Reasoning { id, .. } => id.as_deref(),
        }
    }

    /// Gives the item an id (`prefix_<uuid>`) when it has none.
    pub fn ensure_id(&mut self) {
        let prefix = match self {
            Item::Message { .. } => "msg",
            Item::FunctionCall { .. } => "fc",
            Item::FunctionCallOutput { .. } => "fco",
            Item::CustomToolCall { .. } => "ctc",
            Item::CustomToolCallOutput { .. } => "ctco",
            Item::Reasoning { .. } => "rs",
        };
        let (Item::Message { id, .. }
        | Item::FunctionCall { id, .. }
        | Item::FunctionCallOutput { id, .. }
        | Item::CustomToolCall { id, .. }
        | Item::CustomToolCallOutput { id, .. }
        | Item::Reasoning { id, .. }) = self;
        if id.is_none() {
            *id = Some(format!("{prefix}_{}", uuid::Uuid::new_v4().simple()));
        }
    }
}

/// `metadata`'s schema: at most `MAX_METADATA` string pairs, keys and values bounded.
fn metadata_schema() -> utoipa::openapi::Object {
    use super::convert::{MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_VALUE};
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(MAX_METADATA_KEY)),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(MAX_METADATA_VALUE)),
        ))
        .max_properties(Some(MAX_METADATA))
        .build()
}

/// `GET /v1/responses/{id}/input_items`: a page of a stored response's input items.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct InputItemList {
    pub object: &'static str,
    pub data: Vec<Item>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// `input_items`' query: `limit` (1-100, default 20), `order` (`asc` or `desc`, default
/// `desc`), `after` (the id of the item the page starts after).
#[derive(Deserialize, Debug, Clone, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InputItemsQuery {
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    #[param(pattern = "^(asc|desc)$")]
    pub order: Option<String>,
    pub after: Option<String>,
}

/// An item without its `type` is a message (OpenAI's "easy input message").
#[derive(Deserialize, Debug, Clone)]
struct EasyMessage {
    role: String,
    content: MessageContent,
}

impl Item {
    /// Reads one input item: tagged by `type`, or a message without one. Unknown item types
    /// (hosted tools' calls, item references) are named in the error.
    pub fn from_value(v: Value) -> Result<Item, String> {
        match v.get("type") {
            None | Some(Value::Null) => {
                let m: EasyMessage = serde_json::from_value(v).map_err(|e| e.to_string())?;
                Ok(Item::Message {
                    id: None,
                    role: m.role,
                    content: m.content,
                    status: None,
                })
            }
            Some(Value::String(t)) => match t.as_str() {
                "message"
                | "function_call"
                | "function_call_output"
                | "reasoning"
                | "custom_tool_call"
                | "custom_tool_call_output" => {
                    let t = t.clone();
                    serde_json::from_value(v).map_err(|e| format!("a `{t}` item: {e}"))
                }
                other => Err(format!(
                    "items of type `{other}` are not supported (message, function_call, \
                     function_call_output, custom_tool_call, custom_tool_call_output and \
                     reasoning are)"
                )),
            },
            Some(other) => Err(format!("`type` must be a string, found {}", kind_of(other))),
        }
    }
}

#[derive(Serialize, Debug, Clone, Copy, ToSchema)]
pub struct InputTokensDetails {
    /// Input tokens served from the prefix cache.
    pub cached_tokens: u32,
}

#[derive(Serialize, Debug, Clone, Copy, ToSchema)]
pub struct OutputTokensDetails {
    /// Output tokens the model spent reasoning (its think block).
    pub reasoning_tokens: u32,
}

#[derive(Serialize, Debug, Clone, Copy, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

/// Why a response is `incomplete`.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens` (the budget or the context ran out).
    pub reason: &'static str,
}

/// The `text` of a response: the format it was asked for.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct TextOut {
    #[schema(value_type = Object)]
    pub format: Value,
}

/// A response (`object: "response"`).
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress` (stream start), `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub output: Vec<Item>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: ReasoningConfig,
    pub store: bool,
    pub temperature: f32,
    pub text: TextOut,
    /// As asked: `auto`, `none`, `required` or `{"type": "function", "name": ..}`.
    pub tool_choice: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    pub top_p: f32,
    pub truncation: &'static str,
    /// Present once the response has finished.
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
}

/// `DELETE /v1/responses/{id}`.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ResponseDeleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}
