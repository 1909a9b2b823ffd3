//! The grammar of a model's own tool-call text (Lark, llguidance's dialect), for `tool_choice`
//! `required` or a named function: the markers of the format (special tokens by name when the
//! vocabulary has them, else text), the function name fixed, and the arguments a `%json` value
//! of the tool's parameter schema (Qwen3-Coder: one `<parameter=..>` block per property, in the
//! schema's order, required ones mandatory). One call, or one or more with parallel calls.

use serde_json::Value;

use super::{ToolFormat, ToolSpec};
use crate::constrain::{json_layout, with_layout, ConstraintVocab};

/// Which calls the grammar allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallChoice {
    /// A call of any declared tool.
    Any,
    /// A call of this tool.
    Named(String),
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A marker: the special token by name when the vocabulary has it, else its text.
fn marker(vocab: &ConstraintVocab, m: &str) -> String {
    if vocab.has_special(m) {
        m.to_string()
    } else {
        lit(m)
    }
}

/// The arguments schema of a tool (an object schema; none declared = any object).
fn args_schema(t: &ToolSpec) -> Value {
    match &t.parameters {
        Value::Object(m) if !m.is_empty() => Value::Object(m.clone()),
        _ => serde_json::json!({"type": "object"}),
    }
}

/// `%json {..}` of a schema with the Python JSON layout.
fn json_rule(schema: &Value) -> String {
    format!("%json {}", with_layout(schema))
}

/// The Lark grammar of `choice` in `format`.
pub fn tool_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    choice: &CallChoice,
    parallel: bool,
    vocab: &ConstraintVocab,
) -> Result<String, String> {
    let chosen: Vec<&ToolSpec> = match choice {
        CallChoice::Any => tools.iter().collect(),
        CallChoice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
    };
    if chosen.is_empty() {
        return Err("no tool to call".into());
    }
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in chosen.iter().enumerate() {
        let f = format!("f{i}");
        alts.push(f.clone());
        let args = json_rule(&args_schema(t));
        let rule = match format {
            ToolFormat::Hermes => {
                let mut props = serde_json::Map::new();
                props.insert("name".into(), serde_json::json!({"const": t.name}));
                props.insert("arguments".into(), args_schema(t));
                let call = serde_json::json!({
                    "type": "object",
                    "properties": props,
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                });
                format!(
                    "{f}: {} {} {}",
                    marker(vocab, "<tool_call>"),
                    lit("\n"),
                    json_rule(&call)
                ) + &format!(" {} {}", lit("\n"), marker(vocab, "</tool_call>"))
            }
            ToolFormat::Qwen3Coder => {
                let params = coder_params(&f, t, &mut rules)?;
                format!(
                    "{f}: {} {} {params} {} {}",
                    marker(vocab, "<tool_call>"),
                    lit(&format!("\n<function={}>\n", t.name)),
                    lit("</function>\n"),
                    marker(vocab, "</tool_call>")
                )
            }
            ToolFormat::KimiK2 => format!(
                "{f}: {} {} /[0-9]{{1,3}}/ {} {args} {}",
                marker(vocab, "<|tool_call_begin|>"),
                lit(&format!("functions.{}:", t.name)),
                marker(vocab, "<|tool_call_argument_begin|>"),
                marker(vocab, "<|tool_call_end|>")
            ),
            ToolFormat::DeepSeekV31 => format!(
                "{f}: {} {} {} {args} {}",
                marker(vocab, "<｜tool▁call▁begin｜>"),
                lit(&t.name),
                marker(vocab, "<｜tool▁sep｜>"),
                marker(vocab, "<｜tool▁call▁end｜>")
            ),
        };
        rules.push(rule);
    }
    let call = format!("call: {}", alts.join(" | "));
    let calls = match (format, parallel) {
        (ToolFormat::Hermes | ToolFormat::Qwen3Coder, true) => {
            format!("call ({} call)*", lit("\n"))
        }
        (_, true) => "call+".to_string(),
        (_, false) => "call".to_string(),
    };
    let start = match format {
        ToolFormat::Hermes | ToolFormat::Qwen3Coder => format!("start: {calls}"),
        ToolFormat::KimiK2 => format!(
            "start: {} {calls} {}",
            marker(vocab, "<|tool_calls_section_begin|>"),
            marker(vocab, "<|tool_calls_section_end|>")
        ),
        ToolFormat::DeepSeekV31 => format!(
            "start: {} {calls} {}",
            marker(vocab, "<｜tool▁calls▁begin｜>"),
            marker(vocab, "<｜tool▁calls▁end｜>")
        ),
    };
    let mut g = vec![start, call];
    g.extend(rules);
    Ok(g.join("\n"))
}

/// Qwen3-Coder's parameter blocks of one tool: rules added to `rules`, the sequence returned.
fn coder_params(f: &str, t: &ToolSpec, rules: &mut Vec<String>) -> Result<String, String> {
    let schema = args_schema(t);
    let props = schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = props else {
        return Ok(String::new());
    };
    let mut seq = Vec::new();
    for (j, (name, p)) in props.iter().enumerate() {
        let r = format!("{f}_p{j}");
        let value = match p.get("type").and_then(Value::as_str) {
            // text up to the closing tag: no `<` inside, as the parser reads it; the
            // schema's length bounds hold
            Some("string") if p.get("enum").is_none() && p.get("const").is_none() => {
                let min = p.get("minLength").and_then(Value::as_u64).unwrap_or(0);
                match p.get("maxLength").and_then(Value::as_u64) {
                    Some(max) => format!("/[^<]{{{min},{max}}}/"),
                    None if min > 0 => format!("/[^<]{{{min},}}/"),
                    None => "/[^<]*/".to_string(),
                }
            }
            Some("string") => {
                let opts: Vec<String> = p
                    .get("enum")
                    .and_then(Value::as_array)
                    .cloned()
                    .or_else(|| p.get("const").map(|c| vec![c.clone()]))
                    .unwrap_or_default()
                    .iter()
                    .filter_map(Value::as_str)
                    .map(lit)
                    .collect();
                if opts.is_empty() {
                    return Err(format!(
                        "parameter `{name}`: a string enum needs string values"
                    ));
                }
                format!("({})", opts.join(" | "))
            }
            _ => {
                let mut s = p.clone();
                if let Value::Object(m) = &mut s {
                    m.insert("x-guidance".into(), json_layout());
                }
                format!("%json {s}")
            }
        };
        rules.push(format!(
            "{r}: {} {value} {}",
            lit(&format!("<parameter={name}>\n")),
            lit("\n</parameter>\n")
        ));
        if required.contains(&name.as_str()) {
            seq.push(r);
        } else {
            seq.push(format!("{r}?"));
        }
    }
    Ok(seq.join(" "))
}
