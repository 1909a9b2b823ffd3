//! A Responses request into the chat request the pipeline runs: `instructions` as the system
//! message, input items as chat messages (an assistant's text, reasoning and function calls
//! in one assistant turn; a call's output as a tool message), flat function tools in chat's
//! shape, `text.format` as `response_format`, `max_output_tokens` as the token budget. Errors
//! the chat checks raise are renamed to the Responses fields (`messages` -> `input`).

use super::types::*;
use crate::gateway::error::ApiError;
use crate::gateway::types::{
    ChatMessageIn, ChatRequest, FunctionCallIn, ReasoningFormat, ToolCallIn,
};
use serde_json::{json, Map, Value};

/// Most `metadata` pairs (OpenAI's limit), and their key and value lengths.
pub const MAX_METADATA: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 512;

/// The include that asks for the output text's logprobs.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// A request's checked Responses-only fields.
pub struct Plan {
    /// This request's own input items.
    pub input: Vec<Item>,
    /// Tools in chat's shape.
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    pub store: bool,
    pub truncate: bool,
    pub logprobs: bool,
    /// How the model's calls map back to the request's tools.
    pub names: CallNames,
    metadata: Map<String, Value>,
}

/// How the names the model calls map back to the request's tools: a namespace's functions are
/// called as `{namespace}.{name}`, custom tools by name with their input as `{"input": ..}`.
#[derive(Clone, Debug, Default)]
pub struct CallNames {
    pub namespaces: Vec<String>,
    pub custom: Vec<String>,
}

fn invalid(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, msg)
}

impl Plan {
    pub fn new(req: &ResponsesRequest) -> Result<Plan, ApiError> {
        let input = match &req.input {
            None if req.previous_response_id.is_some() => Vec::new(),
            None => return Err(invalid("input", "missing required field `input`")),
            Some(ResponseInput::Text(t)) => vec![Item::Message {
                id: None,
                role: "user".into(),
                content: MessageContent::Text(t.clone()),
                status: None,
            }],
            Some(ResponseInput::Items(v)) => v.clone(),
        };
        let (tools, namespaces, custom) = match &req.tools {
            None => (None, Vec::new(), Vec::new()),
            Some(t) => {
                let seen = chat_tools(t)?;
                if !seen.skipped.is_empty() {
                    tracing::info!(tools = ?seen.skipped, "tools the server cannot run are left out of the prompt");
                }
                // none the model can call: the request goes on as one without tools
                let tools = (!seen.tools.is_empty()).then_some(seen.tools);
                (tools, seen.namespaces, seen.custom)
            }
        };
        let tool_choice = req.tool_choice.as_ref().map(chat_tool_choice).transpose()?;
        let tool_choice = tool_choice.filter(|c| tools.is_some() || c != "auto" && c != "none");
        let response_format = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
            None | Some(Value::Null) => None,
            Some(f) => chat_format(f)?,
        };
        let truncate = match req.truncation.as_deref() {
            None | Some("disabled") => false,
            Some("auto") => true,
            Some(other) => {
                return Err(invalid(
                    "truncation",
                    format!("expected `auto` or `disabled`, found `{other}`"),
                ))
            }
        };
        let logprobs = req.include.iter().flatten().any(|s| s == INCLUDE_LOGPROBS);
        if req.top_logprobs.is_some_and(|n| n > 0) && !logprobs {
            return Err(invalid(
                "top_logprobs",
                format!("`top_logprobs` needs `include: [\"{INCLUDE_LOGPROBS}\"]`"),
            ));
        }
        let metadata = req.metadata.clone().unwrap_or_default();
        check_metadata(&metadata)?;
        Ok(Plan {
            input,
            tools,
            tool_choice,
            response_format,
            store: req.store.unwrap_or(true),
            truncate,
            logprobs,
            names: CallNames { namespaces, custom },
            metadata,
        })
    }

    /// The chat request for the conversation `items` (stored history, then this input).
    pub fn chat_request(
        &self,
        req: &ResponsesRequest,
        items: &[Item],
    ) -> Result<ChatRequest, ApiError> {
        let mut messages = Vec::with_capacity(items.len() + 1);
        if let Some(i) = &req.instructions {
            messages.push(ChatMessageIn::text("system", Some(i.clone())));
        }
        messages.extend(chat_messages(items)?);
        Ok(ChatRequest {
            messages,
            max_completion_tokens: req.max_output_tokens,
            logprobs: Some(self.logprobs),
            top_logprobs: self.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            parallel_tool_calls: req.parallel_tool_calls,
            response_format: self.response_format.clone(),
            grammar: req.grammar.clone(),
            chat_template_kwargs: req.chat_template_kwargs.clone(),
            prediction: None,
            // reasoning always comes back as its own item
            reasoning_format: Some(ReasoningFormat::Deepseek),
            reasoning_effort: req.reasoning.as_ref().and_then(|r| r.effort.clone()),
            model: req.model.clone(),
            max_tokens: None,
            temperature: req.temperature,
            top_p: req.top_p,
            seed: req.seed,
            stop: None,
            stream: req.stream,
            stream_options: None,
            presence_penalty: None,
            frequency_penalty: None,
            n: None,
            user: req.user.clone(),
            top_k: None,
            min_p: None,
            repeat_penalty: None,
            ignore_eos: None,
            cache_prompt: None,
            speculative: None,
            logit_bias: None,
        })
    }

    /// The response object before generation: the request's settings, no output yet.
    pub fn shell(&self, req: &ResponsesRequest, id: String, created_at: u64) -> ResponseObject {
        let format = req
            .text
            .as_ref()
            .and_then(|t| t.format.clone())
            .filter(|f| !f.is_null())
            .unwrap_or_else(|| json!({"type": "text"}));
        ResponseObject {
            id,
            object: "response",
            created_at,
            status: "in_progress",
            error: None,
            incomplete_details: None,
            instructions: req.instructions.clone(),
            max_output_tokens: req.max_output_tokens,
            model: req.model.clone().unwrap_or_default(),
            output: Vec::new(),
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
            previous_response_id: req.previous_response_id.clone(),
            reasoning: req.reasoning.clone().unwrap_or_default(),
            store: self.store,
            temperature: req.temperature.unwrap_or(1.0),
            text: TextOut { format },
            tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            tools: req.tools.clone().unwrap_or_default(),
            top_p: req.top_p.unwrap_or(1.0),
            truncation: if self.truncate { "auto" } else { "disabled" },
            usage: None,
            user: req.user.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

fn check_metadata(m: &Map<String, Value>) -> Result<(), ApiError> {
    if m.len() > MAX_METADATA {
        return Err(invalid(
            "metadata",
            format!("expected at most {MAX_METADATA} pairs, found {}", m.len()),
        ));
    }
    for (k, v) in m {
        let Some(s) = v.as_str() else {
            return Err(invalid(
                format!("metadata.{k}"),
                "metadata values are strings",
            ));
        };
        if k.chars().count() > MAX_METADATA_KEY || s.chars().count() > MAX_METADATA_VALUE {
            return Err(invalid(
                format!("metadata.{k}"),
                format!(
                    "keys are at most {MAX_METADATA_KEY} characters and values at most \
                     {MAX_METADATA_VALUE}"
                ),
            ));
        }
    }
    Ok(())
}

/// The tools a request gives the model.
struct SeenTools {
    /// In chat's shape.
    tools: Vec<Value>,
    namespaces: Vec<String>,
    /// Custom tools' names as the model calls them.
    custom: Vec<String>,
    /// Tools left out: hosted tools the server cannot run (`web_search`, `file_search`, ...).
    skipped: Vec<String>,
}

/// The tools the model sees, in chat's shape: function tools; custom (free-form) tools as
/// functions of one string, `input`; each namespace's tools named `{namespace}.{name}` (how
/// its calls come back). Tools this server cannot run are left out of the prompt (an agent
/// such as Codex sends `web_search` with its own tools).
fn chat_tools(tools: &[Value]) -> Result<SeenTools, ApiError> {
    let mut seen = SeenTools {
        tools: Vec::new(),
        namespaces: Vec::new(),
        custom: Vec::new(),
        skipped: Vec::new(),
    };
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Some(obj) = t.as_object() else {
            return Err(invalid(p, "a tool is an object"));
        };
        match obj.get("type").and_then(Value::as_str) {
            Some("function") => seen.tools.push(chat_function(&p, obj, None)?),
            Some("custom") => {
                let (f, name) = custom_function(&p, obj, None)?;
                seen.tools.push(f);
                seen.custom.push(name);
            }
            Some("namespace") => {
                let Some(ns) = obj.get("name").and_then(Value::as_str) else {
                    return Err(invalid(
                        format!("{p}.name"),
                        "missing the namespace's `name`",
                    ));
                };
                let Some(inner) = obj.get("tools").and_then(Value::as_array) else {
                    return Err(invalid(
                        format!("{p}.tools"),
                        "a namespace lists its `tools`",
                    ));
                };
                for (j, t) in inner.iter().enumerate() {
                    let q = format!("{p}.tools[{j}]");
                    match t.as_object() {
                        Some(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                            seen.tools.push(chat_function(&q, o, Some(ns))?)
                        }
                        Some(o) if o.get("type").and_then(Value::as_str) == Some("custom") => {
                            let (f, name) = custom_function(&q, o, Some(ns))?;
                            seen.tools.push(f);
                            seen.custom.push(name);
                        }
                        _ => seen.skipped.push(q),
                    }
                }
                seen.namespaces.push(ns.to_string());
            }
            Some(other) => seen.skipped.push(format!("{p} ({other})")),
            None => {
                return Err(invalid(
                    format!("{p}.type"),
                    "missing `type` (expected `function`)",
                ))
            }
        }
    }
    Ok(seen)
}

/// A flat Responses function tool (`{"type": "function", "name", ...}`) in chat's shape, its
/// other keys in the order sent, named `{namespace}.{name}` inside a namespace. A tool already
/// in chat's shape is kept.
fn chat_function(p: &str, obj: &Map<String, Value>, ns: Option<&str>) -> Result<Value, ApiError> {
    if ns.is_none() && obj.get("function").is_some_and(Value::is_object) {
        return Ok(Value::Object(obj.clone()));
    }
    let Some(name) = obj.get("name").and_then(Value::as_str) else {
        return Err(invalid(format!("{p}.name"), "missing function `name`"));
    };
    let mut f = Map::new();
    for (k, v) in obj {
        // OpenAI's `strict` defaults to true in the Responses API; chat's to false
        if k != "type" && !v.is_null() {
            f.insert(k.clone(), v.clone());
        }
    }
    if let Some(ns) = ns {
        f.insert("name".into(), json!(format!("{ns}.{name}")));
    }
    Ok(json!({"type": "function", "function": f}))
}

/// A custom (free-form) tool as a function of one string, `input`; a grammar the input
/// follows is shown to the model in the description. Returns the function and its name.
fn custom_function(
    p: &str,
    obj: &Map<String, Value>,
    ns: Option<&str>,
) -> Result<(Value, String), ApiError> {
    let Some(name) = obj.get("name").and_then(Value::as_str) else {
        return Err(invalid(format!("{p}.name"), "missing the tool's `name`"));
    };
    let name = qualified(name, ns);
    let mut description = obj
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if let Some(f) = obj
        .get("format")
        .filter(|f| f.get("type").and_then(Value::as_str) == Some("grammar"))
    {
        let syntax = f.get("syntax").and_then(Value::as_str).unwrap_or("lark");
        let definition = f.get("definition").and_then(Value::as_str).unwrap_or("");
        description.push_str(&format!(
            "\n\nThe input follows this {syntax} grammar:\n{definition}"
        ));
    }
    let f = json!({"type": "function", "function": {"name": name, "description": description,
        "parameters": {"type": "object", "properties": {"input": {"type": "string",
            "description": "The tool's input, as plain text."}},
            "required": ["input"], "additionalProperties": false}}});
    Ok((f, name))
}

/// A custom tool call's input from the arguments the model wrote for it (`{"input": ..}`);
/// anything else is the input as written.
pub fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(m)) => match m.get("input") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

/// A call's name as the model writes it: `{namespace}.{name}` for a namespace's function.
pub fn qualified(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{ns}.{name}"),
        None => name.to_string(),
    }
}

/// A call's name split back into (namespace, name) when it starts with a known namespace.
pub fn split_namespace<'a>(name: &'a str, namespaces: &[String]) -> (Option<String>, &'a str) {
    for ns in namespaces {
        if let Some(rest) = name
            .strip_prefix(ns.as_str())
            .and_then(|r| r.strip_prefix('.'))
        {
            return (Some(ns.clone()), rest);
        }
    }
    (None, name)
}

/// `tool_choice` in chat's shape.
fn chat_tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) | Value::Null => Ok(c.clone()),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") if o.get("function").is_some() => Ok(c.clone()),
            Some("function" | "custom") => match o.get("name").and_then(Value::as_str) {
                Some(n) => {
                    let n = qualified(n, o.get("namespace").and_then(Value::as_str));
                    Ok(json!({"type": "function", "function": {"name": n}}))
                }
                None => Err(invalid("tool_choice.name", "missing the function's `name`")),
            },
            Some(other) => Err(invalid(
                "tool_choice.type",
                format!("only `function` tool choices are supported, found `{other}`"),
            )),
            None => Err(invalid("tool_choice.type", "missing `type`")),
        },
        _ => Err(invalid(
            "tool_choice",
            "expected `auto`, `none`, `required` or `{\"type\": \"function\", \"name\": ..}`",
        )),
    }
}

/// `text.format` as chat's `response_format` (None for plain text).
fn chat_format(f: &Value) -> Result<Option<Value>, ApiError> {
    let Some(o) = f.as_object() else {
        return Err(invalid("text.format", "expected an object"));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut js = Map::new();
            for (k, v) in o {
                if k != "type" {
                    js.insert(k.clone(), v.clone());
                }
            }
            if !js.contains_key("name") {
                js.insert("name".into(), json!("response"));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        Some(other) => Err(invalid(
            "text.format.type",
            format!("expected `text`, `json_object` or `json_schema`, found `{other}`"),
        )),
        None => Err(invalid("text.format.type", "missing `type`")),
    }
}

/// The text of a message's content; images, files and audio are refused.
fn text_of(c: &MessageContent, at: &str) -> Result<String, ApiError> {
    match c {
        MessageContent::Text(t) => Ok(t.clone()),
        MessageContent::Parts(parts) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text, &p.refusal) {
                    ("input_text" | "output_text" | "text", Some(t), _) => s.push_str(t),
                    ("refusal", _, Some(r)) => s.push_str(r),
                    ("input_text" | "output_text" | "text", None, _) => {
                        return Err(invalid(
                            format!("{at}[{j}].text"),
                            "a text part needs its `text`",
                        ))
                    }
                    (other, _, _) => {
                        return Err(invalid(
                            format!("{at}[{j}].type"),
                            format!(
                                "only text parts (`input_text`, `output_text`) are supported, \
                                 found `{other}`"
                            ),
                        ))
                    }
                }
            }
            Ok(s)
        }
    }
}

/// Input items as chat messages. An assistant turn gathers the reasoning before it, its text
/// and the function calls that follow, as the chat templates expect one assistant message
/// with `tool_calls`.
fn chat_messages(items: &[Item]) -> Result<Vec<ChatMessageIn>, ApiError> {
    let mut out: Vec<ChatMessageIn> = Vec::new();
    let mut reasoning: Option<String> = None;
    // whether the last message is an assistant turn that later calls may join
    let mut assistant_open = false;
    for (i, it) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        match it {
            Item::Message { role, content, .. } => {
                let text = text_of(content, &format!("{at}.content"))?;
                match role.as_str() {
                    "system" | "developer" | "user" => {
                        out.push(ChatMessageIn::text(role, Some(text)));
                        assistant_open = false;
                    }
                    "assistant" => {
                        let mut m = ChatMessageIn::text("assistant", Some(text));
                        m.reasoning_content = reasoning.take();
                        out.push(m);
                        assistant_open = true;
                    }
                    other => {
                        return Err(invalid(
                            format!("{at}.role"),
                            format!(
                                "expected role system, developer, user or assistant, found \
                                 `{other}`"
                            ),
                        ))
                    }
                }
            }
            Item::Reasoning {
                summary, content, ..
            } => {
                let parts = content
                    .as_deref()
                    .filter(|c| !c.is_empty())
                    .unwrap_or(summary);
                let text: String = parts.iter().map(|p| p.text.as_str()).collect();
                reasoning.get_or_insert_with(String::new).push_str(&text);
                assistant_open = false;
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
                namespace,
                ..
            } => {
                let name = qualified(name, namespace.as_deref());
                let call = tool_call(call_id, name, arguments.clone());
                push_call(&mut out, &mut reasoning, &mut assistant_open, call);
            }
            Item::CustomToolCall {
                call_id,
                name,
                input,
                namespace,
                ..
            } => {
                let name = qualified(name, namespace.as_deref());
                let call = tool_call(call_id, name, json!({ "input": input }).to_string());
                push_call(&mut out, &mut reasoning, &mut assistant_open, call);
            }
            Item::FunctionCallOutput {
                call_id, output, ..
            }
            | Item::CustomToolCallOutput {
                call_id, output, ..
            } => {
                let text = text_of(output, &format!("{at}.output"))?;
                let mut m = ChatMessageIn::text("tool", Some(text));
                m.tool_call_id = Some(call_id.clone());
                out.push(m);
                assistant_open = false;
            }
        }
    }
    if out.is_empty() {
        return Err(invalid("input", "the input has no messages"));
    }
    Ok(out)
}

/// A call in chat's shape.
fn tool_call(call_id: &str, name: String, arguments: String) -> ToolCallIn {
    ToolCallIn {
        id: Some(call_id.to_string()),
        kind: Some("function".into()),
        function: FunctionCallIn {
            name,
            arguments: Some(Value::String(arguments)),
        },
    }
}

/// Adds a call to the open assistant turn, or to a new one that takes the reasoning before it.
fn push_call(
    out: &mut Vec<ChatMessageIn>,
    reasoning: &mut Option<String>,
    assistant_open: &mut bool,
    call: ToolCallIn,
) {
    if !*assistant_open {
        let mut m = ChatMessageIn::text("assistant", None);
        m.reasoning_content = reasoning.take();
        out.push(m);
        *assistant_open = true;
    }
    if let Some(m) = out.last_mut() {
        m.tool_calls.get_or_insert_with(Vec::new).push(call);
    }
}

/// Where the conversation may start instead of at `skip` (`truncation: auto`): after the
/// leading system and developer messages, at the next user message that starts a later turn.
/// None when no turn is left to drop.
pub fn next_turn(items: &[Item], skip: usize) -> Option<usize> {
    let is_user = |it: &Item| matches!(it, Item::Message { role, .. } if role == "user");
    let first = items[skip..].iter().position(
        |it| !matches!(it, Item::Message { role, .. } if role == "system" || role == "developer"),
    )? + skip;
    let next = items[first + 1..].iter().position(is_user)? + first + 1;
    Some(next)
}

/// The conversation from `skip` on, after its leading system and developer messages.
pub fn from_turn(items: &[Item], skip: usize) -> Vec<Item> {
    let lead = items
        .iter()
        .take_while(|it| matches!(it, Item::Message { role, .. } if role == "system" || role == "developer"))
        .count();
    if skip <= lead {
        return items.to_vec();
    }
    items[..lead]
        .iter()
        .chain(&items[skip.min(items.len())..])
        .cloned()
        .collect()
}

/// An error the chat checks raised, with the field named as the Responses API names it.
pub fn rename(mut e: ApiError) -> ApiError {
    if let Some(p) = e.param.take() {
        let renamed = if let Some(rest) = p.strip_prefix("messages") {
            format!("input{rest}")
        } else if p == "max_completion_tokens" || p == "max_tokens" {
            "max_output_tokens".into()
        } else if let Some(rest) = p.strip_prefix("response_format") {
            format!("text.format{}", rest.replacen(".json_schema", "", 1))
        } else if p == "reasoning_effort" {
            "reasoning.effort".into()
        } else if p.starts_with("tools[") {
            p.replacen(".function", "", 1)
        } else {
            p
        };
        e.param = Some(renamed);
    }
    e
}

#[cfg(test)]
mod tests;
