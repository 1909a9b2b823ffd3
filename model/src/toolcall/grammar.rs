//! The grammar of a model's own tool-call text (Lark, llguidance's dialect), for `tool_choice`
//! `required` or a named function: the markers of the format (special tokens by name when the
//! vocabulary has them, else text), the function name fixed, and the arguments a `%json` value
//! of the tool's parameter schema (Qwen3-Coder and DeepSeek-V3.2: one parameter block per
//! property, in the schema's order, required ones mandatory). One call, or one or more with parallel calls.
//!
//! With `tool_choice` `auto` and `strict: true` tools ([`CallChoice::Auto`]) the output is free
//! text that never spells a call marker, optionally followed by the calls: the first marker
//! ends the text (as a special token, or as text closing the text lexeme — llguidance's lexer
//! does not backtrack, so text and a textual marker are one lexeme), and from there the call
//! follows the grammar: a strict tool's arguments its schema, another tool's any JSON object.

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
    /// Text, or text then calls; strict tools' arguments follow their schema.
    Auto,
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

/// The tool as the grammar of `choice` sees it: in `auto` mode a tool that is not strict takes
/// any JSON object (its schema is advice to the model, not a rule).
fn as_chosen(t: &ToolSpec, choice: &CallChoice) -> ToolSpec {
    if *choice == CallChoice::Auto && !t.strict {
        ToolSpec {
            name: t.name.clone(),
            parameters: serde_json::json!({"type": "object"}),
            strict: false,
        }
    } else {
        t.clone()
    }
}

/// A regex matching `s` literally (regex-syntax's meta characters escaped; `<` and `>` are
/// not, since `\<` is a word boundary there).
fn regex_lit(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
    let chosen: Vec<ToolSpec> = match choice {
        CallChoice::Any | CallChoice::Auto => tools.iter().map(|t| as_chosen(t, choice)).collect(),
        CallChoice::Named(n) => tools.iter().filter(|t| &t.name == n).cloned().collect(),
    };
    if chosen.is_empty() {
        return Err("no tool to call".into());
    }
    let (open, _) = format.call_markers();
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in chosen.iter().enumerate() {
        let f = format!("f{i}");
        alts.push(f.clone());
        let args = json_rule(&args_schema(t));
        // the call after its opening marker
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
                    "{f}: {} {} {} {}",
                    lit("\n"),
                    json_rule(&call),
                    lit("\n"),
                    marker(vocab, "</tool_call>")
                )
            }
            ToolFormat::Qwen3Coder => {
                let params = coder_params(&f, t, &mut rules)?;
                format!(
                    "{f}: {} {params} {} {}",
                    lit(&format!("\n<function={}>\n", t.name)),
                    lit("</function>\n"),
                    marker(vocab, "</tool_call>")
                )
            }
            ToolFormat::KimiK2 => format!(
                "{f}: {} /[0-9]{{1,3}}/ {} {args} {}",
                lit(&format!("functions.{}:", t.name)),
                marker(vocab, "<|tool_call_argument_begin|>"),
                marker(vocab, "<|tool_call_end|>")
            ),
            ToolFormat::DeepSeekV31 => format!(
                "{f}: {} {} {args} {}",
                lit(&t.name),
                marker(vocab, "<｜tool▁sep｜>"),
                marker(vocab, "<｜tool▁call▁end｜>")
            ),
            ToolFormat::DeepSeekV3 => format!(
                "{f}: {} {} {} {args} {} {}",
                lit("function"),
                marker(vocab, "<｜tool▁sep｜>"),
                lit(&format!("{}\n```json\n", t.name)),
                lit("\n```"),
                marker(vocab, "<｜tool▁call▁end｜>")
            ),
            ToolFormat::Glm45 => {
                // `NAME\n`, one key/value pair per argument, each ending its line
                let params = glm_params(&f, t, &mut rules)?;
                format!(
                    "{f}: {} {params} {}",
                    lit(&format!("{}\n", t.name)),
                    marker(vocab, "</tool_call>")
                )
            }
            ToolFormat::DeepSeekV32 => {
                // `NAME">\n`, each parameter block and a newline, the closing tag (a call
                // without parameters has an empty line there)
                let (params, any_required) = dsml_params(&f, t, &mut rules)?;
                let params = if any_required {
                    params
                } else {
                    format!("({params} | {})", lit("\n"))
                };
                format!(
                    "{f}: {} {params} {}",
                    lit(&format!("{}\">\n", t.name)),
                    lit(format.call_markers().1)
                )
            }
        };
        rules.push(rule);
    }
    let body = format!("body: {}", alts.join(" | "));
    let call = format!("call: {} body", marker(vocab, open));
    // what follows the first call (one call, or more with parallel calls)
    let more = match (format, parallel) {
        (
            ToolFormat::Hermes
            | ToolFormat::Qwen3Coder
            | ToolFormat::Glm45
            | ToolFormat::DeepSeekV3
            | ToolFormat::DeepSeekV32,
            true,
        ) => {
            format!("({} call)*", lit("\n"))
        }
        (_, true) => "call*".to_string(),
        (_, false) => String::new(),
    };
    // the block of calls: its first marker, then the rest
    let (first, rest) = match format {
        ToolFormat::Hermes | ToolFormat::Qwen3Coder | ToolFormat::Glm45 => {
            (open, format!("body {more}"))
        }
        ToolFormat::KimiK2 => (
            "<|tool_calls_section_begin|>",
            format!(
                "call {more} {}",
                marker(vocab, "<|tool_calls_section_end|>")
            ),
        ),
        ToolFormat::DeepSeekV31 | ToolFormat::DeepSeekV3 => (
            "<｜tool▁calls▁begin｜>",
            format!("call {more} {}", marker(vocab, "<｜tool▁calls▁end｜>")),
        ),
        ToolFormat::DeepSeekV32 => {
            let (first, end) = super::DSML_BLOCK;
            let nl = lit("\n");
            (first, format!("{nl} call {more} {nl} {}", lit(end)))
        }
    };
    let mut g = match choice {
        CallChoice::Auto => {
            // text never spells a marker of the format
            let mut markers = vec![open];
            markers.extend_from_slice(format.section_markers());
            let spelled = markers
                .iter()
                .map(|m| regex_lit(m))
                .collect::<Vec<_>>()
                .join("|");
            let any = "(?s:.)";
            let text = format!("/{any}*/ & ~/{any}*({spelled}){any}*/");
            let mut g = vec![format!("TEXT: {text}")];
            if vocab.has_special(first) {
                g.push(format!("start: TEXT? | TEXT? {first} {rest}"));
            } else {
                // the text and the first marker as one lexeme: ends at the marker's first
                // occurrence
                let m = regex_lit(first);
                g.push(format!("OPEN: /{any}*{m}/ & ~/{any}*({spelled}){any}+/"));
                g.push(format!("start: TEXT? | OPEN {rest}"));
            }
            g
        }
        _ => vec![format!("start: {} {rest}", marker(vocab, first))],
    };
    g.push(call);
    g.push(body);
    g.extend(rules);
    Ok(g.join("\n"))
}

/// Qwen3-Coder's parameter blocks of one tool: rules added to `rules`, the sequence returned.
fn coder_params(f: &str, t: &ToolSpec, rules: &mut Vec<String>) -> Result<String, String> {
    let schema = args_schema(t);
    let props = schema.get("properties").and_then(Value::as_object);
    let required = required_of(&schema);
    let Some(props) = props else {
        // no declared properties: any parameter blocks
        let r = format!("{f}_any");
        rules.push(format!(
            "{r}: /<parameter=[A-Za-z0-9_.\\-]+>\\n[^<]*{CLOSE_PARAM}/"
        ));
        return Ok(format!("{r}*"));
    };
    let mut seq = Vec::new();
    for (j, (name, p)) in props.iter().enumerate() {
        let r = format!("{f}_p{j}");
        let value = match p.get("type").and_then(Value::as_str) {
            // text up to the closing tag: no `<` inside, as the parser reads it; the
            // schema's length bounds hold; one lexeme with the closing tag, since the text may
            // end in a newline, which the tag starts with, and llguidance's lexer does not
            // backtrack
            Some("string") if p.get("enum").is_none() && p.get("const").is_none() => {
                let min = p.get("minLength").and_then(Value::as_u64).unwrap_or(0);
                let text = match p.get("maxLength").and_then(Value::as_u64) {
                    Some(max) => format!("[^<]{{{min},{max}}}"),
                    None if min > 0 => format!("[^<]{{{min},}}"),
                    None => "[^<]*".to_string(),
                };
                rules.push(format!(
                    "{r}: {} /{text}{CLOSE_PARAM}/",
                    lit(&format!("<parameter={name}>\n"))
                ));
                push_param(&mut seq, &r, required.contains(&name.as_str()));
                continue;
            }
            Some("string") => string_choices(name, p)?,
            _ => json_value(p),
        };
        rules.push(format!(
            "{r}: {} {value} {}",
            lit(&format!("<parameter={name}>\n")),
            lit("\n</parameter>\n")
        ));
        push_param(&mut seq, &r, required.contains(&name.as_str()));
    }
    Ok(seq.join(" "))
}

/// The lexeme `name` (added to `rules` once): any text up to the first `close` tag, with the
/// tag, as the parser reads a tagged value; returned by name.
fn text_to_tag(rules: &mut Vec<String>, name: &str, close: &str) -> String {
    let close = regex_lit(close);
    let any = "(?s:.)";
    let lexeme = format!("{name}: /{any}*{close}/ & ~/{any}*{close}{any}+/");
    if !rules.contains(&lexeme) {
        rules.push(lexeme);
    }
    name.to_string()
}

/// The names a schema lists as `required`.
fn required_of(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A tagged parameter value of schema `p` with its closing tag `close` (DeepSeek-V3.2's DSML,
/// GLM's `<arg_value>`): a string its text (`text`: the [`text_to_tag`] lexeme; with length
/// bounds, text without `<` of that length), a string enum one of its values, anything else
/// JSON of its schema.
fn tagged_value(name: &str, p: &Value, close: &str, text: &str) -> Result<String, String> {
    Ok(match p.get("type").and_then(Value::as_str) {
        Some("string") if p.get("enum").is_none() && p.get("const").is_none() => {
            let min = p.get("minLength").and_then(Value::as_u64);
            let max = p.get("maxLength").and_then(Value::as_u64);
            let end = regex_lit(close);
            match (min, max) {
                (None, None) => text.to_string(),
                (min, Some(max)) => format!("/[^<]{{{},{max}}}{end}/", min.unwrap_or(0)),
                (Some(min), None) => format!("/[^<]{{{min},}}{end}/"),
            }
        }
        Some("string") => format!("{} {}", string_choices(name, p)?, lit(close)),
        _ => format!("{} {}", json_value(p), lit(close)),
    })
}

/// DeepSeek-V3.2's parameter blocks of one tool, each followed by a newline: rules added to
/// `rules`; the sequence returned, and whether a parameter is required.
fn dsml_params(f: &str, t: &ToolSpec, rules: &mut Vec<String>) -> Result<(String, bool), String> {
    const OPEN: &str = "<｜DSML｜parameter name=\"";
    const CLOSE: &str = "</｜DSML｜parameter>";
    let text = text_to_tag(rules, "DSML_TEXT", CLOSE);
    let schema = args_schema(t);
    let required = required_of(&schema);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        // no declared properties: any parameter blocks
        let r = format!("{f}_any");
        rules.push(format!(
            "{r}: {} /[^\"<>\\n]+/ ({} | {}) {text} {}",
            lit(OPEN),
            lit("\" string=\"true\">"),
            lit("\" string=\"false\">"),
            lit("\n")
        ));
        return Ok((format!("{r}*"), false));
    };
    let mut seq = Vec::new();
    for (j, (name, p)) in props.iter().enumerate() {
        let r = format!("{f}_p{j}");
        let is_string = p.get("type").and_then(Value::as_str) == Some("string");
        let head = lit(&format!("{OPEN}{name}\" string=\"{is_string}\">"));
        let value = tagged_value(name, p, CLOSE, &text)?;
        rules.push(format!("{r}: {head} {value} {}", lit("\n")));
        push_param(&mut seq, &r, required.contains(&name.as_str()));
    }
    let any_required = props.keys().any(|k| required.contains(&k.as_str()));
    Ok((seq.join(" "), any_required))
}

/// GLM's argument pairs of one tool (`<arg_key>P</arg_key>\n<arg_value>VALUE</arg_value>\n`,
/// in the schema's order, required ones mandatory), values as [`tagged_value`]. Rules added to
/// `rules`, the sequence returned.
fn glm_params(f: &str, t: &ToolSpec, rules: &mut Vec<String>) -> Result<String, String> {
    const CLOSE: &str = "</arg_value>";
    let text = text_to_tag(rules, "GLM_TEXT", CLOSE);
    let schema = args_schema(t);
    let required = required_of(&schema);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        // no declared properties: any pairs, values as text
        let r = format!("{f}_any");
        rules.push(format!(
            "{r}: {} /[^<>\\n]+/ {} {text} {}",
            lit("<arg_key>"),
            lit("</arg_key>\n<arg_value>"),
            lit("\n")
        ));
        return Ok(format!("{r}*"));
    };
    let mut seq = Vec::new();
    for (j, (name, p)) in props.iter().enumerate() {
        let r = format!("{f}_p{j}");
        let head = lit(&format!("<arg_key>{name}</arg_key>\n<arg_value>"));
        let value = tagged_value(name, p, CLOSE, &text)?;
        rules.push(format!("{r}: {head} {value} {}", lit("\n")));
        push_param(&mut seq, &r, required.contains(&name.as_str()));
    }
    Ok(seq.join(" "))
}

/// A parameter's value as JSON of its schema, in the Python layout the templates write.
fn json_value(p: &Value) -> String {
    let mut s = p.clone();
    if let Value::Object(m) = &mut s {
        m.insert("x-guidance".into(), json_layout());
    }
    format!("%json {s}")
}

/// A string parameter's `enum` or `const` values as Lark alternatives (the text itself).
fn string_choices(name: &str, p: &Value) -> Result<String, String> {
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
    Ok(format!("({})", opts.join(" | ")))
}

/// A parameter block's closing tag, as a regex.
const CLOSE_PARAM: &str = "\\n<\\/parameter>\\n";

/// A parameter block in the sequence: required, or optional.
fn push_param(seq: &mut Vec<String>, rule: &str, required: bool) {
    if required {
        seq.push(rule.to_string());
    } else {
        seq.push(format!("{rule}?"));
    }
}

#[cfg(test)]
#[path = "grammar_tests.rs"]
mod tests;
