//! Tool calls in generated text: each model family writes them in its own format (the one its
//! chat template renders, see `tests/data/templates/`), and [`ToolParser`] turns a stream of
//! generated text into content and complete calls, incrementally, for every format:
//!
//! - [`ToolFormat::Hermes`] (Qwen3): `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`
//! - [`ToolFormat::Qwen3Coder`]: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`
//! - [`ToolFormat::KimiK2`]: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{..}<|tool_call_end|>…<|tool_calls_section_end|>`
//! - [`ToolFormat::DeepSeekV31`]: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`
//! - [`ToolFormat::DeepSeekV3`] (DeepSeek-V3 before 3.1, R1): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜>`, calls joined by `\n`
//! - [`ToolFormat::DeepSeekV32`] (DeepSeek-V3.2's DSML): `<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="P" string="true|false">VALUE</｜DSML｜parameter>\n…</｜DSML｜invoke>\n…</｜DSML｜function_calls>`
//!   (`string="true"`: the value is the text as written, else JSON; the `tool_calls` spelling
//!   of the block DeepSeek's later models write is read too)
//! - [`ToolFormat::Glm45`] (GLM-4.5, 4.6): `<tool_call>NAME\n<arg_key>P</arg_key>\n<arg_value>VALUE</arg_value>\n…</tool_call>`
//!   (a string value as written, any other JSON; read by the parameter's schema type)
//!
//! The format is chosen from the template text (the markers it writes, as llama.cpp does) unless
//! the server is told (`--tool-format`). Text that might still become a marker is held back, so a
//! partial marker is never sent as content; a call is emitted once its closing marker arrives
//! (or at the end, if the model stopped right after the arguments). A call that does not parse
//! (malformed body, unknown tool, arguments that are not a JSON object) goes out as the text it
//! was, as content — never an error.

mod formats;
pub mod grammar;
mod stream_args;
#[cfg(test)]
mod tests;

use formats::parse_body;
use stream_args::{ArgStream, Step};

/// The tool-call text format of a model family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Qwen3Coder,
    KimiK2,
    DeepSeekV31,
    DeepSeekV3,
    DeepSeekV32,
    Glm45,
}

impl ToolFormat {
    /// Every format with its name (vLLM's `--tool-call-parser` names).
    pub const ALL: [(ToolFormat, &'static str); 7] = [
        (ToolFormat::Hermes, "hermes"),
        (ToolFormat::Qwen3Coder, "qwen3_coder"),
        (ToolFormat::KimiK2, "kimi_k2"),
        (ToolFormat::DeepSeekV31, "deepseek_v31"),
        (ToolFormat::DeepSeekV3, "deepseek_v3"),
        (ToolFormat::DeepSeekV32, "deepseek_v32"),
        (ToolFormat::Glm45, "glm45"),
    ];

    /// The format a chat template writes tool calls in, from the markers in its text.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        // DeepSeek-V3.2 builds its tags from a `｜DSML｜` variable
        if template.contains("｜DSML｜") {
            Some(ToolFormat::DeepSeekV32)
        } else if template.contains("<|tool_calls_section_begin|>") {
            Some(ToolFormat::KimiK2)
        } else if template.contains("<｜tool▁calls▁begin｜>") {
            // V3 and R1 fence the arguments, V3.1 does not
            Some(if template.contains("```json") {
                ToolFormat::DeepSeekV3
            } else {
                ToolFormat::DeepSeekV31
            })
        } else if template.contains("<function=") && template.contains("<parameter=") {
            Some(ToolFormat::Qwen3Coder)
        } else if template.contains("<tool_call>") && template.contains("<arg_key>") {
            // GLM's calls open with Hermes' tag but hold one key/value pair per argument
            Some(ToolFormat::Glm45)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else {
            None
        }
    }

    /// The format named `name` (see [`ToolFormat::ALL`]).
    pub fn from_name(name: &str) -> Option<ToolFormat> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(f, _)| *f)
    }

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("", |(_, n)| n)
    }

    /// (opening, closing) marker of one call.
    pub fn call_markers(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Hermes | ToolFormat::Qwen3Coder | ToolFormat::Glm45 => {
                ("<tool_call>", "</tool_call>")
            }
            ToolFormat::KimiK2 => ("<|tool_call_begin|>", "<|tool_call_end|>"),
            ToolFormat::DeepSeekV31 | ToolFormat::DeepSeekV3 => {
                ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
            }
            ToolFormat::DeepSeekV32 => (DSML_INVOKE, "</｜DSML｜invoke>"),
        }
    }

    /// Markers around a group of calls, dropped from the content.
    fn section_markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Qwen3Coder | ToolFormat::Glm45 => &[],
            ToolFormat::KimiK2 => &["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"],
            ToolFormat::DeepSeekV31 | ToolFormat::DeepSeekV3 => {
                &["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"]
            }
            ToolFormat::DeepSeekV32 => &[
                DSML_BLOCK.0,
                DSML_BLOCK.1,
                "<｜DSML｜tool_calls>",
                "</｜DSML｜tool_calls>",
            ],
        }
    }
}

/// DeepSeek-V3.2: a call's opening tag up to its name.
const DSML_INVOKE: &str = "<｜DSML｜invoke name=\"";
/// DeepSeek-V3.2: the tags around its block of calls.
const DSML_BLOCK: (&str, &str) = ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>");

/// One tool the request declared: its name and its parameters' JSON Schema.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: serde_json::Value,
    /// `strict: true`: the arguments must follow `parameters` even when the model chooses
    /// whether to call (`tool_choice` auto), so the output is constrained then too.
    pub strict: bool,
}

/// A parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The id the model wrote (Kimi K2's `functions.NAME:IDX`), if the format has one.
    pub id: Option<String>,
    pub name: String,
    /// The arguments: a JSON object, as compact text.
    pub arguments: String,
}

/// What one piece of text produced, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    Content(String),
    /// A whole call, at its closing marker.
    Call(ParsedCall),
    /// With [`ToolParser::streaming_arguments`]: a call's start (the id the model wrote, if its
    /// format has one, and the name), then its arguments in pieces.
    CallBegin {
        id: Option<String>,
        name: String,
    },
    CallArgs(String),
}

/// Where the scanner is.
#[derive(Debug)]
enum Mode {
    Text,
    /// Inside a call, after its opening marker.
    Call,
}

/// The incremental parser of one generation.
#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    tools: Vec<ToolSpec>,
    mode: Mode,
    /// Text not yet emitted (a possible marker prefix, or the body of the open call).
    buf: String,
    /// Whitespace held back: it is dropped when it only separates calls.
    pending_ws: String,
    calls: usize,
    /// Send each call's name and argument pieces as they come (see `stream_args`).
    stream_args: bool,
    args: ArgStream,
}

impl ToolParser {
    /// A parser for `format`; calls of tools not in `tools` are content.
    pub fn new(format: ToolFormat, tools: Vec<ToolSpec>) -> ToolParser {
        ToolParser {
            format,
            tools,
            mode: Mode::Text,
            buf: String::new(),
            pending_ws: String::new(),
            calls: 0,
            stream_args: false,
            args: ArgStream::default(),
        }
    }

    /// Calls go out as [`Parsed::CallBegin`] and [`Parsed::CallArgs`] pieces while they are
    /// generated. Only for output a grammar keeps well-formed: a call whose start has been sent
    /// cannot turn back into content.
    pub fn streaming_arguments(mut self) -> ToolParser {
        self.stream_args = true;
        self
    }

    /// Calls emitted so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds generated text; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<Parsed> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.scan(&mut out, false);
        out
    }

    /// The generation ended: everything left, a call without its closing marker included.
    pub fn finish(&mut self) -> Vec<Parsed> {
        let mut out = Vec::new();
        self.scan(&mut out, true);
        match self.mode {
            Mode::Call => {
                let body = std::mem::take(&mut self.buf);
                self.mode = Mode::Text;
                self.stream_call(&body, true, &mut out);
                self.close_call(&body, false, &mut out);
            }
            Mode::Text => {
                let rest = std::mem::take(&mut self.buf);
                self.content(&rest, &mut out);
            }
        }
        if self.calls == 0 {
            let ws = std::mem::take(&mut self.pending_ws);
            push_content(&mut out, ws);
        }
        out
    }

    fn scan(&mut self, out: &mut Vec<Parsed>, at_end: bool) {
        let (open, close) = self.format.call_markers();
        loop {
            match self.mode {
                Mode::Text => {
                    let mut markers: Vec<&str> = vec![open];
                    markers.extend_from_slice(self.format.section_markers());
                    let hit = markers
                        .iter()
                        .filter_map(|m| self.buf.find(m).map(|at| (at, *m)))
                        .min();
                    match hit {
                        Some((at, m)) => {
                            let before = self.buf[..at].to_string();
                            self.content(&before, out);
                            self.buf.drain(..at + m.len());
                            if m == open {
                                self.mode = Mode::Call;
                            } else if self.calls > 0 {
                                // blanks before a block's closing marker (DeepSeek-V3.2 puts
                                // a newline there) only separate it from the last call
                                self.pending_ws.clear();
                            }
                        }
                        None => {
                            let keep = if at_end {
                                0
                            } else {
                                partial_suffix(&self.buf, &markers)
                            };
                            let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
                            self.content(&emit, out);
                            return;
                        }
                    }
                }
                Mode::Call => {
                    let found = self.buf.find(close);
                    if self.stream_args {
                        let end = found.unwrap_or_else(|| {
                            self.buf.len() - partial_suffix(&self.buf, &[close])
                        });
                        let body = self.buf[..end].to_string();
                        self.stream_call(&body, found.is_some(), out);
                    }
                    match found {
                        Some(at) => {
                            let body = self.buf[..at].to_string();
                            self.buf.drain(..at + close.len());
                            self.mode = Mode::Text;
                            self.close_call(&body, true, out);
                        }
                        None => return,
                    }
                }
            }
        }
    }

    /// The open call's body so far (`complete`: all of it): its start and argument pieces.
    fn stream_call(&mut self, body: &str, complete: bool, out: &mut Vec<Parsed>) {
        if !self.stream_args {
            return;
        }
        let mut steps = Vec::new();
        self.args
            .advance(self.format, body, complete, &self.tools, &mut steps);
        for s in steps {
            match s {
                Step::Begin(id, name) => {
                    self.pending_ws.clear();
                    self.calls += 1;
                    out.push(Parsed::CallBegin { id, name });
                }
                Step::Args(a) => out.push(Parsed::CallArgs(a)),
            }
        }
    }

    /// A call's body is complete: a call, or its text as content when it does not parse
    /// (unless its start went out already: then its pieces were the call).
    fn close_call(&mut self, body: &str, closed: bool, out: &mut Vec<Parsed>) {
        let streamed = std::mem::take(&mut self.args);
        if streamed.header_sent() && !streamed.fell_back() {
            return;
        }
        match parse_body(self.format, body, &self.tools) {
            Some(call) => {
                // whitespace between calls (or before the first) is not content
                self.pending_ws.clear();
                self.calls += 1;
                out.push(Parsed::Call(call));
            }
            None => {
                let (open, close) = self.format.call_markers();
                let mut raw = format!("{open}{body}");
                if closed {
                    raw.push_str(close);
                }
                self.content(&raw, out);
            }
        }
    }

    /// Text that is content: whitespace-only runs wait (they may only separate calls).
    fn content(&mut self, text: &str, out: &mut Vec<Parsed>) {
        if text.is_empty() {
            return;
        }
        if text.trim().is_empty() {
            self.pending_ws.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.pending_ws);
        s.push_str(text);
        // trailing whitespace waits too
        let trimmed = s.trim_end().len();
        self.pending_ws = s[trimmed..].to_string();
        s.truncate(trimmed);
        push_content(out, s);
    }
}

fn push_content(out: &mut Vec<Parsed>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(Parsed::Content(prev)) = out.last_mut() {
        prev.push_str(&s);
    } else {
        out.push(Parsed::Content(s));
    }
}

/// Length of the longest suffix of `buf` that is a proper prefix of one of `markers`.
pub(crate) fn partial_suffix(buf: &str, markers: &[&str]) -> usize {
    let max = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let mut k = max.saturating_sub(1).min(buf.len());
    while k > 0 {
        let start = buf.len() - k;
        if buf.is_char_boundary(start) && markers.iter().any(|m| m.starts_with(&buf[start..])) {
            return k;
        }
        k -= 1;
    }
    0
}
