//! The two seams the scheduler drives, so that it can be built and tested before and apart from
//! the model crate: `StepEngine` (sequences + one batched forward step, owned by the engine
//! thread) and `TextModel` (tokenizer + chat template, shared with the HTTP handlers). The
//! adapters over `nightshift_model` live in `model_backend.rs`; `mock.rs` has a deterministic
//! stand-in used by the tests.

/// Opaque id of one sequence inside a `StepEngine`.
pub type SeqHandle = u64;

/// One token of an engine batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepToken {
    pub seq: SeqHandle,
    pub token: u32,
    pub pos: u32,
    pub want_logits: bool,
}

/// Why a sequence could not be added.
#[derive(Debug)]
pub enum AdmitError {
    /// The KV-cache budget (or sequence limit) is used up now; retry when a sequence ends.
    Full,
    /// Anything else.
    #[allow(dead_code)] // the model adapter returns it
    Failed(String),
}

/// A failed forward step.
#[derive(Debug)]
pub struct StepError {
    /// Expert nodes unreachable (HTTP 503) rather than an internal failure (HTTP 500).
    pub unavailable: bool,
    pub message: String,
}

/// A model with a KV cache for several sequences; driven by exactly one thread.
pub trait StepEngine: Send + 'static {
    fn add_sequence(&mut self) -> Result<SeqHandle, AdmitError>;
    fn remove_sequence(&mut self, seq: SeqHandle);
    /// One step; returns one row of logits per token with `want_logits`, in batch order.
    fn forward(&mut self, batch: &[StepToken]) -> Result<Vec<Vec<f32>>, StepError>;
}

pub use nightshift_model::chat::{ChatMessage, ToolCall};
use nightshift_model::constrain::ConstraintVocab;
use nightshift_model::toolcall::ToolFormat;

/// The prompt side of a chat request, already validated by the gateway: the messages (text
/// content, tool calls, tool results), the tool definitions as the client sent them, and extra
/// template variables (`chat_template_kwargs`).
#[derive(Clone, Debug, Default)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Vec<serde_json::Value>>,
    pub extra: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Tokenizer and chat template of the served model.
pub trait TextModel: Send + Sync + 'static {
    /// Renders the chat with the model's template, ending with the assistant prompt.
    fn render_chat(&self, prompt: &ChatPrompt) -> Result<String, String>;
    /// The format the chat template writes tool calls in (None: it writes none).
    fn tool_format(&self) -> Option<ToolFormat> {
        None
    }
    /// The vocabulary for constrained decoding (None: constraints are not available).
    fn constraint_vocab(&self) -> Option<std::sync::Arc<ConstraintVocab>> {
        None
    }
    /// Tokenizes a prompt; `chat` = the text came from the chat template (special tokens parsed).
    fn encode(&self, text: &str, chat: bool) -> Vec<u32>;
    /// The prompt of a chat: rendered, then tokenized with special tokens coming from the
    /// template's markup only (the model's `ModelText` keeps message contents plain text).
    fn tokenize_chat(&self, prompt: &ChatPrompt) -> Result<Vec<u32>, String> {
        Ok(self.encode(&self.render_chat(prompt)?, true))
    }
    /// Raw bytes of a token's piece.
    fn token_bytes(&self, id: u32) -> Vec<u8>;
    /// Bytes of the longest token's piece: a text of N bytes is at least N / this many tokens.
    fn max_token_bytes(&self) -> usize;
    /// End-of-generation token (EOS, EOT, <|im_end|>, ...).
    fn is_eog(&self, id: u32) -> bool;
    fn vocab_size(&self) -> usize;
}
