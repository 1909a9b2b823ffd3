//! Tools and structured outputs at the edge: `tools`, `tool_choice`, `parallel_tool_calls` and
//! `response_format` checked into a plan (every rejection a 400 naming the field), the grammar a
//! request's output must follow compiled for its sequence (`tool_choice` required or named: the
//! model's own call format with the tool's schema; `response_format` json_object/json_schema),
//! and, on the way out, the generated text split into content and tool calls (`ToolStream`
//! over the model crate's `ToolParser`) with OpenAI's ids.

use super::error::ApiError;
use super::types::{ChatRequest, FunctionCallOut, ToolCallOut};
use crate::scheduler::TextModel;
use nightshift_model::constrain::{Grammar, SeqConstraint};
use nightshift_model::toolcall::grammar::{tool_grammar, CallChoice};
use nightshift_model::toolcall::{Parsed, ToolFormat, ToolParser, ToolSpec};
use serde_json::Value;

/// Most tools in one request (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Largest JSON Schema accepted (a tool's parameters or a response format), as JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The checked tool fields of a chat request.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    /// The definitions as sent, for the chat template.
    pub tools_json: Vec<Value>,
    pub specs: Vec<ToolSpec>,
    pub choice: Choice,
    pub parallel: bool,
}

fn invalid(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, msg)
}

fn schema_size(param: &str, v: &Value) -> Result<(), ApiError> {
    let n = serde_json::to_string(v)
        .map(|s| s.len())
        .unwrap_or(usize::MAX);
    if n > MAX_SCHEMA_BYTES {
        return Err(invalid(
            param,
            format!("the schema is {n} bytes of JSON; at most {MAX_SCHEMA_BYTES} are accepted"),
        ));
    }
    Ok(())
}

/// OpenAI's function names: letters, digits, `_` and `-`, 1 to 64 characters.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`; None without tools.
pub fn plan(req: &ChatRequest) -> Result<Option<ToolPlan>, ApiError> {
    let Some(tools) = &req.tools else {
        if req.tool_choice.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(invalid(
                "tool_choice",
                "`tool_choice` is only allowed when `tools` are given",
            ));
        }
        return Ok(None);
    };
    if tools.len() > MAX_TOOLS {
        return Err(invalid(
            "tools",
            format!("expected at most {MAX_TOOLS} tools, found {}", tools.len()),
        ));
    }
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(invalid(
                    format!("{p}.type"),
                    format!("only `function` tools are supported, found `{other}`"),
                ))
            }
            None => {
                return Err(invalid(
                    format!("{p}.type"),
                    "missing `type` (expected `function`)",
                ))
            }
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(invalid(
                format!("{p}.function"),
                "expected a `function` object",
            ));
        };
        let name = match f.get("name").and_then(Value::as_str) {
            Some(n) if valid_name(n) => n.to_string(),
            Some(n) => {
                return Err(invalid(
                    format!("{p}.function.name"),
                    format!(
                        "a function name is 1 to 64 letters, digits, `_`, `-` or `.`, found `{n}`"
                    ),
                ))
            }
            None => {
                return Err(invalid(
                    format!("{p}.function.name"),
                    "missing function `name`",
                ))
            }
        };
        if specs.iter().any(|s| s.name == name) {
            return Err(invalid(
                format!("{p}.function.name"),
                format!("the function name `{name}` is declared twice"),
            ));
        }
        if let Some(d) = f.get("description") {
            if !d.is_string() && !d.is_null() {
                return Err(invalid(
                    format!("{p}.function.description"),
                    "expected a string",
                ));
            }
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => {
                return Err(invalid(
                    format!("{p}.function.parameters"),
                    "expected a JSON Schema object",
                ))
            }
        };
        schema_size(&format!("{p}.function.parameters"), &parameters)?;
        specs.push(ToolSpec { name, parameters });
    }
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(invalid(
                    "tool_choice",
                    format!("expected `none`, `auto`, `required` or a function, found `{other}`"),
                ))
            }
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            match (v.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => {
                    if !specs.iter().any(|s| s.name == n) {
                        return Err(invalid(
                            "tool_choice",
                            format!(
                                "`tool_choice` names the function `{n}`, which is not in `tools`"
                            ),
                        ));
                    }
                    Choice::Named(n.to_string())
                }
                _ => {
                    return Err(invalid(
                        "tool_choice",
                        "expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(invalid(
                "tool_choice",
                "expected a string or a function object",
            ))
        }
    };
    if specs.is_empty() && matches!(choice, Choice::Required) {
        return Err(invalid("tool_choice", "`required` needs at least one tool"));
    }
    Ok(Some(ToolPlan {
        tools_json: tools.clone(),
        specs,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    }))
}

/// Checks `response_format`: None for text.
pub fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonObject)),
        Some("json_schema") => {
            let Some(js) = v.get("json_schema").and_then(Value::as_object) else {
                return Err(invalid(
                    "response_format.json_schema",
                    "expected a `json_schema` object with `name` and `schema`",
                ));
            };
            match js.get("name").and_then(Value::as_str) {
                Some(n) if valid_name(n) => {}
                _ => {
                    return Err(invalid(
                        "response_format.json_schema.name",
                        "expected a `name` of 1 to 64 letters, digits, `_` or `-`",
                    ))
                }
            }
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(Grammar::JsonObject)),
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    schema_size("response_format.json_schema.schema", s)?;
                    Ok(Some(Grammar::JsonSchema(s.clone())))
                }
                Some(_) => Err(invalid(
                    "response_format.json_schema.schema",
                    "expected a JSON Schema object",
                )),
            }
        }
        Some(other) => Err(invalid(
            "response_format.type",
            format!("expected `text`, `json_object` or `json_schema`, found `{other}`"),
        )),
        None => Err(invalid("response_format.type", "missing `type`")),
    }
}

/// The grammar the content follows: `response_format`, or the `grammar` extension (a Lark
/// grammar); both at once is a 400. Returns the grammar and the field it came from.
pub fn output_grammar(
    format: Option<&Value>,
    grammar: Option<&str>,
) -> Result<Option<(Grammar, &'static str)>, ApiError> {
    let from_format = response_format(format)?;
    match (from_format, grammar) {
        (Some(_), Some(_)) => Err(invalid(
            "grammar",
            "give either `grammar` or a JSON `response_format`, not both",
        )),
        (Some(g), None) => Ok(Some((g, "response_format"))),
        (None, Some(l)) if l.len() > MAX_SCHEMA_BYTES => Err(invalid(
            "grammar",
            format!(
                "the grammar is {} bytes; at most {MAX_SCHEMA_BYTES} are accepted",
                l.len()
            ),
        )),
        (None, Some(l)) => Ok(Some((Grammar::Lark(l.to_string()), "grammar"))),
        (None, None) => Ok(None),
    }
}

/// The grammar of a request, compiled for its sequence: forced tool calls win over a response
/// format; None when the output is free.
pub fn constraint(
    plan: Option<&ToolPlan>,
    format: Option<(Grammar, &'static str)>,
    text: &dyn TextModel,
) -> Result<Option<SeqConstraint>, ApiError> {
    let (grammar, param) = match plan.map(|p| (&p.choice, p)) {
        Some((Choice::Required | Choice::Named(_), p)) => {
            let Some(tf) = text.tool_format() else {
                return Err(invalid(
                    "tool_choice",
                    "the served model's chat template writes no tool calls, so a call cannot be \
                     forced; start the server with --tool-format",
                ));
            };
            let choice = match &p.choice {
                Choice::Named(n) => CallChoice::Named(n.clone()),
                _ => CallChoice::Any,
            };
            let vocab = vocab(text)?;
            let lark = tool_grammar(tf, &p.specs, &choice, p.parallel, &vocab)
                .map_err(|e| invalid("tools", format!("cannot constrain the tool call: {e}")))?;
            (Grammar::Lark(lark), "tools")
        }
        _ => match format {
            Some(g) => g,
            None => return Ok(None),
        },
    };
    let vocab = vocab(text)?;
    vocab
        .compile(&grammar)
        .map(Some)
        .map_err(|e| invalid(param, format!("unsupported schema or grammar: {e}")))
}

fn vocab(
    text: &dyn TextModel,
) -> Result<std::sync::Arc<nightshift_model::constrain::ConstraintVocab>, ApiError> {
    text.constraint_vocab().ok_or_else(|| {
        invalid(
            "response_format",
            "constrained decoding is not available for the served model's vocabulary",
        )
    })
}

/// What the parser settles, with OpenAI ids on the calls.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Call { index: u32, call: ToolCallOut },
}

/// The output side of a request with tools: generated text in, content and calls out.
#[derive(Debug)]
pub struct ToolStream {
    parser: ToolParser,
    parallel: bool,
    calls: u32,
}

impl ToolStream {
    /// A stream for a request's plan; None when its output is not parsed for calls
    /// (`tool_choice` none, or a model whose template writes no calls).
    pub fn new(plan: &ToolPlan, format: Option<ToolFormat>) -> Option<ToolStream> {
        if plan.choice == Choice::None {
            return None;
        }
        Some(ToolStream {
            parser: ToolParser::new(format?, plan.specs.clone()),
            parallel: plan.parallel,
            calls: 0,
        })
    }

    /// Calls emitted so far.
    pub fn calls(&self) -> u32 {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let parsed = self.parser.push(text);
        self.pieces(parsed)
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let parsed = self.parser.finish();
        self.pieces(parsed)
    }

    fn pieces(&mut self, parsed: Vec<Parsed>) -> Vec<Piece> {
        let mut out = Vec::new();
        for p in parsed {
            match p {
                Parsed::Content(s) => out.push(Piece::Content(s)),
                // without parallel calls only the first one counts
                Parsed::Call(_) if !self.parallel && self.calls > 0 => {}
                Parsed::Call(c) => {
                    let id = c.id.unwrap_or_else(|| {
                        format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
                    });
                    out.push(Piece::Call {
                        index: self.calls,
                        call: ToolCallOut {
                            id,
                            kind: "function",
                            function: FunctionCallOut {
                                name: c.name,
                                arguments: c.arguments,
                            },
                        },
                    });
                    self.calls += 1;
                }
            }
        }
        out
    }
}
