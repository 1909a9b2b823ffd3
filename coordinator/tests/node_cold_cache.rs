//! Expert nodes with a staging cache of cold experts (`nightshift-expert-node --cold-cache`):
//! real node processes over real sockets, keeping a quarter of their experts resident
//! (`--memory-budget 25%`) and reading the rest whole through a cache that holds one expert, so
//! nearly every layer call evicts. Two nodes splitting the experts, over shared memory and over
//! gRPC streams, give outputs bit-identical to the in-process engine, and so do three nodes
//! holding every expert that share each call through the claim board (each reading the cold
//! experts of the groups it takes); each node's log shows the cache was read through and
//! evicted from (the summary it logs at exit) and its size (the ready line).

mod support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, LaunchOptions, LocalCluster, RemoteOptions};
use nightshift_model::cold::ColdCache;
use nightshift_model::{ExpertMemory, LoadOptions, Model};
use support::cluster::PROMPT;
use support::cluster::{
    assert_bits_equal, connect, explicit, generate, in_process, node_binary, nodes,
};

/// A script running the node with `extra` arguments after its own, its stderr appended to `log`.
fn wrapper(dir: &Path, extra: &str, log: &Path) -> PathBuf {
    let path = dir.join("node-cold.sh");
    let mut f = std::fs::File::create(&path).expect("wrapper");
    writeln!(
        f,
        "#!/bin/sh\nexec {} \"$@\" {extra} 2>>{}",
        node_binary().display(),
        log.display()
    )
    .expect("write wrapper");
    drop(f);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// The counter called `what` in the cold cache summary line `line` (`ColdStats::summary`).
fn counter(line: &str, what: &str) -> u64 {
    let tail = &line[line.find("cold cache: ").expect("summary") + "cold cache: ".len()..];
    tail.split(", ")
        .find_map(|part| {
            let (n, rest) = part.split_once(' ')?;
            rest.starts_with(what).then(|| n.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no {what} in {line}"))
}

#[test]
fn nodes_reading_cold_experts_through_a_one_expert_cache_match_in_process() {
    let model_path = support::fixture("tiny-qwen3moe-Q4_K_M.gguf");
    let model = Model::load_with(
        &model_path,
        LoadOptions {
            experts: ExpertMemory::Mapped,
            ..LoadOptions::default()
        },
    )
    .expect("model");
    let want = in_process(&model, 8);
    // one expert: the largest footprint any expert takes in a cache
    let probe = ColdCache::new(model.clone(), 0).expect("probe");
    let shape = model_shape(&model).expect("shape");
    let mut largest = 0;
    for &l in &shape.moe_layers {
        for e in 0..shape.n_experts as u32 {
            largest = largest.max(probe.footprint(l, e).expect("footprint"));
        }
    }
    drop(probe);

    let work = std::env::temp_dir().join(format!("nightshift-node-cold-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let split = Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts);
    // every expert on each of three nodes: calls are shared through the claim board
    let everywhere = explicit(&shape, 3, |_| (0..3).collect());
    for (arm, placement, opts) in [
        ("shared memory", split.clone(), RemoteOptions::default()),
        (
            "grpc",
            split,
            RemoteOptions {
                shm_pairs: 0,
                ..RemoteOptions::default()
            },
        ),
        ("shared calls", everywhere, RemoteOptions::default()),
    ] {
        let n = placement.nodes.len();
        let log = work.join(format!("nodes-{}.log", arm.replace(' ', "-")));
        let _ = std::fs::remove_file(&log);
        let exe = wrapper(
            &work,
            &format!("--memory-budget 25% --cold-cache {largest}"),
            &log,
        );
        let mut cluster = LocalCluster::start(LaunchOptions {
            model: model_path.clone(),
            placement,
            // one worker over shared memory, two (groups taken side by side) otherwise
            threads_per_node: Some(if arm == "shared memory" { 1 } else { 2 }),
            numa: Vec::new(),
            auth_token_file: None,
            tls: None,
            exe: Some(exe),
            work_dir: work.clone(),
            start_timeout: Duration::from_secs(60),
            node_log: "info".into(),
        })
        .expect("cluster starts");
        let remote = connect(&model, &cluster, opts);
        let got = generate(
            &mut support::engine(&model, remote.clone()),
            &PROMPT,
            8,
            |_| {},
        )
        .expect("cluster generates");
        assert_bits_equal(
            &got,
            &want,
            &format!("{arm}: nodes with a one-expert cold cache"),
        );
        let st = remote.take_stats();
        assert_eq!(
            st.shared_rounds > 0,
            arm == "shared calls",
            "{arm}: shared calls {st:?}"
        );
        drop(remote);
        cluster.stop();
        let text = support::plain(&std::fs::read_to_string(&log).expect("node log"));
        let ready: Vec<&str> = text.lines().filter(|l| l.contains("node ready")).collect();
        assert_eq!(ready.len(), n, "{arm}: a ready line per node in {text}");
        for l in &ready {
            assert!(l.contains("cold_cache_kib="), "{arm}: {l}");
        }
        let summaries: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("cold cache: "))
            .collect();
        assert_eq!(summaries.len(), n, "{arm}: a summary per node in {text}");
        let total = |what: &str| -> u64 { summaries.iter().map(|s| counter(s, what)).sum() };
        assert!(total("misses") > 0, "{arm}: {summaries:?}");
        assert!(total("evicted") > 0, "{arm}: {summaries:?}");
        assert_eq!(total("read ahead"), 0, "{arm}: no predictions reach a node");
        if arm != "shared calls" {
            // each node computes every call of its experts: each reads through its cache
            for s in &summaries {
                assert!(counter(s, "misses") > 0, "{arm}: {s}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}
