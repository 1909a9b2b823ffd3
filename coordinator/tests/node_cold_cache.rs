//! Expert nodes with a staging cache of cold experts (`nightshift-expert-node --cold-cache`):
//! real node processes over real sockets, keeping a quarter of their experts resident
//! (`--memory-budget 25%`) and reading the rest whole through a cache that holds one expert, so
//! nearly every layer call evicts. Two nodes splitting the experts, over shared memory and over
//! gRPC streams, give outputs bit-identical to the in-process engine, and so do three nodes
//! holding every expert that share each call through the claim board (each reading the cold
//! experts of the groups it takes); each node's log shows the cache was read through and
//! evicted from (the summary it logs at exit) and its size (the ready line).
//!
//! With the coordinator's prefetch hints (`RemoteExperts::send_hints`) on a deeper model, a
//! node with a small cache reads the next layer's predicted cold experts ahead: outputs stay
//! bit-identical, experts arrive in time, a decode run waits for fewer reads, and an expert
//! several nodes hold is read ahead by the one that computes it (few read-aheads unused).

mod support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, LaunchOptions, LocalCluster, RemoteOptions};
use nightshift_model::cold::ColdCache;
use nightshift_model::gen::{generate as gen_model, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::prefetch::NextLayer;
use nightshift_model::{
    ActRows, ExpertBackend, ExpertError, ExpertMemory, ExpertPair, LoadOptions, Model,
    PostedExperts,
};
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
/// The nodes of `placement` as processes started through `exe` (`wrapper`: extra node flags,
/// stderr to a log), `threads` workers each.
fn start_nodes(
    model: &Path,
    placement: Placement,
    threads: usize,
    exe: PathBuf,
    work: &Path,
) -> LocalCluster {
    LocalCluster::start(LaunchOptions {
        model: model.to_path_buf(),
        placement,
        threads_per_node: Some(threads),
        numa: Vec::new(),
        auth_token_file: None,
        tls: None,
        exe: Some(exe),
        work_dir: work.to_path_buf(),
        start_timeout: Duration::from_secs(60),
        node_log: "info".into(),
    })
    .expect("cluster starts")
}

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
        // one worker over shared memory, two (groups taken side by side) otherwise
        let threads = if arm == "shared memory" { 1 } else { 2 };
        let mut cluster = start_nodes(&model_path, placement, threads, exe, &work);
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
        assert_eq!(
            total("read ahead"),
            0,
            "{arm}: without a predictor no hints reach a node"
        );
        if arm != "shared calls" {
            // each node computes every call of its experts: each reads through its cache
            for s in &summaries {
                assert!(counter(s, "misses") > 0, "{arm}: {s}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The counter called `what` in the node's hint summary line (`HintStats::summary`): the number
/// before `what`, or after it ("in time N").
fn hint_counter(line: &str, what: &str) -> u64 {
    let tail =
        &line[line.find("prefetch hints: ").expect("hint summary") + "prefetch hints: ".len()..];
    let words: Vec<&str> = tail
        .split(|c: char| [',', '(', ')', ':'].contains(&c))
        .map(str::trim)
        .collect();
    words
        .iter()
        .find_map(|w| {
            if let Some(n) = w.strip_prefix(what).map(str::trim) {
                return n.parse().ok();
            }
            let (n, rest) = w.split_once(' ')?;
            rest.starts_with(what).then(|| n.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no {what} in {line}"))
}

/// `inner` with `gap` after every layer call: the time a layer's attention and shared expert
/// take on a real model (the tiny model's take microseconds), in which a node reads ahead.
struct Gap {
    inner: Arc<dyn ExpertBackend>,
    gap: Duration,
}

impl ExpertBackend for Gap {
    fn run_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        self.inner.run_experts(layer, acts, pairs, out)?;
        std::thread::sleep(self.gap);
        Ok(())
    }

    fn overlaps(&self) -> bool {
        self.inner.overlaps()
    }

    fn micro_batches(&self) -> bool {
        self.inner.micro_batches()
    }

    fn overlap_always(&self) -> bool {
        self.inner.overlap_always()
    }

    fn post_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
    ) -> Result<PostedExperts, ExpertError> {
        self.inner.post_experts(layer, acts, pairs)
    }

    fn collect_experts(&self, posted: PostedExperts, out: &mut [f32]) -> Result<(), ExpertError> {
        self.inner.collect_experts(posted, out)?;
        std::thread::sleep(self.gap);
        Ok(())
    }
}

#[test]
fn prefetch_hints_read_the_next_layers_cold_experts_ahead_on_small_cache_nodes() {
    let work = std::env::temp_dir().join(format!("nightshift-node-hints-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    // eight MoE layers: a small cache cannot keep a layer's experts from one step to the next,
    // so what is in memory as a layer starts is what was read ahead for it
    let mut spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
    spec.layers = Some(8);
    let model_path = work.join("deep.gguf");
    gen_model(&spec, &model_path, &mut |_| {}).expect("generate the model");
    let model = Model::load_with(
        &model_path,
        LoadOptions {
            experts: ExpertMemory::Mapped,
            ..LoadOptions::default()
        },
    )
    .expect("model");
    const TOKENS: usize = 24;
    let want = in_process(&model, TOKENS);
    let shape = model_shape(&model).expect("shape");
    let probe = ColdCache::new(model.clone(), 0).expect("probe");
    let mut largest = 0;
    for &l in &shape.moe_layers {
        for e in 0..shape.n_experts as u32 {
            largest = largest.max(probe.footprint(l, e).expect("footprint"));
        }
    }
    drop(probe);
    let split = Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts);
    // every expert on each of three nodes: calls shared through the claim board, each predicted
    // expert hinted to one node, which then computes its group
    let everywhere = explicit(&shape, 3, |_| (0..3).collect());
    let shm = RemoteOptions::default().shm_pairs;
    // (hints, reads that went to the disk on demand) per transport
    let mut misses: Vec<(&str, bool, u64)> = Vec::new();
    let arms = [
        ("shared memory", shm, &split),
        ("grpc", 0, &split),
        ("shared calls", shm, &everywhere),
    ];
    for (arm, shm_pairs, placement) in arms {
        let n = placement.nodes.len();
        for hints in [false, true] {
            let what = format!("{arm}, hints {}", if hints { "on" } else { "off" });
            let log = work.join(format!("nodes-{}-{hints}.log", arm.replace(' ', "-")));
            let _ = std::fs::remove_file(&log);
            // six experts: this layer's cold ones and the next one's read ahead, little more
            let exe = wrapper(
                &work,
                &format!("--memory-budget 25% --cold-cache {}", 6 * largest),
                &log,
            );
            let mut cluster = start_nodes(&model_path, placement.clone(), 1, exe, &work);
            let remote = connect(
                &model,
                &cluster,
                RemoteOptions {
                    shm_pairs,
                    ..RemoteOptions::default()
                },
            );
            if hints {
                remote.send_hints(Arc::new(NextLayer::new(model.clone())));
            }
            let backend = Arc::new(Gap {
                inner: remote.clone(),
                gap: Duration::from_millis(2),
            });
            let got = generate(
                &mut support::engine(&model, backend),
                &PROMPT,
                TOKENS,
                |_| {},
            )
            .expect("cluster generates");
            assert_bits_equal(&got, &want, &what);
            let st = remote.take_stats();
            assert_eq!(st.hints > 0, hints, "{what}: {st:?}");
            assert_eq!(st.shm_calls > 0, shm_pairs > 0, "{what}: {st:?}");
            assert_eq!(
                st.shared_rounds > 0,
                arm == "shared calls",
                "{what}: {st:?}"
            );
            drop(remote);
            cluster.stop();
            let text = support::plain(&std::fs::read_to_string(&log).expect("node log"));
            let caches: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("cold cache: "))
                .collect();
            let hinted: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("prefetch hints: "))
                .collect();
            assert_eq!((caches.len(), hinted.len()), (n, n), "{what}: {text}");
            let sum = |lines: &[&str], f: &dyn Fn(&str) -> u64| -> u64 {
                lines.iter().map(|l| f(l)).sum()
            };
            let read_ahead = sum(&caches, &|l| counter(l, "read ahead"));
            let received = sum(&hinted, &|l| hint_counter(l, "received"));
            let in_time = sum(&hinted, &|l| hint_counter(l, "in time"));
            let ignored = sum(&hinted, &|l| hint_counter(l, "experts ignored"));
            let cold_needed = sum(&hinted, &|l| hint_counter(l, "cold experts needed"));
            let wasted = sum(&hinted, &|l| hint_counter(l, "wasted"));
            eprintln!("{what}: {caches:?} {hinted:?}");
            assert_eq!(ignored, 0, "{what}: hints name only experts a node holds");
            if hints {
                assert!(
                    received > 0 && read_ahead > 0,
                    "{what}: {hinted:?} {caches:?}"
                );
                // hints name the layer they predict: most cold experts a layer needs were
                // hinted for it and read by the time it started
                assert!(
                    2 * in_time > cold_needed,
                    "{what}: {in_time} of {cold_needed} in time: {hinted:?}"
                );
                // each expert read ahead by one node, the one computing it: few read for
                // nothing (every replica hinted, shared calls wasted two thirds)
                assert!(
                    5 * wasted < read_ahead,
                    "{what}: {wasted} of {read_ahead} experts read ahead were not used: {hinted:?}"
                );
            } else {
                assert_eq!((received, read_ahead, in_time), (0, 0, 0), "{what}");
            }
            misses.push((arm, hints, sum(&caches, &|l| counter(l, "misses"))));
        }
    }
    for (arm, _, _) in arms {
        let of = |h: bool| {
            misses
                .iter()
                .find(|m| m.0 == arm && m.1 == h)
                .expect("arm")
                .2
        };
        assert!(
            of(true) < of(false),
            "{arm}: hints must save demand reads: {} with, {} without",
            of(true),
            of(false)
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Local nodes bounded by their placement's `memory_bytes` default to a staging cache (the
/// budget their resident experts leave is lent to it); on one machine each is started with its
/// share of half the free memory, not half each. An unbounded node gets none.
#[test]
fn local_nodes_with_a_memory_bound_share_the_default_staging_cache() {
    let path = support::fixture("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let mut p = explicit(&shape, 2, |e| vec![e % 2]);
    p.nodes[1].memory_bytes = 1 << 30;
    let cluster = support::cluster::launch(&path, p);
    let args = |node: &str| support::cmdline(cluster.pid(node).expect("pid"));
    let cold = |node: &str| {
        let a = args(node);
        a.iter()
            .position(|x| x == "--cold-cache")
            .map(|i| a[i + 1].parse::<u64>().expect("a byte count"))
    };
    assert_eq!(
        cold("node0"),
        None,
        "an unbounded node: {:?}",
        args("node0")
    );
    let share = cold("node1").expect("a bounded node is given its share");
    let free = nightshift_model::weights::mem_available().expect("meminfo");
    // a quarter of what is free now, within what the nodes themselves took meanwhile
    assert!(
        share > free / 8 && share <= free / 2,
        "share {share} of {free} free"
    );
}
