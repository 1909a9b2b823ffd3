//! A live rebalance whose load fails on a real node rolls back, under load. Three
//! `nightshift-expert-node` processes serve the tiny qwen3moe fixture to a `nightshift serve
//! --placement` that dials them. Old placement: every expert on node0 (mapped) and node2
//! (resident), the first half also on node1. New placement: every expert on all three, resident
//! on node0 — node0 only upgrades experts it holds, node1 loads the second half fresh, node2
//! must load too. node2 is killed before the rebalance, so its load fails after node0 and node1
//! have loaded theirs. Checked: `POST /v1/admin/placement` answers 503 naming node2 and the
//! rollback; every greedy stream running meanwhile succeeds with the same text as before; `GET
//! /v1/admin/placement` still shows the old placement; node1 holds exactly its old experts again
//! (the fresh half dropped) and node0 still holds all of its own (an upgrade is not dropped:
//! the old placement routes to it). Once node2 is back the same placement applies. Before all
//! that, a placement needing more resident memory on node1 than node1 was started with (its
//! file claims more) is refused with 400 and changes nothing.

mod support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_atlas_core::placement::{LayerPlacement, ModelShape, NodeSpec, Placement};
use nightshift_proto::v1::expert_service_client::ExpertServiceClient;
use nightshift_proto::v1::InfoRequest;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");
const MODEL: &str = "tiny-qwen3moe-Q2_K";
const KEY: &str = "rollback-test-key";

fn fixture() -> PathBuf {
    support::fixture(&format!("{MODEL}.gguf"))
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// The nodes' auth token (the coordinator and the test's own inventory calls present it).
const TOKEN: &str = "rollback-test-token";

/// The node token both sides read: the placement's directory holds it.
fn token_file(placement: &Path) -> std::path::PathBuf {
    placement.with_file_name("node-token")
}

fn spawn_node(bin: &Path, placement: &Path, name: &str, addr: SocketAddr) -> Proc {
    let child = Command::new(bin)
        .arg("--model")
        .arg(fixture())
        .arg("--placement")
        .arg(placement)
        .arg("--auth-token-file")
        .arg(token_file(placement))
        .args([
            "--node",
            name,
            "--listen",
            &addr.to_string(),
            "--threads",
            "1",
        ])
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nightshift-expert-node");
    let t0 = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{name} did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Proc(child)
}

fn serve(placement: &Path) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ctx",
            "256",
        ])
        .args(["--max-seqs", "8", "--threads", "1", "--api-key", KEY])
        .arg("--model")
        .arg(fixture())
        .arg("--placement")
        .arg(placement)
        .arg("--auth-token-file")
        .arg(token_file(placement))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn nightshift serve");
    let url = support::wait_listening(&mut child, Duration::from_secs(120));
    (Proc(child), url)
}

/// A placement over `nodes` where expert `e` of every MoE layer has `replicas(e)` and
/// `resident(e)`.
fn placement(
    nodes: &[NodeSpec],
    shape: &ModelShape,
    replicas: impl Fn(usize) -> Vec<usize>,
    resident: impl Fn(usize) -> Vec<usize>,
) -> Placement {
    let layers = shape
        .moe_layers
        .iter()
        .map(|&index| LayerPlacement {
            index,
            replicas: (0..shape.n_experts).map(&replicas).collect(),
            resident: (0..shape.n_experts).map(&resident).collect(),
        })
        .collect();
    let p = Placement::from_layers(nodes.to_vec(), layers).expect("placement");
    p.validate(shape).expect("valid placement");
    p
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn round(url: String, prompts: Vec<String>) -> Vec<Result<String, String>> {
    support::chat_round(url, MODEL, KEY, prompts).await
}

async fn get_placement(url: &str) -> Placement {
    Placement::from_toml_str(&support::get_ok(url, "/v1/admin/placement", KEY).await)
        .expect("placement toml")
}

/// POSTs a placement; returns the status and the body.
async fn post_placement(url: &str, p: &Placement) -> (u16, Value) {
    let r = client()
        .post(format!("{url}/v1/admin/placement"))
        .bearer_auth(KEY)
        .header("content-type", "application/toml")
        .body(p.to_toml_string())
        .send()
        .await
        .expect("POST /v1/admin/placement");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The experts a node holds: (layer, expert, resident), sorted.
async fn held(addr: SocketAddr) -> Vec<(u32, u32, bool)> {
    let mut c = ExpertServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to node");
    let mut req = tonic::Request::new(InfoRequest {});
    req.metadata_mut().insert(
        nightshift_proto::AUTH_HEADER,
        format!("Bearer {TOKEN}").parse().expect("header"),
    );
    let info = c.info(req).await.expect("info").into_inner();
    let mut v: Vec<_> = info
        .experts
        .iter()
        .map(|h| (h.layer, h.expert, h.resident))
        .collect();
    v.sort();
    v
}

/// The experts `p` gives node `name`, as `held` lists them.
fn expected(p: &Placement, name: &str) -> Vec<(u32, u32)> {
    let mut v: Vec<_> = p
        .experts_on(name)
        .expect("node of the placement")
        .into_iter()
        .map(|s| (s.layer as u32, s.expert as u32))
        .collect();
    v.sort();
    v
}

fn keys(h: &[(u32, u32, bool)]) -> Vec<(u32, u32)> {
    h.iter().map(|&(l, e, _)| (l, e)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_load_rolls_back_under_load() {
    let node_bin = support::workspace_bin("nightshift-expert-node", "nightshift-expert-node");
    let dir = std::env::temp_dir().join(format!("nightshift-rollback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let model = nightshift_model::Model::load(&fixture()).expect("fixture loads");
    let shape = nightshift_coordinator::cluster::model_shape(&model).expect("moe shape");
    drop(model);
    let half = shape.n_experts / 2;
    assert!(half >= 1, "the fixture needs at least 2 experts");

    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    let mut nodes: Vec<NodeSpec> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut n = NodeSpec::named(format!("node{i}"));
            n.addr = Some(a.to_string());
            n
        })
        .collect();
    // node1 was started with room for half the experts resident.
    let node1_capacity = shape.expert_bytes * (shape.moe_layers.len() * half) as u64;
    nodes[1].memory_bytes = node1_capacity;
    let old = placement(
        &nodes,
        &shape,
        |e| if e < half { vec![2, 0, 1] } else { vec![2, 0] },
        |_| vec![2],
    );
    let new = placement(&nodes, &shape, |_| vec![0, 1, 2], |_| vec![0]);
    let old_path = dir.join("old.toml");
    old.save_atomic(&old_path).expect("write old placement");
    std::fs::write(token_file(&old_path), format!("{TOKEN}\n")).expect("write token");

    let mut node_procs: Vec<Option<Proc>> = nodes
        .iter()
        .zip(&addrs)
        .map(|(n, &a)| Some(spawn_node(&node_bin, &old_path, &n.name, a)))
        .collect();
    let (_serve, url) = serve(&old_path);
    assert_eq!(get_placement(&url).await, old, "served placement");

    // Baseline greedy outputs on the old placement, all nodes up.
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("tell me about the number {i}"))
        .collect();
    let before: Vec<String> = round(url.clone(), prompts.clone())
        .await
        .into_iter()
        .map(|r| r.expect("baseline request"))
        .collect();
    let node0_before = held(addrs[0]).await;
    let node1_before = held(addrs[1]).await;
    assert_eq!(keys(&node0_before), expected(&old, "node0"));
    assert_eq!(keys(&node1_before), expected(&old, "node1"));

    // A placement that claims more memory for node1 than it was started with is refused before
    // anything loads: the running cluster's capacities count.
    let mut claimed = nodes.clone();
    claimed[1].memory_bytes = 0;
    let over = placement(&claimed, &shape, |_| vec![1, 0, 2], |_| vec![1]);
    let (status, body) = post_placement(&url, &over).await;
    let msg = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert_eq!(status, 400, "{body}");
    assert!(
        msg.contains("does not fit the running nodes")
            && msg.contains("node1")
            && msg.contains(&node1_capacity.to_string()),
        "{msg}"
    );
    assert_eq!(
        get_placement(&url).await,
        old,
        "placement after the refused one"
    );
    assert_eq!(held(addrs[1]).await, node1_before, "node1 loaded nothing");

    // node2 dies: every expert still has a replica on node0.
    node_procs[2] = None;

    // Rounds of 8 concurrent streams run until the failed POST has returned and one more round
    // after it (at least 3, at most 30); the POST starts once the first round is running.
    let posted = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let load = tokio::spawn(support::rounds_until(
        url.clone(),
        MODEL,
        KEY,
        prompts.clone(),
        posted.clone(),
        started.clone(),
    ));
    started.notified().await;
    let (status, body) = post_placement(&url, &new).await;
    posted.store(true, Ordering::SeqCst);
    let msg = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    assert_eq!(status, 503, "{body}");
    assert!(
        msg.contains("node2") && msg.contains("rolled back, routing stays on the old placement"),
        "{msg}"
    );
    eprintln!("the failed rebalance answered: {msg}");

    let (rounds, during) = load.await.expect("load task");
    assert!(during >= 1, "no round ran while the placement was posted");
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
    eprintln!(
        "{} rounds of 8 streams ({during} before the POST returned), {failed} failed",
        rounds.len()
    );
    assert_eq!(failed, 0, "failed requests during the failed rebalance");

    // Routing and the nodes are back on the old placement.
    assert_eq!(get_placement(&url).await, old, "placement after rollback");
    let node1_after = held(addrs[1]).await;
    assert_eq!(
        node1_after, node1_before,
        "node1 keeps only its old experts"
    );
    let node0_after = held(addrs[0]).await;
    assert_eq!(
        keys(&node0_after),
        keys(&node0_before),
        "node0 keeps every expert the old placement routes to it"
    );

    // node2 comes back: the same placement now applies, outputs unchanged.
    node_procs[2] = Some(spawn_node(&node_bin, &old_path, "node2", addrs[2]));
    let t0 = Instant::now();
    let report = loop {
        let (status, body) = post_placement(&url, &new).await;
        if status == 200 {
            break body;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the retried rebalance still fails: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(report["loaded"].as_array().is_some(), "{report}");
    assert_eq!(get_placement(&url).await, new, "placement after the retry");
    for (i, a) in addrs.iter().enumerate() {
        assert_eq!(
            keys(&held(*a).await),
            expected(&new, &format!("node{i}")),
            "node{i} after the retry"
        );
    }
    let after = round(url.clone(), prompts.clone()).await;
    for (i, o) in after.iter().enumerate() {
        assert_eq!(o.as_ref().expect("request after the retry"), &before[i]);
    }
    drop(node_procs);
    let _ = std::fs::remove_dir_all(&dir);
}
