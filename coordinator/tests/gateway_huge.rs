//! Huge prompts cannot stall the gateway: eight ~3.9 MB prompts at once (chat and completions,
//! ordinary text and `"ab"` repeated: one pre-token of 3.9 MB) against the tiny qwen3moe fixture
//! all get their 400 `context_length_exceeded` naming the right field, while `/health`, polled
//! throughout, keeps answering within 100 ms (median; a loaded 2-core VM gets one slow probe in
//! 500 ms of slack). Before, tokenizing ran on the async workers: `/health` waited seconds.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_answers_while_huge_prompts_are_rejected() {
    let model = support::fixture("tiny-qwen3moe-Q2_K.gguf");
    let s = support::serve(BIN, |c| c.args(["--threads", "1", "--model"]).arg(&model));
    let client = reqwest::Client::new();
    let words = "the quick brown fox jumps over the lazy dog ".repeat(88_000);
    let pair = "ab".repeat(1_950_000);
    let mut jobs = Vec::new();
    for i in 0..8 {
        let text = if i % 2 == 0 {
            pair.clone()
        } else {
            words.clone()
        };
        let (path, body, param) = if i % 4 < 2 {
            (
                "/v1/chat/completions",
                json!({"model": "tiny-qwen3moe-Q2_K", "messages": [{"role": "user", "content": text}]}),
                "messages",
            )
        } else {
            (
                "/v1/completions",
                json!({"model": "tiny-qwen3moe-Q2_K", "prompt": text}),
                "prompt",
            )
        };
        let (c, url) = (client.clone(), s.url.clone());
        jobs.push(tokio::spawn(async move {
            let r = c
                .post(format!("{url}{path}"))
                .json(&body)
                .send()
                .await
                .expect("send");
            let status = r.status().as_u16();
            let v: Value = r.json().await.expect("json");
            (status, v, param)
        }));
    }
    let mut probes = Vec::new();
    while !jobs.iter().all(|j| j.is_finished()) || probes.len() < 10 {
        let t0 = Instant::now();
        let r = client
            .get(format!("{}/health", s.url))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("health");
        assert_eq!(r.status().as_u16(), 200);
        probes.push(t0.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for j in jobs {
        let (status, v, param) = j.await.expect("job");
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    probes.sort();
    let median = probes[probes.len() / 2];
    let worst = *probes.last().expect("probes");
    assert!(
        median < Duration::from_millis(100) && worst < Duration::from_millis(500),
        "/health median {median:?}, worst {worst:?} over {} probes",
        probes.len()
    );
}
