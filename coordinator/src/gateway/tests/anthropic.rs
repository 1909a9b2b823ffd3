//! `/v1/messages` over the mock model: the same prompt and answer as the equivalent chat
//! request, Anthropic's stream events adding up to the whole message, tool_use blocks and
//! tool_result turns, count_tokens, `x-api-key`, and errors in Anthropic's shape.

use super::tool_api::{check_weather_args, tools as chat_tools};
use super::*;

fn anthropic_tools() -> Value {
    let v: Vec<Value> = chat_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"name": f["name"], "description": f.get("description").cloned()
                .unwrap_or(json!("")), "input_schema": f["parameters"]})
        })
        .collect();
    Value::Array(v)
}

async fn events(s: &Server, body: Value) -> Vec<(String, Value)> {
    named_events(s, "/v1/messages", body).await
}

fn text_of(m: &Value) -> String {
    m["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn a_message_is_the_chat_answer_in_blocks() {
    let s = start(Opts::default()).await;
    let (_, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "mock", "max_tokens": 12, "temperature": 0, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]}),
    )
    .await;
    let body = json!({"model": "mock", "system": "be brief", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]});
    let (st, m) = post(&s, "/v1/messages", body.clone()).await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    let u = &m["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        chat["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        text_of(&m),
        chat["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let want = if chat["choices"][0]["finish_reason"] == "length" {
        "max_tokens"
    } else {
        "end_turn"
    };
    assert_eq!(m["stop_reason"], want);

    let (st, c) = post(&s, "/v1/messages/count_tokens", body.clone()).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["input_tokens"], chat["usage"]["prompt_tokens"]);

    let mut sb = body;
    sb["stream"] = json!(true);
    let ev = events(&s, sb).await;
    let names: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names.first().copied(), Some("message_start"));
    assert_eq!(names.last().copied(), Some("message_stop"));
    assert_eq!(
        ev[0].1["message"]["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    let text: String = ev
        .iter()
        .filter_map(|e| e.1["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, text_of(&m));
    let delta = ev
        .iter()
        .find(|e| e.0 == "message_delta")
        .expect("message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], want);
    assert_eq!(
        delta.1["usage"]["output_tokens"],
        m["usage"]["output_tokens"]
    );
}

#[tokio::test]
async fn tool_use_blocks_and_tool_results() {
    let s = start(Opts::default()).await;
    let body = |stream: bool| {
        json!({"model": "mock", "max_tokens": 200, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "weather?"}], "tools": anthropic_tools(),
            "tool_choice": {"type": "tool", "name": "get_weather",
                            "disable_parallel_tool_use": true}})
    };
    let (st, m) = post(&s, "/v1/messages", body(false)).await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let blocks = m["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "{m}");
    assert_eq!(blocks[0]["type"], "tool_use");
    assert_eq!(blocks[0]["name"], "get_weather");
    assert!(blocks[0]["input"].is_object(), "{m}");
    check_weather_args(&blocks[0]["input"].to_string());

    let ev = events(&s, body(true)).await;
    let json_text: String = ev
        .iter()
        .filter_map(|e| e.1["delta"]["partial_json"].as_str())
        .collect();
    let streamed: Value = serde_json::from_str(&json_text).unwrap();
    check_weather_args(&json_text);
    assert!(streamed.is_object());
    let start = ev
        .iter()
        .find(|e| e.0 == "content_block_start")
        .expect("block start");
    assert_eq!(start.1["content_block"]["type"], "tool_use");
    assert_eq!(start.1["content_block"]["input"], json!({}));

    // the call answered: the same prompt as chat's tool conversation
    let (_, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "mock", "tools": chat_tools(), "max_tokens": 4, "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\":\"Paris\",\"days\":1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}),
    )
    .await;
    let (st, m) = post(
        &s,
        "/v1/messages",
        json!({"model": "mock", "tools": anthropic_tools(), "max_tokens": 4, "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                "name": "get_weather", "input": {"city": "Paris", "days": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                "content": "sunny"}]}]}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(
        m["usage"]["input_tokens"].as_u64().unwrap()
            + m["usage"]["cache_read_input_tokens"].as_u64().unwrap(),
        chat["usage"]["prompt_tokens"].as_u64().unwrap()
    );
}

#[tokio::test]
async fn errors_answer_in_anthropic_shape_and_x_api_key_authorizes() {
    let s = start(Opts {
        key: Some("sk-test"),
        ..Opts::default()
    })
    .await;
    let c = reqwest::Client::new();
    let send = |body: Value, key: Option<&'static str>| {
        let mut r = c.post(format!("{}/v1/messages", s.url)).json(&body);
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        async move {
            let r = r.send().await.expect("send");
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let ok = json!({"model": "mock", "max_tokens": 2,
        "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(send(ok.clone(), None).await.0, 401);
    assert_eq!(send(ok.clone(), Some("wrong")).await.0, 401);
    let (st, m) = send(ok, Some("sk-test")).await;
    assert_eq!(st, 200, "{m}");
    let cases = [
        (
            json!({"model": "mock", "messages": [{"role": "user", "content": "x"}]}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"model": "mock", "max_tokens": 2, "messages": [{"role": "user",
                "content": [{"type": "image", "source": {"type": "base64"}}]}]}),
            400,
            "invalid_request_error",
            "messages[0].content[0].type",
        ),
        (
            json!({"model": "mock", "max_tokens": 2, "messages": [{"role": "user",
                "content": "x"}], "tools": [{"input_schema": {}}]}),
            400,
            "invalid_request_error",
            "tools[0].name",
        ),
        (
            json!({"model": "mock", "max_tokens": 2, "messages": "x"}),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            json!({"model": "other", "max_tokens": 2,
                "messages": [{"role": "user", "content": "x"}]}),
            404,
            "not_found_error",
            "other",
        ),
    ];
    for (body, status, kind, mention) in cases {
        let (st, v) = send(body.clone(), Some("sk-test")).await;
        assert_eq!(st, status, "{body}: {v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(mention), "{body}: {msg}");
    }
}

/// `--model-alias`: an agent's own model names reach the served model; others stay a 404.
#[tokio::test]
async fn aliases_answer_for_the_served_model() {
    let s = start(Opts {
        aliases: &["claude-sonnet-4-5", "claude-haiku-4-5"],
        ..Opts::default()
    })
    .await;
    let body = |model: &str| json!({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]});
    for m in ["mock", "claude-sonnet-4-5", "claude-haiku-4-5"] {
        let (st, v) = post(&s, "/v1/messages", body(m)).await;
        assert_eq!(st, 200, "{m}: {v}");
    }
    let (st, v) = post(&s, "/v1/messages", body("claude-opus-4")).await;
    assert_eq!(st, 404, "{v}");
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "claude-haiku-4-5", "max_tokens": 2,
            "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let models: Value = reqwest::get(format!("{}/v1/models", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mock", "claude-sonnet-4-5", "claude-haiku-4-5"]);
}

/// A stop sequence ends the message where it starts: `stop_reason: "stop_sequence"` and the
/// sequence itself, whole and streamed.
#[tokio::test]
async fn stop_sequences_are_reported() {
    let s = start(Opts {
        no_eos: true,
        ..Opts::default()
    })
    .await;
    let body = json!({"model": "mock", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "hello"}]});
    let (_, free) = post(&s, "/v1/messages", body.clone()).await;
    let text = text_of(&free);
    let cut = text
        .char_indices()
        .nth(6)
        .map(|(i, _)| i)
        .expect("a long answer");
    let stop: String = text[cut..].chars().take(3).collect();
    let before = &text[..text.find(&stop).unwrap()];
    let mut b = body;
    b["stop_sequences"] = json!(["never-in-the-text", stop]);
    let (st, m) = post(&s, "/v1/messages", b.clone()).await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
    assert_eq!(m["stop_sequence"], stop.as_str());
    assert_eq!(text_of(&m), before);
    b["stream"] = json!(true);
    let ev = events(&s, b).await;
    let delta = ev
        .iter()
        .find(|e| e.0 == "message_delta")
        .expect("message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta.1["delta"]["stop_sequence"], stop.as_str());
}

/// An output budget larger than the context leaves is an upper bound on both agent APIs: the
/// answer stops where the context ends (`max_tokens` / `incomplete`), where chat's explicit
/// `max_tokens` is a 400 as OpenAI's is.
#[tokio::test]
async fn agent_budgets_stop_at_the_end_of_the_context() {
    let s = start(Opts {
        no_eos: true,
        n_ctx: 64,
        ..Opts::default()
    })
    .await;
    let (st, m) = post(
        &s,
        "/v1/messages",
        json!({"model": "mock", "max_tokens": 32000, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["stop_reason"], "max_tokens");
    let u = &m["usage"];
    let prompt =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(prompt + u["output_tokens"].as_u64().unwrap(), 64, "{m}");
    let (st, r) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "hi", "max_output_tokens": 32000, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["usage"]["total_tokens"], 64, "{r}");
    let (st, c) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "mock", "max_tokens": 32000,
            "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(
        (st, c["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    // a budget of 0 is still refused
    let (st, _) = post(
        &s,
        "/v1/messages",
        json!({"model": "mock", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 400);
}

/// The server's stream timeout ends both named-event streams with their error events, and the
/// sequence is freed, as it ends chat's.
#[tokio::test]
async fn stream_timeouts_end_both_agent_streams() {
    let s = start(Opts {
        delay_ms: 10,
        n_ctx: 4096,
        no_eos: true,
        stream_timeout_ms: Some(300),
        ..Default::default()
    })
    .await;
    let messages = named_events(
        &s,
        "/v1/messages",
        json!({"model": "mock", "max_tokens": 3000, "stream": true,
            "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    let last = &messages.last().expect("events").1;
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["error"]["type"], "api_error", "{last}");
    assert!(last["error"]["message"]
        .as_str()
        .unwrap()
        .contains("timed out"));
    let responses = named_events(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "x", "max_output_tokens": 3000, "stream": true}),
    )
    .await;
    let names: Vec<&str> = responses.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names[names.len() - 2..],
        ["error", "response.failed"],
        "{names:?}"
    );
    assert_eq!(responses.last().unwrap().1["response"]["status"], "failed");
    for _ in 0..100 {
        if s.live.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("a sequence is still allocated after its stream timed out");
}
