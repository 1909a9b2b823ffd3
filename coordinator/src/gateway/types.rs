//! OpenAI JSON schemas (the only place that knows them): chat and legacy completion requests,
//! responses, stream chunks, logprobs, usage and the model list; each derives its OpenAPI schema
//! (`openapi.rs`). Requests ignore unknown fields,
//! as OpenAI does; `null` is the same as absent.

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{
    ArrayBuilder, ObjectBuilder, OneOfBuilder, Ref, Schema, SchemaType, Type,
};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// `stop`: one string or a list of at most `convert::MAX_STOPS` (its schema below).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl utoipa::PartialSchema for StopField {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(
                ArrayBuilder::new()
                    .items(ObjectBuilder::new().schema_type(Type::String))
                    .max_items(Some(super::convert::MAX_STOPS)),
            )
            .description(Some(format!(
                "`stop`: one string or a list of at most {}.",
                super::convert::MAX_STOPS
            )))
            .into()
    }
}

impl ToSchema for StopField {}

#[derive(Deserialize, Debug, Clone, Default, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// A content part of a chat message; only text parts are supported (with their `text`).
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[schema(as = ChatContentPart)]
pub struct ContentPart {
    #[serde(rename = "type")]
    #[schema(pattern = "^text$")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// Message content: a string or an array of parts.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ChatMessageIn {
    #[schema(pattern = "^(system|developer|user|assistant|tool)$")]
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant's tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A tool result's call id.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant's reasoning (vLLM's field; templates that keep reasoning render it).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

impl ChatMessageIn {
    /// A message of `role` with text content (None: no content), as the other APIs' edges
    /// build them.
    pub fn text(role: &str, content: Option<String>) -> ChatMessageIn {
        ChatMessageIn {
            role: role.to_string(),
            content: content.map(Content::Text),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

/// `function` of a tool call in a request: `arguments` is JSON text (an object is accepted too).
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct FunctionCallIn {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<serde_json::Value>,
}

/// A tool call of an assistant message in a request.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ToolCallIn {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

/// Fields shared by both endpoints (copied out of either request).
#[derive(Debug, Clone, Default)]
pub struct Common {
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub n: Option<u32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub cache_prompt: Option<bool>,
    pub speculative: Option<bool>,
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Declares a request struct with the common fields written out (not `#[serde(flatten)]`,
/// which would lose the field path in type errors) plus its own.
macro_rules! request_struct {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Deserialize, Debug, Clone, ToSchema)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
            /// The served model's id (`GET /v1/models`); required, as OpenAI requires it.
            #[schema(required = true, value_type = String)]
            pub model: Option<String>,
            /// The prompt's tokens plus `max_tokens` must fit the context (`maximum` is the
            /// context less one prompt token; a longer prompt leaves less room: a 400).
            #[schema(minimum = 1)]
            #[serde(default, deserialize_with = "crate::gateway::int::opt")]
            pub max_tokens: Option<u32>,
            #[schema(minimum = 0.0, maximum = 2.0)]
            pub temperature: Option<f32>,
            /// Nucleus sampling: the most probable tokens whose probabilities sum to `top_p`,
            /// never fewer than one (llama.cpp's top-p), so 0 keeps only the most probable
            /// token (greedy).
            #[schema(minimum = 0.0, maximum = 1.0)]
            pub top_p: Option<f32>,
            #[serde(default, deserialize_with = "crate::gateway::int::opt")]
            pub seed: Option<i64>,
            pub stop: Option<StopField>,
            pub stream: Option<bool>,
            /// Only when `stream` is true (otherwise a 400).
            pub stream_options: Option<StreamOptions>,
            #[schema(minimum = -2.0, maximum = 2.0)]
            pub presence_penalty: Option<f32>,
            #[schema(minimum = -2.0, maximum = 2.0)]
            pub frequency_penalty: Option<f32>,
            /// Only 1 is supported.
            #[schema(minimum = 1, maximum = 1)]
            #[serde(default, deserialize_with = "crate::gateway::int::opt")]
            pub n: Option<u32>,
            pub user: Option<String>,
            #[serde(default, deserialize_with = "crate::gateway::int::opt")]
            pub top_k: Option<u32>,
            #[schema(minimum = 0.0, maximum = 1.0)]
            pub min_p: Option<f32>,
            /// Above 0: the least positive normal f32 (`f32::MIN_POSITIVE`) is the smallest
            /// accepted.
            #[schema(minimum = 1.1754944e-38, maximum = 10.0)]
            pub repeat_penalty: Option<f32>,
            pub ignore_eos: Option<bool>,
            pub cache_prompt: Option<bool>,
            /// Extension: false opts this request out of speculative decoding.
            pub speculative: Option<bool>,
            /// Token id (as a string, below the vocabulary's size) -> bias in -100..=100
            /// added to its logit; -100 bans it. At most 1024 entries.
            #[schema(schema_with = logit_bias_schema)]
            pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
        }
        impl $name {
            pub fn common(&self) -> Common {
                Common {
                    model: self.model.clone(),
                    temperature: self.temperature,
                    top_p: self.top_p,
                    seed: self.seed,
                    stop: self.stop.clone(),
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    n: self.n,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    repeat_penalty: self.repeat_penalty,
                    ignore_eos: self.ignore_eos,
                    cache_prompt: self.cache_prompt,
                    speculative: self.speculative,
                    logit_bias: self.logit_bias.clone(),
                }
            }
        }
    };
}

request_struct!(
    /// `POST /v1/chat/completions`.
    ChatRequest {
        #[schema(min_items = 1)]
        messages: Vec<ChatMessageIn>,
        /// As `max_tokens` (which it replaces when both are given).
        #[schema(minimum = 1)]
        #[serde(default, deserialize_with = "crate::gateway::int::opt")]
        max_completion_tokens: Option<u32>,
        logprobs: Option<bool>,
        /// Only with `logprobs` true (otherwise a 400).
        #[schema(minimum = 0, maximum = 20)]
        #[serde(default, deserialize_with = "crate::gateway::int::opt")]
        top_logprobs: Option<u32>,
        /// Tool definitions, kept as sent (key order included) for the chat template;
        /// checked in `tools.rs`.
        tools: Option<Vec<serde_json::Value>>,
        tool_choice: Option<serde_json::Value>,
        parallel_tool_calls: Option<bool>,
        response_format: Option<serde_json::Value>,
        /// Extension: a Lark grammar (llguidance's dialect) the content must follow, at most
        /// 64 KiB of UTF-8; one that does not compile is a 400. Not with a JSON
        /// `response_format`.
        grammar: Option<String>,
        /// Extension (vLLM's): extra chat template variables (`enable_thinking`, ...).
        #[schema(value_type = Option<Object>)]
        chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
        /// OpenAI's predicted output (`{"type": "content", "content": ...}`): feeds the drafter.
        prediction: Option<Prediction>,
        /// Extension (llama-server's): where a thinking model's leading `<think>` block goes.
        reasoning_format: Option<ReasoningFormat>,
        /// `none`/`minimal` turn a hybrid model's thinking off, `low`..`xhigh` on (the chat
        /// template's `enable_thinking` / `thinking`, unless `chat_template_kwargs` sets them).
        #[schema(pattern = "^(none|minimal|low|medium|high|xhigh)$")]
        reasoning_effort: Option<String>,
    }
);

/// llama-server's `reasoning_format`.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningFormat {
    /// In `reasoning_content`.
    Deepseek,
    /// Left in the content.
    None,
    /// The server's `--reasoning-format`.
    Auto,
}

impl ReasoningFormat {
    /// Whether to split reasoning out (None: the server's choice).
    pub fn split(self) -> Option<bool> {
        match self {
            ReasoningFormat::Deepseek => Some(true),
            ReasoningFormat::None => Some(false),
            ReasoningFormat::Auto => Option::None,
        }
    }
}

/// OpenAI's `prediction`: the expected output (a string, or text parts), used as an extra
/// lookup source by the speculative drafter; it never changes the output.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    #[serde(rename = "type")]
    #[schema(pattern = "^content$")]
    pub kind: String,
    pub content: Content,
}

/// `prompt`: a string, a list with one string, token ids, or a list with one list of ids
/// (its schema below: one prompt per request, with at least one token).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    #[serde(deserialize_with = "crate::gateway::int::list")]
    Tokens(Vec<u32>),
    #[serde(deserialize_with = "crate::gateway::int::lists")]
    TokenLists(Vec<Vec<u32>>),
}

impl utoipa::PartialSchema for PromptField {
    fn schema() -> RefOr<Schema> {
        // a prompt needs a token: a non-empty text is at least one, an empty one only on a
        // model that adds a BOS token (`served_document` drops `minLength` there); ids are
        // used as given
        let text = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
        };
        let ids = || {
            ArrayBuilder::new()
                .items(Ref::from_schema_name("TokenId"))
                .min_items(Some(1))
        };
        // a list holding exactly one of `item` (one prompt per request)
        fn just_one(item: impl Into<utoipa::openapi::schema::ArrayItems>) -> ArrayBuilder {
            ArrayBuilder::new()
                .items(item)
                .min_items(Some(1))
                .max_items(Some(1))
        }
        OneOfBuilder::new()
            .item(text())
            .item(just_one(text()))
            .item(ids())
            .item(just_one(ids()))
            .description(Some(
                "`prompt`: a string, a list with one string, token ids, or a list with one list \
                 of ids. It needs at least one token: text is tokenized as the model does, so \
                 an empty string is the BOS token alone on a model that adds one (a 400 on \
                 others: this server's document says which by the strings' `minLength`); token \
                 ids are used as given, without a BOS token, so `[]` and `[[]]` are a 400.",
            ))
            .into()
    }
}

impl ToSchema for PromptField {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("TokenId".into(), TokenId::schema()));
    }
}

/// A token id of the served model's vocabulary; `served_document` sets its `maximum` (the
/// vocabulary's size less one).
pub struct TokenId;

impl utoipa::PartialSchema for TokenId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0))
            .description(Some("A token id of the served model's vocabulary."))
            .into()
    }
}

request_struct!(
    /// `POST /v1/completions`.
    CompletionRequest {
        prompt: PromptField,
        #[schema(minimum = 0, maximum = 5)]
        #[serde(default, deserialize_with = "crate::gateway::int::opt")]
        logprobs: Option<u32>,
        /// Not supported: only false.
        #[schema(schema_with = only_false)]
        echo: Option<bool>,
        /// Only 1 is supported.
        #[schema(minimum = 1, maximum = 1)]
        #[serde(default, deserialize_with = "crate::gateway::int::opt")]
        best_of: Option<u32>,
        /// Not supported: only empty.
        #[schema(max_length = 0)]
        suffix: Option<String>,
    }
);

/// `logit_bias`'s schema: token ids (decimal keys) to biases in -100..=100, at most
/// `convert::MAX_LOGIT_BIAS` entries.
fn logit_bias_schema() -> utoipa::openapi::Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[0-9]+$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .minimum(Some(-100.0))
                .maximum(Some(100.0)),
        ))
        .max_properties(Some(super::convert::MAX_LOGIT_BIAS))
        .build()
}

/// A boolean field the server takes only as false (or null).
pub(super) fn only_false() -> utoipa::openapi::Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Boolean, Type::Null]))
        .enum_values(Some([
            serde_json::Value::Bool(false),
            serde_json::Value::Null,
        ]))
        .build()
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

/// OpenAI's breakdown of the completion tokens: draft tokens (from `prediction` or the
/// server's own drafter) the model accepted and rejected.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: u32,
    pub rejected_prediction_tokens: u32,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(u: crate::scheduler::Usage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: CompletionTokensDetails {
                accepted_prediction_tokens: u.accepted_prediction_tokens,
                rejected_prediction_tokens: u.rejected_prediction_tokens,
            },
        }
    }
}

// ---- chat responses ----

#[derive(Serialize, Deserialize, Debug, Clone, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug, Clone, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize, Debug, Clone, Default, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// `function` of a tool call in a response: `arguments` is JSON text.
#[derive(Serialize, Debug, Clone, PartialEq, Eq, ToSchema)]
pub struct FunctionCallOut {
    pub name: String,
    pub arguments: String,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq, ToSchema)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// null when the message only calls tools.
    pub content: Option<String>,
    /// A thinking model's reasoning (its leading `<think>` block), apart from the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A piece of a streamed tool call: the first carries id, type and name (arguments empty),
/// the next ones arguments text, as OpenAI streams them.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Serialize, Debug, Clone, Default, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChunkChoice>,
    /// Present (null until the last chunk) only with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One server-sent event of a streamed answer, in the shape OpenAPI 3.2 gives a
/// `text/event-stream` item (and schemathesis checks each event against): `data` holds one
/// JSON chunk (`ChatChunk` or `Completion`), or `[DONE]` last. The server writes no `event`,
/// `id` or `retry` field, so a reader sees `event` as its default, `message`.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct StreamEvent {
    /// One chunk as JSON, or `[DONE]`.
    pub data: String,
    /// The event type (`message`).
    pub event: Option<String>,
    pub id: Option<String>,
    pub retry: Option<u64>,
}

// ---- legacy completion responses ----

#[derive(Serialize, Debug, Clone, Default, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    #[schema(value_type = Vec<Object>)]
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    pub text_offset: Vec<u32>,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct CompletionChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

// ---- models ----

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}
