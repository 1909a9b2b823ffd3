//! The `nightshift` binary end to end on loopback: `serve` prints its URL and paste-ready
//! snippets, answers the API, refuses flags it cannot honour yet, drains a running stream on
//! SIGTERM, and `bench serve` measures it. Uses the built-in toy model (`--mock`), so it needs
//! no GGUF; the same requests against a real model are in `gateway_model.rs`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");

/// A running `nightshift serve`; killed on drop.
struct Server {
    child: Child,
    url: String,
    banner: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `nightshift serve --port 0 ARGS` and waits for its "listening on" line.
fn serve(args: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("NIGHTSHIFT_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn nightshift serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut banner = Vec::new();
    let mut url = None;
    // The banner is printed at once after the bind; collect it until the python snippet ends.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        if let Some(u) = line.strip_prefix("nightshift serve: listening on ") {
            url = Some(u.trim().to_string());
        }
        let end = line == "PY";
        banner.push(line);
        if end {
            break;
        }
    }
    let url = url.unwrap_or_else(|| panic!("no 'listening on' line; got {banner:?}"));
    Server { child, url, banner }
}

fn chat_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
}

#[tokio::test]
async fn serve_prints_snippets_and_answers() {
    let s = serve(&["--mock", "--model-name", "toy"]);
    let text = s.banner.join("\n");
    assert!(
        text.contains(&format!("curl {}/v1/chat/completions", s.url)),
        "{text}"
    );
    assert!(
        text.contains(&format!("OpenAI(base_url=\"{}/v1\"", s.url)),
        "{text}"
    );
    assert!(text.contains("model : toy"), "{text}");
    assert!(text.contains("nodes :"), "{text}");
    let c = reqwest::Client::new();
    assert_eq!(
        c.get(format!("{}/health", s.url))
            .send()
            .await
            .expect("health")
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        c.get(format!("{}/ready", s.url))
            .send()
            .await
            .expect("ready")
            .status()
            .as_u16(),
        200
    );
    let r = c
        .post(format!("{}/v1/chat/completions", s.url))
        .json(&chat_body("toy"))
        .send()
        .await
        .expect("chat");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers().get("x-request-id").is_some());
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["model"], "toy");
    assert!(v["usage"]["completion_tokens"]
        .as_u64()
        .is_some_and(|n| n >= 1));
    let m = c
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(m.contains("nightshift_http_requests_total"), "{m}");
}

#[tokio::test]
async fn api_key_is_enforced() {
    let s = serve(&["--mock", "--api-key", "k3y"]);
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", s.url);
    let r = c
        .post(&url)
        .json(&chat_body("mock"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(&url)
        .bearer_auth("k3y")
        .json(&chat_body("mock"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
}

#[test]
fn flags_that_cannot_be_honoured_yet_fail_clearly() {
    for (args, needle) in [
        (&["--mock", "--nodes", "2"][..], "--mock runs no experts"),
        (
            &["--mock", "--placement", "p.toml"][..],
            "--mock runs no experts",
        ),
        (&["--mock", "--max-seqs", "0"][..], "--max-seqs"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--port", "0"])
            .args(args)
            .output()
            .expect("run nightshift serve");
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// SIGTERM while a stream runs: the stream still finishes with [DONE]; new requests are refused
/// and the process exits by itself.
#[tokio::test]
async fn sigterm_drains_running_streams() {
    // 200 tokens at 10 ms a step: the stream is still running when the signal arrives.
    let mut s = serve(&["--mock", "--mock-step-ms", "10", "--drain", "20"]);
    let body = json!({"model": "mock", "prompt": "abc", "max_tokens": 200, "temperature": 0, "stream": true, "stop": "\u{1}"});
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.url))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let mut text = String::new();
    if let Some(c) = r.chunk().await.expect("first chunk") {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    while let Some(c) = r.chunk().await.expect("chunk") {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "stream cut short: {text}"
    );
    let mut exited = false;
    for _ in 0..100 {
        if s.child.try_wait().expect("wait").is_some() {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exited, "server did not exit after SIGTERM");
}

#[tokio::test]
async fn bench_serve_reports_every_level() {
    let s = serve(&["--mock"]);
    let url = s.url.clone();
    let stdout = bench(vec![
        "--url".into(),
        url,
        "--concurrency".into(),
        "1,4".into(),
        "--requests".into(),
        "8".into(),
        "--max-tokens".into(),
        "16".into(),
        "--json".into(),
    ])
    .await;
    let rows: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, conc) in rows.iter().zip([1, 4]) {
        assert_eq!(row["concurrency"], conc);
        assert_eq!(row["requests"], 8);
        assert_eq!(row["errors"], 0, "{row}");
        assert!(
            row["completion_tokens"].as_u64().is_some_and(|n| n > 0),
            "{row}"
        );
    }
}

/// The soak shape in small: more streams than running slots plus queue, for a fixed time.
/// `bench serve --duration` stops by itself, the surplus streams get deliberate 429s (and wait
/// their Retry-After), nothing else fails, and the server's RSS is sampled.
#[tokio::test]
async fn bench_serve_soak_stops_by_itself_with_only_deliberate_429s() {
    let s = serve(&[
        "--mock",
        "--mock-step-ms",
        "5",
        "--max-seqs",
        "2",
        "--queue",
        "2",
    ]);
    let url = s.url.clone();
    let pid = s.child.id().to_string();
    let t0 = std::time::Instant::now();
    let stdout = bench(vec![
        "--url".into(),
        url.clone(),
        "--concurrency".into(),
        "8".into(),
        "--requests".into(),
        "1000000".into(),
        "--duration".into(),
        "3".into(),
        "--max-tokens".into(),
        "16".into(),
        "--ignore-eos".into(),
        "--report-every".into(),
        "1".into(),
        "--warmup".into(),
        "1".into(),
        "--rss-pid".into(),
        pid.clone(),
        "--json".into(),
    ])
    .await;
    // 3 s of load, then the requests in flight finish (16 tokens) and 429s wait at most 1 s
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(stdout.contains("] conc 8: "), "no progress lines: {stdout}");
    let row: Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no json row: {stdout}"));
    assert_eq!(row["errors"], 0, "{row}");
    assert!(row["rate_limited"].as_u64().is_some_and(|n| n > 0), "{row}");
    let served = row["requests"].as_u64().unwrap_or(0) - row["rate_limited"].as_u64().unwrap_or(0);
    assert!(served > 2, "{row}");
    assert_eq!(
        row["completion_tokens"].as_u64(),
        Some(16 * served),
        "{row}"
    );
    for k in [
        "rss_mib_start",
        "rss_mib_warm",
        "rss_mib_end",
        "anon_mib_end",
    ] {
        assert!(row[k].as_f64().is_some_and(|m| m > 0.0), "{k}: {row}");
    }
}

/// Runs `nightshift bench serve ARGS` (off the async runtime), asserts it succeeded and returns
/// its stdout.
async fn bench(args: Vec<String>) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(["bench", "serve"])
            .args(&args)
            .output()
            .expect("run bench")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
