//! A call's arguments as they are generated, for output a grammar makes well-formed (a forced
//! call, or `auto` with strict tools): the call's name goes out as soon as it is known and its
//! arguments in pieces, as OpenAI streams them, instead of the whole call at its closing
//! marker. Each format's header (Hermes' `{"name": "..", "arguments": `, Kimi K2's
//! `functions.NAME:IDX<|tool_call_argument_begin|>`, DeepSeek's `NAME<｜tool▁sep｜>`,
//! Qwen3-Coder's `<function=NAME>`, DeepSeek-V3.2's `NAME">`) is read from the start of the
//! body; the JSON formats then send the argument text as written (a string/depth scanner finds
//! where Hermes' arguments object ends), Qwen3-Coder and DeepSeek-V3.2 one `"param": value`
//! member per closed parameter block.
//! A body that does not start like its format is left to the whole-call parser at the close.

use super::formats::{param_block, properties};
use super::{ToolFormat, ToolSpec};

/// What the body of the open call has given so far.
#[derive(Debug, Default)]
pub(super) struct ArgStream {
    /// The header is known: (id, name) sent, arguments start at this byte of the body.
    args_at: Option<usize>,
    /// The body does not follow the format's layout: the call is parsed whole at its close.
    fallback: bool,
    /// Body bytes already sent as arguments (JSON formats), or read as parameters (Coder).
    done: usize,
    /// The first argument character was sent (blanks before it are not).
    started: bool,
    /// JSON scanner over the sent argument text: nesting depth, inside a string, after `\`.
    depth: u32,
    in_str: bool,
    escaped: bool,
    /// Hermes, DeepSeek-V3: the arguments object closed.
    closed: bool,
    /// Qwen3-Coder, DeepSeek-V3.2: parameters sent.
    params: usize,
}

/// What one step of the open call gives.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The header: the id the model wrote (Kimi K2), the name.
    Begin(Option<String>, String),
    /// More argument text.
    Args(String),
}

impl ArgStream {
    pub fn header_sent(&self) -> bool {
        self.args_at.is_some()
    }

    pub fn fell_back(&self) -> bool {
        self.fallback
    }

    /// Advances over `body` (the call's text so far: more may follow unless `complete`).
    pub fn advance(
        &mut self,
        format: ToolFormat,
        body: &str,
        complete: bool,
        tools: &[ToolSpec],
        out: &mut Vec<Step>,
    ) {
        if self.fallback {
            return;
        }
        if self.args_at.is_none() {
            match header(format, body, tools) {
                Header::Wait if complete => {
                    self.fallback = true;
                    return;
                }
                Header::Wait => return,
                Header::No => {
                    self.fallback = true;
                    return;
                }
                Header::Yes { id, name, args_at } => {
                    out.push(Step::Begin(id, name));
                    self.args_at = Some(args_at);
                    self.done = args_at;
                }
            }
        }
        match format {
            ToolFormat::Qwen3Coder | ToolFormat::DeepSeekV32 | ToolFormat::Glm45 => {
                self.params(format, body, complete, tools, out)
            }
            _ => self.json(format, body, out),
        }
    }

    /// JSON formats: the argument text up to what is certain (no blanks before or after it
    /// yet; Hermes stops at the arguments object's closing brace).
    fn json(&mut self, format: ToolFormat, body: &str, out: &mut Vec<Step>) {
        if self.closed {
            return;
        }
        let mut start = self.done;
        if !self.started {
            let rest = &body[start..];
            start += rest.len() - rest.trim_start().len();
            self.done = start;
            if start == body.len() {
                return;
            }
            self.started = true;
        }
        // the scanner state after the last non-blank character: blanks at the end wait
        let mut state = (self.depth, self.in_str, self.escaped);
        let mut end = start;
        let (mut depth, mut in_str, mut escaped) = state;
        for (i, c) in body[start..].char_indices() {
            let at = start + i + c.len_utf8();
            if in_str {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_str = false;
                }
            } else {
                match c {
                    '"' => in_str = true,
                    '{' | '[' => depth += 1,
                    '}' | ']' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            if !c.is_whitespace() {
                state = (depth, in_str, escaped);
                end = at;
                // Hermes' object and DeepSeek-V3's fence follow the arguments
                if depth == 0
                    && !in_str
                    && matches!(format, ToolFormat::Hermes | ToolFormat::DeepSeekV3)
                {
                    self.closed = true;
                    break;
                }
            }
        }
        (self.depth, self.in_str, self.escaped) = state;
        if end > start {
            out.push(Step::Args(body[start..end].to_string()));
        }
        self.done = end;
    }

    /// Qwen3-Coder, DeepSeek-V3.2: one member per closed parameter block; the object closed
    /// with the body.
    fn params(
        &mut self,
        format: ToolFormat,
        body: &str,
        complete: bool,
        tools: &[ToolSpec],
        out: &mut Vec<Step>,
    ) {
        let name = match header(format, body, tools) {
            Header::Yes { name, .. } => name,
            _ => return,
        };
        let schema = properties(tools, &name);
        while let Some((key, value, used)) = param_block(format, &body[self.done..], schema) {
            let key = serde_json::to_string(&key).unwrap_or_default();
            let val = serde_json::to_string(&value).unwrap_or_default();
            let sep = if self.params == 0 { "{" } else { "," };
            out.push(Step::Args(format!("{sep}{key}:{val}")));
            self.params += 1;
            self.done += used;
        }
        if complete && !self.closed {
            self.closed = true;
            out.push(Step::Args(if self.params == 0 { "{}" } else { "}" }.into()));
        }
    }
}

enum Header {
    /// Not enough text yet.
    Wait,
    /// Not this format's layout.
    No,
    Yes {
        id: Option<String>,
        name: String,
        args_at: usize,
    },
}

/// The call's header from the start of its body.
fn header(format: ToolFormat, body: &str, tools: &[ToolSpec]) -> Header {
    let known = |n: &str| !n.is_empty() && (tools.is_empty() || tools.iter().any(|t| t.name == n));
    let found = |id: Option<String>, name: &str, args_at: usize| {
        if known(name) {
            Header::Yes {
                id,
                name: name.to_string(),
                args_at,
            }
        } else {
            Header::No
        }
    };
    match format {
        ToolFormat::KimiK2 => match body.find("<|tool_call_argument_begin|>") {
            Some(at) => {
                let id = body[..at].trim();
                let name = id.split(':').next().unwrap_or("");
                let name = name.rsplit('.').next().unwrap_or("");
                found(
                    Some(id.to_string()),
                    name,
                    at + "<|tool_call_argument_begin|>".len(),
                )
            }
            None => Header::Wait,
        },
        ToolFormat::DeepSeekV31 => match body.find("<｜tool▁sep｜>") {
            Some(at) => found(None, body[..at].trim(), at + "<｜tool▁sep｜>".len()),
            None => Header::Wait,
        },
        ToolFormat::DeepSeekV3 => deepseek_v3_header(body, &found),
        ToolFormat::Qwen3Coder => {
            let t = body.trim_start();
            let lead = body.len() - t.len();
            const F: &str = "<function=";
            if t.len() < F.len() {
                return if F.starts_with(t) {
                    Header::Wait
                } else {
                    Header::No
                };
            }
            let Some(rest) = t.strip_prefix(F) else {
                return Header::No;
            };
            match rest.find('>') {
                Some(gt) => found(None, rest[..gt].trim(), lead + F.len() + gt + 1),
                None => Header::Wait,
            }
        }
        ToolFormat::Hermes => hermes_header(body, &known),
        // `NAME` then a line break or the first argument's tag
        ToolFormat::Glm45 => match super::formats::glm_name(body) {
            Some((name, rest)) => found(None, name, body.len() - rest.len()),
            None => Header::Wait,
        },
        // `NAME">`: a name has no quote, tag or line break
        ToolFormat::DeepSeekV32 => match body.find("\">") {
            Some(at) if !body[..at].contains(['<', '\n']) => found(None, body[..at].trim(), at + 2),
            Some(_) => Header::No,
            None if body.contains(['<', '\n']) => Header::No,
            None => Header::Wait,
        },
    }
}

/// `TYPE<｜tool▁sep｜>NAME\n```json` (the arguments follow the fence).
fn deepseek_v3_header(body: &str, found: &dyn Fn(Option<String>, &str, usize) -> Header) -> Header {
    const SEP: &str = "<｜tool▁sep｜>";
    const FENCE: &str = "```json";
    let Some(at) = body.find(SEP) else {
        return Header::Wait;
    };
    let rest = &body[at + SEP.len()..];
    let Some(nl) = rest.find('\n') else {
        return Header::Wait;
    };
    let after = &rest[nl + 1..];
    let t = after.trim_start();
    if t.len() < FENCE.len() {
        return if FENCE.starts_with(t) {
            Header::Wait
        } else {
            Header::No
        };
    }
    if !t.starts_with(FENCE) {
        return Header::No;
    }
    let args_at = body.len() - t.len() + FENCE.len();
    found(None, rest[..nl].trim(), args_at)
}

/// `{"name": "NAME", "arguments": ` (any blanks between the pieces).
fn hermes_header(body: &str, known: &dyn Fn(&str) -> bool) -> Header {
    let mut at = 0usize;
    // each expected piece: a literal, or the name string
    let ws = |at: &mut usize| {
        let rest = &body[*at..];
        *at += rest.len() - rest.trim_start().len();
    };
    let lit = |at: &mut usize, l: &str| -> Option<bool> {
        let rest = &body[*at..];
        if rest.len() < l.len() {
            return if l.starts_with(rest) {
                None
            } else {
                Some(false)
            };
        }
        if rest.starts_with(l) {
            *at += l.len();
            Some(true)
        } else {
            Some(false)
        }
    };
    macro_rules! expect {
        ($l:expr) => {
            ws(&mut at);
            match lit(&mut at, $l) {
                None => return Header::Wait,
                Some(false) => return Header::No,
                Some(true) => {}
            }
        };
    }
    expect!("{");
    expect!("\"name\"");
    expect!(":");
    ws(&mut at);
    // the name: a JSON string
    let rest = &body[at..];
    if rest.is_empty() {
        return Header::Wait;
    }
    if !rest.starts_with('"') {
        return Header::No;
    }
    let mut esc = false;
    let mut close = None;
    for (i, c) in rest.char_indices().skip(1) {
        if esc {
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == '"' {
            close = Some(i);
            break;
        }
    }
    let Some(close) = close else {
        return Header::Wait;
    };
    let Ok(name) = serde_json::from_str::<String>(&rest[..=close]) else {
        return Header::No;
    };
    at += close + 1;
    expect!(",");
    expect!("\"arguments\"");
    expect!(":");
    if !known(&name) {
        return Header::No;
    }
    Header::Yes {
        id: None,
        name,
        args_at: at,
    }
}
