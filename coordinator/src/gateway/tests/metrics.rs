//! Operators' endpoints over HTTP: `/metrics` (what it exports, and the API key it needs unless
//! `--metrics-public`) and `/ready` while an engine step runs too long.

use super::*;

#[tokio::test]
async fn metrics_are_exported() {
    let s = start(Opts::default()).await;
    let _ = post(&s, "/v1/chat/completions", chat_body("hello", 3)).await;
    let text = metrics_page(&s).await;
    for name in [
        "nightshift_http_requests_total",
        "nightshift_time_to_first_token_seconds",
        "nightshift_decode_tokens_total",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
}

/// With an API key, `/metrics` needs it too, unless `--metrics-public`; `/health` never does.
#[tokio::test]
async fn metrics_need_the_api_key_unless_public() {
    let c = reqwest::Client::new();
    for public in [false, true] {
        let s = start(Opts {
            key: Some("sekret"),
            metrics_public: public,
            ..Default::default()
        })
        .await;
        let get = |key: Option<&str>| {
            let mut r = c.get(format!("{}/metrics", s.url));
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            r.send()
        };
        let anon = get(None).await.expect("send");
        let code = anon.status().as_u16();
        if public {
            assert_eq!(code, 200);
        } else {
            assert_eq!(code, 401);
            let v: Value = anon.json().await.unwrap_or(Value::Null);
            assert!(v["error"]["message"].is_string(), "{v}");
        }
        assert_eq!(
            get(Some("wrong")).await.expect("send").status().as_u16(),
            if public { 200 } else { 401 }
        );
        assert_eq!(
            get(Some("sekret")).await.expect("send").status().as_u16(),
            200
        );
        let health = c
            .get(format!("{}/health", s.url))
            .send()
            .await
            .expect("send");
        assert_eq!(health.status().as_u16(), 200);
    }
}

/// `/ready` answers 503 "engine stalled" while one step runs longer than `stall_after`, and
/// ready again once the step ends.
#[tokio::test]
async fn ready_reports_a_step_that_runs_too_long() {
    let s = start(Opts {
        delay_ms: 1500,
        stall_ms: 300,
        ..Default::default()
    })
    .await;
    let c = reqwest::Client::new();
    let ready = |c: reqwest::Client, url: String| async move {
        let r = c.get(format!("{url}/ready")).send().await.expect("send");
        let st = r.status().as_u16();
        (st, r.json::<Value>().await.expect("json"))
    };
    assert_eq!(ready(c.clone(), s.url.clone()).await.0, 200);
    let url = s.url.clone();
    let gen = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat_body("x", 1))
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.json::<Value>().await.expect("json"))
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    let (st, v) = ready(c.clone(), s.url.clone()).await;
    assert_eq!(st, 503, "{v}");
    let reason = v["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("engine stalled: one step has run for"),
        "{v}"
    );
    let (st, v) = gen.await.expect("join");
    assert_eq!(st, 200, "{v}");
    assert_eq!(ready(c, s.url.clone()).await.0, 200);
}
