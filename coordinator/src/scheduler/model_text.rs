//! `ModelText`: the model's tokenizer and chat template behind the scheduler's `TextModel` seam.
//! Chat prompts are rendered with the GGUF's own template (`tokenizer.chat_template`), tools and
//! tool messages included; a model without one gets ChatML. Special tokens are parsed only in
//! rendered chat prompts, and only from the template's markup: what clients wrote (contents,
//! names, tool definitions) is plain text (`Tokenizer::protect_content`) unless
//! `--allow-special-in-content`. The tool-call format comes from the template's markers unless
//! the server names one (`--tool-format`); the constraint vocabulary is built on first use.

use std::sync::{Arc, OnceLock};

use super::backend::{ChatPrompt, TextModel};
use nightshift_model::chat::{ChatTemplate, RenderOptions};
use nightshift_model::constrain::ConstraintVocab;
use nightshift_model::tokenizer::{Protect, Tokenizer};
use nightshift_model::toolcall::ToolFormat;
use nightshift_model::Model;

pub struct ModelText {
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    bos: String,
    eos: String,
    tool_format: Option<ToolFormat>,
    vocab: OnceLock<Option<Arc<ConstraintVocab>>>,
    /// Message contents may produce special tokens (the behaviour before contents were plain).
    special_in_content: bool,
    /// The template writes think blocks.
    thinks: bool,
    /// Reasoning is split out unless a request says otherwise (`--reasoning-format`).
    split_reasoning: bool,
    /// Bytes of the longest token's piece.
    longest: usize,
}

impl ModelText {
    /// The model's text side; `tool_format` overrides the format found in the template.
    pub fn from_model(model: &Model, tool_format: Option<ToolFormat>) -> Result<ModelText, String> {
        let g = model.gguf();
        let tok = Tokenizer::from_gguf(g).map_err(|e| format!("tokenizer: {e}"))?;
        let template = ChatTemplate::from_gguf(g).map_err(|e| format!("chat template: {e}"))?;
        let piece = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
                .unwrap_or_default()
        };
        let bos = piece(tok.bos());
        let eos = piece(tok.eos());
        let tool_format = tool_format.or_else(|| {
            template
                .as_ref()
                .and_then(|t| ToolFormat::detect(t.source()))
        });
        let longest = (0..tok.vocab_size() as u32)
            .map(|i| tok.token_bytes(i).len())
            .max()
            .unwrap_or(1);
        let thinks = template
            .as_ref()
            .is_some_and(|t| nightshift_model::reasoning::template_thinks(t.source()));
        Ok(ModelText {
            longest,
            special_in_content: false,
            thinks,
            split_reasoning: true,
            tok,
            template,
            bos,
            eos,
            tool_format,
            vocab: OnceLock::new(),
        })
    }

    /// Leaves think blocks in the content unless a request asks (`--reasoning-format none`).
    pub fn without_reasoning_split(mut self) -> ModelText {
        self.split_reasoning = false;
        self
    }

    /// Lets message contents produce special tokens (`--allow-special-in-content`).
    pub fn with_special_in_content(mut self, allow: bool) -> ModelText {
        self.special_in_content = allow;
        self
    }

    /// BOS when the model wants one, unless a chat template already wrote it.
    fn add_bos(&self, text: &str, chat: bool) -> bool {
        let has_bos = chat && !self.bos.is_empty() && text.starts_with(&self.bos);
        self.tok.add_bos() && !has_bos
    }

    /// `prompt` with every client-written string protected (`Tokenizer::protect_content`): an
    /// assistant's own markup (`<think>`, `<tool_call>`: user-defined tokens) stays in its turns.
    fn protect(&self, prompt: &ChatPrompt) -> ChatPrompt {
        let p = |s: &str, w| self.tok.protect_content(s, w);
        let json = |v: &serde_json::Value| protect_json(v, &|s| p(s, Protect::All));
        ChatPrompt {
            messages: prompt
                .messages
                .iter()
                .map(|m| {
                    let own = if m.role == "assistant" {
                        Protect::Control
                    } else {
                        Protect::All
                    };
                    let mut m = m.clone();
                    m.content = p(&m.content, own);
                    m.reasoning_content = m.reasoning_content.map(|r| p(&r, Protect::Control));
                    m.name = m.name.map(|n| p(&n, Protect::All));
                    m.tool_call_id = m.tool_call_id.map(|n| p(&n, Protect::All));
                    for c in &mut m.tool_calls {
                        c.id = p(&c.id, Protect::All);
                        c.name = p(&c.name, Protect::All);
                        c.arguments = p(&c.arguments, Protect::Control);
                    }
                    m
                })
                .collect(),
            tools: prompt.tools.as_ref().map(|t| t.iter().map(json).collect()),
            extra: prompt
                .extra
                .as_ref()
                .map(|e| e.iter().map(|(k, v)| (k.clone(), json(v))).collect()),
        }
    }
}

/// `v` with `f` applied to every string in it (keys stay: the template looks them up).
fn protect_json(v: &serde_json::Value, f: &dyn Fn(&str) -> String) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(f(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| protect_json(x, f)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), protect_json(x, f)))
                .collect(),
        ),
        other => other.clone(),
    }
}

impl TextModel for ModelText {
    fn render_chat(&self, prompt: &ChatPrompt) -> Result<String, String> {
        match &self.template {
            Some(t) => {
                let opts = RenderOptions {
                    tools: prompt.tools.as_deref(),
                    add_generation_prompt: true,
                    bos: &self.bos,
                    eos: &self.eos,
                    extra: prompt.extra.as_ref(),
                };
                t.render_prompt(&prompt.messages, &opts)
                    .map_err(|e| e.to_string())
            }
            None => {
                let mut s = String::new();
                for m in &prompt.messages {
                    s.push_str(&format!(
                        "<|im_start|>{}\n{}<|im_end|>\n",
                        m.role, m.content
                    ));
                }
                s.push_str("<|im_start|>assistant\n");
                Ok(s)
            }
        }
    }

    fn tool_format(&self) -> Option<ToolFormat> {
        self.tool_format
    }

    fn splits_reasoning(&self, asked: Option<bool>) -> bool {
        self.thinks && asked.unwrap_or(self.split_reasoning)
    }

    fn constraint_vocab(&self) -> Option<Arc<ConstraintVocab>> {
        self.vocab
            .get_or_init(|| match ConstraintVocab::from_tokenizer(&self.tok) {
                Ok(v) => Some(Arc::new(v)),
                Err(e) => {
                    tracing::warn!(error = %e, "constrained decoding is not available");
                    None
                }
            })
            .clone()
    }

    fn encode(&self, text: &str, chat: bool) -> Vec<u32> {
        self.tok.encode(text, self.add_bos(text, chat), chat)
    }

    fn tokenize_chat(&self, prompt: &ChatPrompt) -> Result<Vec<u32>, String> {
        if self.special_in_content {
            return Ok(self.encode(&self.render_chat(prompt)?, true));
        }
        let (text, plain) = self
            .tok
            .restore_content(&self.render_chat(&self.protect(prompt))?);
        Ok(self
            .tok
            .encode_with_plain(&text, self.add_bos(&text, true), &plain))
    }

    fn max_token_bytes(&self) -> usize {
        self.longest
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        if (id as usize) < self.tok.vocab_size() {
            self.tok.token_bytes(id).to_vec()
        } else {
            Vec::new()
        }
    }

    fn is_eog(&self, id: u32) -> bool {
        self.tok.is_eog(id)
    }

    fn vocab_size(&self) -> usize {
        self.tok.vocab_size()
    }
}
