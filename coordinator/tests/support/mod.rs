//! Shared by the coordinator's integration tests: finding the workspace's other binaries
//! (`nightshift-expert-node`, `nightshift-atlas`), which cargo does not build for this package's
//! tests. With `NIGHTSHIFT_PREBUILT_BINS=1` (set by scripts/test.d/10-cargo.sh after it built
//! every binary) an existing binary is used as is; otherwise it is built once with cargo in this
//! test's profile, so `cargo test -p nightshift-coordinator` alone works too.

// Each test crate uses only some of these helpers.
#![allow(dead_code)]

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

/// A model fixture of `model/tests/data`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data")
        .join(name)
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
