//! Requests OpenAI's API and llama.cpp's server take, which clients (the `openai` package,
//! agents, bots) send: integer fields written as integral floats (`"max_tokens": 16.0`).

use super::*;

const CHAT: &str = "/v1/chat/completions";
const COMP: &str = "/v1/completions";
const RESP: &str = "/v1/responses";
const MSGS: &str = "/v1/messages";

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
