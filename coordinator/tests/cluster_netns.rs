//! The cluster across network namespaces (issue 23): the coordinator and two expert nodes each in
//! their own namespace behind a bridge, links capped at 10 Gbit/s by `tc tbf`, mutual TLS, and
//! the coordinator dialling either directly or through the delay relays (50 us each way), for
//! qwen3moe and for deepseek2 (whose shared expert runs while the routed experts are out). The
//! logits are bit-identical to the in-process engine's, every layer call went over TCP, and the
//! nodes' addresses are unreachable from the root namespace. Skipped, saying why, where network
//! namespaces cannot be made (not root); `NIGHTSHIFT_REQUIRE_NETNS` turns that into a failure.

mod support;

use std::time::Duration;

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, netns, RemoteOptions};
use nightshift_model::Model;
use support::cluster::{
    assert_bits_equal, connect_netns, generate, in_process, netns_cluster, netns_or_skip, nodes,
    PROMPT,
};
use support::{engine, fixture};

#[test]
fn tls_cluster_across_namespaces_matches_in_process() {
    if !netns_or_skip("tls_cluster_across_namespaces_matches_in_process") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("nightshift-netns-{}", std::process::id()));
    // deepseek2 has a shared expert: computed while the routed experts cross the network.
    let runs = [
        ("tiny-qwen3moe-Q2_K.gguf", None),
        ("tiny-qwen3moe-Q2_K.gguf", Some(Duration::from_micros(50))),
        (
            "tiny-deepseek2-Q4_K_M.gguf",
            Some(Duration::from_micros(50)),
        ),
    ];
    for (file, delay) in runs {
        let path = fixture(file);
        let model = Model::load(&path).expect("model");
        let shape = model_shape(&model).expect("shape");
        let want = in_process(&model, 4);
        let placement = Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts);
        let (cluster, tls) = netns_cluster(&path, placement, &dir, "10gbit", delay);
        // The harness's addresses exist only inside the namespaces (a connect from here is no
        // test: some sandboxes answer every outbound connection).
        let root = std::process::Command::new("ip")
            .args(["-o", "addr", "show"])
            .output()
            .expect("ip addr");
        let root = String::from_utf8_lossy(&root.stdout);
        assert!(
            !root.contains(&netns::node_ip(0).to_string()) && !root.contains("10.77.0.1/"),
            "harness addresses leaked into the root namespace: {root}"
        );
        let r = connect_netns(&model, &cluster, tls, RemoteOptions::default());
        let got = generate(&mut engine(&model, r.clone()), &PROMPT, 4, |_| {})
            .expect("across namespaces");
        assert_bits_equal(
            &got,
            &want,
            &format!("{file} across namespaces, relay {delay:?}"),
        );
        let st = r.take_stats();
        assert!(st.calls > 0, "expert calls went to the nodes");
        assert_eq!(st.shm_calls, 0, "no call may bypass the network");
        assert_eq!(st.errors, 0, "no call failed");
        // Every call went over the nodes' mutual-TLS data links (through the relays too).
        assert_eq!(st.link_calls, st.calls, "{file}, relay {delay:?}: {st:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A partition and a throttled link, with every expert on both nodes: node 0's link set down
/// inside its namespace mid-generation, then (back up) capped at 100 kbit/s: this model's calls
/// are ~2 KB, so that cap holds one back as long as a few Mbit/s hold a K2-sized call (~230 KB at
/// batch 8), far beyond the scheduling noise of a loaded machine. Calls stuck on it are hedged on
/// node 1 and the logits stay bit-identical; once the link is back and fast the node is trusted
/// again.
#[test]
fn partition_and_throttle_hedge_to_the_replica() {
    if !netns_or_skip("partition_and_throttle_hedge_to_the_replica") {
        return;
    }
    let path = fixture("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let steps = 40;
    let want = in_process(&model, steps);
    let dir = std::env::temp_dir().join(format!("nightshift-netns-part-{}", std::process::id()));
    let placement = support::cluster::explicit(&shape, 2, |_| vec![0, 1]);
    let (cluster, tls) = netns_cluster(&path, placement, &dir, "10gbit", None);
    let r = connect_netns(
        &model,
        &cluster,
        tls,
        RemoteOptions {
            deadline: Duration::from_secs(60),
            stall_min: Duration::from_secs(30),
            hedge_min: Duration::from_millis(5),
            ..Default::default()
        },
    );
    let mut e = engine(&model, r.clone());
    let mut hedges = Vec::new();
    let got = generate(&mut e, &PROMPT, steps, |i| {
        match i {
            10 => cluster.set_link(0, false).expect("link down"),
            15 => {
                cluster.set_link(0, true).expect("link up");
                hedges.push(r.take_stats().hedges);
                // The late answer of the stuck call clears the suspect mark.
                wait_trusted(&r, "node0");
            }
            20 => {
                hedges.push(r.take_stats().hedges);
                cluster.set_rate(0, "100kbit").expect("throttle")
            }
            _ => {}
        }
    })
    .expect("generation survives the partition and the throttle");
    let st = r.take_stats();
    eprintln!(
        "throttled phase: {} calls, {} B out, {} B in, p50 {:?} us, p99 {:?} us, status {:?}",
        st.calls,
        st.bytes_out,
        st.bytes_in,
        st.latency_quantile_us(0.5),
        st.latency_quantile_us(0.99),
        r.status()
    );
    hedges.push(st.hedges);
    assert_bits_equal(&got, &want, "partition then throttle");
    eprintln!("hedges: partition {}, throttle {}", hedges[0], hedges[2]);
    assert!(
        hedges[0] >= 1,
        "calls stuck behind the partition were hedged"
    );
    assert!(
        hedges[2] >= 1,
        "calls slowed by the 100 kbit/s cap were hedged"
    );
    cluster.set_rate(0, "10gbit").expect("unthrottle");
    wait_trusted(&r, "node0");
    drop(e);
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (30 s at most) until `node` is up and not suspect.
fn wait_trusted(r: &nightshift_coordinator::cluster::RemoteExperts, node: &str) {
    let start = std::time::Instant::now();
    while r
        .status()
        .iter()
        .any(|s| s.name == node && (s.suspect || !s.up))
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{node} trusted again: {:?}",
            r.status()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
