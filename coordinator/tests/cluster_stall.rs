//! Stalls (issue 23): an expert node stopped with SIGSTOP keeps its TCP connection (and its
//! shared-memory region), so without hedging its calls would wait for the whole deadline. With
//! every expert on both nodes, over the streams and over shared memory (shared calls and calls
//! split in advance), the call stuck on the stopped node is hedged on the other one, the node is marked suspect and gets no
//! new work, the generation runs on with logits bit-identical to in process and no failed call,
//! and after SIGCONT the node's late answer clears the mark. With no replica, the call fails at
//! the stall deadline (well before the deadline) naming the node, later calls fail at once while
//! it is down, and once it runs again the cluster serves the same bits as before.

mod support;

use std::time::{Duration, Instant};

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, LocalCluster, RemoteExperts, RemoteOptions};
use nightshift_model::Model;
use support::cluster::{
    assert_bits_equal, connect, explicit, generate, in_process, launch, nodes, PROMPT,
};
use support::{engine, fixture};

/// The tests of this file run one at a time: each stops a node and times how soon its calls
/// move or fail, and the stall deadline is a multiple of the node's recent latency, which five
/// clusters started side by side on a 2-core machine stretch toward the 10 s the test compares
/// with.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn signal(cluster: &LocalCluster, node: &str, sig: i32) {
    let pid = cluster.pid(node).expect("node pid");
    // SAFETY: kill(2) on a child process of this test's cluster; no memory is touched.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signal {sig}");
}

fn wait_trusted(r: &RemoteExperts, node: &str, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if r.status()
            .iter()
            .any(|s| s.name == node && s.up && !s.suspect)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Stops node0 of a two-node cluster holding every expert on both for six decode steps and
/// checks the generation runs on through hedges with the same bits, then that node0 is trusted
/// again after SIGCONT. `link` names the transport under test.
fn stopped_node_is_hedged(opts: RemoteOptions, link: &str) {
    let _serial = one_at_a_time();
    let path = fixture("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let steps = 24;
    let want = in_process(&model, steps);
    let cluster = launch(&path, explicit(&shape, 2, |_| vec![0, 1]));
    // A stall deadline far away: only hedging can keep the stopped node from holding a step.
    let r = connect(
        &model,
        &cluster,
        RemoteOptions {
            deadline: Duration::from_secs(60),
            stall_min: Duration::from_secs(30),
            ..opts.clone()
        },
    );
    let mut e = engine(&model, r.clone());
    let mut last = Instant::now();
    let mut stopped_steps = Vec::new();
    let got = generate(&mut e, &PROMPT, steps, |i| {
        let now = Instant::now();
        if (13..=18).contains(&i) {
            stopped_steps.push(now - last);
        }
        if i == 12 {
            signal(&cluster, "node0", libc::SIGSTOP);
        }
        if i == 18 {
            signal(&cluster, "node0", libc::SIGCONT);
        }
        last = now;
    })
    .expect("generation survives the stopped node");
    assert_bits_equal(
        &got,
        &want,
        &format!("{link}: node0 stopped mid-generation"),
    );
    let st = r.take_stats();
    assert!(st.hedges >= 1, "{link}: the stuck call was hedged: {st:?}");
    assert_eq!(st.errors, 0, "{link}: no call failed: {st:?}");
    let worst = stopped_steps.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{link}: decode steps with node0 stopped: worst {worst:?}, hedges {}, shared-memory calls {} of {}",
        st.hedges, st.shm_calls, st.calls
    );
    assert!(
        worst < Duration::from_secs(10),
        "{link}: a step waited {worst:?}: as long as the old 10 s deadline"
    );
    assert!(
        wait_trusted(&r, "node0", Duration::from_secs(20)),
        "{link}: node0 trusted again after SIGCONT: {:?}",
        r.status()
    );
    let again = generate(&mut e, &PROMPT, 4, |_| {}).expect("after recovery");
    assert_bits_equal(
        &again,
        &want[..again.len()],
        &format!("{link}: after node0 recovered"),
    );
    let st = r.take_stats();
    if opts.shm_pairs > 0 {
        assert!(
            st.shm_calls > 0,
            "{link}: calls went through shared memory again: {st:?}"
        );
    }
    assert_eq!(
        st.link_calls > 0,
        opts.shm_pairs == 0 && opts.net_links > 0,
        "{link}: calls over the data links again: {st:?}"
    );
}

#[test]
fn stopped_node_is_hedged_on_its_replica() {
    stopped_node_is_hedged(
        RemoteOptions {
            shm_pairs: 0,
            net_links: 0,
            ..Default::default()
        },
        "streams",
    );
}

/// The data links (nodes across a network): a share given up on keeps its link held by a
/// background reader until the node answers.
#[test]
fn stopped_link_node_is_hedged_on_its_replica() {
    stopped_node_is_hedged(
        RemoteOptions {
            shm_pairs: 0,
            ..Default::default()
        },
        "data links",
    );
}

/// Shared memory, each call split between the nodes as they go (claim board): the stopped node
/// takes no group, and the call stops waiting for it at its hedge point.
#[test]
fn stopped_shm_node_is_hedged_in_shared_calls() {
    stopped_node_is_hedged(RemoteOptions::default(), "shared memory, shared calls");
}

/// Shared memory, each call split in advance: the stopped node's share goes to the other node.
#[test]
fn stopped_shm_node_is_hedged_on_its_replica() {
    stopped_node_is_hedged(
        RemoteOptions {
            share_work: false,
            ..Default::default()
        },
        "shared memory, split in advance",
    );
}

/// Stops node0 of a round-robin cluster (no replicas): requests fail at the stall deadline,
/// naming it, later ones at once, and once it runs again the cluster serves the same bits.
fn stopped_node_without_replica(opts: RemoteOptions, link: &str) {
    let _serial = one_at_a_time();
    let path = fixture("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let want = in_process(&model, 20);
    let cluster = launch(
        &path,
        Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts),
    );
    let r = connect(
        &model,
        &cluster,
        RemoteOptions {
            stall_min: Duration::from_secs(1),
            ..opts
        },
    );
    let mut e = engine(&model, r.clone());
    // Enough calls for each node's latency window.
    let warm = generate(&mut e, &PROMPT, 20, |_| {}).expect("warm-up");
    assert_bits_equal(&warm, &want, "before the stop");

    signal(&cluster, "node0", libc::SIGSTOP);
    let started = Instant::now();
    let err = generate(&mut e, &PROMPT, 2, |_| {}).expect_err("node0 holds experts alone");
    let took = started.elapsed();
    eprintln!("{link}: request with node0 stopped failed after {took:?}: {err}");
    assert!(err.contains("node0"), "the error names the node: {err}");
    assert!(
        took < Duration::from_secs(10),
        "failed after {took:?}, not before the 10 s deadline"
    );
    let started = Instant::now();
    let err = generate(&mut e, &PROMPT, 2, |_| {}).expect_err("still stopped");
    eprintln!(
        "{link}: next request failed after {:?}: {err}",
        started.elapsed()
    );
    assert!(err.contains("node0"), "{err}");

    signal(&cluster, "node0", libc::SIGCONT);
    assert!(
        r.wait_all_up(Duration::from_secs(30)),
        "node0 back: {:?}",
        r.status()
    );
    let again = generate(&mut e, &PROMPT, 20, |_| {}).expect("after SIGCONT");
    assert_bits_equal(&again, &want, "after node0 runs again");
}

#[test]
fn stopped_node_without_replica_fails_fast_then_recovers() {
    stopped_node_without_replica(
        RemoteOptions {
            shm_pairs: 0,
            net_links: 0,
            ..Default::default()
        },
        "streams",
    );
}

#[test]
fn stopped_link_node_without_replica_fails_fast_then_recovers() {
    stopped_node_without_replica(
        RemoteOptions {
            shm_pairs: 0,
            ..Default::default()
        },
        "data links",
    );
}

#[test]
fn stopped_shm_node_without_replica_fails_fast_then_recovers() {
    stopped_node_without_replica(RemoteOptions::default(), "shared memory");
}
