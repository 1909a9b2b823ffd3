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
        ToolFormat::DeepSeekV32 => {
            let (name, rest) = body.split_once("\">")?;
            let name = name.trim().to_string();
            (None, name.clone(), params(format, rest, &name, tools, "")?)
        }
        ToolFormat::Glm45 => {
            let (name, rest) = glm_name(body)?;
            let name = name.to_string();
            (None, name.clone(), params(format, rest, &name, tools, "")?)
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

/// GLM: `NAME` up to the line break or the first tag -> (NAME, the rest); a name holds no tag
/// or line break.
pub(super) fn glm_name(body: &str) -> Option<(&str, &str)> {
    let at = body.find(['\n', '<'])?;
    Some((body[..at].trim(), &body[at..]))
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
/// (optional at the very end).
fn qwen3_coder(
    body: &str,
    tools: &[ToolSpec],
) -> Option<(Option<String>, String, Map<String, Value>)> {
    let rest = body.trim_start().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let name = name.trim().to_string();
    let args = params(ToolFormat::Qwen3Coder, rest, &name, tools, "</function>")?;
    Some((None, name, args))
}

/// The parameter blocks of a call of `name` up to the end of `text` (or up to `end` then
/// only blanks); `None` if anything else is there.
fn params(
    format: ToolFormat,
    mut text: &str,
    name: &str,
    tools: &[ToolSpec],
    end: &str,
) -> Option<Map<String, Value>> {
    let schema = properties(tools, name);
    let mut args = Map::new();
    loop {
        let r = text.trim_start();
        if r.is_empty() {
            return Some(args);
        }
        if !end.is_empty() && r.starts_with(end) {
            return r[end.len()..].trim().is_empty().then_some(args);
        }
        let (key, value, used) = param_block(format, text, schema)?;
        args.insert(key, value);
        text = &text[used..];
    }
}

/// The `properties` of tool `name`'s parameter schema.
pub(super) fn properties<'a>(tools: &'a [ToolSpec], name: &str) -> Option<&'a Value> {
    tools
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"))
}

/// GLM's argument tags: key open/close, value open/close.
const GLM_ARG: [&str; 4] = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"];

/// DeepSeek-V3.2's parameter tag, up to the parameter's name, and its closing tag.
const DSML_PARAM: (&str, &str) = ("<｜DSML｜parameter name=\"", "</｜DSML｜parameter>");

/// The whole parameter block at the start of `text` (blanks before it skipped) of the formats
/// that write one block per argument: (name, value, bytes up to the end of its closing tag), or
/// `None` when no complete block starts there.
///
/// - Qwen3-Coder: `<parameter=P>\nVALUE\n</parameter>` (one newline on each side belongs to the
///   tags); the value is text when the schema says `string`, else JSON when it parses.
/// - DeepSeek-V3.2: `<｜DSML｜parameter name="P" string="true|false">VALUE</｜DSML｜parameter>`;
///   `string="true"`: the text, `"false"`: JSON (the text if it does not parse); without the
///   attribute, as Qwen3-Coder's by the schema.
pub(super) fn param_block(
    format: ToolFormat,
    text: &str,
    schema: Option<&Value>,
) -> Option<(String, Value, usize)> {
    let t = text.trim_start();
    let lead = text.len() - t.len();
    let ty = |p: &str| {
        schema
            .and_then(|s| s.get(p))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
    };
    match format {
        ToolFormat::Qwen3Coder => {
            const OPEN: &str = "<parameter=";
            const CLOSE: &str = "</parameter>";
            let r = t.strip_prefix(OPEN)?;
            let (param, r) = r.split_once('>')?;
            let (raw, _) = r.split_once(CLOSE)?;
            let used = lead + OPEN.len() + param.len() + 1 + raw.len() + CLOSE.len();
            let value = raw.strip_prefix('\n').unwrap_or(raw);
            let value = value.strip_suffix('\n').unwrap_or(value);
            let param = param.trim();
            Some((param.to_string(), coder_value(value, ty(param)), used))
        }
        ToolFormat::DeepSeekV32 => {
            let (open, close) = DSML_PARAM;
            let r = t.strip_prefix(open)?;
            let (param, r) = r.split_once('"')?;
            let (attrs, r) = r.split_once('>')?;
            let (raw, _) = r.split_once(close)?;
            let used =
                lead + open.len() + param.len() + 1 + attrs.len() + 1 + raw.len() + close.len();
            let value = if attrs.contains("string=\"true\"") {
                Value::String(raw.to_string())
            } else if attrs.contains("string=\"false\"") {
                coder_value(raw, None)
            } else {
                coder_value(raw, ty(param))
            };
            Some((param.to_string(), value, used))
        }
        ToolFormat::Glm45 => {
            let [ko, kc, vo, vc] = GLM_ARG;
            let r = t.strip_prefix(ko)?;
            let (key, r) = r.split_once(kc)?;
            let after_key = r.trim_start();
            let gap = r.len() - after_key.len();
            let r = after_key.strip_prefix(vo)?;
            let (raw, _) = r.split_once(vc)?;
            let used =
                lead + ko.len() + key.len() + kc.len() + gap + vo.len() + raw.len() + vc.len();
            let key = key.trim();
            Some((key.to_string(), coder_value(raw, ty(key)), used))
        }
        _ => None,
    }
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
