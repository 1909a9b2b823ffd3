//! Planner properties (proptest) and planner errors: every expert placed, copies on distinct
//! nodes, capacities respected, replicas >= 1, deterministic, never worse than round-robin, and
//! infeasible requests rejected with their own message.

use nightshift_atlas::placement::{ModelShape, NodeSpec, Placement};
use nightshift_atlas::plan::{plan, PlanRequest, ReplicaBudget};
use nightshift_atlas::stats::LoadReport;
use nightshift_atlas::synth::zipf_counts;
use nightshift_atlas::trace::Counts;
use proptest::prelude::*;

fn nodes(n: usize, memory: u64) -> Vec<NodeSpec> {
    (0..n)
        .map(|i| NodeSpec {
            memory_bytes: memory,
            ..NodeSpec::named(format!("n{i}"))
        })
        .collect()
}

fn counts_of(acts: Vec<Vec<u64>>) -> Counts {
    let w = acts.iter().map(|l| vec![0.0; l.len()]).collect();
    Counts {
        tokens: 1,
        activations: acts,
        weight_sums: w,
    }
}

/// A random case: shape, counts (skewed by squaring), nodes, extra copies per layer.
fn case() -> impl Strategy<Value = (ModelShape, Counts, usize, usize)> {
    (1usize..4, 2usize..24, 1usize..6)
        .prop_flat_map(|(layers, experts, n)| {
            let acts = prop::collection::vec(prop::collection::vec(0u64..1000, experts), layers);
            (
                Just(layers),
                Just(experts),
                Just(n),
                acts,
                0..=experts * (n - 1),
            )
        })
        .prop_map(|(layers, experts, n, acts, extra)| {
            let skewed = acts
                .into_iter()
                .map(|l| l.into_iter().map(|c| c * c / 100).collect())
                .collect();
            let shape = ModelShape {
                moe_layers: (2..2 + layers).collect(),
                n_experts: experts,
                expert_bytes: 10,
            };
            (shape, counts_of(skewed), n, extra)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_complete_valid_deterministic_and_beat_round_robin((shape, counts, n, extra) in case()) {
        let req = PlanRequest { shape: &shape, counts: &counts, nodes: nodes(n, 0), budget: ReplicaBudget::PerLayer(extra), previous: None };
        let a = plan(&req).unwrap();
        let b = plan(&req).unwrap();
        prop_assert_eq!(&a.placement, &b.placement);
        a.placement.validate(&shape).unwrap();
        let mut copies = 0;
        for &layer in &shape.moe_layers {
            for x in 0..shape.n_experts {
                let reps = a.placement.replicas(layer, x);
                prop_assert!(!reps.is_empty());
                let mut d = reps.to_vec();
                d.sort_unstable();
                d.dedup();
                prop_assert_eq!(d.len(), reps.len());
                copies += reps.len();
            }
        }
        prop_assert!(copies <= shape.moe_layers.len() * (shape.n_experts + extra));
        prop_assert!(a.ours.imbalance <= a.round_robin.imbalance + 1e-9,
            "ours {} rr {}", a.ours.imbalance, a.round_robin.imbalance);
        let rr = Placement::round_robin(nodes(n, 0), &shape.moe_layers, shape.n_experts);
        let rr_report = LoadReport::new(&rr, &shape.moe_layers, &counts);
        prop_assert!((rr_report.imbalance() - a.round_robin.imbalance).abs() < 1e-12);
    }

    #[test]
    fn memory_limits_are_respected((shape, counts, n, _extra) in case(), slack in 0u64..5) {
        // room for the node's share of one copy per expert, plus `slack` extra copies
        let per_node = (shape.moe_layers.len() * shape.n_experts).div_ceil(n) as u64 + slack;
        let mem = per_node * shape.expert_bytes;
        let extra = (slack as usize * n / shape.moe_layers.len()).min(shape.n_experts * (n - 1));
        let req = PlanRequest { shape: &shape, counts: &counts, nodes: nodes(n, mem), budget: ReplicaBudget::PerLayer(extra), previous: None };
        match plan(&req) {
            Ok(p) => {
                p.placement.validate(&shape).unwrap();
                for (bytes, node) in p.ours.resident_bytes.iter().zip(&p.placement.nodes) {
                    prop_assert!(*bytes <= node.memory_bytes);
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("cannot keep its"), "{}", e),
        }
    }
}

#[test]
fn kimi_like_zipf_meets_the_target_on_8_nodes() {
    // smaller than Kimi K2 (8 layers) to keep the test quick; same experts and budget
    let shape = ModelShape {
        moe_layers: (1..=8).collect(),
        n_experts: 384,
        expert_bytes: 1,
    };
    let counts = zipf_counts(&shape, 1.0, 1_000_000, 7);
    let budget = ReplicaBudget::Bytes((shape.moe_layers.len() * 384) as u64 / 10);
    let req = PlanRequest {
        shape: &shape,
        counts: &counts,
        nodes: nodes(8, 0),
        budget,
        previous: None,
    };
    let p = plan(&req).unwrap();
    assert_eq!(p.extra_per_layer, 38);
    assert!(p.ours.imbalance <= 1.05, "ours {}", p.ours.imbalance);
    assert!(
        p.round_robin.imbalance > 1.5,
        "round-robin {}",
        p.round_robin.imbalance
    );
}

#[test]
fn previous_placement_keeps_bytes_to_move_low() {
    let shape = ModelShape {
        moe_layers: (1..=4).collect(),
        n_experts: 64,
        expert_bytes: 1000,
    };
    let counts = zipf_counts(&shape, 1.0, 100_000, 1);
    let req = PlanRequest {
        shape: &shape,
        counts: &counts,
        nodes: nodes(4, 0),
        budget: ReplicaBudget::PerLayer(8),
        previous: None,
    };
    let first = plan(&req).unwrap().placement;
    // the same atlas again: nothing needs to move
    let again = plan(&PlanRequest {
        previous: Some(&first),
        ..req
    })
    .unwrap();
    assert_eq!(again.ours.bytes_to_move, 0);
    // a slightly different atlas: far fewer bytes than a fresh plan would move
    let drifted = zipf_counts(&shape, 1.0, 100_000, 1);
    let mut drifted = drifted;
    for l in &mut drifted.activations {
        l[0] += 500;
        l[5] += 300;
    }
    let req2 = PlanRequest {
        shape: &shape,
        counts: &drifted,
        nodes: nodes(4, 0),
        budget: ReplicaBudget::PerLayer(8),
        previous: Some(&first),
    };
    let sticky = plan(&req2).unwrap();
    let fresh_placement = plan(&PlanRequest {
        previous: None,
        ..req2
    })
    .unwrap()
    .placement;
    let fresh_moved = fresh_placement.bytes_to_move_from(&first, 1000);
    assert!(
        sticky.ours.bytes_to_move < fresh_moved,
        "sticky {} fresh {}",
        sticky.ours.bytes_to_move,
        fresh_moved
    );
    assert!(sticky.ours.imbalance <= 1.05, "{}", sticky.ours.imbalance);
}

#[test]
fn infeasible_requests_are_errors() {
    let shape = ModelShape {
        moe_layers: vec![1, 2],
        n_experts: 4,
        expert_bytes: 100,
    };
    let counts = counts_of(vec![vec![100, 1, 1, 1], vec![1, 1, 1, 100]]);
    let wrong = counts_of(vec![vec![1, 2, 3]]);
    let other = ModelShape {
        moe_layers: vec![1, 2],
        n_experts: 5,
        expert_bytes: 100,
    };
    let prev = Placement::round_robin(nodes(2, 0), &other.moe_layers, 5);
    type Row<'a> = (
        Counts,
        Vec<NodeSpec>,
        ReplicaBudget,
        Option<&'a Placement>,
        &'a str,
    );
    let rows: Vec<Row> = vec![
        (counts.clone(), vec![], ReplicaBudget::PerLayer(0), None, "expected at least one node, found none"),
        (wrong, nodes(2, 0), ReplicaBudget::PerLayer(0), None,
         "atlas counts cover 1 MoE layers x 3 experts, expected 2 x 4 from the shape"),
        (counts.clone(), nodes(2, 0), ReplicaBudget::PerLayer(5), None,
         "5 extra copies per layer requested, but 2 nodes can hold at most 4 (one copy of each of 4 experts per node)"),
        (counts.clone(), nodes(2, 150), ReplicaBudget::PerLayer(1), None,
         "node \"n0\": memory_bytes 150 cannot keep its 2 replicated (hot) expert copies resident (200 bytes): give it more memory or ask for fewer replicas"),
        (counts.clone(), nodes(2, 0), ReplicaBudget::PerLayer(0), Some(&prev),
         "previous placement does not fit this model: layer 1: expected replicas for 4 experts, found 5"),
        (counts.clone(), vec![NodeSpec::named("a"), NodeSpec::named("a")], ReplicaBudget::PerLayer(0), None,
         "node[1].name: node \"a\" listed twice (first at node[0].name)"),
    ];
    for (counts, nodes, budget, previous, expect) in rows {
        let req = PlanRequest {
            shape: &shape,
            counts: &counts,
            nodes,
            budget,
            previous,
        };
        let got = plan(&req)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "ok".into());
        assert_eq!(got, expect);
    }
    let zero = ModelShape {
        expert_bytes: 0,
        ..shape.clone()
    };
    let req = PlanRequest {
        shape: &zero,
        counts: &counts,
        nodes: nodes(2, 0),
        budget: ReplicaBudget::Bytes(10),
        previous: None,
    };
    assert_eq!(
        plan(&req).err().unwrap().to_string(),
        "--replica-memory needs expert_bytes > 0 in the atlas shape, found 0"
    );
}

#[test]
fn recorded_atlas_plans_better_than_round_robin() {
    use nightshift_atlas::trace::{Atlas, Recorder, RecorderConfig};
    // the recorder fed skewed routing (expert e chosen with weight ~ 1/(e+1)), saved and reloaded,
    // then planned: the whole offline path on one atlas file
    let shape = ModelShape {
        moe_layers: vec![1, 2, 3],
        n_experts: 32,
        expert_bytes: 1 << 20,
    };
    let mut cfg = RecorderConfig::new("skewed", 4);
    cfg.window_tokens = 256;
    let mut r = Recorder::new(shape.clone(), cfg);
    let mut s = 0x1234_5678_9abc_def0u64;
    for _step in 0..200 {
        let mut ids = Vec::new();
        for _row in 0..4 {
            let mut row: Vec<usize> = Vec::new();
            while row.len() < 4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                let e = ((32f64).powf(u) - 1.0) as usize; // log-uniform: skewed to low ids
                if !row.contains(&e) {
                    row.push(e);
                }
            }
            ids.extend(row);
        }
        for layer in 1..=3 {
            r.record(layer, &ids, &vec![0.25; ids.len()]).unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skewed.atlas");
    r.snapshot().save_atomic(&path).unwrap();
    let atlas = Atlas::load(&path).unwrap();
    assert_eq!(atlas.all_time.tokens, 800);
    assert!(
        atlas.window.tokens >= 224 && atlas.window.tokens <= 256,
        "{}",
        atlas.window.tokens
    );
    for counts in [&atlas.all_time, &atlas.window] {
        let req = PlanRequest {
            shape: &atlas.shape,
            counts,
            nodes: nodes(4, 0),
            budget: ReplicaBudget::PerLayer(4),
            previous: None,
        };
        let p = plan(&req).unwrap();
        assert!(
            p.ours.imbalance < p.round_robin.imbalance,
            "ours {} rr {}",
            p.ours.imbalance,
            p.round_robin.imbalance
        );
        assert!(p.ours.imbalance < 1.1, "ours {}", p.ours.imbalance);
    }
}

#[test]
fn uneven_memory_gets_proportional_copies_and_cold_copies_go_mmap() {
    let shape = ModelShape {
        moe_layers: vec![1, 2],
        n_experts: 40,
        expert_bytes: 10,
    };
    let counts = zipf_counts(&shape, 1.0, 10_000, 3);
    // node a: 3x the memory of node b; together they hold 70 of the 80 copies resident
    let nodes = vec![
        NodeSpec {
            memory_bytes: 525,
            ..NodeSpec::named("a")
        },
        NodeSpec {
            memory_bytes: 175,
            ..NodeSpec::named("b")
        },
    ];
    let req = PlanRequest {
        shape: &shape,
        counts: &counts,
        nodes,
        budget: ReplicaBudget::PerLayer(0),
        previous: None,
    };
    let p = plan(&req).unwrap();
    assert_eq!(
        p.ours.held_bytes,
        vec![600, 200],
        "copies split 3:1 like memory"
    );
    assert_eq!(
        p.ours.resident_bytes,
        vec![520, 170],
        "resident up to whole experts within memory"
    );
    // the copies left mmap'd are the coldest ones on their node
    for (node, name) in [(0usize, "a"), (1, "b")] {
        let slots = p.placement.experts_on(name).unwrap();
        let hottest_cold = slots
            .iter()
            .filter(|s| !s.resident)
            .map(|s| counts.activations[s.layer - 1][s.expert])
            .max()
            .unwrap();
        let coldest_hot = slots
            .iter()
            .filter(|s| s.resident)
            .map(|s| counts.activations[s.layer - 1][s.expert])
            .min()
            .unwrap();
        assert!(
            hottest_cold <= coldest_hot,
            "node {node}: mmap'd {hottest_cold} > resident {coldest_hot}"
        );
    }
}
