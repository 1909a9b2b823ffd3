//! The gateway's table of malformed and out-of-range requests over the toy model: each gets its
//! OpenAI-shaped 4xx (status, `param`, `code`), never a 5xx, and the server keeps serving.

use super::*;

#[tokio::test]
async fn bad_input_table() {
    let s = start(Opts {
        n_ctx: 64,
        ..Default::default()
    })
    .await;
    let client = reqwest::Client::new();
    let chat = "/v1/chat/completions";
    let comp = "/v1/completions";
    let rows: Vec<(&str, &str, u16, &str, Option<&str>)> = vec![
        (chat, "{not json", 400, "invalid_request_error", None),
        (
            chat,
            r#"{"model":"mock"}"#,
            400,
            "invalid_request_error",
            Some("messages"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":"hi"}"#,
            400,
            "invalid_request_error",
            Some("messages"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
            400,
            "invalid_request_error",
            Some("temperature"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
            400,
            "invalid_request_error",
            Some("temperature"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
            400,
            "invalid_request_error",
            Some("max_tokens"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"n":2}"#,
            400,
            "invalid_request_error",
            Some("n"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"wizard","content":"x"}]}"#,
            400,
            "invalid_request_error",
            Some("messages[0].role"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
            400,
            "invalid_request_error",
            Some("messages[0].content[0].type"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
            400,
            "invalid_request_error",
            Some("top_logprobs"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
            400,
            "invalid_request_error",
            Some("stream_options"),
        ),
        (
            chat,
            r#"{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}"#,
            404,
            "invalid_request_error",
            Some("model"),
        ),
        (
            chat,
            r#"{"model":"mock","messages":[{"role":"user","content":"x"}],"max_tokens":60}"#,
            400,
            "invalid_request_error",
            Some("messages"),
        ),
        (
            comp,
            r#"{"model":"mock","prompt":["a","b"]}"#,
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            comp,
            r#"{"model":"mock","prompt":[1,2,999999]}"#,
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            comp,
            r#"{"model":"mock","prompt":"x","logprobs":9}"#,
            400,
            "invalid_request_error",
            Some("logprobs"),
        ),
        (
            comp,
            r#"{"model":"mock","prompt":"x","echo":true}"#,
            400,
            "invalid_request_error",
            Some("echo"),
        ),
        (
            comp,
            r#"{"model":"mock","prompt":""}"#,
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        ("/v1/nope", "{}", 404, "invalid_request_error", None),
    ];
    for (path, body, status, kind, param) in rows {
        let r = client
            .post(format!("{}{path}", s.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send");
        let got = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(got, status, "{path} {body} -> {v}");
        assert_eq!(v["error"]["type"], kind, "{body} -> {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{body} -> {v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // context overflow names both numbers
    let (_, v) = post(
        &s,
        chat,
        json!({"model":"mock","messages":[{"role":"user","content":"x"}],"max_tokens":60}),
    )
    .await;
    let m = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        m.contains("64") && m.contains(&(60 + "<user>x\n<assistant>".len()).to_string()),
        "{m}"
    );
    // unknown fields are ignored
    let (st, _) = post(&s, chat, json!({"model":"mock","messages":[{"role":"user","content":"x"}],"max_tokens":2,"whatever":{"a":1}})).await;
    assert_eq!(st, 200);
    // body over the limit
    let big = "x".repeat(BODY_LIMIT + 10);
    let r = client
        .post(format!("{}{chat}", s.url))
        .body(big)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 413);
}
