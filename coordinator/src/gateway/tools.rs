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
        let strict = match f.get("strict") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(invalid(
                    format!("{p}.function.strict"),
                    "expected a boolean",
                ))
            }
        };
        specs.push(ToolSpec {
            name,
            parameters,
            strict,
        });
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

/// Whether a request's calls follow a grammar (`tool_choice` required or named; `auto` with a
/// strict tool and no response format), so they can be streamed while generated.
pub fn constrains_calls(plan: &ToolPlan, has_format: bool, text: &dyn TextModel) -> bool {
    match plan.choice {
        Choice::Required | Choice::Named(_) => true,
        Choice::Auto => {
            plan.specs.iter().any(|s| s.strict) && !has_format && text.tool_format().is_some()
        }
        Choice::None => false,
    }
}

/// The grammar of a request, compiled for its sequence: forced tool calls win over a response
/// format; in `auto` mode with a `strict` tool (and no response format, which would make the
/// whole output JSON content), text or calls whose arguments follow the strict tools' schemas;
/// None when the output is free.
pub fn constraint(
    plan: Option<&ToolPlan>,
    format: Option<(Grammar, &'static str)>,
    text: &dyn TextModel,
) -> Result<Option<SeqConstraint>, ApiError> {
    let (grammar, param) = match plan {
        Some(p) if constrains_calls(p, format.is_some(), text) => {
            let Some(tf) = text.tool_format() else {
                return Err(invalid(
                    "tool_choice",
                    "the served model's chat template writes no tool calls, so a call cannot be \
                     forced; start the server with --tool-format",
                ));
            };
            let choice = match &p.choice {
                Choice::Named(n) => CallChoice::Named(n.clone()),
                Choice::Auto => CallChoice::Auto,
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
    /// Reasoning (from [`super::output::OutputParser`]'s think split; never a tool stream's).
    Reasoning(String),
    /// A whole call.
    Call {
        index: u32,
        call: ToolCallOut,
    },
    /// A streamed call: its start (arguments empty), then pieces of its arguments.
    CallStart {
        index: u32,
        call: ToolCallOut,
    },
    CallArgs {
        index: u32,
        text: String,
    },
}

/// The output side of a request with tools: generated text in, content and calls out.
#[derive(Debug)]
pub struct ToolStream {
    parser: ToolParser,
    parallel: bool,
    calls: u32,
    /// The streamed call being generated is dropped (a second call without parallel calls).
    skipping: bool,
}

impl ToolStream {
    /// A stream for a request's plan; None when its output is not parsed for calls
    /// (`tool_choice` none, or a model whose template writes no calls). With `constrained`
    /// calls (a grammar makes them well-formed, see [`constrains_calls`]) each call goes out
    /// as it is generated, its arguments in pieces; otherwise whole, at its closing marker
    /// (one that does not parse is content).
    pub fn new(
        plan: &ToolPlan,
        format: Option<ToolFormat>,
        constrained: bool,
    ) -> Option<ToolStream> {
        if plan.choice == Choice::None {
            return None;
        }
        let parser = ToolParser::new(format?, plan.specs.clone());
        Some(ToolStream {
            parser: if constrained {
                parser.streaming_arguments()
            } else {
                parser
            },
            parallel: plan.parallel,
            calls: 0,
            skipping: false,
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
                    let call = call_out(c.id, c.name, c.arguments);
                    out.push(Piece::Call {
                        index: self.calls,
                        call,
                    });
                    self.calls += 1;
                }
                Parsed::CallBegin { .. } if !self.parallel && self.calls > 0 => {
                    self.skipping = true;
                }
                Parsed::CallBegin { id, name } => {
                    self.skipping = false;
                    out.push(Piece::CallStart {
                        index: self.calls,
                        call: call_out(id, name, String::new()),
                    });
                    self.calls += 1;
                }
                Parsed::CallArgs(_) if self.skipping => {}
                Parsed::CallArgs(text) => out.push(Piece::CallArgs {
                    index: self.calls.saturating_sub(1),
                    text,
                }),
            }
        }
        out
    }
}

/// A call with its OpenAI id (the model's own when its format writes one).
fn call_out(id: Option<String>, name: String, arguments: String) -> ToolCallOut {
    let id =
        id.unwrap_or_else(|| format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]));
    ToolCallOut {
        id,
        kind: "function",
        function: FunctionCallOut { name, arguments },
    }
}
