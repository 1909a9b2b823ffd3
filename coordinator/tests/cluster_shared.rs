//! Shared calls with real node processes: when several nodes on this machine hold every expert
//! of a layer call, the coordinator posts the whole call to each and they split it through the
//! claim board as they go. Logits stay bit-identical to the in-process engine (both
//! architectures), the same cluster with the calls split in advance gives the same bits, and a
//! node killed with kill -9 mid-generation changes nothing: the groups it took are retried on
//! the others. Several callers at once all get the same bits.

mod support;

use support::cluster::{assert_bits_equal, explicit, generate, launch, PROMPT};
use support::engine;
use support::fixture as data;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_atlas_core::placement::{ModelShape, Placement};
use nightshift_coordinator::cluster::{model_shape, LocalCluster, RemoteExperts, RemoteOptions};
use nightshift_model::{LocalExperts, Model};

fn remote(model: &Model, cluster: &LocalCluster, share_work: bool) -> Arc<RemoteExperts> {
    let opts = RemoteOptions {
        deadline: Duration::from_secs(5),
        share_work,
        ..Default::default()
    };
    support::cluster::connect(model, cluster, opts)
}

/// Every expert on every one of `n` nodes.
fn everywhere(shape: &ModelShape, n: usize) -> Placement {
    explicit(shape, n, |_| (0..n).collect())
}

fn check_bit_identical(file: &str) {
    let path = data(file);
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let local = Arc::new(LocalExperts::new(model.clone(), None));
    let want = generate(&mut engine(&model, local), &PROMPT, 6, |_| {}).expect("in process");
    let cluster = launch(&path, everywhere(&shape, 3));
    for share_work in [true, false] {
        let r = remote(&model, &cluster, share_work);
        let got = generate(&mut engine(&model, r.clone()), &PROMPT, 6, |_| {}).expect("cluster");
        let what = format!("{file}, share_work {share_work}");
        assert_bits_equal(&got, &want, &what);
        let st = r.take_stats();
        assert!(st.calls > 0 && st.errors == 0, "{what}: {st:?}");
        assert_eq!(st.shm_calls, st.calls, "{what}");
        if share_work {
            // Every layer call of this model routes to several experts: all are shared, and
            // each went to all three nodes.
            assert!(st.shared_rounds > 0, "{what}: {st:?}");
            assert_eq!(st.calls, 3 * st.shared_rounds, "{what}: {st:?}");
        } else {
            assert_eq!(st.shared_rounds, 0, "{what}");
        }
    }
}

#[test]
fn shared_calls_are_bit_identical_qwen3moe() {
    check_bit_identical("tiny-qwen3moe-Q2_K.gguf");
}

#[test]
fn shared_calls_are_bit_identical_deepseek2() {
    check_bit_identical("tiny-deepseek2-Q4_K_M.gguf");
}

#[test]
fn kill_9_during_shared_calls_changes_nothing() {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let local = Arc::new(LocalExperts::new(model.clone(), None));
    let want = generate(&mut engine(&model, local), &PROMPT, 12, |_| {}).expect("in process");
    let cluster = launch(&path, everywhere(&shape, 3));
    let r = remote(&model, &cluster, true);
    let mut e = engine(&model, r.clone());
    let mut before = None;
    let started = Instant::now();
    let got = generate(&mut e, &PROMPT, 12, |i| {
        if i == 4 {
            before = Some(r.take_stats());
            let pid = cluster.pid("node1").expect("pid");
            // SAFETY: kill(2) on a child process id we spawned; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    })
    .expect("no failed step with every expert on every node");
    assert_bits_equal(&got, &want, "kill -9 during shared calls");
    // Noticed from the node's broken stream, not by waiting out the 5 s deadline.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "generation took {:?}",
        started.elapsed()
    );
    let before = before.expect("stats before the kill");
    assert!(before.shared_rounds > 0 && before.errors == 0, "{before:?}");
    // After the kill the two survivors still share the calls.
    let after = r.take_stats();
    assert!(after.shared_rounds > 0, "{after:?}");
}

/// Several engines calling one backend at once: a call finding the board (or a node's region)
/// taken by another goes the ordinary way, and every caller still gets the in-process bits.
#[test]
fn concurrent_callers_get_the_same_bits() {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let local = Arc::new(LocalExperts::new(model.clone(), None));
    let want = generate(&mut engine(&model, local), &PROMPT, 8, |_| {}).expect("in process");
    let cluster = launch(&path, everywhere(&shape, 2));
    let r = remote(&model, &cluster, true);
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let (m, r) = (model.clone(), r.clone());
            std::thread::spawn(move || generate(&mut engine(&m, r), &PROMPT, 8, |_| {}))
        })
        .collect();
    for (i, c) in callers.into_iter().enumerate() {
        let got = c.join().expect("caller").expect("generation");
        assert_bits_equal(&got, &want, &format!("caller {i}"));
    }
    let st = r.take_stats();
    assert!(st.errors == 0 && st.shared_rounds > 0, "{st:?}");
}
