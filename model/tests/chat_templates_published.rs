//! The published chat templates of Qwen3-30B-A3B (and its Thinking-2507), Qwen3-Coder-30B-A3B (current and 2025-07),
//! Kimi-K2-Instruct (current, 2025-07 and 0905), Kimi-K2-Thinking, DeepSeek-V3 (Dec 2024),
//! DeepSeek-V3.1, DeepSeek-V3.2, DeepSeek-R1 (its distills' copy, the ```json tool-call layout of DeepSeek-V3 and R1) and GLM-4.6 render byte for byte what Python's
//! jinja2 renders in transformers' environment (`tests/data/templates/render_templates.py` made
//! the `.rendered.txt` files): a conversation with one tool call and its result, and one with two
//! parallel calls and two results, with `tools=[get_weather]` and the generation prompt.

use std::path::{Path, PathBuf};

use nightshift_model::chat::{ChatMessage, ChatTemplate, Quirks, RenderOptions, ToolCall};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/templates")
        .join(name)
}

fn read(name: &str) -> String {
    let p = data(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn tools() -> Vec<serde_json::Value> {
    vec![serde_json::json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    })]
}

fn call(idx: usize, city: &str) -> ToolCall {
    ToolCall {
        id: format!("functions.get_weather:{idx}"),
        name: "get_weather".into(),
        arguments: format!(r#"{{"city": "{city}"}}"#),
    }
}

fn result(idx: usize, payload: &str) -> ChatMessage {
    ChatMessage {
        role: "tool".into(),
        content: payload.into(),
        tool_call_id: Some(format!("functions.get_weather:{idx}")),
        name: Some("get_weather".into()),
        ..ChatMessage::default()
    }
}

fn single() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "What's the weather in Paris?"),
        ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![call(0, "Paris")],
            ..ChatMessage::default()
        },
        result(0, r#"{"temperature_c": 18, "condition": "sunny"}"#),
    ]
}

fn parallel() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "What's the weather in Paris and in London?"),
        ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![call(0, "Paris"), call(1, "London")],
            ..ChatMessage::default()
        },
        result(0, r#"{"temperature_c": 18, "condition": "sunny"}"#),
        result(1, r#"{"temperature_c": 12, "condition": "rain"}"#),
    ]
}

const DS_BOS: &str = "<｜begin▁of▁sentence｜>";
const DS_EOS: &str = "<｜end▁of▁sentence｜>";

/// (template, bos, eos, whether the template needs the arguments as an object, whether an
/// assistant turn with calls needs its content to be none).
const TEMPLATES: &[(&str, &str, &str, bool, bool)] = &[
    ("qwen3-30b-a3b", "", "<|im_end|>", false, false),
    ("qwen3-thinking-2507", "", "<|im_end|>", false, false),
    ("qwen3-coder-30b-a3b", "", "<|im_end|>", true, false),
    (
        "qwen3-coder-30b-a3b.2025-07-initial",
        "",
        "<|im_end|>",
        true,
        false,
    ),
    ("kimi-k2-instruct", "[BOS]", "[EOS]", false, false),
    (
        "kimi-k2-instruct.2025-07-initial",
        "[BOS]",
        "[EOS]",
        true,
        false,
    ),
    ("kimi-k2-instruct-0905", "[BOS]", "[EOS]", false, false),
    ("kimi-k2-thinking", "[BOS]", "[EOS]", false, false),
    ("deepseek-v3.1", DS_BOS, DS_EOS, false, false),
    // DeepSeek-V3 (Dec 2024): renders the calls only when the content is none
    ("deepseek-v3", DS_BOS, DS_EOS, false, true),
    // DeepSeek-R1's layout (```json fences), which DeepSeek-V3 (Dec 2024) writes too
    ("deepseek-r1-distill", DS_BOS, DS_EOS, false, true),
    // DeepSeek-V3.2's DSML calls: one `<｜DSML｜parameter>` per argument, so object arguments
    ("deepseek-v3.2", DS_BOS, DS_EOS, true, false),
    // GLM-4.6 (GLM-4.5's `<arg_key>`/`<arg_value>` calls): iterates the arguments' items
    ("glm-4.6", "", "<|endoftext|>", true, false),
];

/// What the tests render with: `tools`, the generation prompt, the template's BOS and EOS.
fn with_tools<'a>(tools: &'a [serde_json::Value], bos: &'a str, eos: &'a str) -> RenderOptions<'a> {
    RenderOptions {
        tools: Some(tools),
        add_generation_prompt: true,
        bos,
        eos,
        extra: None,
    }
}

/// The first byte where two texts differ, with context, for a readable failure.
fn diff(got: &str, want: &str) -> String {
    let at = got
        .bytes()
        .zip(want.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let ctx = |s: &str| {
        let lo = at.saturating_sub(60);
        String::from_utf8_lossy(&s.as_bytes()[lo..(at + 60).min(s.len())]).into_owned()
    };
    format!(
        "first difference at byte {at} (lengths {} / {}):\n got: {:?}\nwant: {:?}",
        got.len(),
        want.len(),
        ctx(got),
        ctx(want)
    )
}

#[test]
fn published_templates_render_byte_for_byte() {
    renders_as_published(|src| src.to_string());
}

/// jinja2 reads every line break (`\r\n`, `\r`) as `\n` before it tokenizes, in text and in
/// string literals alike, so a template saved with other line endings (a Windows copy, a GGUF
/// made from one) renders the same bytes; the published expectations hold for those copies too.
#[test]
fn published_templates_render_the_same_with_other_line_endings() {
    renders_as_published(|src| src.replace("\r\n", "\n").replace('\n', "\r\n"));
    renders_as_published(|src| src.replace("\r\n", "\n").replace('\n', "\r"));
}

/// Renders every published template, its source passed through `edit`, against the files
/// `render_templates.py` made.
fn renders_as_published(edit: impl Fn(&str) -> String) {
    let tools = tools();
    for &(name, bos, eos, object_args, content_none) in TEMPLATES {
        // the Python script passes None for a missing BOS; the templates here do not print it
        let t = ChatTemplate::new(&edit(&read(&format!("{name}.jinja"))))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            t.quirks(),
            Quirks {
                arguments_as_object: object_args,
                tool_call_content_none: content_none
            },
            "{name}: probed quirks"
        );
        let opts = with_tools(&tools, bos, eos);
        for (msgs, file) in [
            (single(), format!("{name}.rendered.txt")),
            (parallel(), format!("{name}.parallel.rendered.txt")),
        ] {
            let got = t
                .render_with(&msgs, &opts)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let want = read(&file);
            assert!(got == want, "{file}: {}", diff(&got, &want));
        }
    }
}

/// Long agent sessions render within a render's budget (`chat::render_fuel`) on every
/// published template: 2,001 messages of ~4 KiB each (tool calls and results, 8 MiB) with 64
/// tools, and 4,001 short messages (DeepSeek-V3.2's template looks ahead from each message, so
/// its work grows with their square).
#[test]
fn long_agent_sessions_render_within_the_budget() {
    let tools: Vec<serde_json::Value> = (0..64)
        .map(|i| {
            serde_json::json!({"type": "function", "function": {
                "name": format!("tool_{i}"), "description": "d".repeat(200),
                "parameters": {"type": "object", "properties": {
                    "a": {"type": "string", "description": "x"},
                    "b": {"type": "array", "items": {"type": "integer"}}},
                    "required": ["a"]}}})
        })
        .collect();
    let session = |rounds: usize, body: &str| {
        let mut msgs = vec![ChatMessage::new("system", "You review pull requests.")];
        for i in 0..rounds {
            msgs.push(ChatMessage::new("user", body));
            msgs.push(ChatMessage {
                role: "assistant".into(),
                content: body.into(),
                tool_calls: vec![ToolCall {
                    id: format!("call_{i}"),
                    name: "tool_1".into(),
                    arguments: format!(r#"{{"a": "{}"}}"#, "v".repeat(100)),
                }],
                ..ChatMessage::default()
            });
            msgs.push(ChatMessage {
                role: "tool".into(),
                content: body.into(),
                tool_call_id: Some(format!("call_{i}")),
                name: Some("tool_1".into()),
                ..ChatMessage::default()
            });
            msgs.push(ChatMessage::new("assistant", body));
        }
        msgs
    };
    let long = session(500, &"word ".repeat(800));
    let many = session(1000, "short reply");
    for &(name, bos, eos, _, _) in TEMPLATES {
        let t = ChatTemplate::new(&read(&format!("{name}.jinja"))).unwrap();
        let opts = with_tools(&tools, bos, eos);
        for msgs in [&long, &many] {
            let s = t
                .render_with(msgs, &opts)
                .unwrap_or_else(|e| panic!("{name}, {} messages: {e}", msgs.len()));
            assert!(s.len() > msgs.len() * 10, "{name}: {} bytes", s.len());
        }
    }
}

/// Without tools, the templates still render plain conversations (the `tools` variable is
/// undefined).
#[test]
fn published_templates_render_without_tools() {
    for &(name, bos, eos, _, _) in TEMPLATES {
        let t = ChatTemplate::new(&read(&format!("{name}.jinja"))).unwrap();
        let msgs = [ChatMessage::new("user", "Hi")];
        let s = t.render(&msgs, true, bos, eos).unwrap();
        assert!(s.contains("Hi"), "{name}: {s:?}");
        assert!(!s.contains("get_weather"), "{name}: {s:?}");
    }
}

/// A template that never prints the tools it is given (DeepSeek V3, V3.1 and R1's) still shows
/// them to the model through `render_prompt`: their definitions and an example call in the
/// template's own syntax join the system message, the rest of the render unchanged. Templates
/// that print the tools render the same through it.
#[test]
fn tools_a_template_does_not_print_join_the_system_prompt() {
    let tools = tools();
    for &(name, bos, eos, _, _) in TEMPLATES {
        let t = ChatTemplate::new(&read(&format!("{name}.jinja"))).unwrap();
        let shim = t.tool_shim();
        let prints = !name.starts_with("deepseek") || name == "deepseek-v3.2";
        assert_eq!(shim.prints_tools, prints, "{name}: {shim:?}");
        assert!(shim.system_role, "{name}: {shim:?}");
        let opts = with_tools(&tools, bos, eos);
        let msgs = single();
        let plain = t.render_with(&msgs, &opts).unwrap();
        let got = t.render_prompt(&msgs, &opts).unwrap();
        if prints {
            assert_eq!(got, plain, "{name}");
            continue;
        }
        assert!(!plain.contains("Get the current weather"), "{name}");
        let example = shim.example.as_deref().unwrap_or_else(|| panic!("{name}"));
        // the example is the template's own call syntax, without an end of turn
        assert!(
            example.contains("<｜tool▁call▁begin｜>") && example.contains("tool_name"),
            "{name}: {example}"
        );
        let example = example.strip_suffix(eos).unwrap_or(example).trim_end();
        assert!(!example.contains(eos), "{name}: {example}");
        // the definitions and the example sit in the system turn, before the user's
        let defs = got.find("Get the current weather").expect("definitions");
        let ex = got.find(example).expect("example");
        assert!(
            !got[ex..got.find("What's the weather in Paris?").unwrap()].contains(eos),
            "{name}: no end of turn inside the system prompt: {got}"
        );
        let system = got.find("You are a helpful assistant.").unwrap();
        let user = got.find("What's the weather in Paris?").unwrap();
        assert!(system < defs && defs < ex && ex < user, "{name}: {got}");
        // the rest is the render of the same conversation
        let extra = got.len() - plain.len();
        assert!(got[..system].eq(&plain[..system]), "{name}");
        assert_eq!(got[user..], plain[user - extra..], "{name}");
    }
}
