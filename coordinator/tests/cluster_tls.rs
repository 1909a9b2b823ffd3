//! TLS between coordinator and expert nodes with real processes on loopback: nodes spawned with
//! a certificate from a test CA and requiring client certificates (mutual TLS) serve logits
//! bit-identical to the in-process engine; a coordinator that trusts another CA, one that dials
//! in plaintext, and one without a client certificate are all refused with a reason that says so.

mod support;

use support::certs::Ca;
use support::engine;
use support::fixture as data;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::{NodeSpec, Placement};
use nightshift_coordinator::cluster::{
    model_shape, ClientTls, LaunchOptions, LocalCluster, NodeTls, RemoteExperts, RemoteOptions,
};
use nightshift_model::{Engine, LocalExperts, Model};

/// Logits of every position of `prompt`, prefilled as one batch.
fn logits(e: &mut Engine, prompt: &[u32]) -> Vec<Vec<f32>> {
    support::cluster::generate(e, prompt, 0, |_| {}).expect("forward")
}

fn connect(model: &Model, cluster: &LocalCluster, tls: Option<ClientTls>) -> RemoteExperts {
    let opts = RemoteOptions {
        deadline: Duration::from_secs(10),
        tls,
        auth_token: Some(cluster.auth_token().to_string()),
        ..Default::default()
    };
    RemoteExperts::connect(
        cluster.placement().clone(),
        model.gguf().fingerprint(),
        model.config().n_embd,
        opts,
    )
    .expect("connect")
}

/// Waits a moment and returns every node's down reason (panics if one came up).
fn refused(r: &RemoteExperts) -> Vec<String> {
    assert!(
        !r.wait_all_up(Duration::from_secs(3)),
        "nodes must refuse: {:?}",
        r.status()
    );
    r.status()
        .into_iter()
        .map(|s| {
            assert!(!s.up, "{} came up", s.name);
            s.detail
        })
        .collect()
}

#[test]
fn mutual_tls_cluster_serves_and_refuses_strangers() {
    let dir = tempfile_dir();
    let ca = Ca::new(&dir, "cluster");
    let other = Ca::new(&dir, "other");
    let (node_cert, node_key) = ca.issue(&dir, "node", &["localhost", "127.0.0.1"]);
    let (client_cert, client_key) = ca.issue(&dir, "coordinator", &["coordinator"]);
    let (stray_cert, stray_key) = other.issue(&dir, "stray", &["coordinator"]);

    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let nodes = (0..2)
        .map(|i| NodeSpec::named(format!("node{i}")))
        .collect();
    let cluster = LocalCluster::start(LaunchOptions {
        model: path.clone(),
        placement: Placement::round_robin(nodes, &shape.moe_layers, shape.n_experts),
        threads_per_node: Some(1),
        numa: Vec::new(),
        auth_token_file: None,
        tls: Some(NodeTls {
            cert: node_cert,
            key: node_key,
            client_ca: Some(ca.pem.clone()),
        }),
        exe: Some(support::workspace_bin(
            "nightshift-expert-node",
            "nightshift-expert-node",
        )),
        work_dir: dir.clone(),
        start_timeout: Duration::from_secs(60),
        node_log: "error".into(),
    })
    .expect("cluster starts");

    let good =
        ClientTls::from_files(&ca.pem, None, Some((&client_cert, &client_key))).expect("tls");
    let r = Arc::new(connect(&model, &cluster, Some(good)));
    assert!(
        r.wait_all_up(Duration::from_secs(20)),
        "up over TLS: {:?}",
        r.status()
    );
    let prompt = [407, 550, 566, 544, 543, 570];
    let want = logits(
        &mut engine(&model, Arc::new(LocalExperts::new(model.clone(), None))),
        &prompt,
    );
    let got = logits(&mut engine(&model, r.clone()), &prompt);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {i} differs over TLS"
        );
    }
    assert!(r.take_stats().calls > 0, "expert calls went to the nodes");

    let cases: Vec<(&str, Option<ClientTls>, &str)> = vec![
        (
            "node certificate from an untrusted CA",
            Some(
                ClientTls::from_files(&other.pem, None, Some((&client_cert, &client_key)))
                    .expect("tls"),
            ),
            "UnknownIssuer",
        ),
        ("plaintext client", None, "connect"),
        (
            "no client certificate",
            Some(ClientTls::from_files(&ca.pem, None, None).expect("tls")),
            "pass --tls-client-cert and --tls-client-key",
        ),
        (
            "client certificate from another CA",
            Some(
                ClientTls::from_files(&ca.pem, None, Some((&stray_cert, &stray_key))).expect("tls"),
            ),
            "check that its --tls-client-ca signed --tls-client-cert",
        ),
        (
            "wrong expected name",
            Some(
                ClientTls::from_files(
                    &ca.pem,
                    Some("node.example".into()),
                    Some((&client_cert, &client_key)),
                )
                .expect("tls"),
            ),
            "certificate not valid for name \"node.example\"",
        ),
    ];
    for (what, tls, expect) in cases {
        let reasons = refused(&connect(&model, &cluster, tls));
        for reason in reasons {
            eprintln!("{what}: {reason}");
            assert!(
                reason.contains(expect),
                "{what}: reason {reason:?} lacks {expect:?}"
            );
        }
    }
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("nightshift-tls-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// Runs `nightshift logits` on the tiny model with `extra` flags; returns (success, stderr, file).
fn cli_logits(dir: &Path, out: &str, extra: &[&std::ffi::OsStr]) -> (bool, String, Vec<u8>) {
    let out = dir.join(out);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg("logits")
        .arg("--model")
        .arg(data("tiny-qwen3moe-Q2_K.gguf"))
        .args([
            "--prompt-ids",
            "407,550,566",
            "--decode-ids",
            "543,570",
            "--threads",
            "1",
        ])
        .arg("--out")
        .arg(&out)
        .args(extra)
        .output()
        .expect("nightshift runs");
    let file = std::fs::read(&out).unwrap_or_default();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        file,
    )
}

/// The command-line flags wire it all: `--nodes 2` with node certificates and a client
/// certificate gives the in-process logits byte for byte; `--tls-ca` without node certificates
/// for spawned nodes is refused before anything starts.
#[test]
fn cli_flags_spawn_a_mutual_tls_cluster() {
    support::workspace_bin("nightshift-expert-node", "nightshift-expert-node");
    let dir = tempfile_dir().join("cli");
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = Ca::new(&dir, "cli");
    let (nc, nk) = ca.issue(&dir, "node", &["localhost", "127.0.0.1"]);
    let (cc, ck) = ca.issue(&dir, "coordinator", &["coordinator"]);
    let (ok, err, local) = cli_logits(&dir, "local.bin", &[]);
    assert!(ok && !local.is_empty(), "in process: {err}");
    let flags: Vec<&std::ffi::OsStr> = vec![
        "--nodes".as_ref(),
        "2".as_ref(),
        "--node-threads".as_ref(),
        "1".as_ref(),
        "--tls-ca".as_ref(),
        ca.pem.as_os_str(),
        "--node-tls-cert".as_ref(),
        nc.as_os_str(),
        "--node-tls-key".as_ref(),
        nk.as_os_str(),
        "--tls-client-cert".as_ref(),
        cc.as_os_str(),
        "--tls-client-key".as_ref(),
        ck.as_os_str(),
    ];
    let (ok, err, tls) = cli_logits(&dir, "tls.bin", &flags);
    assert!(ok, "mutual TLS cluster: {err}");
    assert!(
        tls == local,
        "logits differ between in-process and the TLS cluster"
    );

    let (ok, err, _) = cli_logits(&dir, "none.bin", &flags[..6]);
    assert!(!ok, "--tls-ca without node certificates must fail");
    assert!(err.contains("--node-tls-cert"), "{err}");
}
