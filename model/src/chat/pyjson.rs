//! JSON the way the Python side of a chat template sees it. Hugging Face renders templates with a
//! `tojson` filter that is `json.dumps(x, ensure_ascii=False)`: `", "` and `": "` separators,
//! keys in insertion order, non-ASCII kept, floats in Python's `repr`. Templates (and so the
//! prompts models were trained on) contain that exact text, so [`dumps`] reproduces it, with
//! `json.dumps`'s `indent`, `separators`, `sort_keys` and `ensure_ascii` options. [`to_value`]
//! turns request JSON into template values keeping the key order (minijinja's
//! `preserve_order`, serde_json's `preserve_order`).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// A JSON tree as a template value; objects keep their key order.
pub fn to_value(j: &serde_json::Value) -> Value {
    match j {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(to_value).collect::<Vec<_>>()),
        serde_json::Value::Object(o) => Value::from_pairs(
            o.iter()
                .map(|(k, v)| (Value::from(k.as_str()), to_value(v))),
        ),
    }
}

/// `json.dumps` options.
#[derive(Clone, Debug)]
pub struct DumpOptions {
    /// None: one line. Some(n): newlines and n spaces per level (Python's item separator then
    /// defaults to `","`).
    pub indent: Option<usize>,
    pub item_sep: String,
    pub key_sep: String,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    /// transformers' `tojson`: `ensure_ascii=False`, default separators.
    fn default() -> Self {
        DumpOptions {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

fn bad(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// `json.dumps(value, ...)` of a template value.
pub fn dumps(v: &Value, o: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write(&mut out, v, o, 0)?;
    Ok(out)
}

fn newline(out: &mut String, o: &DumpOptions, depth: usize) {
    if let Some(n) = o.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

fn write(out: &mut String, v: &Value, o: &DumpOptions, depth: usize) -> Result<(), Error> {
    if depth > 128 {
        return Err(bad("tojson: value nested deeper than 128 levels".into()));
    }
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let x = f64::try_from(v.clone())
                .map_err(|_| bad(format!("tojson: number {v} is not a float")))?;
            out.push_str(&py_float(x));
        }
        ValueKind::String => string(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep(o));
                }
                newline(out, o, depth + 1);
                write(out, item, o, depth + 1)?;
            }
            newline(out, o, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if o.sort_keys {
                keys.sort_by(|a, b| a.to_string().cmp(&b.to_string()));
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep(o));
                }
                newline(out, o, depth + 1);
                let name = match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or_default().to_string(),
                    ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                        let mut s = String::new();
                        write(&mut s, k, o, depth + 1)?;
                        s
                    }
                    other => {
                        return Err(bad(format!("tojson: keys must be strings, found {other}")))
                    }
                };
                string(out, &name, o.ensure_ascii);
                out.push_str(&o.key_sep);
                write(out, &v.get_item(k)?, o, depth + 1)?;
            }
            newline(out, o, depth);
            out.push('}');
        }
        ValueKind::Undefined => return Err(bad("tojson: the value is undefined".into())),
        other => {
            return Err(bad(format!(
                "tojson: cannot serialize a value of kind {other}"
            )))
        }
    }
    Ok(())
}

/// Python's item separator: `","` when indenting and none was given (handled by the caller).
fn item_sep(o: &DumpOptions) -> &str {
    &o.item_sep
}

/// A JSON string literal as Python's encoder writes it.
fn string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (what `json.dumps` writes): the shortest round-trip digits, in
/// positional notation for exponents -5 < e < 16, otherwise `d.ddde+XX`; `NaN`, `Infinity`.
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// The `tojson` filter: `value | tojson(indent=None, separators=None, ensure_ascii=False,
/// sort_keys=False)`.
pub fn tojson_filter(v: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut o = DumpOptions::default();
    if let Some(n) = kwargs.get::<Option<usize>>("indent")? {
        o.indent = Some(n);
        o.item_sep = ",".into();
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    o.item_sep = a.as_str().unwrap_or_default().to_string();
                    o.key_sep = b.as_str().unwrap_or_default().to_string();
                }
                _ => return Err(bad("tojson: separators must be two strings".into())),
            }
        }
    }
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        o.ensure_ascii = b;
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        o.sort_keys = b;
    }
    kwargs.assert_all_used()?;
    dumps(v, &o).map(Value::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(j: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(j).unwrap();
        dumps(&to_value(&v), &DumpOptions::default()).unwrap()
    }

    #[test]
    fn matches_python_json_dumps() {
        // expected strings are Python 3's json.dumps(json.loads(x), ensure_ascii=False)
        assert_eq!(
            py(r#"{"b":1,"a":[true,null,"x"],"c":{}}"#),
            r#"{"b": 1, "a": [true, null, "x"], "c": {}}"#
        );
        assert_eq!(
            py(r#"["é\n\"\\\u0001",[]]"#),
            "[\"é\\n\\\"\\\\\\u0001\", []]"
        );
        assert_eq!(
            py("[0.1, 1.0, 1e16, 1.5e-5, 0.0001, 123456789012.5, -2.0]"),
            "[0.1, 1.0, 1e+16, 1.5e-05, 0.0001, 123456789012.5, -2.0]"
        );
        assert_eq!(py("18446744073709551615"), "18446744073709551615");
    }

    #[test]
    fn options_follow_python() {
        let v: serde_json::Value = serde_json::from_str(r#"{"b":[1,2],"a":"é"}"#).unwrap();
        let o = DumpOptions {
            indent: Some(2),
            item_sep: ",".into(),
            sort_keys: true,
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        // json.dumps(v, indent=2, sort_keys=True, ensure_ascii=True)
        assert_eq!(
            dumps(&to_value(&v), &o).unwrap(),
            "{\n  \"a\": \"\\u00e9\",\n  \"b\": [\n    1,\n    2\n  ]\n}"
        );
        let compact = DumpOptions {
            item_sep: ",".into(),
            key_sep: ":".into(),
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(&to_value(&v), &compact).unwrap(),
            r#"{"b":[1,2],"a":"é"}"#
        );
    }
}
