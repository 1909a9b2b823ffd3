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

/// The reference a cluster is compared with: [`generate`] over [`PROMPT`] for `n` tokens with
/// every expert computed in process.
#[allow(dead_code)] // not every test binary compares against it
pub fn in_process(model: &Arc<Model>, n: usize) -> Vec<Vec<f32>> {
    let local = Arc::new(nightshift_model::LocalExperts::new(model.clone(), None));
    generate(&mut super::engine(model, local), &PROMPT, n, |_| {}).expect("in process")
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

/// Whether the multi-host harness can run here. Without permission to add network namespaces
/// the caller skips (saying so), unless `NIGHTSHIFT_REQUIRE_NETNS` is set (the test scripts set
/// it when running as root), where that is a failure.
pub fn netns_or_skip(test: &str) -> bool {
    match nightshift_coordinator::cluster::netns::available() {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var_os("NIGHTSHIFT_REQUIRE_NETNS").is_none(),
                "{test}: NIGHTSHIFT_REQUIRE_NETNS is set but {e}"
            );
            eprintln!("SKIPPED {test}: {e}");
            false
        }
    }
}

/// A TLS cluster of `n` nodes in network namespaces serving `placement`, with mutual TLS from a
/// fresh test CA in `dir`, links capped at `rate`, and `delay` added each way by relays (or
/// none). Returns the cluster and the coordinator's TLS settings.
pub fn netns_cluster(
    model: &Path,
    placement: Placement,
    dir: &Path,
    rate: &str,
    delay: Option<Duration>,
) -> (
    nightshift_coordinator::cluster::netns::NetnsCluster,
    nightshift_coordinator::cluster::ClientTls,
) {
    use nightshift_coordinator::cluster::{netns, ClientTls, NodeTls};
    std::fs::create_dir_all(dir).expect("dir");
    let ca = super::certs::Ca::new(dir, "netns");
    let n = placement.nodes.len();
    let (cert, key) = ca.issue(dir, "node", &netns::node_cert_names(n));
    let (cc, ck) = ca.issue(dir, "coordinator", &["coordinator"]);
    let cluster = netns::NetnsCluster::start(netns::NetnsOptions {
        model: model.to_path_buf(),
        placement,
        threads_per_node: Some(1),
        tls: Some(NodeTls {
            cert,
            key,
            client_ca: Some(ca.pem.clone()),
        }),
        exe: node_binary(),
        work_dir: dir.to_path_buf(),
        rate: rate.to_string(),
        delay,
        start_timeout: Duration::from_secs(60),
        node_log: "error".into(),
    })
    .expect("netns cluster starts");
    let tls = ClientTls::from_files(&ca.pem, None, Some((&cc, &ck))).expect("client tls");
    (cluster, tls)
}

/// The remote backend of a netns cluster, built in the coordinator's namespace with `opts`
/// (over TCP only: shared memory would bypass the network), once every node is up.
pub fn connect_netns(
    model: &Model,
    cluster: &nightshift_coordinator::cluster::netns::NetnsCluster,
    tls: nightshift_coordinator::cluster::ClientTls,
    opts: RemoteOptions,
) -> Arc<RemoteExperts> {
    let opts = RemoteOptions {
        auth_token: Some(cluster.auth_token().to_string()),
        tls: Some(tls),
        shm_pairs: 0,
        ..opts
    };
    let placement = cluster.placement().clone();
    let (fp, n_embd) = (model.gguf().fingerprint(), model.config().n_embd);
    let r = cluster
        .in_coord(move || RemoteExperts::connect(placement, fp, n_embd, opts))
        .expect("enter the coordinator namespace")
        .expect("connect");
    assert!(
        r.wait_all_up(Duration::from_secs(20)),
        "nodes up across namespaces: {:?}",
        r.status()
    );
    Arc::new(r)
}
