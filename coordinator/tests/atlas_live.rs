//! The live ExpertAtlas loop on loopback: `nightshift serve --nodes 2` on the tiny qwen3moe
//! fixture records the routing of real requests (`GET /v1/atlas`: every MoE layer sees
//! tokens × top_k activations, both nodes got rows); `nightshift-atlas apply` rebalances the
//! cluster while 8 greedy streams run, with no failed request and every output identical to the
//! same request before the rebalance; bad placements fail with a clear message and leave serving
//! unaffected; SIGTERM writes the final snapshot to --atlas-out. With experts in process the atlas
//! is recorded too and a rebalance is refused (409).

mod support;

use support::Server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::{LayerPlacement, NodeSpec, Placement};
use nightshift_atlas_core::trace::Atlas;

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");
const MODEL: &str = "tiny-qwen3moe-Q2_K";
const KEY: &str = "atlas-test-key";

fn fixture() -> PathBuf {
    support::fixture(&format!("{MODEL}.gguf"))
}

/// Builds (or finds) `bin` of `package` in this test's profile and returns its path.
fn build_bin(package: &str, bin: &str) -> PathBuf {
    support::workspace_bin(package, bin)
}

fn serve(atlas_out: &Path, nodes: &str) -> Server {
    // Two nodes start round-robin (explicitly: the default would put every expert on both), so
    // the rebalance below has experts to load.
    let rr = atlas_out.with_file_name("round-robin.toml");
    std::fs::write(
        &rr,
        "version = 1\nstrategy = \"round-robin\"\n[[node]]\nname = \"node0\"\n[[node]]\nname = \"node1\"\n",
    )
    .expect("write placement");
    support::serve(BIN, |c| {
        if nodes == "2" {
            c.arg("--placement").arg(&rr);
        }
        c.args(["--max-seqs", "8", "--threads", "1", "--nodes", nodes])
            .args([
                "--node-threads",
                "1",
                "--api-key",
                KEY,
                "--atlas-every",
                "1",
            ])
            .arg("--model")
            .arg(fixture())
            .arg("--atlas-out")
            .arg(atlas_out)
    })
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn get_atlas(url: &str) -> Atlas {
    serde_json::from_str(&support::get_ok(url, "/v1/atlas", KEY).await).expect("atlas json")
}

async fn round(url: String, prompts: Vec<String>) -> Vec<Result<String, String>> {
    support::chat_round(url, MODEL, KEY, prompts).await
}

/// Checks the atlas's counts add up: every MoE layer saw tokens × top_k activations.
fn check_counts(a: &Atlas) {
    assert!(a.all_time.tokens > 0, "no tokens recorded");
    assert_eq!(a.all_time.activations.len(), a.shape.moe_layers.len());
    for (slot, row) in a.all_time.activations.iter().enumerate() {
        let sum: u64 = row.iter().sum();
        assert_eq!(
            sum,
            a.all_time.tokens * a.top_k as u64,
            "layer {}",
            a.shape.moe_layers[slot]
        );
    }
}

fn apply(atlas_bin: &Path, url: &str, placement: &Path) -> (bool, String) {
    let o = Command::new(atlas_bin)
        .arg("apply")
        .arg(placement)
        .args(["--coordinator", url, "--api-key", KEY])
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run nightshift-atlas apply");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_and_rebalance_under_load() {
    build_bin("nightshift-expert-node", "nightshift-expert-node");
    let atlas_bin = build_bin("nightshift-atlas", "nightshift-atlas");
    let dir = tempfile_dir();
    let atlas_out = dir.join("live.atlas");
    let mut s = serve(&atlas_out, "2");
    let url = s.url.clone();

    // Auth: the atlas is behind the API key.
    let r = client()
        .get(format!("{url}/v1/atlas"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);

    // Baseline: the same 8 requests the load rounds send, before any rebalance.
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("tell me about the number {i}"))
        .collect();
    let before: Vec<String> = round(url.clone(), prompts.clone())
        .await
        .into_iter()
        .map(|r| r.expect("baseline request"))
        .collect();
    let a = get_atlas(&url).await;
    check_counts(&a);
    assert_eq!(a.nodes.len(), 2);
    assert!(a.nodes.iter().all(|n| n.rows > 0), "{:?}", a.nodes);
    let tokens_before = a.all_time.tokens;

    // A different valid placement: every expert on node1, replicated on node0.
    let shape = a.shape.clone();
    let layers = shape
        .moe_layers
        .iter()
        .map(|&index| LayerPlacement {
            index,
            replicas: vec![vec![1, 0]; shape.n_experts],
            resident: vec![vec![1, 0]; shape.n_experts],
        })
        .collect();
    let nodes = vec![NodeSpec::named("node0"), NodeSpec::named("node1")];
    let good = Placement::from_layers(nodes.clone(), layers).expect("placement");
    good.validate(&shape).expect("valid");
    let good_path = dir.join("good.toml");
    good.save_atomic(&good_path).expect("write placement");

    // Rebalance under load: rounds of 8 concurrent streams run until the apply has finished
    // and one more round after it (at least 3, at most 30); the apply starts once the first
    // round is running.
    let applied = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let load = tokio::spawn(support::rounds_until(
        url.clone(),
        MODEL,
        KEY,
        prompts.clone(),
        applied.clone(),
        started.clone(),
    ));
    started.notified().await;
    let (bin, u, gp) = (atlas_bin.clone(), url.clone(), good_path.clone());
    let (ok, text) = tokio::task::spawn_blocking(move || apply(&bin, &u, &gp))
        .await
        .expect("apply task");
    applied.store(true, Ordering::SeqCst);
    assert!(ok, "apply failed: {text}");
    assert!(text.contains("applied"), "{text}");
    assert!(text.contains("loaded: node"), "{text}");
    let (rounds, during) = load.await.expect("load task");
    assert!(during >= 1, "no round ran while the placement was applied");
    eprintln!(
        "{} rounds of 8 streams, {during} started before the apply finished",
        rounds.len()
    );
    let mut failed = 0;
    for (r, outs) in rounds.iter().enumerate() {
        for (i, o) in outs.iter().enumerate() {
            match o {
                Ok(t) => assert_eq!(t, &before[i], "round {r} request {i} changed"),
                Err(e) => {
                    eprintln!("round {r} request {i} failed: {e}");
                    failed += 1;
                }
            }
        }
    }
    assert_eq!(failed, 0, "failed requests during the rebalance");

    // Bad placements: clear errors, nothing applied.
    let unknown = Placement::from_layers(
        vec![NodeSpec::named("node0"), NodeSpec::named("node9")],
        shape
            .moe_layers
            .iter()
            .map(|&index| LayerPlacement {
                index,
                replicas: vec![vec![1]; shape.n_experts],
                resident: vec![vec![1]; shape.n_experts],
            })
            .collect(),
    )
    .expect("structurally fine");
    let missing = Placement::from_layers(
        nodes,
        vec![LayerPlacement {
            index: shape.moe_layers[0],
            replicas: vec![vec![0]; shape.n_experts],
            resident: vec![vec![0]; shape.n_experts],
        }],
    )
    .expect("structurally fine");
    let unknown_path = dir.join("unknown.toml");
    let missing_path = dir.join("missing.toml");
    let garbage_path = dir.join("garbage.toml");
    unknown.save_atomic(&unknown_path).expect("write");
    missing.save_atomic(&missing_path).expect("write");
    std::fs::write(&garbage_path, "version = 1\n[[node]\nname = ").expect("write");
    for (path, needle) in [
        (&unknown_path, "node9"),
        (&missing_path, "layer"),
        (&garbage_path, "garbage.toml"),
    ] {
        let (ok, text) = apply(&atlas_bin, &url, path);
        assert!(!ok, "{} should be refused: {text}", path.display());
        assert!(text.contains(needle), "{}: {text}", path.display());
    }
    // Serving is unaffected and still on the good placement's outputs.
    let after = round(url.clone(), prompts[..2].to_vec()).await;
    for (i, o) in after.iter().enumerate() {
        assert_eq!(o.as_ref().expect("request after bad apply"), &before[i]);
    }

    let a = get_atlas(&url).await;
    check_counts(&a);
    assert!(a.all_time.tokens > tokens_before);

    // SIGTERM: the final snapshot on disk has everything GET /v1/atlas had.
    // SAFETY: kill(2) on our own child's pid; no memory is touched.
    let rc = unsafe { libc::kill(s.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let t0 = std::time::Instant::now();
    loop {
        if s.child.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "serve did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let saved = Atlas::load(&atlas_out).expect("atlas written at shutdown");
    check_counts(&saved);
    assert_eq!(saved.all_time.tokens, a.all_time.tokens);
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "nightshift-atlas-live-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// Experts in process: the atlas is recorded all the same (no node loads); a rebalance is
/// refused with 409 and a message saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_records_and_refuses_rebalance() {
    let atlas_bin = build_bin("nightshift-atlas", "nightshift-atlas");
    let dir = tempfile_dir();
    let s = serve(&dir.join("live.atlas"), "0");
    let out = round(s.url.clone(), vec!["hello".to_string()]).await;
    assert!(out[0].is_ok(), "{out:?}");
    let a = get_atlas(&s.url).await;
    check_counts(&a);
    assert!(a.nodes.is_empty());
    let p = Placement::round_robin(
        vec![NodeSpec::named("node0")],
        &a.shape.moe_layers,
        a.shape.n_experts,
    );
    let path = dir.join("p.toml");
    p.save_atomic(&path).expect("write");
    let (ok, text) = apply(&atlas_bin, &s.url, &path);
    assert!(!ok, "{text}");
    assert!(
        text.contains("HTTP 409") && text.contains("experts run in process"),
        "{text}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Atlas flags that cannot be honoured fail at startup with a clear message.
#[test]
fn bad_atlas_flags_fail_at_startup() {
    let model = fixture();
    let model = model.to_str().expect("utf-8 path");
    for (args, needle) in [
        (
            &["--model", model, "--atlas-out", "/nonexistent-dir/x.atlas"][..],
            "--atlas-out /nonexistent-dir/x.atlas",
        ),
        (
            &["--model", model, "--atlas-every", "0"][..],
            "--atlas-every",
        ),
        (
            &["--mock", "--atlas-out", "x.atlas"][..],
            "no atlas to record",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--port", "0"])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("run nightshift serve");
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
