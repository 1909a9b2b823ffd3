//! The body of one call, per format (the text between a call's opening and closing markers),
//! turned into a name and a JSON object of arguments. `None` = not a call of a declared tool.

use serde_json::{Map, Value};

use super::{ParsedCall, ToolFormat, ToolSpec};

/// Parses one call's body.
pub fn parse_body(format: ToolFormat, body: &str, tools: &[ToolSpec]) -> Option<ParsedCall> {
    let (id, name, args) = match format {
        ToolFormat::Hermes => hermes(body)?,
        ToolFormat::Qwen3Coder => qwen3_coder(body, tools)?,
        ToolFormat::KimiK2 => {
            let (id, args) = body.split_once("<|tool_call_argument_begin|>")?;
            let id = id.trim();
            // `functions.NAME:IDX`
            let name = id.split(':').next()?.rsplit('.').next()?;
            (Some(id.to_string()), name.to_string(), object(args)?)
        }
        ToolFormat::DeepSeekV31 => {
            let (name, args) = body.split_once("<｜tool▁sep｜>")?;
            (None, name.trim().to_string(), object(args)?)
        }
        ToolFormat::DeepSeekV3 => {
            let (name, args) = deepseek_v3(body)?;
            (None, name.to_string(), object(args)?)
        }
    };
    if name.is_empty() || (!tools.is_empty() && !tools.iter().any(|t| t.name == name)) {
        return None;
    }
    Some(ParsedCall {
        id,
        name,
        arguments: serde_json::to_string(&Value::Object(args)).ok()?,
    })
}

/// DeepSeek-V3 / R1: `TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```` (TYPE is `function`) ->
/// (NAME, ARGS). The fences are optional: a body without them is read as bare arguments.
fn deepseek_v3(body: &str) -> Option<(&str, &str)> {
    let (_, rest) = body.split_once("<｜tool▁sep｜>")?;
    let (name, args) = rest.split_once('\n').unwrap_or((rest, ""));
    let args = args.trim();
    let args = match args
        .strip_prefix("```json")
        .or_else(|| args.strip_prefix("```"))
    {
        Some(a) => a.trim_end().strip_suffix("```")?,
        None => args,
    };
    Some((name.trim(), args))
}

/// A JSON object (surrounding whitespace allowed).
fn object(text: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str(text.trim()) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// `{"name": "..", "arguments": {..}}`; arguments given as a JSON string of an object are
/// accepted too.
fn hermes(body: &str) -> Option<(Option<String>, String, Map<String, Value>)> {
    let mut m = object(body)?;
    let name = match m.remove("name")? {
        Value::String(s) => s,
        _ => return None,
    };
    let args = match m.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(a)) => a,
        Some(Value::String(s)) => object(&s)?,
        Some(_) => return None,
    };
    Some((None, name, args))
}

/// `<function=NAME>` then `<parameter=P>\nVALUE\n</parameter>` blocks, then `</function>`
/// (optional at the very end). Values are text; a parameter whose schema type is not
/// `string` is read as JSON when it parses.
fn qwen3_coder(
    body: &str,
    tools: &[ToolSpec],
) -> Option<(Option<String>, String, Map<String, Value>)> {
    let rest = body.trim_start().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim().to_string();
    let schema = tools
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut args = Map::new();
    loop {
        let r = rest.trim_start();
        if r.is_empty() || r.starts_with("</function>") {
            let after = r.strip_prefix("</function>").unwrap_or(r);
            if !after.trim().is_empty() {
                return None;
            }
            break;
        }
        let r = r.strip_prefix("<parameter=")?;
        let (param, r) = r.split_once('>')?;
        let (value, r) = r.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let ty = schema
            .and_then(|s| s.get(param.trim()))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        args.insert(param.trim().to_string(), coder_value(value, ty));
        rest = r;
    }
    Some((None, name, args))
}

pub(super) fn coder_value(text: &str, ty: Option<&str>) -> Value {
    if ty == Some("string") {
        return Value::String(text.to_string());
    }
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(v) => v,
        Err(_) => Value::String(text.to_string()),
    }
}
