//! `ModelText`: the model's tokenizer and chat template behind the scheduler's `TextModel` seam.
//! Chat prompts are rendered with the GGUF's own template (`tokenizer.chat_template`), tools and
//! tool messages included; a model without one gets ChatML. Special tokens are parsed only in
//! rendered chat prompts. The tool-call format comes from the template's markers unless the
//! server names one (`--tool-format`); the constraint vocabulary is built on first use.

use std::sync::{Arc, OnceLock};

use super::backend::{ChatPrompt, TextModel};
use nightshift_model::chat::{ChatTemplate, RenderOptions};
use nightshift_model::constrain::ConstraintVocab;
use nightshift_model::tokenizer::Tokenizer;
use nightshift_model::toolcall::ToolFormat;
use nightshift_model::Model;

pub struct ModelText {
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    bos: String,
    eos: String,
    tool_format: Option<ToolFormat>,
    vocab: OnceLock<Option<Arc<ConstraintVocab>>>,
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
        Ok(ModelText {
            tok,
            template,
            bos,
            eos,
            tool_format,
            vocab: OnceLock::new(),
        })
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
                t.render_with(&prompt.messages, &opts)
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
        // BOS when the model wants one, unless a chat template already wrote it.
        let has_bos = chat && !self.bos.is_empty() && text.starts_with(&self.bos);
        self.tok.encode(text, self.tok.add_bos() && !has_bos, chat)
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
