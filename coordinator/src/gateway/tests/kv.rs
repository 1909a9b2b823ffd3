//! The prefix cache seen over HTTP (mock model with prefix caching on): `cached_tokens` in the
//! usage of responses and of the final streamed chunk, the same text whether the prompt came
//! from the cache or not, and `GET /v1/admin/kv` behind the API key.

use super::*;

fn long_chat(max: u32) -> Value {
    let content = "You are reviewing a pull request. ".repeat(12);
    chat_body(&content, max)
}

#[tokio::test]
async fn a_repeated_prompt_reports_cached_tokens() {
    let s = start(Opts {
        prefix: true,
        ..Default::default()
    })
    .await;
    let (st, first) = post(&s, "/v1/chat/completions", long_chat(8)).await;
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) = post(&s, "/v1/chat/completions", long_chat(8)).await;
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(prompt > 300, "{second}");
    assert!(
        cached * 10 >= prompt * 9 && cached < prompt,
        "expected at least 90% of {prompt} prompt tokens cached, found {cached}"
    );
    assert_eq!(
        first["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"],
        "the cached prefix changed the answer"
    );
    // `cache_prompt: false` (llama.cpp's extension) computes the whole prompt
    let mut b = long_chat(8);
    b["cache_prompt"] = json!(false);
    let (_, third) = post(&s, "/v1/chat/completions", b).await;
    assert_eq!(third["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        third["choices"][0]["message"]["content"],
        first["choices"][0]["message"]["content"]
    );
    // the final streamed usage chunk carries it too
    let mut b = long_chat(8);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = sse(&s, "/v1/chat/completions", b).await;
    let last = chunks.last().expect("chunks");
    assert_eq!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    assert_eq!(
        stream_text(&chunks),
        second["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("?")
    );
}

#[tokio::test]
async fn admin_kv_summarises_the_cache_behind_the_key() {
    let s = start(Opts {
        key: Some("sekret"),
        prefix: true,
        ..Default::default()
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/admin/kv", s.url);
    let r = c.get(&url).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 401);
    for _ in 0..2 {
        let r = c
            .post(format!("{}/v1/chat/completions", s.url))
            .bearer_auth("sekret")
            .json(&long_chat(2))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 200);
    }
    let r = c
        .get(&url)
        .bearer_auth("sekret")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(v["object"], "kv_cache");
    assert_eq!(v["prefix_cache"]["enabled"], true);
    assert_eq!(v["prefix_cache"]["lookups"], 2);
    assert!(
        v["prefix_cache"]["hit_tokens"].as_u64().unwrap_or(0) > 300,
        "{v}"
    );
}
