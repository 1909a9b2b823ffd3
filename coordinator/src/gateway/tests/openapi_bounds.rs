//! The OpenAPI document states the limits the server checks: each documented bound equals the
//! constant the edge validates with, a request at the bound is accepted and one just beyond it
//! is a 400 naming the field (schemathesis generates bodies from these schemas and expects the
//! valid ones to be served).

use super::*;
use crate::gateway::convert::{
    MAX_COMPLETION_LOGPROBS, MAX_LOGIT_BIAS, MAX_STOPS, MAX_TOP_LOGPROBS,
};
use crate::gateway::responses::convert::{MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_VALUE};
use crate::gateway::tools::MAX_TOOLS;
use crate::scheduler::mock::VOCAB;

async fn doc(s: &Server) -> Value {
    reqwest::get(format!("{}/openapi.json", s.url))
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

fn schema<'a>(d: &'a Value, name: &str) -> &'a Value {
    let s = &d["components"]["schemas"][name];
    assert!(s.is_object(), "no schema {name}");
    s
}

fn prop<'a>(d: &'a Value, name: &str, p: &str) -> &'a Value {
    let v = &schema(d, name)["properties"][p];
    assert!(v.is_object(), "no property {name}.{p}");
    v
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

fn usize_of(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}")) as usize
}

fn completion(extra: Value) -> Value {
    let mut b = json!({"model": "mock", "prompt": "hello", "max_tokens": 2});
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// `body` with `field` set to `ok` is served, with `bad` a 400 naming `param`.
async fn edge(
    s: &Server,
    path: &str,
    body: &Value,
    field: &str,
    ok: Value,
    bad: Value,
    param: &str,
) {
    let mut b = body.clone();
    b[field] = ok.clone();
    let (st, v) = post(s, path, b.clone()).await;
    assert_eq!(st, 200, "{path} {field} = {ok} is documented as valid: {v}");
    b[field] = bad.clone();
    let (st, v) = post(s, path, b).await;
    assert_eq!(
        st, 400,
        "{path} {field} = {bad} is documented as invalid: {v}"
    );
    let got = v["error"]["param"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| {
            // Anthropic's shape names the field in the message
            v["error"]["message"].as_str().unwrap_or("").to_string()
        });
    assert!(got.contains(param), "{path} {field} = {bad}: {v}");
}

#[tokio::test]
async fn the_documented_bounds_are_the_checked_ones() {
    let s = start(Opts::default()).await;
    let d = doc(&s).await;
    // repeat_penalty: above 0 as an f32 (a smaller positive double reads as 0)
    let v = prop(&d, "CompletionRequest", "repeat_penalty");
    assert_eq!(num(v, "minimum") as f32, f32::MIN_POSITIVE, "{v}");
    assert!(v.get("exclusiveMinimum").is_none(), "{v}");
    // top_p: 0 to 1 on every API (0 keeps the most probable token)
    for name in [
        "ChatRequest",
        "CompletionRequest",
        "ResponsesRequest",
        "MessagesRequest",
    ] {
        let v = prop(&d, name, "top_p");
        assert_eq!(
            (num(v, "minimum"), num(v, "maximum")),
            (0.0, 1.0),
            "{name}: {v}"
        );
        assert!(v.get("exclusiveMinimum").is_none(), "{name}: {v}");
    }
    let c = "CompletionRequest";
    assert_eq!(
        num(prop(&d, c, "logprobs"), "maximum"),
        MAX_COMPLETION_LOGPROBS as f64
    );
    assert_eq!(
        num(prop(&d, "ChatRequest", "top_logprobs"), "maximum"),
        MAX_TOP_LOGPROBS as f64
    );
    assert_eq!(
        usize_of(prop(&d, c, "logit_bias"), "maxProperties"),
        MAX_LOGIT_BIAS
    );
    let bias = &prop(&d, c, "logit_bias")["additionalProperties"];
    assert_eq!(
        (num(bias, "minimum"), num(bias, "maximum")),
        (-100.0, 100.0)
    );
    let stops = &schema(&d, "StopField")["oneOf"][1];
    assert_eq!(usize_of(stops, "maxItems"), MAX_STOPS);
    assert_eq!(
        usize_of(prop(&d, "MessagesRequest", "stop_sequences"), "maxItems"),
        MAX_STOPS
    );
    // per server: token ids below the vocabulary, a budget that leaves a prompt token
    assert_eq!(usize_of(schema(&d, "TokenId"), "maximum"), VOCAB - 1);
    for (name, p) in [
        ("CompletionRequest", "max_tokens"),
        ("ChatRequest", "max_tokens"),
        ("ChatRequest", "max_completion_tokens"),
    ] {
        assert_eq!(usize_of(prop(&d, name, p), "maximum"), 511, "{name}.{p}");
    }
    // an upper bound in the Responses and Messages APIs
    assert!(prop(&d, "MessagesRequest", "max_tokens")
        .get("maximum")
        .is_none());
    assert!(prop(&d, "ResponsesRequest", "max_output_tokens")
        .get("maximum")
        .is_none());
    let r = "ResponsesRequest";
    let meta = prop(&d, r, "metadata");
    assert_eq!(usize_of(meta, "maxProperties"), MAX_METADATA);
    assert_eq!(
        usize_of(&meta["propertyNames"], "maxLength"),
        MAX_METADATA_KEY
    );
    assert_eq!(
        usize_of(&meta["additionalProperties"], "maxLength"),
        MAX_METADATA_VALUE
    );
    assert_eq!(usize_of(prop(&d, r, "tools"), "maxItems"), MAX_TOOLS);
    assert_eq!(
        usize_of(prop(&d, "MessagesRequest", "tools"), "maxItems"),
        MAX_TOOLS
    );
    // /v1/messages needs max_tokens, count_tokens does not
    let required = |name: &str| -> Vec<String> {
        serde_json::from_value(schema(&d, name)["required"].clone()).expect("required")
    };
    assert!(required("MessagesRequest").contains(&"max_tokens".to_string()));
    assert!(!required("CountTokensRequest").contains(&"max_tokens".to_string()));
    assert_eq!(
        d["paths"]["/v1/messages/count_tokens"]["post"]["requestBody"]["content"]
            ["application/json"]["schema"]["$ref"],
        "#/components/schemas/CountTokensRequest"
    );
    // one schema per name: the Responses API's parts and tools are not chat's or Anthropic's
    assert!(prop(&d, "ContentPart", "refusal").is_object());
    assert!(schema(&d, "ChatContentPart")["properties"]
        .get("refusal")
        .is_none());
    let choice = serde_json::to_string(schema(&d, "ResponsesToolChoice")).expect("json");
    assert!(choice.contains("ResponsesToolChoiceMode"), "{choice}");
    let choice = serde_json::to_string(schema(&d, "AnthropicToolChoice")).expect("json");
    assert!(choice.contains("\"any\""), "{choice}");
}

#[tokio::test]
async fn a_request_at_a_documented_bound_is_served_and_one_beyond_is_refused() {
    let s = start(Opts::default()).await;
    let min_pos = f32::MIN_POSITIVE as f64;
    let cases: Vec<(&str, Value, Value, &str)> = vec![
        ("top_p", json!(0), json!(-0.01), "top_p"),
        ("top_p", json!(1), json!(1.01), "top_p"),
        (
            "repeat_penalty",
            json!(min_pos),
            json!(5e-324),
            "repeat_penalty",
        ),
        (
            "logprobs",
            json!(MAX_COMPLETION_LOGPROBS),
            json!(MAX_COMPLETION_LOGPROBS + 1),
            "logprobs",
        ),
        ("best_of", json!(1), json!(2), "best_of"),
        ("echo", json!(false), json!(true), "echo"),
        ("suffix", json!(""), json!("x"), "suffix"),
        (
            "stop",
            json!(vec!["zz"; MAX_STOPS]),
            json!(vec!["zz"; MAX_STOPS + 1]),
            "stop",
        ),
        ("prompt", json!("a"), json!(""), "prompt"),
        ("prompt", json!(["a"]), json!(["a", "b"]), "prompt"),
        ("prompt", json!([VOCAB - 1]), json!([VOCAB]), "prompt"),
        ("prompt", json!([[1]]), json!([[]]), "prompt"),
        (
            "logit_bias",
            json!({"1": 100}),
            json!({"1": 100.5}),
            "logit_bias.1",
        ),
    ];
    let base = completion(json!({}));
    for (field, ok, bad, param) in cases {
        edge(&s, "/v1/completions", &base, field, ok, bad, param).await;
    }
    // the budget: the context less one prompt token
    let one = completion(json!({"prompt": [1], "ignore_eos": true}));
    edge(
        &s,
        "/v1/completions",
        &one,
        "max_tokens",
        json!(511),
        json!(512),
        "prompt",
    )
    .await;
    // Messages: max_tokens required by /v1/messages only; stop_sequences bounded
    let m =
        json!({"model": "mock", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    edge(
        &s,
        "/v1/messages",
        &m,
        "top_p",
        json!(0),
        json!(-0.01),
        "top_p",
    )
    .await;
    edge(
        &s,
        "/v1/messages",
        &m,
        "stop_sequences",
        json!(vec!["zz"; MAX_STOPS]),
        json!(vec!["zz"; MAX_STOPS + 1]),
        "stop",
    )
    .await;
    let mut no_max = m.clone();
    no_max.as_object_mut().expect("object").remove("max_tokens");
    let (st, v) = post(&s, "/v1/messages", no_max.clone()).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(&s, "/v1/messages/count_tokens", no_max).await;
    assert_eq!(st, 200, "{v}");
    // Responses: metadata's bounds, the id format of previous_response_id
    let r = json!({"model": "mock", "input": "hi", "max_output_tokens": 2});
    let pairs = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
    };
    edge(
        &s,
        "/v1/responses",
        &r,
        "metadata",
        pairs(MAX_METADATA),
        pairs(MAX_METADATA + 1),
        "metadata",
    )
    .await;
    let key = |n: usize| json!({ "k".repeat(n): "v" });
    edge(
        &s,
        "/v1/responses",
        &r,
        "metadata",
        key(MAX_METADATA_KEY),
        key(MAX_METADATA_KEY + 1),
        "metadata",
    )
    .await;
    let value = |n: usize| json!({ "k": "v".repeat(n) });
    edge(
        &s,
        "/v1/responses",
        &r,
        "metadata",
        value(MAX_METADATA_VALUE),
        value(MAX_METADATA_VALUE + 1),
        "metadata",
    )
    .await;
    let (st, first) = post(&s, "/v1/responses", r.clone()).await;
    assert_eq!(st, 200, "{first}");
    let id = first["id"].as_str().expect("id");
    let d = doc(&s).await;
    let pattern = prop(&d, "ResponsesRequest", "previous_response_id")["pattern"]
        .as_str()
        .expect("pattern");
    assert_eq!(pattern, "^resp_[0-9a-f]{32}$");
    let hex = id.strip_prefix("resp_").expect("resp_ id");
    assert!(
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "{id}"
    );
    edge(
        &s,
        "/v1/responses",
        &r,
        "previous_response_id",
        json!(id),
        json!("resp_x"),
        "previous_response_id",
    )
    .await;
}
