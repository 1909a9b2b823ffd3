//! `nightshift-atlas record --coordinator` against a real `nightshift serve --nodes 2` (two local
//! expert-node processes) on the tiny qwen3moe fixture: the atlas written has the model's shape,
//! every MoE layer adds up to tokens × top_k, both nodes got rows, the counts grow with the
//! prompts sent (a second, larger prompt set sent 3 at a time adds more than the first), the file is what
//! `GET /v1/atlas` serves and was written atomically. Failures are clear: unreachable
//! coordinator, a non-2xx answer (wrong API key), a malformed atlas (a fake server), and a bad
//! prompt file (before anything is sent).

mod support;

use support::Server;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use nightshift_atlas_core::trace::Atlas;

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");
const MODEL: &str = "tiny-qwen3moe-Q2_K";
const KEY: &str = "record-test-key";

fn fixture() -> PathBuf {
    support::fixture(&format!("{MODEL}.gguf"))
}

fn serve_two_nodes() -> Server {
    support::serve(BIN, |c| {
        c.args(["--max-seqs", "4", "--threads", "1", "--nodes", "2"])
            .args(["--node-threads", "1", "--api-key", KEY])
            .arg("--model")
            .arg(fixture())
    })
}

/// A fresh directory per test (tests of this file run in parallel).
fn tmp_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "nightshift-atlas-record-{}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// Runs `nightshift-atlas record --coordinator url ...`; returns (success, stdout + stderr).
fn record(
    url: &str,
    key: Option<&str>,
    prompts: &Path,
    out: &Path,
    extra: &[&str],
) -> (bool, String) {
    let bin = support::workspace_bin("nightshift-atlas", "nightshift-atlas");
    let mut cmd = Command::new(bin);
    cmd.args(["record", "--coordinator", url, "--max-tokens", "4"])
        .arg("--prompts")
        .arg(prompts)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env_remove("NIGHTSHIFT_API_KEY")
        .env("RUST_BACKTRACE", "0");
    if let Some(k) = key {
        cmd.args(["--api-key", k]);
    }
    let o = cmd.output().expect("run nightshift-atlas record");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

fn write_prompts(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").expect("write prompts");
}

/// `n` prompts of similar length, alternating raw and chat lines, distinct from other calls'.
fn prompts(tag: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let text = format!("{tag} prompt {i}: tell me something about the number {i}");
            if i % 2 == 0 {
                serde_json::json!({ "prompt": text }).to_string()
            } else {
                serde_json::json!({ "messages": [{"role": "user", "content": text}] }).to_string()
            }
        })
        .collect()
}

/// The shape every recorded atlas must have; returns its all-time token count.
fn check_atlas(a: &Atlas) -> u64 {
    assert_eq!(a.model, MODEL, "model name");
    assert!(!a.shape.moe_layers.is_empty());
    assert!(a.shape.n_experts > 1);
    assert!(a.top_k >= 1 && a.top_k <= a.shape.n_experts);
    assert!(a.all_time.tokens > 0, "no tokens recorded");
    assert_eq!(a.all_time.activations.len(), a.shape.moe_layers.len());
    for (slot, row) in a.all_time.activations.iter().enumerate() {
        assert_eq!(row.len(), a.shape.n_experts);
        let sum: u64 = row.iter().sum();
        assert_eq!(
            sum,
            a.all_time.tokens * a.top_k as u64,
            "layer {}: activations must add up to tokens x top_k",
            a.shape.moe_layers[slot]
        );
    }
    let names: Vec<&str> = a.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node0", "node1"]);
    assert!(a.nodes.iter().all(|n| n.rows > 0), "{:?}", a.nodes);
    a.all_time.tokens
}

/// "sent N prompts to URL: P prompt tokens + G generated tokens" -> (N, P, G).
fn sent(text: &str) -> (u64, u64, u64) {
    let line = text
        .lines()
        .find(|l| l.starts_with("sent "))
        .unwrap_or_else(|| panic!("no summary line in {text}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // sent N prompts to http://127.0.0.1:PORT: P prompt tokens + G generated tokens
    let n = nums[0];
    let (p, g) = (nums[nums.len() - 4], nums[nums.len() - 3]);
    (n, p, g)
}

fn get_atlas(url: &str) -> Atlas {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let r = reqwest::Client::new()
            .get(format!("{url}/v1/atlas"))
            .bearer_auth(KEY)
            .send()
            .await
            .expect("GET /v1/atlas");
        assert_eq!(r.status().as_u16(), 200);
        r.json().await.expect("atlas json")
    })
}

#[test]
fn record_through_a_two_node_cluster() {
    support::workspace_bin("nightshift-expert-node", "nightshift-expert-node");
    let dir = tmp_dir("cluster");
    let s = serve_two_nodes();
    let small = dir.join("small.jsonl");
    let large = dir.join("large.jsonl");
    write_prompts(&small, &prompts("first", 2));
    write_prompts(&large, &prompts("second", 6));

    // Wrong key: the coordinator's 401 and its message, no file written.
    let out1 = dir.join("one.atlas");
    let (ok, text) = record(&s.url, Some("wrong-key"), &small, &out1, &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("HTTP 401"), "{text}");
    assert!(!out1.exists());

    // First run: 2 prompts on a fresh coordinator.
    let (ok, text) = record(&s.url, Some(KEY), &small, &out1, &[]);
    assert!(ok, "{text}");
    assert!(
        !text.contains("note: the coordinator had already"),
        "{text}"
    );
    let (n, p1, g1) = sent(&text);
    assert_eq!(n, 2);
    let a1 = Atlas::load(&out1).expect("first atlas file");
    let t1 = check_atlas(&a1);
    // Every prompt token went through the MoE layers, and every generated one but the last
    // of each request (it is returned, never fed back).
    assert!(
        t1 >= p1 + g1 - n && t1 <= p1 + g1,
        "atlas tokens {t1}, gateway counted {p1} prompt + {g1} generated"
    );

    // Second run: 6 prompts, 3 at a time, on the same coordinator add more than the first.
    let out2 = dir.join("two.atlas");
    let (ok, text) = record(&s.url, Some(KEY), &large, &out2, &["--concurrency", "3"]);
    assert!(ok, "{text}");
    assert!(text.contains("note: the coordinator had already"), "{text}");
    eprintln!("{text}");
    let (n, p2, g2) = sent(&text);
    assert_eq!(n, 6);
    let a2 = Atlas::load(&out2).expect("second atlas file");
    let t2 = check_atlas(&a2);
    assert!(
        t2 - t1 >= p2 + g2 - n && t2 - t1 <= p2 + g2,
        "second run added {} tokens, gateway counted {p2} prompt + {g2} generated",
        t2 - t1
    );
    assert!(
        t2 - t1 > t1,
        "6 prompts added {} tokens, 2 added {t1}",
        t2 - t1
    );
    assert_eq!(a2.shape, a1.shape);
    for (n1, n2) in a1.nodes.iter().zip(&a2.nodes) {
        assert!(n2.rows > n1.rows, "{n1:?} -> {n2:?}");
    }
    for (r1, r2) in a1
        .all_time
        .activations
        .iter()
        .flatten()
        .zip(a2.all_time.activations.iter().flatten())
    {
        assert!(r2 >= r1);
    }

    // The file is what the coordinator serves (nothing ran since), written atomically.
    let live = get_atlas(&s.url);
    assert_eq!(live.all_time, a2.all_time);
    assert_eq!(live.nodes, a2.nodes);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A bad prompt file fails before anything is sent.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"ok\"}\n{\"text\": 1}\n").expect("write");
    let (ok, text) = record(&s.url, Some(KEY), &bad, &dir.join("bad.atlas"), &[]);
    assert!(!ok && text.contains("line 2"), "{text}");
    assert_eq!(get_atlas(&s.url).all_time.tokens, t2, "nothing was sent");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unreachable_coordinator_is_a_clear_error() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let dir = tmp_dir("unreachable");
    let p = dir.join("p.jsonl");
    write_prompts(&p, &prompts("x", 1));
    let out = dir.join("x.atlas");
    let (ok, text) = record(&format!("127.0.0.1:{port}"), None, &p, &out, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "cannot reach the coordinator at http://127.0.0.1:{port}/v1/models"
        )),
        "{text}"
    );
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fake coordinator: a model list, then whatever `atlas_body` is for `GET /v1/atlas`.
fn fake_coordinator(atlas_body: &'static str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf);
            let body = if head.starts_with("GET /v1/models") {
                r#"{"object":"list","data":[{"id":"fake","object":"model"}]}"#
            } else if head.starts_with("GET /v1/atlas") {
                atlas_body
            } else {
                "{}"
            };
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

#[test]
fn malformed_atlas_is_a_clear_error() {
    let dir = tmp_dir("malformed");
    let p = dir.join("p.jsonl");
    write_prompts(&p, &prompts("x", 1));
    let out = dir.join("x.atlas");
    for (body, needle) in [
        ("<html>oops</html>", "expected the atlas JSON object"),
        (r#"{"format_version": 1}"#, "expected the atlas JSON object"),
        (
            r#"{"format_version":1,"model":"m","shape":{"moe_layers":[1],"n_experts":2,"expert_bytes":8},"top_k":1,"window_tokens":8,"all_time":{"tokens":0,"activations":[],"weight_sums":[]},"window":{"tokens":0,"activations":[[0,0]],"weight_sums":[[0.0,0.0]]},"nodes":[],"pairs":[{"layer":1,"pairs":[]}]}"#,
            "inconsistent atlas",
        ),
    ] {
        let url = fake_coordinator(body);
        let (ok, text) = record(&url, None, &p, &out, &[]);
        assert!(!ok, "{text}");
        assert!(
            text.contains("the coordinator's atlas at") && text.contains("is malformed"),
            "{text}"
        );
        assert!(text.contains(needle), "{body}: {text}");
        assert!(!out.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
