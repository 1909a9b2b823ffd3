//! The expert cluster with real processes on loopback: 3 expert nodes give logits bit-identical
//! to the in-process engine (both architectures); kill -9 of a node mid-generation with replicas
//! changes nothing; without replicas the layer call fails clearly within the deadline, and the
//! node's restart restores service; nodes refuse a coordinator running another model (malformed
//! messages: `cluster_malformed.rs`); a peer that never answers fails the connection attempt
//! instead of hanging it. The nodes run on this machine, so
//! calls go through the shared-memory link unless a test turns it off: the bit-identity and
//! kill -9 tests run over each transport (and a mix), and check which one carried the calls; a
//! long prefill over the data links gets its answers in parts, bit-identical too.

mod support;

use support::cluster::{assert_bits_equal, explicit, generate, launch, nodes, PROMPT};
use support::engine;
use support::fixture as data;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, LocalCluster, RemoteExperts, RemoteOptions};
use nightshift_model::{ExpertBackend, LocalExperts, Model};

fn remote(model: &Model, cluster: &LocalCluster, deadline: Duration) -> Arc<RemoteExperts> {
    remote_with(model, cluster, deadline, Transport::Shm)
}

/// How layer calls reach the (local) nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    /// Shared memory for every call.
    Shm,
    /// The gRPC streams only.
    Stream,
    /// The framed data links (as to nodes on other machines).
    Link,
    /// Shared memory for calls of at most 2 pairs (decode steps), the stream for the rest.
    Mixed,
}

fn remote_with(
    model: &Model,
    cluster: &LocalCluster,
    deadline: Duration,
    transport: Transport,
) -> Arc<RemoteExperts> {
    let opts = RemoteOptions {
        deadline,
        shm_pairs: match transport {
            Transport::Shm => 1024,
            Transport::Stream | Transport::Link => 0,
            Transport::Mixed => 2,
        },
        net_links: match transport {
            Transport::Link => 2,
            _ => 0,
        },
        ..Default::default()
    };
    support::cluster::connect(model, cluster, opts)
}

fn local(model: &Arc<Model>) -> Arc<dyn ExpertBackend> {
    Arc::new(LocalExperts::new(model.clone(), None))
}

fn check_bit_identical(file: &str) {
    let path = data(file);
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let want =
        generate(&mut engine(&model, local(&model)), &PROMPT, 6, |_| {}).expect("in process");
    let cluster = launch(
        &path,
        Placement::round_robin(nodes(3), &shape.moe_layers, shape.n_experts),
    );
    for transport in [
        Transport::Shm,
        Transport::Stream,
        Transport::Link,
        Transport::Mixed,
    ] {
        let r = remote_with(&model, &cluster, Duration::from_secs(10), transport);
        let got = generate(&mut engine(&model, r.clone()), &PROMPT, 6, |_| {}).expect("cluster");
        assert_bits_equal(&got, &want, &format!("{file} over {transport:?}"));
        check_transport(&r, transport);
    }
}

/// The calls went where `transport` sends them.
fn check_transport(r: &RemoteExperts, transport: Transport) {
    let st = r.take_stats();
    assert!(st.calls > 0 && st.errors == 0, "{transport:?}: {st:?}");
    match transport {
        Transport::Shm => assert_eq!(st.shm_calls, st.calls, "{transport:?}"),
        Transport::Stream | Transport::Link => {
            assert_eq!(st.shm_calls, 0, "{transport:?}");
            let want_link = if transport == Transport::Link {
                st.calls
            } else {
                0
            };
            assert_eq!(st.link_calls, want_link, "{transport:?}: {st:?}");
            // Every stream call came back with the node's timestamps, on this machine's clock:
            // its legs are all known and add up to its round trip.
            assert_eq!(st.legs.len() as u64, st.calls, "legs of {st:?}");
            for l in &st.legs {
                assert!(l.out_us.is_some() && l.back_us.is_some(), "{l:?}");
                let node = l.node_wait_us + l.compute_us + l.node_reply_us;
                let across = l.out_us.unwrap_or(0) + node + l.back_us.unwrap_or(0) + l.wake_us;
                // the legs cover the round trip exactly (up to rounding each to a us)
                assert!(node <= l.total_us, "{l:?}");
                assert!(
                    across <= l.total_us + 1 && across + 6 >= l.total_us,
                    "{l:?}"
                );
            }
            // stream rounds land from the client runtime; link calls are read on this thread
            assert_eq!(
                st.lands_us.is_empty(),
                transport == Transport::Link,
                "{transport:?}: {st:?}"
            );
        }
        Transport::Mixed => assert!(
            st.shm_calls > 0 && st.shm_calls < st.calls,
            "{transport:?}: {} of {} calls through shared memory",
            st.shm_calls,
            st.calls
        ),
    }
}

#[test]
fn three_nodes_bit_identical_qwen3moe() {
    check_bit_identical("tiny-qwen3moe-Q2_K.gguf");
}

#[test]
fn three_nodes_bit_identical_deepseek2() {
    check_bit_identical("tiny-deepseek2-Q4_K_M.gguf");
}

/// A long prompt's prefill gives each node answers of several hundred KiB, which the nodes
/// send in parts over the data links (rows of finished experts ahead of the rest): the logits
/// are the in-process engine's, bit for bit, and parts did arrive.
#[test]
fn data_link_answers_in_parts_are_bit_identical() {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let prompt: Vec<u32> = (0..320u32).map(|i| 300 + (i * 37) % 280).collect();
    let want =
        generate(&mut engine(&model, local(&model)), &prompt, 3, |_| {}).expect("in process");
    let cluster = launch(
        &path,
        Placement::round_robin(nodes(3), &shape.moe_layers, shape.n_experts),
    );
    let r = remote_with(&model, &cluster, Duration::from_secs(10), Transport::Link);
    let got = generate(&mut engine(&model, r.clone()), &prompt, 3, |_| {}).expect("cluster");
    assert_bits_equal(&got, &want, "a long prefill over data links");
    let st = r.take_stats();
    assert!(st.errors == 0 && st.link_calls == st.calls, "{st:?}");
    assert!(st.link_parts > 0, "no answer came in parts: {st:?}");
}

/// Every expert on two of three nodes.
fn replicated(shape: &nightshift_atlas_core::placement::ModelShape) -> Placement {
    explicit(shape, 3, |e| vec![e % 3, (e + 1) % 3])
}

fn kill_9_with_replicas(transport: Transport) {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let want =
        generate(&mut engine(&model, local(&model)), &PROMPT, 12, |_| {}).expect("in process");
    let cluster = launch(&path, replicated(&shape));
    let r = remote_with(&model, &cluster, Duration::from_secs(5), transport);
    let mut e = engine(&model, r.clone());
    let started = Instant::now();
    let got = generate(&mut e, &PROMPT, 12, |i| {
        if i == 4 {
            let pid = cluster.pid("node1").expect("pid");
            // SAFETY: kill(2) on a child process id we spawned; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    })
    .expect("no failed step with replicas");
    assert_bits_equal(
        &got,
        &want,
        &format!("kill -9 with replicas over {transport:?}"),
    );
    // The dead node is noticed from its broken stream, not by waiting out the 5 s deadline.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{transport:?}: generation took {:?}",
        started.elapsed()
    );
    let st = r.take_stats();
    if transport == Transport::Shm {
        assert!(st.shm_calls > 0, "{st:?}");
    }
    if transport == Transport::Link {
        assert!(st.link_calls > 0, "{st:?}");
    }
}

#[test]
fn kill_9_with_replicas_changes_nothing_over_data_links() {
    kill_9_with_replicas(Transport::Link);
}

#[test]
fn kill_9_with_replicas_changes_nothing_over_shared_memory() {
    kill_9_with_replicas(Transport::Shm);
}

#[test]
fn kill_9_with_replicas_changes_nothing_over_streams() {
    kill_9_with_replicas(Transport::Stream);
}

#[test]
fn without_replicas_errors_within_deadline_then_recovers() {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let want =
        generate(&mut engine(&model, local(&model)), &PROMPT, 3, |_| {}).expect("in process");
    let cluster = launch(
        &path,
        Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts),
    );
    let r = remote(&model, &cluster, Duration::from_secs(2));
    let mut e = engine(&model, r.clone());
    cluster.kill_and_hold("node1");
    let start = Instant::now();
    let err = generate(&mut e, &PROMPT, 3, |_| {}).expect_err("experts of node1 are gone");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "error took {:?}",
        start.elapsed()
    );
    assert!(
        err.contains("no live replica") || err.contains("every replica failed"),
        "unclear error: {err}"
    );
    assert!(err.contains("node1"), "error does not name the node: {err}");
    // The coordinator side stays usable: restart the node, it rejoins, results are exact again.
    cluster.resume("node1").expect("restart");
    assert!(
        r.wait_all_up(Duration::from_secs(20)),
        "node1 did not rejoin: {:?}",
        r.status()
    );
    let mut e = engine(&model, r.clone());
    let got = generate(&mut e, &PROMPT, 3, |_| {}).expect("served again");
    assert_bits_equal(&got, &want, "after restart");
}

#[test]
fn node_with_another_model_is_refused() {
    let model = Model::load(&data("tiny-qwen3moe-Q2_K.gguf")).expect("model");
    let other = data("tiny-qwen3moe-Q4_K_M.gguf");
    let shape = model_shape(&model).expect("shape");
    let cluster = launch(
        &other,
        Placement::round_robin(nodes(1), &shape.moe_layers, shape.n_experts),
    );
    let opts = RemoteOptions {
        deadline: Duration::from_secs(2),
        auth_token: Some(cluster.auth_token().to_string()),
        ..Default::default()
    };
    let r = RemoteExperts::connect(
        cluster.placement().clone(),
        model.gguf().fingerprint(),
        model.config().n_embd,
        opts,
    )
    .expect("connect");
    let started = Instant::now();
    assert!(!r.wait_all_up(Duration::from_secs(20)));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a refusal is final: {:?}",
        started.elapsed()
    );
    let st = r.status();
    assert!(st[0].detail.contains("refused") && st[0].refused, "{st:?}");
}

/// A spawned cluster's nodes require the token it made: a coordinator without it, or with
/// another one, is refused at once (not retried until a timeout), and the refusal names the
/// token; with it, the nodes serve.
#[test]
fn local_nodes_require_their_fresh_token() {
    let model = Model::load(&data("tiny-qwen3moe-Q2_K.gguf")).expect("model");
    let shape = model_shape(&model).expect("shape");
    let cluster = launch(
        &data("tiny-qwen3moe-Q2_K.gguf"),
        Placement::round_robin(nodes(1), &shape.moe_layers, shape.n_experts),
    );
    assert_eq!(cluster.auth_token().len(), 64, "256 random bits, hex");
    for token in [None, Some("not-the-token".to_string())] {
        let r = RemoteExperts::connect(
            cluster.placement().clone(),
            model.gguf().fingerprint(),
            model.config().n_embd,
            RemoteOptions {
                auth_token: token.clone(),
                ..Default::default()
            },
        )
        .expect("connect");
        let started = Instant::now();
        assert!(
            !r.wait_all_up(Duration::from_secs(20)),
            "{token:?} accepted"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{token:?}: {:?}",
            started.elapsed()
        );
        let st = r.status();
        assert!(
            st[0].refused && st[0].detail.contains("auth token"),
            "{token:?}: {st:?}"
        );
    }
    // The attack of issue 19: one unauthenticated DropExperts from any local process.
    let addr = cluster.placement().nodes[0].addr.clone().expect("addr");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dropped = rt.block_on(async {
        use nightshift_proto::v1::{expert_service_client::ExpertServiceClient, *};
        let mut c = ExpertServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("dial the node");
        c.drop_experts(DropExpertsRequest {
            experts: vec![ExpertRef {
                layer: shape.moe_layers[0] as u32,
                expert: 0,
            }],
        })
        .await
    });
    let st = dropped.expect_err("an unauthenticated DropExperts must be refused");
    assert_eq!(st.code(), tonic::Code::Unauthenticated, "{st:?}");
    let r = remote(&model, &cluster, Duration::from_secs(5));
    assert!(r.status()[0].up);
    let mut e = support::engine(&model, r.clone());
    generate(&mut e, &PROMPT, 2, |_| {}).expect("the node still serves every expert");
}

/// Something that accepts the connection and never answers (a stopped or wedged node, or not
/// a node at all) fails the connection attempt within the connect timeout: construction and
/// the background reconnects never hang on it.
#[test]
fn a_silent_node_fails_the_attempt_instead_of_hanging() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let model = Model::load(&data("tiny-qwen3moe-Q2_K.gguf")).expect("model");
    let shape = model_shape(&model).expect("shape");
    let mut node = nightshift_atlas_core::placement::NodeSpec::named("silent");
    node.addr = Some(addr);
    let placement = Placement::round_robin(vec![node], &shape.moe_layers, shape.n_experts);
    let opts = RemoteOptions {
        connect_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let started = Instant::now();
    let r = RemoteExperts::connect(
        placement,
        model.gguf().fingerprint(),
        model.config().n_embd,
        opts,
    )
    .expect("connect");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let st = r.status();
    assert!(
        !st[0].up && st[0].detail.contains("no answer within 300 ms"),
        "{st:?}"
    );
}

/// Stopping a cluster stops its nodes together: three nodes that each drain a coordinator's
/// open streams until the 3 s grace period ends stop in one period, not three (9 s before).
#[test]
fn nodes_are_stopped_in_parallel() {
    let model = Model::load(&data("tiny-qwen3moe-Q2_K.gguf")).expect("model");
    let shape = model_shape(&model).expect("shape");
    let mut cluster = launch(
        &data("tiny-qwen3moe-Q2_K.gguf"),
        Placement::round_robin(nodes(3), &shape.moe_layers, shape.n_experts),
    );
    let pids: Vec<u32> = ["node0", "node1", "node2"]
        .iter()
        .map(|n| cluster.pid(n).expect("pid"))
        .collect();
    let r = remote(&model, &cluster, Duration::from_secs(5));
    let t0 = Instant::now();
    cluster.stop();
    let took = t0.elapsed();
    drop(r);
    assert!(
        took < Duration::from_secs(6),
        "stopping 3 nodes took {took:?}"
    );
    for pid in pids {
        // SAFETY: kill(2) with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
        assert!(!alive, "node {pid} still running");
    }
}
