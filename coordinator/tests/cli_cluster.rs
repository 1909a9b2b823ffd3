//! `nightshift logits` and `nightshift generate` take the cluster flags: with `--nodes 2` the
//! logits file is byte-identical to the in-process one, and generate's greedy text is the same.
//! A command that ends leaves none of its shared-memory files (regions, claim board) behind.

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
