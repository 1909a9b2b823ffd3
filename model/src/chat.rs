//! Chat templates from `tokenizer.chat_template`, rendered with minijinja plus the Python string
//! methods of minijinja-contrib's pycompat (`.strip()`, `.startswith()`, ...) that Hugging Face
//! templates use. Whitespace handling is HF's (`trim_blocks` and `lstrip_blocks` on), the
//! context is HF's `apply_chat_template` one: `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, plus `raise_exception(msg)`.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::gguf::{Gguf, GgufError};

/// The metadata key holding the default chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("chat template does not parse: {0}")]
    Syntax(String),
    #[error("chat template raised: {0}")]
    Raised(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

const NAME: &str = "chat";

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}

fn error_chain(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, if the file has one.
    pub fn from_gguf(g: &Gguf) -> Result<Option<ChatTemplate>, TemplateError> {
        match g.metadata().get_str(CHAT_TEMPLATE_KEY)? {
            Some(src) => ChatTemplate::new(src).map(Some),
            None => Ok(None),
        }
    }

    /// Compiles a template from its source.
    pub fn new(source: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TemplateError::Syntax(error_chain(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `bos` / `eos` are the texts of the model's BOS / EOS tokens.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, TemplateError> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert(Value::from("role"), Value::from(m.role.as_str()));
                map.insert(Value::from("content"), Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => Value::from(msgs),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos,
            eos_token => eos,
        };
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Render(error_chain(&e)))?;
        tmpl.render(ctx).map_err(|e| {
            let msg = error_chain(&e);
            match msg.find("raise_exception: ") {
                Some(at) => {
                    let raised = &msg[at + "raise_exception: ".len()..];
                    TemplateError::Raised(
                        raised.split(" (in ").next().unwrap_or(raised).to_string(),
                    )
                }
                None => TemplateError::Render(msg),
            }
        })
    }
}
