//! `/metrics` tells the truth after clients go away: four streams whose clients disconnect
//! mid-generation leave `nightshift_running_sequences` at 0 once the engine has noticed (it used
//! to keep the value published before the last step until the next request), and every one of
//! them is counted in `nightshift_cancelled_total{reason="client_gone_running"}`.

mod support;

use serde_json::json;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");

use support::metric_sample as sample;

#[tokio::test]
async fn gauges_and_cancellations_follow_disconnects() {
    let s = support::serve(BIN, |c| c.args(["--mock", "--mock-step-ms", "30"]));
    let client = reqwest::Client::new();
    let body = json!({"model": "mock", "prompt": "abc", "max_tokens": 200, "stream": true, "ignore_eos": true});
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut r = client
            .post(format!("{}/v1/completions", s.url))
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 200);
        r.chunk().await.expect("first chunk").expect("a chunk");
        streams.push(r);
    }
    let metrics = || async {
        client
            .get(format!("{}/metrics", s.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    };
    let page = metrics().await;
    assert_eq!(
        sample(&page, "nightshift_running_sequences"),
        Some(4.0),
        "{page}"
    );
    drop(streams);
    let t0 = Instant::now();
    loop {
        let page = metrics().await;
        let running = sample(&page, "nightshift_running_sequences");
        let cancelled = sample(
            &page,
            "nightshift_cancelled_total{reason=\"client_gone_running\"}",
        );
        if running == Some(0.0) && cancelled == Some(4.0) {
            assert_eq!(
                sample(
                    &page,
                    "nightshift_cancelled_total{reason=\"client_gone_queued\"}"
                ),
                Some(0.0),
                "{page}"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "running {running:?}, cancelled {cancelled:?}:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
