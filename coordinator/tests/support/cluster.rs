//! Helpers of the cluster tests: local clusters of real node processes, explicit placements,
//! greedy generation that returns every logits row, and a bit-for-bit comparison.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nightshift_atlas_core::placement::{LayerPlacement, NodeSpec, Placement};
use nightshift_coordinator::cluster::{LaunchOptions, LocalCluster, RemoteExperts, RemoteOptions};
use nightshift_model::Engine;
use nightshift_model::Model;

/// `nightshift-expert-node` in this test's profile (built once if needed).
pub fn node_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| super::workspace_bin("nightshift-expert-node", "nightshift-expert-node"))
        .clone()
}

pub fn nodes(n: usize) -> Vec<NodeSpec> {
    (0..n)
        .map(|i| NodeSpec::named(format!("node{i}")))
        .collect()
}

pub fn launch(model: &Path, placement: Placement) -> LocalCluster {
    LocalCluster::start(LaunchOptions {
        model: model.to_path_buf(),
        placement,
        threads_per_node: Some(1),
        numa: Vec::new(),
        auth_token_file: None,
        tls: None,
        exe: Some(node_binary()),
        work_dir: std::env::temp_dir().join(format!("nightshift-test-{}", std::process::id())),
        start_timeout: Duration::from_secs(60),
        node_log: "error".into(),
    })
    .expect("cluster starts")
}

/// Prefill `prompt` as one batch then greedy-decode `n` tokens; returns every logits row.
/// `on_step(i)` runs before decode step i (used to kill nodes mid-generation).
pub fn generate(
    e: &mut Engine,
    prompt: &[u32],
    n: usize,
    mut on_step: impl FnMut(usize),
) -> Result<Vec<Vec<f32>>, String> {
    let seq = e.add_sequence().map_err(|e| e.to_string())?;
    let mut rows = e.prefill_all(seq, prompt).map_err(|e| e.to_string())?;
    for i in 0..n {
        on_step(i);
        let last = rows.last().expect("row");
        let tok = nightshift_model::sampler::argmax(last);
        rows.push(e.prefill(seq, &[tok]).map_err(|e| e.to_string())?);
    }
    e.remove_sequence(seq);
    Ok(rows)
}

pub fn assert_bits_equal(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: row count");
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        let same = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{what}: row {r} differs");
    }
}

pub const PROMPT: [u32; 6] = [407, 550, 566, 544, 543, 570];

/// An explicit placement over `n` nodes: expert `e` of every MoE layer on the nodes `homes(e)`,
/// every copy resident.
pub fn explicit(
    shape: &nightshift_atlas_core::placement::ModelShape,
    n: usize,
    homes: impl Fn(usize) -> Vec<usize>,
) -> Placement {
    let layers = shape
        .moe_layers
        .iter()
        .map(|&index| {
            let replicas: Vec<Vec<usize>> = (0..shape.n_experts).map(&homes).collect();
            LayerPlacement {
                index,
                resident: replicas.clone(),
                replicas,
            }
        })
        .collect();
    Placement::from_layers(nodes(n), layers).expect("placement")
}

/// The remote backend over `cluster` with `opts` and the cluster's node token, once every node
/// is up (20 s at most).
pub fn connect(model: &Model, cluster: &LocalCluster, opts: RemoteOptions) -> Arc<RemoteExperts> {
    let opts = RemoteOptions {
        auth_token: Some(cluster.auth_token().to_string()),
        ..opts
    };
    let r = RemoteExperts::connect(
        cluster.placement().clone(),
        model.gguf().fingerprint(),
        model.config().n_embd,
        opts,
    )
    .expect("connect");
    assert!(
        r.wait_all_up(Duration::from_secs(20)),
        "nodes up: {:?}",
        r.status()
    );
    Arc::new(r)
}
