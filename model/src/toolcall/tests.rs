//! Parser tests per format: one call, parallel calls, text around calls, every split of the
//! text into two stream chunks and one character at a time, malformed and unterminated calls.

use super::*;

fn tools() -> Vec<ToolSpec> {
    let params = serde_json::json!({"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}});
    vec![ToolSpec {
        name: "get_weather".into(),
        parameters: params,
        strict: false,
    }]
}

/// One call of `get_weather` in each format (`{"city": CITY}`), with index `i`.
fn call_text(f: ToolFormat, city: &str, i: usize) -> String {
    match f {
        ToolFormat::Hermes => format!(
            "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>"
        ),
        ToolFormat::Qwen3Coder => format!(
            "<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>"
        ),
        ToolFormat::KimiK2 => format!(
            "<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{{\"city\": \"{city}\"}}<|tool_call_end|>"
        ),
        ToolFormat::DeepSeekV31 => format!(
            "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{{\"city\": \"{city}\"}}<｜tool▁call▁end｜>"
        ),
        ToolFormat::DeepSeekV3 => format!(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{{\"city\": \"{city}\"}}\n```<｜tool▁call▁end｜>"
        ),
        ToolFormat::DeepSeekV32 => format!(
            "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">{city}</｜DSML｜parameter>\n</｜DSML｜invoke>"
        ),
        ToolFormat::Glm45 => format!(
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>{city}</arg_value>\n</tool_call>"
        ),
    }
}

/// The calls as the model writes them after its generation prompt (tool-call-formats.md).
fn calls_text(f: ToolFormat, cities: &[&str]) -> String {
    let calls: Vec<String> = cities
        .iter()
        .enumerate()
        .map(|(i, c)| call_text(f, c, i))
        .collect();
    match f {
        ToolFormat::Hermes | ToolFormat::Qwen3Coder | ToolFormat::Glm45 => calls.join("\n"),
        ToolFormat::KimiK2 => format!(
            "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>",
            calls.concat()
        ),
        ToolFormat::DeepSeekV31 => {
            format!(
                "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
                calls.concat()
            )
        }
        // as DeepSeek-R1's template renders them: parallel calls joined by a newline
        ToolFormat::DeepSeekV3 => {
            format!(
                "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
                calls.join("\n")
            )
        }
        // as DeepSeek-V3.2's template renders them
        ToolFormat::DeepSeekV32 => format!(
            "<｜DSML｜function_calls>\n{}\n</｜DSML｜function_calls>",
            calls.join("\n")
        ),
    }
}

fn expected(f: ToolFormat, cities: &[&str]) -> Vec<Parsed> {
    cities
        .iter()
        .enumerate()
        .map(|(i, c)| {
            Parsed::Call(ParsedCall {
                id: (f == ToolFormat::KimiK2).then(|| format!("functions.get_weather:{i}")),
                name: "get_weather".into(),
                arguments: format!(r#"{{"city":"{c}"}}"#),
            })
        })
        .collect()
}

/// Runs the parser over `chunks`, merging adjacent content.
fn run(f: ToolFormat, chunks: &[&str]) -> Vec<Parsed> {
    let mut p = ToolParser::new(f, tools());
    let mut out = Vec::new();
    let mut add = |v: Vec<Parsed>| {
        for x in v {
            match (out.last_mut(), x) {
                (Some(Parsed::Content(a)), Parsed::Content(b)) => a.push_str(&b),
                (_, x) => out.push(x),
            }
        }
    };
    for c in chunks {
        add(p.push(c));
    }
    add(p.finish());
    out
}

const FORMATS: [ToolFormat; 7] = [
    ToolFormat::Hermes,
    ToolFormat::Qwen3Coder,
    ToolFormat::KimiK2,
    ToolFormat::DeepSeekV31,
    ToolFormat::DeepSeekV3,
    ToolFormat::DeepSeekV32,
    ToolFormat::Glm45,
];

#[test]
fn single_and_parallel_calls() {
    for f in FORMATS {
        for cities in [&["Paris"][..], &["Paris", "London"][..]] {
            let text = calls_text(f, cities);
            assert_eq!(run(f, &[&text]), expected(f, cities), "{f:?} {text:?}");
        }
    }
}

#[test]
fn text_around_calls() {
    for f in FORMATS {
        let text = format!("Let me check.\n\n{}", calls_text(f, &["Paris"]));
        let mut want = vec![Parsed::Content("Let me check.".into())];
        want.extend(expected(f, &["Paris"]));
        assert_eq!(run(f, &[&text]), want, "{f:?}");
        // text after the calls is content too
        let text = format!("{} Done.", calls_text(f, &["Paris"]));
        let mut want = expected(f, &["Paris"]);
        want.push(Parsed::Content(" Done.".into()));
        assert_eq!(run(f, &[&text]), want, "{f:?}");
        // no calls: everything is content, whitespace kept
        assert_eq!(
            run(f, &["Just text ", "<b>bold</b>  \n"]),
            vec![Parsed::Content("Just text <b>bold</b>  \n".into())]
        );
    }
}

#[test]
fn every_split_gives_the_same_result() {
    for f in FORMATS {
        let text = format!("Sure: {}", calls_text(f, &["Paris", "Zürich"]));
        let whole = run(f, &[&text]);
        assert_eq!(whole.len(), 3, "{f:?} {whole:?}");
        for at in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(
                run(f, &[&text[..at], &text[at..]]),
                whole,
                "{f:?} split at byte {at}"
            );
        }
        // one character per chunk: content never shows a piece of a marker
        let mut p = ToolParser::new(f, tools());
        let mut content = String::new();
        let mut buf = [0u8; 4];
        for c in text.chars() {
            for x in p.push(c.encode_utf8(&mut buf)) {
                if let Parsed::Content(s) = x {
                    content.push_str(&s);
                }
            }
            assert!(!content.contains('<'), "{f:?}: {content:?}");
        }
        assert_eq!(content, "Sure:");
    }
}

#[test]
fn malformed_calls_are_content() {
    for f in FORMATS {
        let (open, close) = f.call_markers();
        // a body that does not parse
        let bad = format!("A {open}{{not json{close} B");
        assert_eq!(run(f, &[&bad]), vec![Parsed::Content(bad.clone())], "{f:?}");
        // an unknown tool
        let unknown = calls_text(f, &["Paris"]).replace("get_weather", "launch_rockets");
        let got = run(f, &[&unknown]);
        assert!(
            got.iter().all(|p| matches!(p, Parsed::Content(_))),
            "{f:?} {got:?}"
        );
        // a partial marker at the end is text
        let partial = &open[..open.len() - 1];
        assert_eq!(
            run(f, &["Hello ", partial]),
            vec![Parsed::Content(format!("Hello {partial}"))],
            "{f:?}"
        );
        // an unterminated call whose body is complete is a call; a cut one is text
        let full = call_text(f, "Paris", 0);
        let cut = &full[..full.len() - close.len()];
        assert_eq!(run(f, &[cut]), expected(f, &["Paris"]), "{f:?}");
        let cut_more = &full[..full.len() - close.len() - 4];
        assert_eq!(
            run(f, &[cut_more]),
            vec![Parsed::Content(cut_more.to_string())],
            "{f:?}"
        );
    }
}

#[test]
fn qwen3_coder_values_follow_the_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n\
                <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let got = run(ToolFormat::Qwen3Coder, &[text]);
    assert_eq!(
        got,
        vec![Parsed::Call(ParsedCall {
            id: None,
            name: "get_weather".into(),
            arguments: r#"{"city":"42","days":3}"#.into(),
        })]
    );
}

#[test]
fn deepseek_v32_values_follow_their_string_attribute() {
    let text = "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
                <｜DSML｜parameter name=\"city\" string=\"true\">007 <b>\"x\"\n</｜DSML｜parameter>\n\
                <｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
                <｜DSML｜parameter name=\"opts\" string=\"false\">{\"raw\": [true, null]}</｜DSML｜parameter>\n\
                <｜DSML｜parameter name=\"note\" string=\"false\">not json</｜DSML｜parameter>\n\
                </｜DSML｜invoke>\n</｜DSML｜function_calls>";
    let want = vec![
        Parsed::Content("Checking.".into()),
        Parsed::Call(ParsedCall {
            id: None,
            name: "get_weather".into(),
            arguments:
                r#"{"city":"007 <b>\"x\"\n","days":3,"opts":{"raw":[true,null]},"note":"not json"}"#
                    .into(),
        }),
    ];
    assert_eq!(run(ToolFormat::DeepSeekV32, &[text]), want);
    // every split, streamed arguments included
    for at in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        assert_eq!(
            run(ToolFormat::DeepSeekV32, &[&text[..at], &text[at..]]),
            want,
            "split at {at}"
        );
        let (content, calls) = run_streaming(ToolFormat::DeepSeekV32, &[&text[..at], &text[at..]]);
        assert_eq!(content, "Checking.");
        let Parsed::Call(c) = &want[1] else {
            unreachable!()
        };
        let joined: serde_json::Value = serde_json::from_str(&calls[0].2.concat()).unwrap();
        assert_eq!(
            joined,
            serde_json::from_str::<serde_json::Value>(&c.arguments).unwrap()
        );
    }
    // the block spelled as DeepSeek's later models write it, a call without parameters
    let later = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    assert_eq!(
        run(ToolFormat::DeepSeekV32, &[later]),
        vec![Parsed::Call(ParsedCall {
            id: None,
            name: "get_weather".into(),
            arguments: "{}".into(),
        })]
    );
    // a stray tag inside the call: the call is its text
    let bad = "<｜DSML｜invoke name=\"get_weather\">\n<b>x</b>\n</｜DSML｜invoke>";
    assert_eq!(
        run(ToolFormat::DeepSeekV32, &[bad]),
        vec![Parsed::Content(bad.into())]
    );
}

#[test]
fn formats_are_detected_from_the_published_templates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/templates");
    for (file, want) in [
        ("qwen3-30b-a3b.jinja", ToolFormat::Hermes),
        ("qwen3-thinking-2507.jinja", ToolFormat::Hermes),
        ("qwen3-coder-30b-a3b.jinja", ToolFormat::Qwen3Coder),
        (
            "qwen3-coder-30b-a3b.2025-07-initial.jinja",
            ToolFormat::Qwen3Coder,
        ),
        ("kimi-k2-instruct.jinja", ToolFormat::KimiK2),
        ("kimi-k2-instruct.2025-07-initial.jinja", ToolFormat::KimiK2),
        ("kimi-k2-instruct-0905.jinja", ToolFormat::KimiK2),
        ("kimi-k2-thinking.jinja", ToolFormat::KimiK2),
        ("deepseek-v3.1.jinja", ToolFormat::DeepSeekV31),
        ("deepseek-r1-distill.jinja", ToolFormat::DeepSeekV3),
        ("deepseek-v3.jinja", ToolFormat::DeepSeekV3),
        ("deepseek-v3.2.jinja", ToolFormat::DeepSeekV32),
        ("glm-4.6.jinja", ToolFormat::Glm45),
    ] {
        let src = std::fs::read_to_string(dir.join(file)).unwrap();
        assert_eq!(ToolFormat::detect(&src), Some(want), "{file}");
    }
    assert_eq!(ToolFormat::detect("{{ messages }}"), None);
    for (f, n) in ToolFormat::ALL {
        assert_eq!(ToolFormat::from_name(n), Some(f));
        assert_eq!(f.name(), n);
    }
}

/// Content, and each call's (id, name, argument pieces), from a streaming-arguments parser fed
/// `chunks`.
type Streamed = (String, Vec<(Option<String>, String, Vec<String>)>);

fn run_streaming(f: ToolFormat, chunks: &[&str]) -> Streamed {
    let mut p = ToolParser::new(f, tools()).streaming_arguments();
    let mut content = String::new();
    let mut calls: Vec<(Option<String>, String, Vec<String>)> = Vec::new();
    let mut add = |v: Vec<Parsed>| {
        for x in v {
            match x {
                Parsed::Content(s) => content.push_str(&s),
                Parsed::CallBegin { id, name } => calls.push((id, name, Vec::new())),
                Parsed::CallArgs(a) => calls.last_mut().expect("args after a begin").2.push(a),
                Parsed::Call(c) => panic!("a whole call while streaming arguments: {c:?}"),
            }
        }
    };
    for c in chunks {
        add(p.push(c));
    }
    add(p.finish());
    (content, calls)
}

#[test]
fn streamed_arguments_join_to_the_whole_calls_at_every_split() {
    for f in FORMATS {
        let text = format!("Sure: {}", calls_text(f, &["Paris", "Zürich"]));
        let whole = run(f, &[&text]);
        let want: Vec<(Option<String>, String, serde_json::Value)> = whole
            .iter()
            .filter_map(|p| match p {
                Parsed::Call(c) => Some((
                    c.id.clone(),
                    c.name.clone(),
                    serde_json::from_str(&c.arguments).unwrap(),
                )),
                _ => None,
            })
            .collect();
        let check = |(content, calls): Streamed, how: &str| {
            assert_eq!(content, "Sure:", "{f:?} {how}");
            assert_eq!(calls.len(), want.len(), "{f:?} {how}: {calls:?}");
            for ((id, name, pieces), (wid, wname, wargs)) in calls.iter().zip(&want) {
                assert_eq!((id, name), (wid, wname), "{f:?} {how}");
                let joined = pieces.concat();
                let args: serde_json::Value = serde_json::from_str(&joined)
                    .unwrap_or_else(|e| panic!("{f:?} {how}: {joined:?}: {e}"));
                assert_eq!(&args, wargs, "{f:?} {how}");
            }
        };
        for at in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            check(
                run_streaming(f, &[&text[..at], &text[at..]]),
                &format!("split at {at}"),
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        let streamed = run_streaming(f, &chars);
        // one character at a time, the JSON formats' arguments go out in many pieces
        if !matches!(
            f,
            ToolFormat::Qwen3Coder | ToolFormat::DeepSeekV32 | ToolFormat::Glm45
        ) {
            assert!(streamed.1[0].2.len() > 5, "{f:?}: {:?}", streamed.1[0]);
        }
        check(streamed, "one char per chunk");
    }
}

#[test]
fn a_call_starts_streaming_before_its_closing_marker() {
    for f in FORMATS {
        let text = calls_text(f, &["Paris"]);
        // everything up to the value of `city` and a bit of it
        let cut = text.find("Par").unwrap() + 3;
        let mut p = ToolParser::new(f, tools()).streaming_arguments();
        let out = p.push(&text[..cut]);
        assert!(
            matches!(out.first(), Some(Parsed::CallBegin { name, .. }) if name == "get_weather"),
            "{f:?}: {out:?}"
        );
        if !matches!(
            f,
            ToolFormat::Qwen3Coder | ToolFormat::DeepSeekV32 | ToolFormat::Glm45
        ) {
            let sent: String = out
                .iter()
                .filter_map(|p| match p {
                    Parsed::CallArgs(a) => Some(a.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(sent, "{\"city\": \"Par", "{f:?}");
        }
    }
}

#[test]
fn glm_values_follow_the_schema_and_the_template_round_trips() {
    // a string as written (even one that reads as JSON), anything else JSON
    let text = "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n\
                <arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
    assert_eq!(
        run(ToolFormat::Glm45, &[text]),
        vec![
            Parsed::Content("Let me check.".into()),
            Parsed::Call(ParsedCall {
                id: None,
                name: "get_weather".into(),
                arguments: r#"{"city":"42","days":3}"#.into(),
            })
        ]
    );
    // what GLM-4.6's published template writes for an assistant turn's calls parses back to
    // the same calls, whatever the arguments' JSON types
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/templates");
    let src = std::fs::read_to_string(dir.join("glm-4.6.jinja")).unwrap();
    let t = crate::chat::ChatTemplate::new(&src).unwrap();
    let args = [
        r#"{"city": "Zürich <b>", "days": 3}"#,
        r#"{"city": "{\"not\": \"json\"}", "opts": {"raw": [true, null, 1.5]}}"#,
    ];
    let calls: Vec<crate::chat::ToolCall> = args
        .iter()
        .enumerate()
        .map(|(i, a)| crate::chat::ToolCall {
            id: format!("call_{i}"),
            name: "get_weather".into(),
            arguments: a.to_string(),
        })
        .collect();
    let msgs = [
        crate::chat::ChatMessage::new("user", "u"),
        crate::chat::ChatMessage {
            role: "assistant".into(),
            tool_calls: calls,
            ..Default::default()
        },
    ];
    let rendered = t.render(&msgs, false, "", "").unwrap();
    let from = rendered.find("<tool_call>").expect("calls rendered");
    let mut tools = tools();
    tools[0].parameters["properties"]["opts"] = serde_json::json!({"type": "object"});
    let mut p = ToolParser::new(ToolFormat::Glm45, tools);
    let mut got = p.push(&rendered[from..]);
    got.extend(p.finish());
    let got: Vec<serde_json::Value> = got
        .iter()
        .filter_map(|x| match x {
            Parsed::Call(c) => Some(serde_json::from_str(&c.arguments).unwrap()),
            _ => None,
        })
        .collect();
    let want: Vec<serde_json::Value> = args
        .iter()
        .map(|a| serde_json::from_str(a).unwrap())
        .collect();
    assert_eq!(got, want, "{rendered}");
}
