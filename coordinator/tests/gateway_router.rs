//! The gateway as a library: `gateway::router(state)` driven in process with
//! `tower::ServiceExt::oneshot` (no socket), over the deterministic toy model. Auth, the error
//! shape, the atlas endpoints without a recorder (their state lives in `AppState`, not in a
//! process global), and a chat completion through the real scheduler thread.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use nightshift_coordinator::gateway::{router, AppState};
use nightshift_coordinator::scheduler::mock::{MockEngine, MockText};
use nightshift_coordinator::scheduler::{Scheduler, SchedulerOptions, TextModel};
use serde_json::{json, Value};
use tower::ServiceExt;

const KEY: &str = "router-test-key";

fn state() -> Arc<AppState> {
    let text: Arc<dyn TextModel> = Arc::new(MockText);
    let opts = SchedulerOptions {
        queue_capacity: 8,
        max_seqs: 2,
        prefill_chunk: 64,
        n_ctx: 256,
    };
    let scheduler = Scheduler::spawn(MockEngine::new(2), text.clone(), opts).expect("scheduler");
    Arc::new(AppState {
        model_id: "mock".into(),
        created: 1,
        fingerprint: "fp_mock".into(),
        scheduler,
        text,
        api_key: Some(KEY.into()),
        request_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_secs(30),
        stream_timeout: None,
        metrics: None,
        metrics_public: false,
        nodes_ok: Arc::new(|| Ok(())),
        stall_after: Duration::from_secs(120),
        draining: AtomicBool::new(false),
        atlas: None,
        responses: Default::default(),
        model_aliases: Vec::new(),
    })
}

/// One request through a fresh router: (status, JSON body or Null).
async fn call(
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = match body {
        Some(b) => req
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .expect("request");
    let resp = router(state()).oneshot(req).await.expect("router answers");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn routes_auth_and_errors_in_process() {
    // (method, path, bearer key, expected status, expected error code)
    type Case = (
        &'static str,
        &'static str,
        Option<&'static str>,
        StatusCode,
        Option<&'static str>,
    );
    let cases: &[Case] = &[
        ("GET", "/health", None, StatusCode::OK, None),
        (
            "GET",
            "/v1/models",
            None,
            StatusCode::UNAUTHORIZED,
            Some("invalid_api_key"),
        ),
        (
            "GET",
            "/v1/models",
            Some("wrong"),
            StatusCode::UNAUTHORIZED,
            Some("invalid_api_key"),
        ),
        ("GET", "/v1/models", Some(KEY), StatusCode::OK, None),
        ("GET", "/v1/nowhere", Some(KEY), StatusCode::NOT_FOUND, None),
        (
            "DELETE",
            "/v1/models",
            Some(KEY),
            StatusCode::METHOD_NOT_ALLOWED,
            None,
        ),
    ];
    for &(method, path, key, want, code) in cases {
        let (status, body) = call(method, path, key, None).await;
        assert_eq!(status, want, "{method} {path} key={key:?}: {body}");
        if status.is_success() {
            continue;
        }
        assert!(
            body["error"]["message"].is_string(),
            "{method} {path}: {body}"
        );
        if let Some(c) = code {
            assert_eq!(body["error"]["code"], c, "{method} {path}: {body}");
        }
    }
    let (_, models) = call("GET", "/v1/models", Some(KEY), None).await;
    assert_eq!(models["data"][0]["id"], "mock", "{models}");
}

#[tokio::test]
async fn atlas_endpoints_without_a_recorder_answer_409() {
    for (method, path) in [("GET", "/v1/atlas"), ("GET", "/v1/admin/placement")] {
        let (status, body) = call(method, path, Some(KEY), None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("atlas"),
            "{path}: {body}"
        );
    }
}

#[tokio::test]
async fn a_chat_completion_through_the_scheduler() {
    let body = json!({
        "model": "mock",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "temperature": 0
    });
    let (status, resp) = call("POST", "/v1/chat/completions", Some(KEY), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(resp["object"], "chat.completion", "{resp}");
    let content = resp["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(!content.is_empty(), "{resp}");
    assert!(
        resp["usage"]["completion_tokens"].as_u64().unwrap_or(0) >= 1,
        "{resp}"
    );
}
