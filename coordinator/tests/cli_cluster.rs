//! `nightshift logits` and `nightshift generate` take the cluster flags: with `--nodes 2` the
//! logits file is byte-identical to the in-process one, and generate's greedy text is the same.
//! A command that ends leaves none of its shared-memory files (regions, claim board) behind.
//! `serve`'s `/metrics` shows a stopped node suspect until it answers again.

mod support;

use support::fixture as data;

use std::path::Path;
use std::process::Command;

/// `nightshift` finds `nightshift-expert-node` next to itself: make sure it is there.
fn build_node_binary() {
    support::workspace_bin("nightshift-expert-node", "nightshift-expert-node");
}

/// The files process `pid` created in /dev/shm (regions, claim board) that are still there.
fn shm_files_of(pid: u32) -> Vec<String> {
    let mine = format!("nightshift-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&mine))
                .collect()
        })
        .unwrap_or_default()
}

fn logits(model: &Path, out: &Path, extra: &[&str]) -> Vec<u8> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg("logits")
        .arg("--model")
        .arg(model)
        .args([
            "--prompt-ids",
            "407,550,566,544",
            "--decode-ids",
            "543,570,443",
            "--threads",
            "1",
            "--out",
        ])
        .arg(out)
        .args(extra)
        .spawn()
        .expect("nightshift runs");
    let st = child.wait().expect("nightshift ends");
    assert!(st.success(), "nightshift logits {extra:?} failed");
    let left = shm_files_of(child.id());
    assert!(left.is_empty(), "{extra:?} left {left:?} in /dev/shm");
    std::fs::read(out).expect("logits file")
}

#[test]
fn logits_with_local_nodes_are_byte_identical() {
    build_node_binary();
    let dir = std::env::temp_dir().join(format!("ns-cli-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for fixture in ["tiny-qwen3moe-Q4_K_M.gguf", "tiny-deepseek2-Q2_K.gguf"] {
        let model = data(fixture);
        let local = logits(&model, &dir.join("local.bin"), &[]);
        let remote = logits(
            &model,
            &dir.join("remote.bin"),
            &["--nodes", "2", "--node-threads", "1"],
        );
        assert!(!local.is_empty());
        assert!(
            local == remote,
            "{fixture}: logits differ between in-process and 2 nodes"
        );
    }
}

#[test]
fn generate_with_local_nodes_gives_the_same_text() {
    build_node_binary();
    let model = data("tiny-qwen3moe-Q2_K.gguf");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
            .arg("generate")
            .arg("--model")
            .arg(&model)
            .args([
                "--prompt",
                "The coordinator runs attention and routing",
                "-n",
                "8",
                "--temp",
                "0",
                "--threads",
                "1",
            ])
            .args(extra)
            .output()
            .expect("nightshift runs");
        assert!(
            out.status.success(),
            "generate {extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let local = run(&[]);
    assert!(!local.is_empty());
    assert_eq!(
        local,
        run(&["--nodes", "2"]),
        "greedy text differs with 2 nodes"
    );
}

/// `serve --nodes 2` stopped with SIGTERM stops its nodes and removes its claim board, which
/// lives as long as the coordinator (nodes that restart attach to it again).
#[test]
fn serve_stopped_by_sigterm_leaves_no_shared_memory_files() {
    build_node_binary();
    let mut server = support::serve(env!("CARGO_BIN_EXE_nightshift"), |c| {
        c.args(["--threads", "1", "--nodes", "2", "--node-threads", "1"])
            .arg("--model")
            .arg(data("tiny-qwen3moe-Q2_K.gguf"))
    });
    let pid = server.child.id();
    assert!(
        !shm_files_of(pid).is_empty(),
        "a running coordinator with local nodes keeps its claim board"
    );
    // SAFETY: kill(2) on a child process id we spawned; no memory is involved.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let st = server.child.wait().expect("serve ends");
    assert!(st.success(), "serve exited with {st}");
    let left = shm_files_of(pid);
    assert!(left.is_empty(), "serve left {left:?} in /dev/shm");
}

/// A coordinator whose token the nodes refuse fails at once, naming the cause (it used to retry
/// for 30 s and then report the nodes unreachable).
#[test]
fn a_refused_token_fails_the_command_at_once() {
    build_node_binary();
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = nightshift_model::Model::load(&path).expect("model");
    let shape = nightshift_coordinator::cluster::model_shape(&model).expect("shape");
    let cluster = support::cluster::launch(
        &path,
        nightshift_atlas_core::placement::Placement::round_robin(
            support::cluster::nodes(1),
            &shape.moe_layers,
            shape.n_experts,
        ),
    );
    let wrong = cluster.placement_path().with_file_name("wrong-token");
    std::fs::write(&wrong, "not-the-token\n").expect("token");
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg("logits")
        .arg("--model")
        .arg(&path)
        .args(["--prompt-ids", "407,550", "--threads", "1", "--out"])
        .arg(cluster.placement_path().with_file_name("refused.bin"))
        .arg("--placement")
        .arg(cluster.placement_path())
        .arg("--auth-token-file")
        .arg(&wrong)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("nightshift runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted a wrong token: {err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        err.contains("refused this coordinator") && err.contains("auth token"),
        "{err}"
    );
}

/// The pids of `parent`'s children whose command line has `--node NAME`, with NAME.
fn node_children(parent: u32) -> Vec<(u32, String)> {
    let mut kids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{parent}/task"))
        .expect("tasks")
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        kids.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    kids.into_iter()
        .filter_map(|pid| {
            let args = support::cmdline(pid);
            let i = args.iter().position(|a| a == "--node")?;
            Some((pid, args.get(i + 1)?.clone()))
        })
        .collect()
}

use support::metric_sample as sample;

/// `/metrics` follows each node's health (`nightshift_expert_node_up`, `_suspect`): unpinned
/// local nodes each hold every expert, so a node stopped with SIGSTOP while requests run has its
/// calls hedged on the other one and is shown suspect (and, past its stall deadline, down), the
/// requests all complete, and once it runs again it is up and no longer suspect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_stopped_node_suspect_until_it_answers() {
    build_node_binary();
    let server = support::serve(env!("CARGO_BIN_EXE_nightshift"), |c| {
        c.args(["--threads", "1", "--nodes", "2", "--node-threads", "1"])
            .arg("--model")
            .arg(data("tiny-qwen3moe-Q2_K.gguf"))
    });
    let url = server.url.clone();
    let http = reqwest::Client::new();
    let page = || async {
        http.get(format!("{url}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics body")
    };
    let complete = |n: usize| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body = serde_json::json!({"model": "tiny-qwen3moe-Q2_K", "prompt": format!("request {n}: the"),
                "max_tokens": 24, "temperature": 0, "ignore_eos": true});
            let r = http
                .post(format!("{url}/v1/completions"))
                .json(&body)
                .send()
                .await
                .expect("completion");
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    };
    let nodes = node_children(server.child.id());
    assert_eq!(nodes.len(), 2, "two node processes: {nodes:?}");
    let (pid, name) = nodes[0].clone();
    let up = format!("nightshift_expert_node_up{{node=\"{name}\"}}");
    let suspect = format!("nightshift_expert_node_suspect{{node=\"{name}\"}}");
    // warm up: the nodes' latency windows need calls before a call can be hedged
    for n in 0..4 {
        let (status, text) = complete(n).await;
        assert_eq!(status, 200, "{text}");
    }
    let wait_for = |want_suspect: f64| {
        let page = &page;
        let (up, suspect) = (&up, &suspect);
        async move {
            let t = std::time::Instant::now();
            loop {
                let p = page().await;
                // a stopped node stays suspect; past its stall deadline it is also down until
                // it answers again, so `up` is asked only of a node that is not suspect (a
                // reconnect begun while it was stopped can take the 10 s RPC deadline)
                let up_ok = want_suspect == 1.0 || sample(&p, up) == Some(1.0);
                if sample(&p, suspect) == Some(want_suspect) && up_ok {
                    return p;
                }
                assert!(
                    t.elapsed() < std::time::Duration::from_secs(90),
                    "{suspect} never {want_suspect}:\n{}",
                    p.lines()
                        .filter(|l| l.starts_with("nightshift_expert_node"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    };
    wait_for(0.0).await;

    // SAFETY: kill(2) on a node process this test's server spawned; no memory is touched.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    for n in 4..6 {
        let (status, text) = complete(n).await;
        assert_eq!(status, 200, "with {name} stopped: {text}");
    }
    let p = wait_for(1.0).await;
    let hedges = format!("nightshift_node_hedges_total{{node=\"{name}\"}}");
    assert!(
        sample(&p, &hedges).unwrap_or(0.0) >= 1.0,
        "{hedges} counted"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    wait_for(0.0).await;
    let (status, text) = complete(9).await;
    assert_eq!(status, 200, "after SIGCONT: {text}");
}
