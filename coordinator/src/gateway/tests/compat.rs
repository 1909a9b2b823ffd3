//! Requests OpenAI's API and llama.cpp's server take, which clients (the `openai` package,
//! agents, bots) send: `top_p: 0` (greedy: top-p keeps at least one token) on every API that
//! takes `top_p`, integer fields written as integral floats (`"max_tokens": 16.0`), and an
//! empty completions prompt (the BOS token alone on a model that adds one; a 400 saying why on
//! one that does not).

use super::*;

const CHAT: &str = "/v1/chat/completions";
const COMP: &str = "/v1/completions";
const RESP: &str = "/v1/responses";
const MSGS: &str = "/v1/messages";

/// Where an answer's text is.
type TextOf = fn(&Value) -> String;

/// A request of each API taking `top_p`, and where its answer's text is.
fn per_api() -> Vec<(&'static str, Value, TextOf)> {
    fn chat(v: &Value) -> String {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    fn comp(v: &Value) -> String {
        v["choices"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    fn msgs(v: &Value) -> String {
        v["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["text"].as_str().map(String::from))
            .collect()
    }
    let user = json!([{"role": "user", "content": "tell me"}]);
    vec![
        (
            CHAT,
            json!({"model": "mock", "messages": user, "max_tokens": 12}),
            chat as TextOf,
        ),
        (
            COMP,
            json!({"model": "mock", "prompt": "once upon", "max_tokens": 12}),
            comp as TextOf,
        ),
        (
            RESP,
            json!({"model": "mock", "input": "tell me", "max_output_tokens": 12}),
            output_text as TextOf,
        ),
        (
            MSGS,
            json!({"model": "mock", "messages": user, "max_tokens": 12}),
            msgs as TextOf,
        ),
    ]
}

fn with(body: &Value, extra: Value) -> Value {
    let mut b = body.clone();
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// The error's field: `param`, or Anthropic's message (which starts with it).
fn param_of(v: &Value) -> String {
    v["error"]["param"]
        .as_str()
        .or_else(|| v["error"]["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn top_p_zero_is_greedy_on_every_api() {
    let s = start(Opts {
        no_eos: true,
        ..Default::default()
    })
    .await;
    for (path, body, text) in per_api() {
        let (st, g) = post(&s, path, with(&body, json!({"temperature": 0}))).await;
        assert_eq!(st, 200, "{path}: {g}");
        let greedy = text(&g);
        assert!(!greedy.is_empty(), "{path}: {g}");
        let mut sampled_differs = false;
        for seed in 1..=6 {
            let b = with(&body, json!({"temperature": 1.0, "top_p": 0, "seed": seed}));
            let (st, v) = post(&s, path, b).await;
            assert_eq!(st, 200, "{path} top_p 0: {v}");
            assert_eq!(text(&v), greedy, "{path} top_p 0 seed {seed}");
            // the same draw without the cut: the mock's winner has about a quarter of the mass
            let b = with(&body, json!({"temperature": 1.0, "top_p": 1, "seed": seed}));
            let (st, v) = post(&s, path, b).await;
            assert_eq!(st, 200, "{path} top_p 1: {v}");
            sampled_differs |= text(&v) != greedy;
        }
        assert!(sampled_differs, "{path}: sampling never left greedy");
        // below 0 is still out of range, naming the field
        let (st, v) = post(&s, path, with(&body, json!({"top_p": -0.01}))).await;
        assert_eq!(st, 400, "{path}: {v}");
        assert!(param_of(&v).contains("top_p"), "{path}: {v}");
    }
}

#[tokio::test]
async fn integral_floats_are_integers_everywhere() {
    let s = start(Opts::default()).await;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    // (path, body with integers, the integer fields to write as floats)
    let cases: Vec<(&str, Value, &[&str])> = vec![
        (
            CHAT,
            json!({"model": "mock", "messages": msgs, "max_tokens": 5, "n": 1, "seed": 42,
                "top_k": 40, "temperature": 1.0, "logprobs": true, "top_logprobs": 2}),
            &["max_tokens", "n", "seed", "top_k", "top_logprobs"],
        ),
        (
            CHAT,
            json!({"model": "mock", "messages": msgs, "max_completion_tokens": 5,
                "temperature": 0}),
            &["max_completion_tokens"],
        ),
        (
            COMP,
            json!({"model": "mock", "prompt": "once", "max_tokens": 5, "logprobs": 2,
                "best_of": 1, "n": 1, "seed": -7, "top_k": 3, "temperature": 1.0}),
            &["max_tokens", "logprobs", "best_of", "n", "seed", "top_k"],
        ),
        (
            RESP,
            json!({"model": "mock", "input": "hi", "max_output_tokens": 5, "seed": 42,
                "temperature": 1.0, "top_logprobs": 2,
                "include": ["message.output_text.logprobs"]}),
            &["max_output_tokens", "seed", "top_logprobs"],
        ),
        (
            MSGS,
            json!({"model": "mock", "messages": msgs, "max_tokens": 5, "top_k": 40,
                "seed": 42, "temperature": 1.0}),
            &["max_tokens", "top_k", "seed"],
        ),
        (
            "/v1/messages/count_tokens",
            json!({"model": "mock", "messages": msgs, "max_tokens": 5}),
            &["max_tokens"],
        ),
    ];
    // what does not depend on the request's identity
    let answer = |v: &Value| {
        let mut v = v.clone();
        for k in ["id", "created", "created_at"] {
            v.as_object_mut().map(|o| o.remove(k));
        }
        // a response's output items have fresh ids
        if let Some(items) = v["output"].as_array_mut() {
            for i in items {
                i.as_object_mut().map(|o| o.remove("id"));
            }
        }
        v
    };
    for (path, body, fields) in cases {
        let (st, want) = post(&s, path, body.clone()).await;
        assert_eq!(st, 200, "{path}: {want}");
        let mut floats = body.clone();
        for f in fields {
            let n = body[*f].as_i64().expect("an integer field");
            floats[*f] = json!(n as f64);
            assert!(floats[*f].is_f64(), "{f} goes out as a float");
        }
        let (st, got) = post(&s, path, floats.clone()).await;
        assert_eq!(st, 200, "{path} {floats}: {got}");
        assert_eq!(answer(&got), answer(&want), "{path}: {floats}");
        // each field alone: a fraction, below an unsigned field's range, past the type's
        for f in fields {
            let unsigned = *f != "seed";
            let mut bad = vec![json!(16.5), json!(1e300), json!(9.3e18)];
            if unsigned {
                bad.extend([json!(-1.0), json!(-1), json!(4294967296.0)]);
            }
            for x in bad {
                let (st, v) = post(&s, path, with(&body, json!({ *f: x }))).await;
                assert_eq!(st, 400, "{path} {f} = {x}: {v}");
                let m = v["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    param_of(&v).contains(f) && m.contains("expected an integer from"),
                    "{path} {f} = {x}: {v}"
                );
            }
        }
    }
    // token ids too, in both list shapes
    let base = json!({"model": "mock", "max_tokens": 4, "temperature": 0});
    let (_, want) = post(&s, COMP, with(&base, json!({"prompt": [104, 105]}))).await;
    for prompt in [json!([104.0, 105]), json!([[104, 105.0]])] {
        let (st, got) = post(&s, COMP, with(&base, json!({ "prompt": prompt }))).await;
        assert_eq!(st, 200, "{prompt}: {got}");
        assert_eq!(got["choices"], want["choices"], "{prompt}");
    }
    for prompt in [json!([104.5]), json!([[-1.0]])] {
        let (st, v) = post(&s, COMP, with(&base, json!({ "prompt": prompt }))).await;
        assert_eq!(
            (st, param_of(&v).as_str()),
            (400, "prompt"),
            "{prompt}: {v}"
        );
    }
    // and the server still serves
    let (st, _) = post(
        &s,
        CHAT,
        json!({"model": "mock", "messages": msgs, "max_tokens": 2}),
    )
    .await;
    assert_eq!(st, 200);
}

/// The served document's `minLength` of a prompt text (the string, the list of one string).
async fn prompt_text_min_length(s: &Server) -> [Option<u64>; 2] {
    let d: Value = reqwest::get(format!("{}/openapi.json", s.url))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let p = &d["components"]["schemas"]["PromptField"]["oneOf"];
    assert_eq!(p[0]["type"], "string", "{p}");
    assert_eq!(p[1]["items"]["type"], "string", "{p}");
    [
        p[0].get("minLength").and_then(Value::as_u64),
        p[1]["items"].get("minLength").and_then(Value::as_u64),
    ]
}

#[tokio::test]
async fn an_empty_text_prompt_is_the_bos_token_alone() {
    let s = start(Opts {
        bos: true,
        ..Default::default()
    })
    .await;
    let base = json!({"model": "mock", "max_tokens": 6, "temperature": 0});
    let (st, want) = post(&s, COMP, with(&base, json!({"prompt": [256]}))).await;
    assert_eq!(st, 200, "{want}");
    for prompt in [json!(""), json!([""])] {
        let (st, v) = post(&s, COMP, with(&base, json!({ "prompt": prompt }))).await;
        assert_eq!(st, 200, "{prompt}: {v}");
        assert_eq!(v["usage"]["prompt_tokens"], 1, "{prompt}: {v}");
        assert_eq!(
            v["choices"], want["choices"],
            "{prompt}: the prompt is [BOS]"
        );
    }
    let chunks = sse(&s, COMP, with(&base, json!({"prompt": "", "stream": true}))).await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(
        text,
        want["choices"][0]["text"].as_str().unwrap_or_default()
    );
    // token ids are used as given: no BOS is added, so no ids is no prompt
    for prompt in [json!([]), json!([[]])] {
        let (st, v) = post(&s, COMP, with(&base, json!({ "prompt": prompt }))).await;
        assert_eq!(st, 400, "{prompt}: {v}");
        assert_eq!(v["error"]["param"], "prompt", "{v}");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(m.contains("no token ids"), "{prompt}: {m}");
    }
    // the document allows the empty text here
    assert_eq!(prompt_text_min_length(&s).await, [None, None]);
}

#[tokio::test]
async fn an_empty_prompt_without_a_bos_token_is_a_400_saying_so() {
    let s = start(Opts::default()).await;
    let base = json!({"model": "mock", "max_tokens": 6});
    for (prompt, says) in [
        (json!(""), "no BOS token"),
        (json!([""]), "no BOS token"),
        (json!([]), "no token ids"),
        (json!([[]]), "no token ids"),
    ] {
        let (st, v) = post(&s, COMP, with(&base, json!({ "prompt": prompt }))).await;
        assert_eq!(st, 400, "{prompt}: {v}");
        assert_eq!(v["error"]["param"], "prompt", "{v}");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(m.contains(says), "{prompt}: {m}");
    }
    // the document says a prompt text has a character here
    assert_eq!(prompt_text_min_length(&s).await, [Some(1), Some(1)]);
    let (st, v) = post(&s, COMP, with(&base, json!({"prompt": "a"}))).await;
    assert_eq!(st, 200, "{v}");
}
