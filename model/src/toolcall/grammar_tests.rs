//! The call grammars against the token masks they make, for every format, with the markers as
//! text and as special tokens: `auto` with a strict tool lets text end the output, lets calls
//! follow text, refuses arguments that break a strict schema (and takes any object for a tool
//! that is not strict), and never lets text spell a marker; random walks that enter a call
//! always end in calls whose arguments validate.

use super::*;
use crate::constrain::{ConstraintVocab, Grammar, SeqConstraint};
use crate::sampler::TokenMask;
use crate::toolcall::{Parsed, ToolParser};
use nightshift_kernels::rng::SplitMix64;

const FORMATS: [ToolFormat; 7] = [
    ToolFormat::Hermes,
    ToolFormat::Qwen3Coder,
    ToolFormat::KimiK2,
    ToolFormat::DeepSeekV31,
    ToolFormat::DeepSeekV3,
    ToolFormat::DeepSeekV32,
    ToolFormat::Glm45,
];

/// Every marker any format writes.
const MARKERS: [&str; 12] = [
    "<tool_call>",
    "</tool_call>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
];

const END: &str = "<end>";

/// Bytes 0..=255, then the markers (special tokens when `special`, else nothing: they are
/// spelled with bytes), then the special end token.
struct Vocab {
    v: ConstraintVocab,
    tokens: Vec<String>,
    end: u32,
}

fn vocab(special: bool) -> Vocab {
    let mut t: Vec<(Vec<u8>, bool)> = (0..=255u8).map(|b| (vec![b], false)).collect();
    let mut names: Vec<String> = (0..=255u8).map(|b| (b as char).to_string()).collect();
    if special {
        for m in MARKERS {
            t.push((m.as_bytes().to_vec(), true));
            names.push(m.to_string());
        }
    }
    let end = t.len() as u32;
    t.push((END.as_bytes().to_vec(), true));
    names.push(END.to_string());
    Vocab {
        v: ConstraintVocab::new(t, end).unwrap(),
        tokens: names,
        end,
    }
}

impl Vocab {
    /// `text` as tokens: a marker is its special token when the vocabulary has one, all else bytes.
    fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for (id, name) in self.tokens.iter().enumerate().skip(256) {
                if rest.starts_with(name.as_str()) {
                    out.push(id as u32);
                    rest = &rest[name.len()..];
                    continue 'outer;
                }
            }
            let c = rest.chars().next().unwrap();
            let mut buf = [0u8; 4];
            out.extend(c.encode_utf8(&mut buf).bytes().map(u32::from));
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    /// The text of tokens.
    fn detokenize(&self, toks: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &t in toks {
            if t < 256 {
                bytes.push(t as u8);
            } else {
                bytes.extend_from_slice(self.tokens[t as usize].as_bytes());
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Feeds `text` then the end token; Err(the text accepted before the first refused token).
fn feed(v: &Vocab, c: &mut SeqConstraint, text: &str) -> Result<(), String> {
    let toks = v.tokenize(text);
    for (i, &t) in toks.iter().chain(std::iter::once(&v.end)).enumerate() {
        let m = c.mask().unwrap();
        if !TokenMask(&m).allows(t) {
            return Err(v.detokenize(&toks[..i]));
        }
        if t == v.end {
            return Ok(());
        }
        c.accept(t).unwrap();
    }
    Ok(())
}

fn strict_params() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city", "days"], "additionalProperties": false})
}

/// `get_weather` (strict unless `loose`) and `note` (never strict).
fn tools(loose: bool) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: strict_params(),
            strict: !loose,
        },
        ToolSpec {
            name: "note".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}}),
            strict: false,
        },
    ]
}

/// One call in `f` with `args` (a JSON object in the Python layout) or, for Qwen3-Coder,
/// DeepSeek-V3.2 and GLM, the parameters `(name, value)` (DeepSeek-V3.2: a value that reads as
/// JSON other than a string is `string="false"`).
fn call(f: ToolFormat, name: &str, args: &str, params: &[(&str, &str)]) -> String {
    match f {
        ToolFormat::Hermes => format!(
            "<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>"
        ),
        ToolFormat::Qwen3Coder => {
            let p: String = params
                .iter()
                .map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n"))
                .collect();
            format!("<tool_call>\n<function={name}>\n{p}</function>\n</tool_call>")
        }
        ToolFormat::KimiK2 => format!(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>"
        ),
        ToolFormat::DeepSeekV31 => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        ToolFormat::DeepSeekV3 => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        ToolFormat::DeepSeekV32 => {
            let p: String = params
                .iter()
                .map(|(k, v)| {
                    let string = serde_json::from_str::<serde_json::Value>(v).is_err();
                    format!(
                        "<｜DSML｜parameter name=\"{k}\" string=\"{string}\">{v}</｜DSML｜parameter>\n"
                    )
                })
                .collect();
            let p = if p.is_empty() { "\n".to_string() } else { p };
            format!(
                "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"{name}\">\n{p}</｜DSML｜invoke>\n</｜DSML｜function_calls>"
            )
        }
        ToolFormat::Glm45 => {
            let p: String = params
                .iter()
                .map(|(k, v)| format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"))
                .collect();
            format!("<tool_call>{name}\n{p}</tool_call>")
        }
    }
}

fn compile(v: &Vocab, f: ToolFormat, tools: &[ToolSpec]) -> SeqConstraint {
    let g = tool_grammar(f, tools, &CallChoice::Auto, true, &v.v)
        .unwrap_or_else(|e| panic!("{f:?}: {e}"));
    v.v.compile(&Grammar::Lark(g.clone()))
        .unwrap_or_else(|e| panic!("{f:?}: {e}\n{g}"))
}

#[test]
fn auto_with_a_strict_tool_allows_text_and_valid_calls_only() {
    for special in [false, true] {
        let v = vocab(special);
        for f in FORMATS {
            let ctx = format!("{f:?}, special markers: {special}");
            let ok = |text: &str, loose: bool| {
                let mut c = compile(&v, f, &tools(loose));
                feed(&v, &mut c, text)
            };
            ok("", false).unwrap_or_else(|at| panic!("{ctx}: empty output refused at {at:?}"));
            ok("Just text, no call <tool or |tool_", false)
                .unwrap_or_else(|at| panic!("{ctx}: text refused after {at:?}"));
            let good = call(
                f,
                "get_weather",
                r#"{"city": "Paris", "days": 3}"#,
                &[("city", "Paris"), ("days", "3")],
            );
            ok(&format!("Let me look.\n\n{good}"), false)
                .unwrap_or_else(|at| panic!("{ctx}: valid call refused after {at:?}"));
            ok(&good, false).unwrap_or_else(|at| panic!("{ctx}: call refused after {at:?}"));
            let bad = call(
                f,
                "get_weather",
                r#"{"city": "Paris", "days": 30}"#,
                &[("city", "Paris"), ("days", "30")],
            );
            let at = ok(&bad, false).expect_err(&format!("{ctx}: days 30 accepted"));
            assert!(at.contains("Paris"), "{ctx}: refused too early: {at:?}");
            ok(&bad, true)
                .unwrap_or_else(|at| panic!("{ctx}: a loose tool's args refused after {at:?}"));
            let other = call(
                f,
                "note",
                r#"{"anything": [1, 2]}"#,
                &[("anything", "[1, 2]")],
            );
            ok(&other, false)
                .unwrap_or_else(|at| panic!("{ctx}: a loose tool refused after {at:?}"));
            let unknown = call(f, "get_time", r#"{}"#, &[]);
            ok(&unknown, false).expect_err(&format!("{ctx}: undeclared tool accepted"));
        }
    }
}

#[test]
fn deepseek_v32_string_values_take_any_text_up_to_the_closing_tag() {
    let v = vocab(false);
    let f = ToolFormat::DeepSeekV32;
    // a forced call of `note`, whose `text` is a string without bounds
    let g = tool_grammar(
        f,
        &tools(false),
        &CallChoice::Named("note".into()),
        false,
        &v.v,
    )
    .unwrap();
    let ok = |text: &str| {
        let mut c = v.v.compile(&Grammar::Lark(g.clone())).unwrap();
        feed(&v, &mut c, text)
    };
    let block = |p: &str| {
        format!(
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"note\">\n{p}</｜DSML｜invoke>\n</｜DSML｜function_calls>"
        )
    };
    let text = "<｜DSML｜parameter name=\"text\" string=\"true\">if a < b {\n  <i>x</i>\n}</｜DSML｜parameter>\n";
    ok(&block(text)).unwrap_or_else(|at| panic!("markup in a value refused at {at:?}"));
    // no parameters: the empty line the template writes
    ok(&block("\n")).unwrap_or_else(|at| panic!("no parameters refused at {at:?}"));
    // a string parameter marked as JSON is refused
    let at = ok(&block(&text.replace("true", "false"))).expect_err("string=\"false\" accepted");
    assert!(at.ends_with("name=\"text\" string=\""), "{at:?}");
}

#[test]
fn text_never_spells_a_marker_outside_a_call() {
    let v = vocab(false);
    for f in FORMATS {
        let (open, _) = f.call_markers();
        let first = match f {
            ToolFormat::KimiK2 => "<|tool_calls_section_begin|>",
            ToolFormat::DeepSeekV31 | ToolFormat::DeepSeekV3 => "<｜tool▁calls▁begin｜>",
            ToolFormat::DeepSeekV32 => "<｜DSML｜function_calls>",
            _ => open,
        };
        // the marker ends the text; what follows must be a call, never more text
        let mut c = compile(&v, f, &tools(false));
        let at = feed(&v, &mut c, &format!("a {first} and more text"))
            .expect_err(&format!("{f:?}: text after a marker accepted"));
        assert!(at.starts_with(&format!("a {first}")), "{f:?}: {at:?}");
    }
}

#[test]
fn random_walks_into_a_call_end_in_valid_calls() {
    for special in [false, true] {
        let v = vocab(special);
        for f in FORMATS {
            let first = match f {
                ToolFormat::KimiK2 => "<|tool_calls_section_begin|>",
                ToolFormat::DeepSeekV31 | ToolFormat::DeepSeekV3 => "<｜tool▁calls▁begin｜>",
                ToolFormat::DeepSeekV32 => "<｜DSML｜function_calls>",
                _ => "<tool_call>",
            };
            // the strict tool only: a loose tool's free JSON may hold numbers like 8E3645,
            // valid JSON that serde_json does not read
            let strict = &tools(false)[..1];
            for seed in 0..6 {
                let mut c = compile(&v, f, strict);
                let mut toks = v.tokenize(&format!("Checking. {first}"));
                for &t in &toks {
                    c.accept(t).unwrap();
                }
                let mut r = SplitMix64::new(seed);
                let mut ended = false;
                for _ in 0..3000 {
                    let m = c.mask().unwrap();
                    let allowed: Vec<u32> = (0..v.tokens.len() as u32)
                        .filter(|&t| TokenMask(&m).allows(t))
                        .collect();
                    assert!(!allowed.is_empty(), "{f:?}: nothing allowed");
                    // lean towards closing strings, objects and blocks, so walks end
                    let closers: Vec<u32> = allowed
                        .iter()
                        .copied()
                        .filter(|&t| t >= 256 || b"\"}]<\n".contains(&(t as u8)))
                        .collect();
                    let t = if allowed.contains(&v.end) {
                        v.end
                    } else if !closers.is_empty() && r.below(2) == 0 {
                        closers[r.below(closers.len() as u64) as usize]
                    } else {
                        allowed[r.below(allowed.len() as u64) as usize]
                    };
                    if t == v.end {
                        ended = true;
                        break;
                    }
                    c.accept(t).unwrap();
                    toks.push(t);
                }
                let text = v.detokenize(&toks);
                assert!(ended, "{f:?} seed {seed}: no end: {text:?}");
                let mut p = ToolParser::new(f, tools(false));
                let mut parsed = p.push(&text);
                parsed.extend(p.finish());
                let calls: Vec<_> = parsed
                    .iter()
                    .filter_map(|p| match p {
                        Parsed::Call(c) => Some(c),
                        _ => None,
                    })
                    .collect();
                assert!(!calls.is_empty(), "{f:?} seed {seed}: no call in {text:?}");
                for call in calls {
                    let a: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
                    if call.name == "get_weather" {
                        assert!(
                            a["city"].as_str().is_some_and(|c| c.chars().count() <= 8)
                                && a["days"].as_i64().is_some_and(|d| (1..=14).contains(&d))
                                && a.as_object().unwrap().len() == 2,
                            "{f:?} seed {seed}: {text:?}"
                        );
                    } else {
                        assert_eq!(call.name, "note", "{text:?}");
                        assert!(a.is_object());
                    }
                }
            }
        }
    }
}
