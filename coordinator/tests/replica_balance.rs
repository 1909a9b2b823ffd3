//! The replica choice of a layer call (`cluster::remote::balance::plan`) without sockets: on a
//! fully replicated placement it balances estimated work (1 + rows per expert), not expert
//! counts; it keeps all rows of an expert on one node, never uses a node that is down or
//! excluded, counts work in flight, is deterministic whatever the pair order, beats the previous
//! count balance on decode-like batches, and names the expert left without a replica.

use std::collections::HashMap;

use nightshift_atlas_core::placement::NodeId;
use nightshift_coordinator::cluster::remote::balance::{expert_cost, plan, NoLiveReplica, Planned};
use nightshift_model::ExpertPair;

/// Pairs from `(expert, rows)`: rows are numbered 0.. per expert, as in a decode batch.
fn pairs_of(experts: &[(u32, u32)]) -> Vec<ExpertPair> {
    experts
        .iter()
        .flat_map(|&(e, r)| (0..r).map(move |row| ExpertPair { expert: e, row }))
        .collect()
}

fn all(pairs: &[ExpertPair]) -> Vec<usize> {
    (0..pairs.len()).collect()
}

/// Estimated work per node (0 for nodes given nothing).
fn costs(shares: &[Planned], nodes: usize) -> Vec<usize> {
    let mut c = vec![0; nodes];
    for s in shares {
        c[s.node] += s.cost;
    }
    c
}

/// Checks the invariants every plan must keep, returns expert -> node.
fn check_plan(
    pairs: &[ExpertPair],
    todo: &[usize],
    shares: &[Planned],
    usable: impl Fn(u32, NodeId) -> bool,
) -> HashMap<u32, NodeId> {
    let mut seen = vec![0usize; pairs.len()];
    let mut node_of: HashMap<u32, NodeId> = HashMap::new();
    let mut rows: HashMap<u32, usize> = HashMap::new();
    for s in shares {
        let mut cost_by_expert: HashMap<u32, usize> = HashMap::new();
        for &pi in &s.pair_idx {
            seen[pi] += 1;
            let e = pairs[pi].expert;
            assert!(
                usable(e, s.node),
                "expert {e} sent to unusable node {}",
                s.node
            );
            let prev = *node_of.entry(e).or_insert(s.node);
            assert_eq!(
                prev, s.node,
                "expert {e} split over nodes {prev} and {}",
                s.node
            );
            *cost_by_expert.entry(e).or_default() += 1;
            *rows.entry(e).or_default() += 1;
        }
        let want: usize = cost_by_expert.values().map(|&r| expert_cost(r)).sum();
        assert_eq!(s.cost, want, "node {} cost", s.node);
        assert!(s.pair_idx.windows(2).all(|w| w[0] < w[1]), "pair order");
    }
    for (pi, &n) in seen.iter().enumerate() {
        let want = usize::from(todo.contains(&pi));
        assert_eq!(n, want, "pair {pi} assigned {n} times");
    }
    node_of
}

#[test]
fn one_heavy_expert_is_balanced_by_rows_not_counts() {
    // Expert 9 routed 5 rows (cost 6), experts 0..6 one row each (cost 2): total 18.
    let mut spec = vec![(9, 5)];
    spec.extend((0..6).map(|e| (e, 1)));
    let pairs = pairs_of(&spec);
    let reps: Vec<Vec<NodeId>> = vec![vec![0, 1]; 16];
    let up = [true, true];
    let shares = plan(
        &pairs,
        &all(&pairs),
        |e| &reps[e as usize],
        &up,
        &[0, 0],
        &HashMap::new(),
    )
    .expect("plan");
    let node_of = check_plan(&pairs, &all(&pairs), &shares, |_, _| true);
    let c = costs(&shares, 2);
    assert_eq!(c[0] + c[1], 18);
    assert!(c[0].abs_diff(c[1]) <= 6, "costs {c:?}");
    // LPT exactly: 6 on node0, three 2s on node1, then alternate from node0: 10 / 8.
    assert_eq!(c, vec![10, 8]);
    // The old count balance (1 unit per expert, in pair order) put 3 of the 6 light experts with
    // the heavy one (12 / 6); by work it gets 2.
    let heavy = node_of[&9];
    let light_on_heavy = (0..6).filter(|e| node_of[e] == heavy).count();
    assert_eq!(
        light_on_heavy, 2,
        "heavy node also got {light_on_heavy} light experts"
    );
}

#[test]
fn down_and_excluded_nodes_get_nothing() {
    let mut spec = vec![(3, 5)];
    spec.extend((10..16).map(|e| (e, 1)));
    let pairs = pairs_of(&spec);
    let reps: Vec<Vec<NodeId>> = vec![vec![0, 1, 2]; 16];
    // node1 down: everything on 0 and 2, balanced there.
    let shares = plan(
        &pairs,
        &all(&pairs),
        |e| &reps[e as usize],
        &[true, false, true],
        &[0, 0, 0],
        &HashMap::new(),
    )
    .expect("plan");
    check_plan(&pairs, &all(&pairs), &shares, |_, n| n != 1);
    let c = costs(&shares, 3);
    assert_eq!(c[1], 0);
    assert!(c[0].abs_diff(c[2]) <= 6, "costs {c:?}");
    // Only node0 up: it gets all the work.
    let shares = plan(
        &pairs,
        &all(&pairs),
        |e| &reps[e as usize],
        &[true, false, false],
        &[0, 0, 0],
        &HashMap::new(),
    )
    .expect("plan");
    assert_eq!(costs(&shares, 3), vec![18, 0, 0]);
    // Exclusions (a retry round): expert 3 failed on node0 and node2, so it must go to node1.
    let exclude: HashMap<u32, Vec<NodeId>> = [(3, vec![0, 2])].into_iter().collect();
    let todo: Vec<usize> = (0..pairs.len()).filter(|&i| i % 2 == 0).collect();
    let shares = plan(
        &pairs,
        &todo,
        |e| &reps[e as usize],
        &[true, true, true],
        &[0, 0, 0],
        &exclude,
    )
    .expect("plan");
    let node_of = check_plan(&pairs, &todo, &shares, |e, n| !(e == 3 && n != 1));
    assert_eq!(node_of[&3], 1);
}

#[test]
fn work_in_flight_biases_the_choice() {
    let pairs = pairs_of(&[(0, 1), (1, 1), (2, 1), (3, 1)]);
    let reps: Vec<Vec<NodeId>> = vec![vec![0, 1]; 4];
    // node0 already has 6 units in flight: the 4 experts (8 units) go 1,1,1 then tie -> 0.
    let shares = plan(
        &pairs,
        &all(&pairs),
        |e| &reps[e as usize],
        &[true, true],
        &[6, 0],
        &HashMap::new(),
    )
    .expect("plan");
    assert_eq!(costs(&shares, 2), vec![2, 6]);
}

#[test]
fn only_holders_are_used_and_missing_replica_is_named() {
    // Expert 0 only on node1, expert 1 only on node0, expert 2 on both.
    let reps: Vec<Vec<NodeId>> = vec![vec![1], vec![0], vec![0, 1]];
    let pairs = pairs_of(&[(0, 3), (1, 1), (2, 2)]);
    let shares = plan(
        &pairs,
        &all(&pairs),
        |e| &reps[e as usize],
        &[true, true],
        &[0, 0],
        &HashMap::new(),
    )
    .expect("plan");
    let node_of = check_plan(&pairs, &all(&pairs), &shares, |e, n| {
        reps[e as usize].contains(&n)
    });
    // 0 (cost 4) -> node1; 2 (cost 3) -> node0 (0 < 4); 1 (cost 2) -> node0.
    assert_eq!((node_of[&0], node_of[&1], node_of[&2]), (1, 0, 0));
    // node1 down: expert 0 has no live replica.
    let err = plan(
        &pairs,
        &all(&pairs),
        |e| &reps[e as usize],
        &[true, false],
        &[0, 0],
        &HashMap::new(),
    )
    .expect_err("expert 0 has no live replica");
    assert_eq!(err, NoLiveReplica { expert: 0 });
}

/// The previous choice, for comparison: experts in pair order, each on the replica with the
/// fewest experts so far (1 unit per expert). Returns the estimated work per node.
fn count_balanced_costs(pairs: &[ExpertPair], nodes: usize) -> Vec<usize> {
    let mut count = vec![0usize; nodes];
    let mut node_of: HashMap<u32, usize> = HashMap::new();
    let mut rows: HashMap<u32, usize> = HashMap::new();
    for p in pairs {
        *rows.entry(p.expert).or_default() += 1;
        node_of.entry(p.expert).or_insert_with(|| {
            let n = (0..nodes).min_by_key(|&n| count[n]).unwrap_or(0);
            count[n] += 1;
            n
        });
    }
    let mut c = vec![0; nodes];
    for (e, r) in rows {
        c[node_of[&e]] += expert_cost(r);
    }
    c
}

/// Deterministic pseudo-random numbers (no external crate needed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn greedy_bound_and_determinism_on_decode_batches() {
    // Batch 8, top-8 over 128 experts (64 pairs, ~50 experts), on 2..4 fully replicated nodes:
    // the most and least loaded nodes differ by at most the largest single expert cost, the
    // choice does not depend on the order of the pairs, and on average the slowest node has less
    // work than with the previous one-unit-per-expert choice.
    let mut rng = Lcg(42);
    // Sum over the cases of (slowest node's work / ideal even split), per choice and node count.
    let mut excess = [[0.0f64; 2]; 3];
    for case in 0..200 {
        let nodes = 2 + case % 3;
        let mut pairs = Vec::new();
        for row in 0..8u32 {
            let mut picked: Vec<u32> = Vec::new();
            while picked.len() < 8 {
                // Skewed routing: low expert ids are popular.
                let e = (rng.next(128) * rng.next(128) / 128) as u32;
                if !picked.contains(&e) {
                    picked.push(e);
                }
            }
            pairs.extend(picked.into_iter().map(|expert| ExpertPair { expert, row }));
        }
        let reps: Vec<Vec<NodeId>> = vec![(0..nodes).collect(); 128];
        let up = vec![true; nodes];
        let bias = vec![0; nodes];
        // plans every pair on live, unbiased, fully replicated nodes and checks the plan
        let plan_all = |pairs: &[ExpertPair]| {
            let todo = all(pairs);
            let shares = plan(
                pairs,
                &todo,
                |e| &reps[e as usize],
                &up,
                &bias,
                &HashMap::new(),
            )
            .expect("plan");
            let node_of = check_plan(pairs, &todo, &shares, |_, _| true);
            (shares, node_of)
        };
        let (shares, node_of) = plan_all(&pairs);
        let c = costs(&shares, nodes);
        let mut rows: HashMap<u32, usize> = HashMap::new();
        for p in &pairs {
            *rows.entry(p.expert).or_default() += 1;
        }
        let largest = rows.values().map(|&r| expert_cost(r)).max().unwrap_or(0);
        let (max, min) = (c.iter().max().unwrap(), c.iter().min().unwrap());
        assert!(
            max - min <= largest,
            "case {case}: costs {c:?}, largest {largest}"
        );
        let ideal = c.iter().sum::<usize>() as f64 / nodes as f64;
        let old = count_balanced_costs(&pairs, nodes);
        assert_eq!(old.iter().sum::<usize>(), c.iter().sum::<usize>());
        excess[nodes - 2][0] += *old.iter().max().unwrap() as f64 / ideal;
        excess[nodes - 2][1] += *max as f64 / ideal;
        // Same pairs reversed (todo is a sorted index list, so permute the pairs themselves).
        let rev: Vec<ExpertPair> = pairs.iter().rev().copied().collect();
        let (_, node_of2) = plan_all(&rev);
        assert_eq!(node_of, node_of2, "case {case}");
    }
    for (k, [old, new]) in excess.iter().enumerate() {
        let cases = (0..200).filter(|c| c % 3 == k).count() as f64;
        let (old, new) = (old / cases, new / cases);
        println!(
            "{} nodes: slowest node / even split: by expert count {old:.3}, by work {new:.3}",
            k + 2
        );
        assert!(
            new < old,
            "{} nodes: by work {new:.3} vs by count {old:.3}",
            k + 2
        );
    }
}
