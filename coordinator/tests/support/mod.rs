//! Shared by the coordinator's integration tests: finding the workspace's other binaries
//! (`nightshift-expert-node`, `nightshift-atlas`), which cargo does not build for this package's
//! tests. With `NIGHTSHIFT_PREBUILT_BINS=1` (set by scripts/test.d/10-cargo.sh after it built
//! every binary) an existing binary is used as is; otherwise it is built once with cargo in this
//! test's profile, so `cargo test -p nightshift-coordinator` alone works too.

// Each test crate uses only some of these helpers.
#![allow(dead_code)]

pub mod certs;
pub mod cluster;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// The path of `bin` from `package`, next to this test's `target/<profile>/` binaries.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    let me = std::env::current_exe().expect("test exe");
    let profile_dir = me
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf();
    let path = profile_dir.join(bin);
    if std::env::var_os("NIGHTSHIFT_PREBUILT_BINS").is_some() && path.is_file() {
        return path;
    }
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-q", "-p", package, "--bin", bin]);
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo build runs").success(),
        "building {bin} failed"
    );
    assert!(path.is_file(), "{} missing", path.display());
    path
}

/// Waits for `nightshift serve`'s "listening on URL" line (its stdout must be piped) and returns
/// the URL. Stdout keeps being drained to its end, so the server never writes into a closed pipe.
/// Kills the child and panics when the server does not start within `timeout`.
pub fn wait_listening(child: &mut Child, timeout: Duration) -> String {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    while let Ok(line) = rx.recv_timeout(timeout) {
        if let Some(u) = line.strip_prefix("nightshift serve: listening on ") {
            return u.trim().to_string();
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("nightshift serve did not start");
}

#[path = "../../../model/tests/fixture_util/locate.rs"]
mod locate;

/// A model fixture file (`tiny-qwen3moe-Q2_K.gguf`), found where `locate.rs` looks.
pub fn fixture(name: &str) -> PathBuf {
    locate::fixture_path(name)
}

/// An engine over `backend` with a one-thread pool (the cluster tests' reference setup).
pub fn engine(
    model: &std::sync::Arc<nightshift_model::Model>,
    backend: std::sync::Arc<dyn nightshift_model::ExpertBackend>,
) -> nightshift_model::Engine {
    let pool = nightshift_model::build_pool(1).expect("pool");
    nightshift_model::Engine::new(
        model.clone(),
        backend,
        nightshift_model::EngineOptions {
            pool: Some(pool),
            ..Default::default()
        },
    )
    .expect("engine")
}

/// Text of a greedy chat stream (12 tokens) from a running `serve` at `url`, or why it failed
/// (HTTP status, an error event, no `[DONE]`).
pub async fn stream_chat(
    url: String,
    model: &'static str,
    key: &'static str,
    prompt: String,
) -> Result<String, String> {
    let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12, "temperature": 0, "stream": true});
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let raw = r.text().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("HTTP {status}: {raw}"));
    }
    let mut out = String::new();
    let mut done = false;
    for line in raw.lines() {
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        if d == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(d).map_err(|e| format!("{e}: {d}"))?;
        if v.get("error").is_some() {
            return Err(format!("error event: {d}"));
        }
        if let Some(c) = v["choices"].get(0) {
            out.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    if !done {
        return Err(format!("no [DONE] in {raw}"));
    }
    Ok(out)
}

/// [`stream_chat`] of every prompt at once; results in prompt order.
pub async fn chat_round(
    url: String,
    model: &'static str,
    key: &'static str,
    prompts: Vec<String>,
) -> Vec<Result<String, String>> {
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| tokio::spawn(stream_chat(url.clone(), model, key, p.clone())))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(e.to_string())));
    }
    out
}

/// A running `nightshift serve` (killed on drop) and its base URL.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin serve` on loopback (free port, `--ctx 256`, quiet logs, no API key from the
/// environment) with the flags `extra` adds, and waits until it listens.
pub fn serve(bin: &str, extra: impl FnOnce(&mut Command) -> &mut Command) -> Server {
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--ctx",
        "256",
    ])
    .env("RUST_LOG", "warn")
    .env("NIGHTSHIFT_NODE_LOG", "error")
    .env_remove("NIGHTSHIFT_API_KEY")
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::inherit());
    extra(&mut cmd);
    let mut child = cmd.spawn().expect("spawn nightshift serve");
    let url = wait_listening(&mut child, Duration::from_secs(120));
    Server { child, url }
}

/// Rounds of concurrent chat streams (every prompt at once, [`chat_round`]) until `done` is set,
/// then one more round (at least 3 rounds, at most 30). `started` is notified once the first
/// round runs. Returns every round's results and how many rounds began before `done`.
pub async fn rounds_until(
    url: String,
    model: &'static str,
    key: &'static str,
    prompts: Vec<String>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    started: std::sync::Arc<tokio::sync::Notify>,
) -> (Vec<Vec<Result<String, String>>>, usize) {
    use std::sync::atomic::Ordering;
    let mut all = Vec::new();
    let mut during = 0;
    loop {
        let was_done = done.load(Ordering::SeqCst);
        let r = tokio::spawn(chat_round(url.clone(), model, key, prompts.clone()));
        if all.is_empty() {
            started.notify_one();
        }
        all.push(r.await.unwrap_or_default());
        if !was_done {
            during += 1;
        }
        if (was_done && all.len() >= 3) || all.len() >= 30 {
            return (all, during);
        }
    }
}

/// `GET url/path` with the Bearer `key`; asserts 200 and returns the body.
pub async fn get_ok(url: &str, path: &str, key: &str) -> String {
    let r = reqwest::Client::new()
        .get(format!("{url}{path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = r.status().as_u16();
    let body = r.text().await.expect("body");
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// `text` without its ANSI colour sequences (the node's log is coloured).
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of the sample `series` (full name with labels) in a Prometheus text page.
pub fn metric_sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The command line of process `pid`, one argument per item.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}
