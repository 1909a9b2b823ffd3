//! `ModelText`: the model's tokenizer and chat template behind the scheduler's `TextModel` seam.
//! Chat prompts are rendered with the GGUF's own template (`tokenizer.chat_template`); a model
//! without one gets ChatML. Special tokens are parsed only in rendered chat prompts.

use super::backend::{ChatTurn, TextModel};
use nightshift_model::chat::{ChatMessage, ChatTemplate};
use nightshift_model::tokenizer::Tokenizer;
use nightshift_model::Model;

pub struct ModelText {
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    bos: String,
    eos: String,
}

impl ModelText {
    pub fn from_model(model: &Model) -> Result<ModelText, String> {
        let g = model.gguf();
        let tok = Tokenizer::from_gguf(g).map_err(|e| format!("tokenizer: {e}"))?;
        let template = ChatTemplate::from_gguf(g).map_err(|e| format!("chat template: {e}"))?;
        let piece = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
                .unwrap_or_default()
        };
        let bos = piece(tok.bos());
        let eos = piece(tok.eos());
        Ok(ModelText {
            tok,
            template,
            bos,
            eos,
        })
    }
}

impl TextModel for ModelText {
    fn render_chat(&self, turns: &[ChatTurn]) -> Result<String, String> {
        let msgs: Vec<ChatMessage> = turns
            .iter()
            .map(|t| ChatMessage {
                role: t.role.clone(),
                content: t.content.clone(),
            })
            .collect();
        match &self.template {
            Some(t) => t
                .render(&msgs, true, &self.bos, &self.eos)
                .map_err(|e| e.to_string()),
            None => {
                let mut s = String::new();
                for m in &msgs {
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
