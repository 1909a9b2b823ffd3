//! The two seams the scheduler drives, so that it can be tested apart from a real model:
//! `StepEngine` (sequences + one batched forward step, owned by the engine thread, in the
//! engine's own `SeqId`/`BatchToken`) and `TextModel` (tokenizer + chat template, shared with
//! the HTTP handlers). The adapters over `nightshift_model` live in `model_backend.rs`;
//! `mock.rs` has a deterministic stand-in used by the tests.

pub use nightshift_model::{Attached, BatchToken, KvStats, SeqId};

/// A sequence the engine admitted, and how much of its prompt it already holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    pub seq: SeqId,
    /// Prompt positions found in the prefix cache (the first token to feed is `prompt[cached]`).
    pub cached: usize,
}

/// Why a sequence could not be added.
#[derive(Debug)]
pub enum AdmitError {
    /// The KV cache cannot promise the blocks (or the sequence limit is reached) now; retry
    /// when a sequence ends.
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
    /// Starts a sequence for `prompt` that may grow to `max_len` positions: it starts from the
    /// longest cached prefix of the prompt (with `reuse`), and the cache promises it every block
    /// it may need (`AdmitError::Full` when it cannot now).
    fn add_sequence(
        &mut self,
        prompt: &[u32],
        max_len: usize,
        reuse: bool,
    ) -> Result<Admitted, AdmitError>;
    fn remove_sequence(&mut self, seq: SeqId);
    /// Before a prefill chunk of `seq`: it takes the blocks of its prompt other sequences
    /// computed since its admission, and `wait` says its next block is still being computed by
    /// another sequence (feed it nothing this step).
    fn attach(&mut self, seq: SeqId) -> Result<Attached, StepError>;
    /// One step; returns one row of logits per token with `want_logits`, in batch order.
    fn forward(&mut self, batch: &[BatchToken]) -> Result<Vec<Vec<f32>>, StepError>;
    /// A verification step: like `forward`, where the last `n` tokens of each `(seq, n)` of
    /// `drafts` are draft tokens (kept out of the prefix cache until `truncate` settles them).
    fn forward_drafts(
        &mut self,
        batch: &[BatchToken],
        drafts: &[(SeqId, usize)],
    ) -> Result<Vec<Vec<f32>>, StepError>;
    /// Cuts a sequence back to its first `len` positions (rejected drafts) and settles them.
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), StepError>;
    /// The KV cache's state (blocks, prefix-cache hits), for `/metrics` and `/v1/admin/kv`.
    fn kv_stats(&self) -> KvStats;
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
    /// Whether chat output may open with a `<think>` block to send as `reasoning_content`:
    /// the template writes think blocks, and the request (`asked`, else the server's
    /// `--reasoning-format`) wants reasoning split out.
    fn splits_reasoning(&self, _asked: Option<bool>) -> bool {
        false
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
