//! Chat templates from `tokenizer.chat_template`, rendered with minijinja plus the Python string
//! methods of minijinja-contrib's pycompat (`.strip()`, `.startswith()`, ...) that Hugging Face
//! templates use. Whitespace handling is HF's (`trim_blocks` and `lstrip_blocks` on, loop
//! controls on, line breaks read as `\n` whatever the file's endings, transformers'
//! `{% generation %}` tag rendering its body), the context is HF's `apply_chat_template` one:
//! `messages` (with `tool_calls`,
//! `tool_call_id`, `name`, `reasoning_content`), `tools` (undefined without tools),
//! `add_generation_prompt`, `bos_token`,
//! `eos_token`, any extra keyword arguments, plus `raise_exception(msg)`, `strftime_now(fmt)`
//! and a `tojson` that writes Python's `json.dumps` text (`chat/pyjson.rs`), so the published
//! templates of Qwen3, Qwen3-Coder, Kimi K2 and DeepSeek V3.1 render byte for byte as Python's
//! jinja2 renders them (`tests/chat_templates.rs`).
//!
//! Templates disagree on how an assistant's tool call must be given to them: Qwen3-Coder
//! iterates `arguments|items` (an object), DeepSeek concatenates it (a string), Kimi's first
//! template always `tojson`s it. As llama.cpp does, each template is probed once when it is
//! compiled (`Quirks`), and a call's arguments (kept as the client's JSON text) are handed to it
//! in the form it renders correctly.

mod pyjson;
mod time;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::gguf::{Gguf, GgufError};

pub use pyjson::{dumps as py_json_dumps, py_float, to_value as json_to_value, DumpOptions};

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
    #[error(
        "chat template stopped: rendering took more steps than its budget (one per \
         instruction and per 64 bytes of text made; see `chat::render_fuel`), far more than \
         this conversation can need: the template loops or builds text without end"
    )]
    OutOfFuel,
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One tool call of an assistant message.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call id.
    pub tool_call_id: Option<String>,
    /// A tool result's function name (or a participant's name).
    pub name: Option<String>,
    /// An assistant's reasoning (Qwen3 renders it in `<think>`).
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// Everything a render takes besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions<'a> {
    /// The tool definitions as the client sent them (`{"type": "function", "function": {..}}`).
    pub tools: Option<&'a [serde_json::Value]>,
    pub add_generation_prompt: bool,
    /// The texts of the model's BOS / EOS tokens.
    pub bos: &'a str,
    pub eos: &'a str,
    /// Extra template variables (`enable_thinking`, `thinking`, ...).
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// How a template wants tool calls handed to it (found by probing it once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quirks {
    /// `function.arguments` as an object (else the JSON text).
    pub arguments_as_object: bool,
    /// The content of a message that only calls tools as `none` (else `""`).
    pub tool_call_content_none: bool,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    quirks: Quirks,
    /// What the template does with tool definitions (probed once, [`ToolShim`]).
    shim: ToolShim,
}

/// How a template that never prints the `tools` it is given (DeepSeek V3, V3.1 and R1's
/// published ones: their makers' servers add the definitions) still shows them to the model, as
/// llama.cpp's template runtime does: the definitions and an example call in the template's own
/// syntax are added to the system prompt ([`ChatTemplate::render_prompt`]). Probed once when the
/// template is compiled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolShim {
    /// The template prints the tool definitions itself (nothing to add).
    pub prints_tools: bool,
    /// The template prints a system message (else the definitions open the first user turn).
    pub system_role: bool,
    /// A call of a tool `tool_name` with `{"arg1": "some_value"}` as the template writes an
    /// assistant turn that makes it, when it can be cut out of a render.
    pub example: Option<String>,
}

const NAME: &str = "chat";

/// What a render may do before its conversation's share is added (minijinja's fuel: one per
/// instruction and per 64 bytes of text made or processed), so that a template from a file (a
/// GGUF's, `--chat-template`'s) cannot hang the server or take its memory: about 16 M steps or
/// 1 GiB of text, plus [`render_fuel`]'s share of the conversation.
pub const RENDER_FUEL: u64 = 16 << 20;

/// The fuel a render of `n` messages gets: [`RENDER_FUEL`] plus 2 per pair of messages (a
/// template may look ahead from each message: DeepSeek-V3.2's takes ~1.8 n^2). The text itself
/// needs no share of its own: a request body is at most 4 MiB (`gateway::extract::BODY_LIMIT`)
/// against the 1 GiB of text the base allows. The published templates render a 2,001-message,
/// 8 MiB agent conversation with 64 tools in 0.25-0.69 M of it, DeepSeek-V3.2's in 7.4 M
/// (docs/RESULTS.md); `tests/chat_templates_published.rs` renders that session and a
/// 4,001-message one on each of them.
pub fn render_fuel(n: usize) -> u64 {
    let n = n as u64;
    RENDER_FUEL.saturating_add(n.saturating_mul(n).saturating_mul(2))
}

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
        env.add_function("strftime_now", time::strftime_now);
        env.add_filter("tojson", pyjson::tojson_filter);
        env.add_template_owned(NAME, jinja_source(source))
            .map_err(|e| TemplateError::Syntax(error_chain(&e)))?;
        let mut t = ChatTemplate {
            env,
            source: source.to_string(),
            quirks: Quirks {
                arguments_as_object: false,
                tool_call_content_none: false,
            },
            shim: ToolShim::default(),
        };
        t.quirks = t.probe();
        t.shim = t.probe_shim();
        Ok(t)
    }

    /// What the template does with tool definitions ([`ToolShim`]).
    pub fn tool_shim(&self) -> &ToolShim {
        &self.shim
    }

    /// Probes whether the template prints `tools` and system messages, and cuts an example call
    /// out of an assistant turn it renders (the text after what the generation prompt alone
    /// renders, the EOS and trailing blanks taken off).
    fn probe_shim(&self) -> ToolShim {
        let tools = [serde_json::json!({"type": "function", "function": {
            "name": "probe_tool_fn", "description": "probe description",
            "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}}}}})];
        let user = ChatMessage::new("user", "probe user turn");
        let with_tools = RenderOptions {
            tools: Some(&tools),
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let prints_tools = self
            .render_quirks(std::slice::from_ref(&user), &with_tools, self.quirks)
            .is_ok_and(|s| s.contains("probe_tool_fn"));
        let system = ChatMessage::new("system", "probe system turn");
        let system_role = self
            .render_quirks(
                &[system, user.clone()],
                &RenderOptions {
                    add_generation_prompt: true,
                    ..RenderOptions::default()
                },
                self.quirks,
            )
            .is_ok_and(|s| s.contains("probe system turn"));
        const EOS: &str = "<probe-eos>";
        let call = ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![ToolCall {
                id: "call_1___".into(),
                name: "tool_name".into(),
                arguments: r#"{"arg1": "some_value"}"#.into(),
            }],
            ..ChatMessage::default()
        };
        let opts = |gen| RenderOptions {
            add_generation_prompt: gen,
            eos: EOS,
            ..RenderOptions::default()
        };
        let prefix = self.render_quirks(std::slice::from_ref(&user), &opts(true), self.quirks);
        let full = self.render_quirks(&[user, call], &opts(false), self.quirks);
        let example = match (prefix, full) {
            (Ok(p), Ok(f)) => {
                let common = p
                    .char_indices()
                    .zip(f.chars())
                    .take_while(|((_, a), b)| a == b)
                    .last()
                    .map_or(0, |((i, a), _)| i + a.len_utf8());
                let tail = f[common..].trim_end();
                let tail = tail.strip_suffix(EOS).unwrap_or(tail).trim_end();
                (tail.contains("tool_name") && tail.contains("some_value"))
                    .then(|| tail.to_string())
            }
            _ => None,
        };
        ToolShim {
            prints_tools,
            system_role,
            example,
        }
    }

    /// Renders a request's prompt: [`ChatTemplate::render_with`], and when tools are given to a
    /// template that does not print them ([`ToolShim`]), their definitions (and an example call
    /// in the template's syntax) added to the system message (or one made for them; the first
    /// user turn when the template prints no system message), as llama.cpp does.
    pub fn render_prompt(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, TemplateError> {
        let tools = opts.tools.filter(|t| !t.is_empty());
        let Some(tools) = tools.filter(|_| !self.shim.prints_tools) else {
            return self.render_with(messages, opts);
        };
        let defs = serde_json::to_string_pretty(tools).unwrap_or_default();
        let mut text = format!(
            "You can call any of the following tools to satisfy the user's requests: {defs}"
        );
        if let Some(ex) = &self.shim.example {
            // a template that writes its EOS itself instead of `eos_token` (DeepSeek-V3.1's)
            let ex = match opts.eos {
                "" => ex.as_str(),
                eos => ex.strip_suffix(eos).unwrap_or(ex).trim_end(),
            };
            text.push_str(&format!("\n\nExample tool call syntax:\n\n{ex}\n\n"));
        }
        let mut msgs = messages.to_vec();
        match msgs.iter().position(|m| m.role == "system") {
            Some(0) if self.shim.system_role => {
                let m = &mut msgs[0];
                m.content = format!("{}\n\n{text}", m.content);
            }
            _ if self.shim.system_role => msgs.insert(0, ChatMessage::new("system", text)),
            _ => match msgs.iter_mut().find(|m| m.role == "user") {
                Some(u) => u.content = format!("{text}\n\n{}", u.content),
                None => msgs.insert(0, ChatMessage::new("user", text)),
            },
        }
        self.render_with(&msgs, opts)
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// How this template takes tool calls.
    pub fn quirks(&self) -> Quirks {
        self.quirks
    }

    /// Renders a one-call conversation with the arguments as text and as an object, and the
    /// content as `""` and as none, and keeps the first argument form whose call comes out
    /// intact (the name and the argument value present, the arguments not JSON-encoded twice),
    /// with the content form that renders less when both are intact.
    fn probe(&self) -> Quirks {
        let tools = [serde_json::json!({"type": "function", "function": {
            "name": "probe_fn", "description": "d",
            "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}}}}})];
        let call = ToolCall {
            id: "functions.probe_fn:0".into(),
            name: "probe_fn".into(),
            arguments: r#"{"probe_arg": "probe_val"}"#.into(),
        };
        let msgs = [
            ChatMessage::new("user", "u"),
            ChatMessage {
                role: "assistant".into(),
                tool_calls: vec![call],
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "r".into(),
                tool_call_id: Some("functions.probe_fn:0".into()),
                name: Some("probe_fn".into()),
                ..ChatMessage::default()
            },
        ];
        let opts = RenderOptions {
            tools: Some(&tools),
            ..RenderOptions::default()
        };
        // the render of a form whose call came out intact
        let intact = |a: bool, c: bool| {
            let q = Quirks {
                arguments_as_object: a,
                tool_call_content_none: c,
            };
            self.render_quirks(&msgs, &opts, q).ok().filter(|s| {
                s.contains("probe_fn") && s.contains("probe_val") && !s.contains(r#"\"probe_arg\""#)
            })
        };
        for a in [false, true] {
            let empty = intact(a, false);
            let none = intact(a, true);
            // Both intact: content none when that renders less. A template that tests
            // `content is not none` (DeepSeek-R1's) writes a second, empty assistant turn for
            // `""`, while one that prints the content prints `none` for none.
            let c = match (&empty, &none) {
                (Some(e), Some(n)) => n.len() < e.len(),
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (None, None) => continue,
            };
            return Quirks {
                arguments_as_object: a,
                tool_call_content_none: c,
            };
        }
        Quirks {
            arguments_as_object: false,
            tool_call_content_none: false,
        }
    }

    /// Renders a conversation. `bos` / `eos` are the texts of the model's BOS / EOS tokens.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, TemplateError> {
        let opts = RenderOptions {
            add_generation_prompt,
            bos,
            eos,
            ..RenderOptions::default()
        };
        self.render_with(messages, &opts)
    }

    /// Renders a conversation with tools and extra variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, TemplateError> {
        self.render_quirks(messages, opts, self.quirks)
    }

    fn render_quirks(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
        q: Quirks,
    ) -> Result<String, TemplateError> {
        let msgs: Vec<Value> = messages.iter().map(|m| message_value(m, q)).collect();
        // without tools the variable is undefined (`tools is defined` is false)
        let tools = opts
            .tools
            .map(|t| Value::from(t.iter().map(pyjson::to_value).collect::<Vec<_>>()));
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        if let Some(extra) = opts.extra {
            for (k, v) in extra {
                pairs.push((Value::from(k.as_str()), pyjson::to_value(v)));
            }
        }
        let fixed = [
            ("messages", Some(Value::from(msgs))),
            ("tools", tools),
            (
                "add_generation_prompt",
                Some(Value::from(opts.add_generation_prompt)),
            ),
            ("bos_token", Some(Value::from(opts.bos))),
            ("eos_token", Some(Value::from(opts.eos))),
        ];
        for (k, v) in fixed {
            let Some(v) = v else { continue };
            pairs.retain(|(name, _)| name.as_str() != Some(k));
            pairs.push((Value::from(k), v));
        }
        let ctx = Value::from_pairs(pairs);
        // the compiled template is shared (an `Arc`); only the budget is this render's
        let mut env = self.env.clone();
        env.set_fuel(Some(render_fuel(messages.len())));
        let tmpl = env
            .get_template(NAME)
            .map_err(|e| TemplateError::Render(error_chain(&e)))?;
        tmpl.render(ctx).map_err(|e| {
            if e.kind() == ErrorKind::OutOfFuel {
                return TemplateError::OutOfFuel;
            }
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

/// The source as Python's jinja2 reads it under transformers, for minijinja:
/// - every line break (`\r\n`, `\r`) becomes `\n`, in text and in string literals alike, as
///   jinja2's lexer does before it tokenizes (templates saved with CRLF endings render `\n`);
/// - transformers' `{% generation %}...{% endgeneration %}` (its `AssistantTracker` extension,
///   which renders the body as it is and only records where it lands) becomes a `with` block:
///   the body renders the same, in a scope of its own as the extension's call block has, and
///   the tags keep their whitespace-control marks.
fn jinja_source(source: &str) -> String {
    let text = source.replace("\r\n", "\n").replace('\r', "\n");
    let tag = fancy_regex::Regex::new(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")
        .expect("a valid pattern");
    tag.replace_all(&text, |c: &fancy_regex::Captures<str>| {
        let (open, close) = (&c[1], &c[3]);
        match c.get(2) {
            Some(_) => format!("{{%{open} endwith {close}%}}"),
            None => format!("{{%{open} with __generation_block = true {close}%}}"),
        }
    })
    .into_owned()
}

/// One message as HF's template context has it (keys in the order OpenAI clients send them).
fn message_value(m: &ChatMessage, q: Quirks) -> Value {
    let mut pairs: Vec<(&str, Value)> = vec![("role", Value::from(m.role.as_str()))];
    let content = if !m.tool_calls.is_empty() && m.content.is_empty() && q.tool_call_content_none {
        Value::from(())
    } else {
        Value::from(m.content.as_str())
    };
    pairs.push(("content", content));
    if let Some(r) = &m.reasoning_content {
        pairs.push(("reasoning_content", Value::from(r.as_str())));
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m.tool_calls.iter().map(|c| call_value(c, q)).collect();
        pairs.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &m.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(n) = &m.name {
        pairs.push(("name", Value::from(n.as_str())));
    }
    Value::from_pairs(pairs)
}

fn call_value(c: &ToolCall, q: Quirks) -> Value {
    let arguments = match serde_json::from_str::<serde_json::Value>(&c.arguments) {
        Ok(j @ serde_json::Value::Object(_)) if q.arguments_as_object => pyjson::to_value(&j),
        _ => Value::from(c.arguments.as_str()),
    };
    let function = Value::from_pairs([
        ("name", Value::from(c.name.as_str())),
        ("arguments", arguments),
    ]);
    Value::from_pairs([
        ("id", Value::from(c.id.as_str())),
        ("type", Value::from("function")),
        ("function", function),
    ])
}

/// The token ids of a conversation under `template` (ChatML when the file has none) with the
/// generation prompt appended, BOS added unless the rendering starts with it: how
/// `nightshift-atlas record --model` and gen-model's router calibration feed prompts to the engine.
pub fn encode_conversation(
    tok: &crate::tokenizer::Tokenizer,
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
) -> Result<Vec<u32>, TemplateError> {
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
            .unwrap_or_default()
    };
    let (bos, eos) = (piece(tok.bos()), piece(tok.eos()));
    let rendered = match template {
        Some(t) => t.render(messages, true, &bos, &eos)?,
        None => {
            let mut s = String::new();
            for m in messages {
                s.push_str(&format!(
                    "<|im_start|>{}\n{}<|im_end|>\n",
                    m.role, m.content
                ));
            }
            s + "<|im_start|>assistant\n"
        }
    };
    let has_bos = !bos.is_empty() && rendered.starts_with(&bos);
    Ok(tok.encode(&rendered, tok.add_bos() && !has_bos, true))
}
