//! Chat templates: the two fixture templates rendered against strings written by hand from the
//! template text, rendering + tokenizing giving the special token ids, HF whitespace rules,
//! Python string methods, and every failure as a typed error.

mod gguf_util;

use std::path::{Path, PathBuf};

use gguf_util::Builder;
use nightshift_model::chat::{ChatMessage, ChatTemplate, TemplateError};
use nightshift_model::gguf::{Gguf, Value};
use nightshift_model::tokenizer::Tokenizer;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn chat() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are helpful."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "Route 東京?"),
    ]
}

fn load(name: &str) -> (Tokenizer, ChatTemplate) {
    let g = Gguf::open(&data(name)).unwrap();
    (
        Tokenizer::from_gguf(&g).unwrap(),
        ChatTemplate::from_gguf(&g).unwrap().unwrap(),
    )
}

#[test]
fn qwen3moe_template() {
    let (tok, t) = load("tiny-qwen3moe-Q2_K.gguf");
    let check = |msgs: &[ChatMessage], gen: bool, expect: &str| {
        assert_eq!(
            t.render(msgs, gen, "<|endoftext|>", "<|im_end|>").unwrap(),
            expect
        );
    };
    check(
        &chat(),
        true,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nRoute 東京?<|im_end|>\n\
         <|im_start|>assistant\n",
    );
    check(&chat()[1..2], false, "<|im_start|>user\nHi<|im_end|>\n");
    check(&[], true, "<|im_start|>assistant\n");

    let text = t.render(&chat()[1..2], true, "", "").unwrap();
    let ids = tok.encode(&text, true, true);
    let (start, end) = (
        tok.token_id("<|im_start|>").unwrap(),
        tok.token_id("<|im_end|>").unwrap(),
    );
    assert_eq!(
        ids[0], start,
        "no BOS for qwen3moe, the turn marker comes first"
    );
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1);
    assert_eq!(tok.decode(&ids), text);
    // Without parse_special the markers are text, not control ids.
    assert!(!tok.encode(&text, true, false).contains(&start));
}

#[test]
fn deepseek2_template() {
    let (tok, t) = load("tiny-deepseek2-Q2_K.gguf");
    let text = t.render(&chat(), true, "[BOS]", "[EOS]").unwrap();
    assert_eq!(
        text,
        "<|im_system|>system<|im_middle|>You are helpful.<|im_end|>\
         <|im_user|>user<|im_middle|>Hi<|im_end|>\
         <|im_assistant|>assistant<|im_middle|>Hello!<|im_end|>\
         <|im_user|>user<|im_middle|>Route 東京?<|im_end|>\
         <|im_assistant|>assistant<|im_middle|>"
    );
    let id = |s: &str| tok.token_id(s).unwrap();
    let ids = tok.encode(&text, true, true);
    assert_eq!(&ids[..3], &[id("[BOS]"), id("<|im_system|>"), ids[2]]);
    let specials: Vec<u32> = ids.iter().copied().filter(|&i| tok.is_special(i)).collect();
    let expect: Vec<u32> = [
        "[BOS]",
        "<|im_system|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|im_user|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|im_assistant|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|im_user|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|im_assistant|>",
        "<|im_middle|>",
    ]
    .iter()
    .map(|s| id(s))
    .collect();
    assert_eq!(specials, expect);
    assert_eq!(*ids.last().unwrap(), id("<|im_middle|>"));
}

fn render(src: &str, msgs: &[ChatMessage]) -> Result<String, TemplateError> {
    ChatTemplate::new(src)?.render(msgs, true, "<s>", "</s>")
}

#[test]
fn jinja_features_and_errors() {
    let m = [ChatMessage::new("user", "  padded  ")];
    let check = |src: &str, expect: &str| assert_eq!(render(src, &m).unwrap(), expect, "{src}");
    // HF's whitespace rules: trim_blocks + lstrip_blocks.
    check(
        "{% for m in messages %}\n  {% if true %}\n[{{ m.role }}]\n  {% endif %}\n{% endfor %}",
        "[user]\n",
    );
    // pycompat string methods and the context variables.
    check(
        "{{ messages[0]['content'].strip() }}|{{ bos_token }}{{ eos_token }}",
        "padded|<s></s>",
    );
    check(
        "{{ messages[0].role.upper() }} {{ 'a,b'.split(',') | length }}",
        "USER 2",
    );
    check(
        "{% if messages[0].content.startswith('  p') %}yes{% endif %}",
        "yes",
    );
    check(
        "{{ add_generation_prompt }} {{ tools is defined }}",
        "True False",
    );

    let err = |src: &str| render(src, &m).unwrap_err();
    assert!(matches!(err("{% for %}"), TemplateError::Syntax(_)));
    assert!(matches!(err("{{ unclosed"), TemplateError::Syntax(_)));
    match err("{{ raise_exception('roles must alternate') }}") {
        TemplateError::Raised(msg) => assert!(msg.contains("roles must alternate"), "{msg}"),
        other => panic!("expected Raised, got {other}"),
    }
    assert!(matches!(
        err("{{ messages[0].content.no_such_method() }}"),
        TemplateError::Render(_)
    ));
    assert!(matches!(err("{{ 1 / 0 }}"), TemplateError::Render(_)));
}

/// A template from a file cannot hang the server or take its memory: work without end (loops,
/// text that doubles) ends in a clear error once the render's budget is spent.
#[test]
fn runaway_templates_stop_with_a_clear_error() {
    let m = [ChatMessage::new("user", "hi")];
    for src in [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}\
         {% endfor %}{{ ns.s | length }}",
        "{% for i in range(100000) %}{{ 'x' * 90000000 }}{% endfor %}",
    ] {
        match render(src, &m) {
            Err(e @ TemplateError::OutOfFuel) => {
                assert!(e.to_string().contains("budget"), "{e}")
            }
            other => panic!("{src}: expected OutOfFuel, got {other:?}"),
        }
    }
    // only work without end is stopped: a loop of modest size renders
    assert_eq!(
        render("{% for i in range(1000) %}{% endfor %}ok", &m).unwrap(),
        "ok"
    );
}

/// transformers compiles templates with its `{% generation %}` tag (what marks the assistant's
/// tokens for `return_assistant_tokens_mask`): the body renders as it is, in a scope of its own.
/// The expected text is what jinja2 3.1.6 renders with a call-block extension for the tag, as
/// transformers' `AssistantTracker` is, under HF's whitespace rules (the `-` and `+` marks of the
/// tags kept).
#[test]
fn generation_blocks_render_their_body() {
    let src =
        "{%- set x = 'outer' -%}\n{%- for message in messages %}\n<|im_start|>{{ message.role }}\n\
        {% if message.role == 'assistant' %}\n    {% generation %}\n{%- set x = 'inner' -%}\n\
        {{ message.content }}<|im_end|>\n    {% endgeneration %}\n{% else %}\n\
        {{ message.content }}<|im_end|>\n{% endif %}\n{%- endfor %}\n{{- x -}}\n\
        {%- if add_generation_prompt %}\n<|im_start|>assistant\n{%+ generation -%}\n  [open]\n\
        {%- endgeneration +%}\n{% endif %}";
    let msgs = [
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        render(src, &msgs).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n\
         <|im_start|>user\nBye<|im_end|>\nouter<|im_start|>assistant\n[open]\n"
    );
}

#[test]
fn template_key_missing_or_wrong_type() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, b: Builder| {
        let p = dir.path().join(name);
        std::fs::write(&p, b.build().0).unwrap();
        Gguf::open(&p).unwrap()
    };
    let none = write(
        "none.gguf",
        Builder::new().kv("general.architecture", Value::Str("x".into())),
    );
    assert!(ChatTemplate::from_gguf(&none).unwrap().is_none());
    let wrong = write(
        "wrong.gguf",
        Builder::new().kv("tokenizer.chat_template", Value::U32(3)),
    );
    let e = ChatTemplate::from_gguf(&wrong).unwrap_err();
    assert!(
        matches!(e, TemplateError::Gguf(_)) && e.to_string().contains("tokenizer.chat_template"),
        "{e}"
    );
    let bad = write(
        "bad.gguf",
        Builder::new().kv("tokenizer.chat_template", Value::Str("{% if %}".into())),
    );
    assert!(matches!(
        ChatTemplate::from_gguf(&bad).unwrap_err(),
        TemplateError::Syntax(_)
    ));
}
