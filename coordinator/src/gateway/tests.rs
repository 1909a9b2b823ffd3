//! In-process tests of the whole HTTP layer over the deterministic mock model: a real server on
//! a loopback port, driven with reqwest. The integration tests in `coordinator/tests/` repeat the
//! important ones against the real binary and a real GGUF.

use super::*;

mod slow_body;
mod tool_api;
use crate::scheduler::mock::{MockBosText, MockEngine, MockText};
use crate::scheduler::SchedulerOptions;
use serde_json::{json, Value};
use std::sync::atomic::AtomicUsize;

mod anthropic;
mod bad_input;
mod compat;
mod kv;
mod metrics;
mod openapi_bounds;
mod responses;
mod spec;

struct Server {
    url: String,
    live: Arc<AtomicUsize>,
    peak_live: Arc<AtomicUsize>,
    max_batch: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

struct Opts {
    key: Option<&'static str>,
    queue: usize,
    max_seqs: usize,
    kv_seqs: usize,
    delay_ms: u64,
    nodes_down: bool,
    n_ctx: usize,
    no_eos: bool,
    kv_budget: Option<usize>,
    stream_timeout_ms: Option<u64>,
    prefix: bool,
    metrics_public: bool,
    body_timeout_ms: Option<u64>,
    /// n-gram speculation, every draft riding (no policy).
    spec: bool,
    /// `--model-alias` names.
    aliases: &'static [&'static str],
    stall_ms: u64,
    /// The toy model with a BOS token (`MockBosText`).
    bos: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            key: None,
            queue: 64,
            max_seqs: 8,
            kv_seqs: 8,
            delay_ms: 0,
            nodes_down: false,
            n_ctx: 512,
            no_eos: false,
            body_timeout_ms: None,
            kv_budget: None,
            stream_timeout_ms: None,
            prefix: false,
            metrics_public: false,
            spec: false,
            aliases: &[],
            stall_ms: 120_000,
            bos: false,
        }
    }
}

async fn start(o: Opts) -> Server {
    let mut engine = MockEngine::new(o.kv_seqs);
    engine.step_delay = std::time::Duration::from_millis(o.delay_ms);
    engine.eos = !o.no_eos;
    engine.kv_budget = o.kv_budget.unwrap_or(0);
    engine.prefix = o.prefix;
    let live = engine.live.clone();
    let peak_live = engine.peak_live.clone();
    let max_batch = engine.max_batch.clone();
    let text: Arc<dyn TextModel> = if o.bos {
        Arc::new(MockBosText)
    } else {
        Arc::new(MockText)
    };
    let opts = SchedulerOptions {
        queue_capacity: o.queue,
        max_seqs: o.max_seqs,
        prefill_chunk: 64,
        n_ctx: o.n_ctx,
    };
    let spec = o.spec.then(|| {
        use nightshift_model::spec::{ngram::NgramRange, NgramDrafter};
        let d = NgramDrafter::new(NgramRange { min: 1, max: 4 });
        crate::scheduler::spec::Speculator::new(Box::new(d), 4, false)
    });
    let scheduler = Scheduler::spawn_speculative(engine, text.clone(), opts, spec)
        .expect("spawn engine thread");
    let down = o.nodes_down;
    let state = Arc::new(AppState {
        model_id: "mock".into(),
        created: 1,
        fingerprint: "fp_mock".into(),
        scheduler,
        text,
        api_key: o.key.map(String::from),
        request_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_millis(o.body_timeout_ms.unwrap_or(30_000)),
        stream_timeout: o.stream_timeout_ms.map(Duration::from_millis),
        metrics: metrics_handle(),
        metrics_public: o.metrics_public,
        nodes_ok: Arc::new(move || {
            if down {
                Err("node0 unreachable".into())
            } else {
                Ok(())
            }
        }),
        stall_after: Duration::from_millis(o.stall_ms),
        draining: AtomicBool::new(false),
        atlas: None,
        responses: Default::default(),
        model_aliases: o.aliases.iter().map(|a| a.to_string()).collect(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(
        listener,
        state,
        async move {
            let _ = rx.await;
        },
        Duration::from_secs(1),
    ));
    Server {
        url,
        live,
        peak_live,
        max_batch,
        stop: Some(tx),
    }
}

async fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.url))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A streamed answer's whole body (status 200).
async fn stream_body(s: &Server, path: &str, body: Value) -> String {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.url))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    r.text().await.expect("body")
}

/// Reads an SSE stream: every `data:` payload until `[DONE]` (which must come last).
async fn sse(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let text = stream_body(s, path, body).await;
    let mut out = Vec::new();
    let mut done = false;
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data: ") {
            assert!(!done, "data after [DONE]");
            if d == "[DONE]" {
                done = true;
            } else {
                out.push(serde_json::from_str(d).expect("chunk json"));
            }
        }
    }
    assert!(done, "stream did not end with [DONE]: {text}");
    out
}

/// Reads an SSE stream whose events are named (the Responses and Messages APIs): (event,
/// data) pairs, every data's `type` its event name; no `[DONE]`.
async fn named_events(s: &Server, path: &str, body: Value) -> Vec<(String, Value)> {
    let text = stream_body(s, path, body).await;
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            name = Some(e.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).expect("event json");
            let n = name.take().expect("every data has its event name");
            assert_eq!(v["type"], n.as_str(), "{v}");
            out.push((n, v));
        }
    }
    assert!(
        !text.contains("[DONE]"),
        "named-event streams send no [DONE]"
    );
    out
}

fn chat_body(content: &str, max: u32) -> Value {
    json!({"model": "mock", "messages": [{"role": "user", "content": content}], "max_tokens": max, "temperature": 0})
}

/// The `/metrics` page (no API key).
async fn metrics_page(s: &Server) -> String {
    reqwest::get(format!("{}/metrics", s.url))
        .await
        .expect("get")
        .text()
        .await
        .expect("text")
}

/// The text of a Responses API response's message items.
fn output_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(String::from))
        .collect()
}

fn stream_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))
        .collect()
}

#[tokio::test]
async fn chat_completion_and_usage() {
    let s = start(Opts::default()).await;
    let (st, v) = post(&s, "/v1/chat/completions", chat_body("hello", 12)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap_or("").starts_with("chatcmpl-"));
    assert_eq!(v["model"], "mock");
    let prompt = "<user>hello\n<assistant>".len() as u64;
    assert_eq!(v["usage"]["prompt_tokens"], prompt);
    let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert_eq!(v["usage"]["total_tokens"], prompt + n);
    let fr = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
    assert!(fr == "length" && n == 12 || fr == "stop" && n < 12, "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    // greedy: same answer twice; streaming gives the same text
    let (_, v2) = post(&s, "/v1/chat/completions", chat_body("hello", 12)).await;
    assert_eq!(
        v["choices"][0]["message"]["content"],
        v2["choices"][0]["message"]["content"]
    );
    let mut b = chat_body("hello", 12);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = sse(&s, "/v1/chat/completions", b).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        stream_text(&chunks),
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("?")
    );
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"].as_array().map(|a| a.len()), Some(0));
    assert_eq!(last["usage"], v["usage"]);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], fr);
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null()));
}

#[tokio::test]
async fn completions_logprobs_and_stop() {
    let s = start(Opts::default()).await;
    let body = json!({"model": "mock", "prompt": "abc", "max_tokens": 20, "temperature": 0, "logprobs": 2});
    let (st, v) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap_or("").to_string();
    let lp = &v["choices"][0]["logprobs"];
    let toks: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert_eq!(toks.concat(), text);
    for (i, t) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let m = t.as_object().expect("map");
        assert!(m.len() <= 2 && !m.is_empty());
        // greedy: the chosen token is the most likely one
        let best = m
            .values()
            .filter_map(|x| x.as_f64())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().expect("lp");
        assert!((best - chosen).abs() < 1e-6 && chosen <= 0.0);
    }
    // default max_tokens for completions is 16
    let (_, d) = post(
        &s,
        "/v1/completions",
        json!({"model": "mock", "prompt": "abc", "temperature": 0}),
    )
    .await;
    assert!(d["usage"]["completion_tokens"].as_u64().unwrap_or(99) <= 16);
    // stop strings: cut at the first occurrence of a substring of the greedy text
    if text.len() >= 6 {
        let stop = &text[3..5];
        let cut = &text[..text.find(stop).unwrap_or(0)];
        let mut b = body.clone();
        b["stop"] = json!([stop, "zzzzzz"]);
        let (_, v) = post(&s, "/v1/completions", b.clone()).await;
        assert_eq!(v["choices"][0]["text"], cut);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        b["stream"] = json!(true);
        let chunks = sse(&s, "/v1/completions", b).await;
        assert_eq!(stream_text(&chunks), cut);
    }
}

#[tokio::test]
async fn chat_logprobs_shape() {
    let s = start(Opts::default()).await;
    let mut b = chat_body("hi", 5);
    b["logprobs"] = json!(true);
    b["top_logprobs"] = json!(3);
    let (st, v) = post(&s, "/v1/chat/completions", b).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0)
    );
    for c in content {
        assert_eq!(c["top_logprobs"].as_array().map(|a| a.len()), Some(3));
        assert_eq!(c["top_logprobs"][0]["token"], c["token"]);
        assert!(c["bytes"].is_array());
    }
}

/// Each row: request -> status + error type (+ param).
#[tokio::test]
async fn auth_nodes_down_and_queue_full() {
    let s = start(Opts {
        key: Some("sekret"),
        ..Default::default()
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/models", s.url);
    let r = c.get(&url).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let r = c.get(&url).bearer_auth("wrong").send().await.expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let r = c
        .get(&url)
        .bearer_auth("sekret")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(v["data"][0]["id"], "mock");
    // health is open
    assert_eq!(
        c.get(format!("{}/health", s.url))
            .send()
            .await
            .expect("send")
            .status()
            .as_u16(),
        200
    );

    let s = start(Opts {
        nodes_down: true,
        ..Default::default()
    })
    .await;
    let (st, v) = post(&s, "/v1/chat/completions", chat_body("x", 2)).await;
    assert_eq!(st, 503, "{v}");
    let r = c
        .get(format!("{}/ready", s.url))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 503);

    // one running sequence, queue of one, slow steps: the third concurrent request gets 429
    let s = start(Opts {
        queue: 1,
        max_seqs: 1,
        kv_seqs: 1,
        delay_ms: 20,
        ..Default::default()
    })
    .await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let url = format!("{}/v1/completions", s.url);
        tasks.push(tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&json!({"model":"mock","prompt":"abc","max_tokens":30,"temperature":0,"stop":"\u{1}"}))
                .send()
                .await
                .expect("send");
            (r.status().as_u16(), r.headers().get("retry-after").is_some())
        }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.expect("join"));
    }
    assert!(codes.contains(&(429, true)), "{codes:?}");
    assert!(codes.iter().any(|c| c.0 == 200), "{codes:?}");
}

/// `queue` bounds the requests waiting for a slot wherever they wait (the channel or the
/// engine thread's FIFO): with one sequence running and a queue of two, exactly two of five
/// more requests get in and three get 429.
#[tokio::test]
async fn queue_bounds_waiting_requests() {
    let s = start(Opts {
        queue: 2,
        max_seqs: 1,
        kv_seqs: 1,
        delay_ms: 20,
        no_eos: true,
        ..Default::default()
    })
    .await;
    let url = format!("{}/v1/completions", s.url);
    let send = |url: String| {
        tokio::spawn(async move {
            let b = json!({"model":"mock","prompt":"abc","max_tokens":20,"temperature":0});
            let r = reqwest::Client::new()
                .post(url)
                .json(&b)
                .send()
                .await
                .expect("send");
            r.status().as_u16()
        })
    };
    let first = send(url.clone());
    for _ in 0..200 {
        if s.live.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        s.live.load(Ordering::SeqCst),
        1,
        "the first request never ran"
    );
    let more: Vec<_> = (0..5).map(|_| send(url.clone())).collect();
    let mut codes = Vec::new();
    for t in more {
        codes.push(t.await.expect("join"));
    }
    codes.sort_unstable();
    assert_eq!(codes, vec![200, 200, 429, 429, 429]);
    assert_eq!(first.await.expect("join"), 200);
}

/// 8 concurrent greedy streams produce exactly what each produces alone, batched together.
#[tokio::test]
async fn concurrent_greedy_equals_alone() {
    let s = start(Opts {
        delay_ms: 2,
        ..Default::default()
    })
    .await;
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("prompt number {i} {}", "x".repeat(i * 3)))
        .collect();
    let body = |p: &str| json!({"model":"mock","messages":[{"role":"user","content":p}],"max_tokens":40,"temperature":0,"stream":true});
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(stream_text(&sse(&s, "/v1/chat/completions", body(p)).await));
    }
    let mut tasks = Vec::new();
    for p in &prompts {
        let url = s.url.clone();
        let b = body(p);
        tasks.push(tokio::spawn(async move {
            let srv = Server {
                url,
                live: Arc::default(),
                peak_live: Arc::default(),
                max_batch: Arc::default(),
                stop: None,
            };
            stream_text(&sse(&srv, "/v1/chat/completions", b).await)
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.expect("join"), alone[i], "prompt {i}");
    }
    assert!(
        s.max_batch.load(Ordering::SeqCst) > 1,
        "requests were never batched together"
    );
}

/// A client that goes away mid-stream frees its sequence.
#[tokio::test]
async fn disconnect_frees_the_sequence() {
    let s = start(Opts {
        delay_ms: 5,
        n_ctx: 4096,
        no_eos: true,
        ..Default::default()
    })
    .await;
    let b = json!({"model":"mock","prompt":"abc","max_tokens":3000,"temperature":0,"stream":true});
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.url))
        .json(&b)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let mut r = r;
    let _ = r.chunk().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.live.load(Ordering::SeqCst), 1);
    drop(r);
    for _ in 0..100 {
        if s.live.load(Ordering::SeqCst) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("sequence still allocated after the client disconnected");
}

/// A stream running past the stream timeout ends with a timeout error event (no `[DONE]`), and
/// its sequence is cancelled and freed; a stream that finishes in time is not affected.
#[tokio::test]
async fn stream_timeout_ends_the_stream_and_frees_the_sequence() {
    let s = start(Opts {
        delay_ms: 10,
        n_ctx: 4096,
        no_eos: true,
        stream_timeout_ms: Some(300),
        ..Default::default()
    })
    .await;
    let b = json!({"model":"mock","prompt":"abc","max_tokens":3000,"temperature":0,"stream":true});
    let t0 = std::time::Instant::now();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.url))
        .json(&b)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("body");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert!(!data.contains(&"[DONE]"), "{text}");
    assert!(data.len() > 2, "expected tokens before the timeout: {text}");
    let last: Value = serde_json::from_str(data[data.len() - 1]).expect("json");
    assert_eq!(last["error"]["code"], "timeout", "{last}");
    assert_eq!(last["error"]["type"], "server_error", "{last}");
    let msg = last["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("timed out after 0.3 s"), "{msg}");
    let mut freed = false;
    for _ in 0..100 {
        if s.live.load(Ordering::SeqCst) == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "sequence still allocated after the stream timed out");
    // a short stream finishes normally under the same limit
    let mut b = chat_body("hi", 3);
    b["stream"] = json!(true);
    let chunks = sse(&s, "/v1/chat/completions", b).await;
    assert!(chunks.iter().all(|c| c.get("error").is_none()));
}

/// `POST /v1/admin/placement` answers a body that is not UTF-8, or too large, in the API's
/// `{"error": ...}` shape (it used to be axum's plain-text rejection).
#[tokio::test]
async fn placement_body_errors_use_the_error_shape() {
    let s = start(Opts::default()).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/admin/placement", s.url);
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (
            b"version = 1\xff\xfe".to_vec(),
            400,
            "not UTF-8 text: invalid byte at offset 11",
        ),
        (vec![b'#'; BODY_LIMIT + 1], 413, "request body too large"),
    ];
    for (body, status, msg) in cases {
        let r = c.post(&url).body(body).send().await.expect("send");
        assert_eq!(r.status().as_u16(), status);
        let v: Value = r.json().await.expect("a JSON error body");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(m.contains(msg), "{v}");
    }
}

/// Admission reserves prompt + max_tokens against the KV budget: with room for one request
/// at a time, concurrent requests wait their turn (FIFO) instead of failing.
#[tokio::test]
async fn kv_budget_admits_one_at_a_time() {
    let s = start(Opts {
        kv_budget: Some(60),
        delay_ms: 2,
        ..Default::default()
    })
    .await;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let url = s.url.clone();
        tasks.push(tokio::spawn(async move {
            let b =
                json!({"model":"mock","prompt":format!("p{i}"),"max_tokens":40,"temperature":0});
            let r = reqwest::Client::new()
                .post(format!("{url}/v1/completions"))
                .json(&b)
                .send()
                .await
                .expect("send");
            r.status().as_u16()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("join"), 200);
    }
    assert_eq!(
        s.peak_live.load(Ordering::SeqCst),
        1,
        "more than one sequence was admitted"
    );
    let s = start(Opts {
        delay_ms: 2,
        ..Default::default()
    })
    .await;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let url = s.url.clone();
        tasks.push(tokio::spawn(async move {
            let b = json!({"model":"mock","prompt":format!("p{i}"),"max_tokens":40,"temperature":0,"ignore_eos":true});
            let r = reqwest::Client::new().post(format!("{url}/v1/completions")).json(&b).send().await.expect("send");
            r.status().as_u16()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("join"), 200);
    }
    assert!(
        s.peak_live.load(Ordering::SeqCst) > 1,
        "requests were never admitted together"
    );
}
