//! An Anthropic Messages request into the chat request the pipeline runs: `system` as the
//! system message, a user turn's `tool_result` blocks as tool messages (then its text as the
//! user message), an assistant turn's `thinking`, `text` and `tool_use` blocks as one assistant
//! message with reasoning, content and calls; tools and `tool_choice` in chat's shape,
//! `stop_sequences` as `stop`, `thinking` as the template's thinking switch.

use super::types::*;
use crate::gateway::error::ApiError;
use crate::gateway::types::{
    ChatMessageIn, ChatRequest, Content, FunctionCallIn, ReasoningFormat, StopField, ToolCallIn,
};
use serde_json::{json, Map, Value};

fn invalid(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, msg)
}

/// The text of `system` or of a `tool_result`'s content: a string or text blocks.
fn field_text(f: &BlocksField, at: &str) -> Result<String, ApiError> {
    match f {
        BlocksField::Text(t) => Ok(t.clone()),
        BlocksField::Blocks(b) => {
            let mut s = String::new();
            for (j, b) in b.iter().enumerate() {
                if b.kind != "text" {
                    return Err(invalid(
                        format!("{at}[{j}].type"),
                        format!("only `text` blocks are supported here, found `{}`", b.kind),
                    ));
                }
                let Some(t) = &b.text else {
                    return Err(invalid(
                        format!("{at}[{j}].text"),
                        "a text block needs its `text`",
                    ));
                };
                s.push_str(t);
            }
            Ok(s)
        }
    }
}

/// What Claude Code puts first in `system`: billing metadata for Anthropic's API, not text
/// for the model (`x-anthropic-billing-header: cc_version=..; cc_entrypoint=..; cch=..;`).
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// `system` without Claude Code's billing header, which changes with every client version (and,
/// in some versions, its `cch=` field with every request) and would otherwise make every
/// prompt's first tokens differ, so that no request found the previous one's prefix cached.
/// A block that is only the header is dropped; a header at the start of a string loses its
/// `cch` value (the rest of such a string cannot be told apart from the header reliably).
fn system_text(f: &BlocksField) -> Result<String, ApiError> {
    match f {
        BlocksField::Blocks(b) if b.iter().any(is_billing_block) => {
            let kept: Vec<BlockIn> = b.iter().filter(|b| !is_billing_block(b)).cloned().collect();
            field_text(&BlocksField::Blocks(kept), "system")
        }
        BlocksField::Text(t) if t.starts_with(BILLING_HEADER) => Ok(mask_cch(t)),
        _ => field_text(f, "system"),
    }
}

fn is_billing_block(b: &BlockIn) -> bool {
    b.kind == "text"
        && b.text.as_deref().is_some_and(|t| {
            t.starts_with(BILLING_HEADER) && t.trim_end().ends_with(';') && !t.contains('\n')
        })
}

/// The header's `cch=XXXXX;` value replaced by a fixed one.
fn mask_cch(t: &str) -> String {
    let header_end = t.find('\n').unwrap_or(t.len());
    match t[..header_end].find("cch=") {
        Some(at) => {
            let start = at + 4;
            let end = t[start..header_end]
                .find(';')
                .map_or(header_end, |e| start + e);
            format!("{}{}{}", &t[..start], "f".repeat(end - start), &t[end..])
        }
        None => t.to_string(),
    }
}

/// The conversation as chat messages.
pub fn chat_messages(req: &MessagesRequest) -> Result<Vec<ChatMessageIn>, ApiError> {
    let mut out = Vec::with_capacity(req.messages.len() + 1);
    if let Some(sys) = &req.system {
        out.push(ChatMessageIn::text("system", Some(system_text(sys)?)));
    }
    if req.messages.is_empty() {
        return Err(invalid(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let blocks = match &m.content {
            BlocksField::Text(t) => {
                out.push(ChatMessageIn::text(&m.role, Some(t.clone())));
                if m.role != "user" && m.role != "assistant" {
                    return Err(invalid(
                        format!("{at}.role"),
                        format!("expected `user` or `assistant`, found `{}`", m.role),
                    ));
                }
                continue;
            }
            BlocksField::Blocks(b) => b,
        };
        match m.role.as_str() {
            "user" => {
                let mut text = String::new();
                let mut has_text = false;
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match b.kind.as_str() {
                        "text" => {
                            text.push_str(b.text.as_deref().unwrap_or(""));
                            has_text = true;
                        }
                        "tool_result" => {
                            let Some(id) = &b.tool_use_id else {
                                return Err(invalid(
                                    format!("{bat}.tool_use_id"),
                                    "a tool_result needs the `tool_use_id` it answers",
                                ));
                            };
                            let mut t = match &b.content {
                                None => String::new(),
                                Some(c) => field_text(c, &format!("{bat}.content"))?,
                            };
                            if b.is_error == Some(true) {
                                t = format!("Error: {t}");
                            }
                            let mut tm = ChatMessageIn::text("tool", Some(t));
                            tm.tool_call_id = Some(id.clone());
                            out.push(tm);
                        }
                        other => {
                            return Err(invalid(
                                format!("{bat}.type"),
                                format!(
                                    "a user message takes `text` and `tool_result` blocks, \
                                     found `{other}`"
                                ),
                            ))
                        }
                    }
                }
                if has_text {
                    out.push(ChatMessageIn::text("user", Some(text)));
                }
            }
            "assistant" => {
                let mut a = ChatMessageIn::text("assistant", None);
                let mut text: Option<String> = None;
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match b.kind.as_str() {
                        "text" => text
                            .get_or_insert_with(String::new)
                            .push_str(b.text.as_deref().unwrap_or("")),
                        "thinking" => a
                            .reasoning_content
                            .get_or_insert_with(String::new)
                            .push_str(b.thinking.as_deref().unwrap_or("")),
                        // encrypted elsewhere; nothing this model can read
                        "redacted_thinking" => {}
                        "tool_use" => {
                            let (Some(id), Some(name)) = (&b.id, &b.name) else {
                                return Err(invalid(
                                    bat,
                                    "a tool_use block needs its `id` and `name`",
                                ));
                            };
                            let input = b.input.clone().unwrap_or_else(|| json!({}));
                            a.tool_calls.get_or_insert_with(Vec::new).push(ToolCallIn {
                                id: Some(id.clone()),
                                kind: Some("function".into()),
                                function: FunctionCallIn {
                                    name: name.clone(),
                                    arguments: Some(Value::String(input.to_string())),
                                },
                            });
                        }
                        other => {
                            return Err(invalid(
                                format!("{bat}.type"),
                                format!(
                                    "an assistant message takes `text`, `thinking` and \
                                     `tool_use` blocks, found `{other}`"
                                ),
                            ))
                        }
                    }
                }
                a.content = text.map(Content::Text);
                out.push(a);
            }
            other => {
                return Err(invalid(
                    format!("{at}.role"),
                    format!("expected `user` or `assistant`, found `{other}`"),
                ))
            }
        }
    }
    Ok(out)
}

/// `tools` in chat's shape. Tools with a `type` other than `custom` (server tools such as
/// `web_search_20250305`, Anthropic-defined ones such as `bash_20250124`, whose schemas the
/// model here never learnt) are left out of the prompt, as the Responses API leaves hosted
/// tools out.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    let mut skipped = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Some(o) = t.as_object() else {
            return Err(invalid(p, "a tool is an object"));
        };
        match o.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                skipped.push(format!("{p} ({other})"));
                continue;
            }
        }
        let Some(name) = o.get("name").and_then(Value::as_str) else {
            return Err(invalid(format!("{p}.name"), "missing the tool's `name`"));
        };
        let mut f = Map::new();
        f.insert("name".into(), json!(name));
        if let Some(d) = o.get("description").filter(|d| !d.is_null()) {
            f.insert("description".into(), d.clone());
        }
        let schema = o
            .get("input_schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        f.insert("parameters".into(), schema);
        out.push(json!({"type": "function", "function": f}));
    }
    if !skipped.is_empty() {
        tracing::info!(tools = ?skipped, "tools the server cannot run are left out of the prompt");
    }
    Ok(out)
}

/// `tool_choice` as chat's, and whether parallel calls are allowed.
fn chat_tool_choice(c: Option<&Value>) -> Result<(Option<Value>, Option<bool>), ApiError> {
    let Some(c) = c.filter(|c| !c.is_null()) else {
        return Ok((None, None));
    };
    let Some(o) = c.as_object() else {
        return Err(invalid("tool_choice", "expected an object with a `type`"));
    };
    let parallel = o
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|d| !d);
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(n) => json!({"type": "function", "function": {"name": n}}),
            None => return Err(invalid("tool_choice.name", "missing the tool's `name`")),
        },
        Some(other) => {
            return Err(invalid(
                "tool_choice.type",
                format!("expected `auto`, `any`, `tool` or `none`, found `{other}`"),
            ))
        }
        None => return Err(invalid("tool_choice.type", "missing `type`")),
    };
    Ok((Some(choice), parallel))
}

/// `thinking` as the chat template's switches (Qwen3's `enable_thinking`, DeepSeek V3.1's
/// `thinking`).
fn thinking_kwargs(t: Option<&Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let Some(t) = t.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let on = match t.get("type").and_then(Value::as_str) {
        Some("enabled") => true,
        Some("disabled") => false,
        _ => return Err(invalid("thinking.type", "expected `enabled` or `disabled`")),
    };
    Ok(Some(crate::gateway::convert::with_thinking(None, on)))
}

/// The chat request a Messages request runs as. `count` (count_tokens) needs no
/// `max_tokens`.
pub fn chat_request(req: &MessagesRequest, count: bool) -> Result<ChatRequest, ApiError> {
    if !count && req.max_tokens.is_none() {
        return Err(invalid("max_tokens", "missing required field `max_tokens`"));
    }
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let (tool_choice, parallel) = chat_tool_choice(req.tool_choice.as_ref())?;
    // a tool_choice with no tools means nothing (Anthropic accepts `auto` without tools)
    let tool_choice = tool_choice.filter(|_| tools.as_ref().is_some_and(|t| !t.is_empty()));
    let tools = tools.filter(|t| !t.is_empty());
    Ok(ChatRequest {
        messages: chat_messages(req)?,
        max_completion_tokens: None,
        logprobs: None,
        top_logprobs: None,
        tools,
        tool_choice,
        parallel_tool_calls: parallel,
        response_format: None,
        grammar: None,
        chat_template_kwargs: thinking_kwargs(req.thinking.as_ref())?,
        prediction: None,
        reasoning_format: Some(ReasoningFormat::Deepseek),
        reasoning_effort: None,
        model: req.model.clone(),
        max_tokens: req.max_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        stop: req.stop_sequences.clone().map(StopField::Many),
        stream: if count { None } else { req.stream },
        stream_options: None,
        presence_penalty: None,
        frequency_penalty: None,
        n: None,
        user: req.metadata.as_ref().and_then(|m| m.user_id.clone()),
        top_k: req.top_k,
        min_p: None,
        repeat_penalty: None,
        ignore_eos: None,
        cache_prompt: None,
        speculative: None,
        logit_bias: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_tool_loop_becomes_chat_messages() {
        let r = req(
            json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "Paris"}},
                    {"type": "tool_use", "id": "t2", "name": "w", "input": {"c": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "t2", "is_error": true,
                     "content": [{"type": "text", "text": "no data"}]},
                    {"type": "text", "text": "and tomorrow?"}]}]}),
        );
        let m = chat_messages(&r).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "tool", "tool", "user"]
        );
        assert_eq!(m[2].reasoning_content.as_deref(), Some("look it up"));
        assert!(matches!(&m[2].content, Some(Content::Text(t)) if t == "Checking."));
        let calls = m[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0].function.arguments,
            Some(Value::String("{\"c\":\"Paris\"}".into()))
        );
        assert_eq!(m[4].tool_call_id.as_deref(), Some("t2"));
        assert!(matches!(&m[4].content, Some(Content::Text(t)) if t == "Error: no data"));
        assert!(matches!(&m[5].content, Some(Content::Text(t)) if t == "and tomorrow?"));
    }

    /// Claude Code's billing header never reaches the prompt: the same conversation from
    /// two client versions renders the same system text.
    #[test]
    fn the_billing_header_is_left_out() {
        let sys = |header: &str| {
            req(json!({"model": "m", "max_tokens": 1,
                "system": [{"type": "text", "text": header},
                           {"type": "text", "text": "You are an agent."}],
                "messages": [{"role": "user", "content": "x"}]}))
        };
        let a = chat_messages(&sys(
            "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;",
        ))
        .unwrap();
        let b = chat_messages(&sys(
            "x-anthropic-billing-header: cc_version=2.1.201.7; cc_entrypoint=cli; cch=a5145;",
        ))
        .unwrap();
        assert!(matches!(&a[0].content, Some(Content::Text(t)) if t == "You are an agent."));
        assert!(matches!(&b[0].content, Some(Content::Text(t)) if t == "You are an agent."));
        // in one string, the per-request `cch` value is masked
        let one = |cch: &str| {
            let r = req(json!({"model": "m", "max_tokens": 1,
                "system": format!("x-anthropic-billing-header: cc_version=2.1.101.e51; cch={cch};You are Claude Code."),
                "messages": [{"role": "user", "content": "x"}]}));
            match chat_messages(&r).unwrap().remove(0).content {
                Some(Content::Text(t)) => t,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(one("a5145"), one("0b77c"));
        assert!(one("a5145").ends_with("cch=fffff;You are Claude Code."));
        // a system text that merely mentions the header is kept as it is
        let r = req(json!({"model": "m", "max_tokens": 1,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: is a header.\nUse it."}],
            "messages": [{"role": "user", "content": "x"}]}));
        assert!(matches!(&chat_messages(&r).unwrap()[0].content,
            Some(Content::Text(t)) if t.starts_with("x-anthropic-billing-header")));
    }

    #[test]
    fn bad_blocks_and_tools_name_their_place() {
        let r = req(json!({"model": "m", "max_tokens": 9, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]}));
        assert_eq!(
            chat_messages(&r).unwrap_err().param.as_deref(),
            Some("messages[0].content[0].type")
        );
        // a tool result's content: text blocks only, each with its text
        for (block, param) in [
            (
                json!({"type": "image", "source": {}}),
                "messages[0].content[0].content[1].type",
            ),
            (
                json!({"type": "text"}),
                "messages[0].content[0].content[1].text",
            ),
        ] {
            let r = req(json!({"model": "m", "max_tokens": 9, "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "ok"}, block]}]}]}));
            assert_eq!(chat_messages(&r).unwrap_err().param.as_deref(), Some(param));
        }
        let kept = chat_tools(&[
            json!({"type": "web_search_20250305", "name": "web_search"}),
            json!({"name": "g", "input_schema": {"type": "object"}}),
        ])
        .unwrap();
        assert_eq!(kept.len(), 1, "the server tool is left out: {kept:?}");
        assert_eq!(kept[0]["function"]["name"], "g");
        let e = chat_tools(&[json!({"description": "no name"})]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].name"));
        let t = chat_tools(&[json!({"name": "f", "description": "d",
            "input_schema": {"type": "object"}})])
        .unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "f", "description": "d",
                "parameters": {"type": "object"}}})
        );
        assert_eq!(
            chat_tool_choice(Some(
                &json!({"type": "any", "disable_parallel_tool_use": true})
            ))
            .unwrap(),
            (Some(json!("required")), Some(false))
        );
        let r = req(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}));
        assert_eq!(
            chat_request(&r, false).unwrap_err().param.as_deref(),
            Some("max_tokens")
        );
        assert!(
            chat_request(&r, true).is_ok(),
            "count_tokens needs no max_tokens"
        );
    }
}
