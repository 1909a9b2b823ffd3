//! The expert seam: `expert_ffn` gives the same bits whether rows come batched or one at a time,
//! whatever the activation type shipped (Q8_K or F32), and `LocalExperts` returns one row per pair
//! in pair order; `ExpertWeights::from_gguf` (what an expert node uses) sees the same bytes as the
//! engine's model. `run_claimed` (the expert groups a node takes one by one in a shared call)
//! hands out each group once and gives the same bits as `run_grouped` for every pair. Bad
//! requests are errors, never panics.

use nightshift_kernels::GgmlType;
use nightshift_model::expert::{
    expert_ffn, expert_groups, run_claimed, run_grouped, ActRows, ExpertBackend, ExpertPair,
    ExpertWeights, LocalExperts,
};

mod fixture_util;
use fixture_util::model;

/// Deterministic activations of roughly unit scale.
fn acts(n: usize, e: usize) -> Vec<f32> {
    (0..n * e)
        .map(|i| (((i * 7919) % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 5) as f32))
        .collect()
}

fn check_batched_equals_single(name: &str, layer: usize) {
    let m = model(name);
    let e = m.config().n_embd;
    let w = m.expert_weights(layer, 3).expect("expert");
    let x = acts(5, e);
    let a = ActRows::quantize(w.act_type(), &x, e).expect("quantize");
    let rows = [4u32, 0, 2, 2, 1];
    let mut batched = vec![0.0f32; rows.len() * e];
    expert_ffn(&w, &a, &rows, &mut batched, None).expect("batched");
    for (i, &r) in rows.iter().enumerate() {
        let mut one = vec![0.0f32; e];
        expert_ffn(&w, &a, &[r], &mut one, None).expect("single");
        assert_eq!(
            &batched[i * e..(i + 1) * e],
            &one[..],
            "{name}: row {r} differs batched vs alone"
        );
    }
    // Shipping f32 and quantizing on the node gives the same bits as shipping the quantized rows.
    let f = ActRows::quantize(GgmlType::F32, &x, e).expect("f32");
    let mut via_f32 = vec![0.0f32; rows.len() * e];
    expert_ffn(&w, &f, &rows, &mut via_f32, None).expect("f32 acts");
    assert_eq!(
        batched,
        via_f32,
        "{name}: f32 activations differ from {} activations",
        w.act_type().name()
    );
}

#[test]
fn expert_ffn_rows_are_independent() {
    check_batched_equals_single("tiny-qwen3moe-Q4_K_M.gguf", 1);
    check_batched_equals_single("tiny-qwen3moe-Q8_0.gguf", 0);
    check_batched_equals_single("tiny-deepseek2-Q2_K.gguf", 2);
    // i-quant experts: IQ1_S gate/up with IQ1_M down (layer 2), IQ2_S down (layer 0)
    check_batched_equals_single("tiny-deepseek2-IQ1_S.gguf", 2);
    check_batched_equals_single("tiny-qwen3moe-IQ2_XXS.gguf", 0);
}

#[test]
fn local_experts_return_rows_in_pair_order() {
    let m = model("tiny-deepseek2-Q5_K_M.gguf");
    let e = m.config().n_embd;
    let layer = 1;
    let ty = m.expert_act_type(layer).expect("moe layer");
    let a = ActRows::quantize(ty, &acts(3, e), e).expect("quantize");
    let pairs = [(5u32, 2u32), (0, 0), (5, 0), (15, 1), (0, 2), (7, 1)]
        .map(|(expert, row)| ExpertPair { expert, row });
    let mut out = vec![0.0f32; pairs.len() * e];
    LocalExperts::new(m.clone(), None)
        .run_experts(layer, &a, &pairs, &mut out)
        .expect("run");
    for (i, p) in pairs.iter().enumerate() {
        let w = m.expert_weights(layer, p.expert).expect("weights");
        let mut one = vec![0.0f32; e];
        expert_ffn(&w, &a, &[p.row], &mut one, None).expect("single");
        assert_eq!(&out[i * e..(i + 1) * e], &one[..], "pair {i} ({p:?})");
    }
}

#[test]
fn expert_groups_follow_first_appearance() {
    let pairs = [(5u32, 2u32), (0, 0), (5, 0), (15, 1), (0, 2), (7, 1)]
        .map(|(expert, row)| ExpertPair { expert, row });
    assert_eq!(
        expert_groups(&pairs),
        vec![
            (5, vec![0, 2]),
            (0, vec![1, 4]),
            (15, vec![3]),
            (7, vec![5])
        ]
    );
    assert!(expert_groups(&[]).is_empty());
}

/// Two takers (this thread alternating, or a 2-thread pool side by side) split the groups of a
/// call through one counter: together they answer each pair once, with `run_grouped`'s bits.
#[test]
fn claimed_groups_are_answered_once_with_the_same_bits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let m = model("tiny-deepseek2-Q5_K_M.gguf");
    let e = m.config().n_embd;
    let layer = 1;
    let ty = m.expert_act_type(layer).expect("moe layer");
    let a = ActRows::quantize(ty, &acts(4, e), e).expect("quantize");
    let pairs = [
        (5u32, 2u32),
        (0, 0),
        (5, 0),
        (15, 1),
        (0, 2),
        (7, 1),
        (5, 3),
        (9, 3),
    ]
    .map(|(expert, row)| ExpertPair { expert, row });
    let mut want = vec![0.0f32; pairs.len() * e];
    run_grouped(
        |x| m.expert_weights(layer, x),
        &a,
        &pairs,
        e,
        &mut want,
        None,
    )
    .expect("grouped");
    let groups = expert_groups(&pairs).len();
    let pool = nightshift_model::build_pool(2).expect("pool");
    for (what, pool) in [("one thread", None), ("two threads", Some(&*pool))] {
        let next = AtomicUsize::new(0);
        // Two takers share the counter: the first stops after 2 groups, the second takes the rest.
        let limit = AtomicUsize::new(2);
        let claim = |n: usize| {
            assert_eq!(n, groups, "{what}: the claim is told the number of groups");
            if limit
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(1))
                .is_err()
            {
                return None;
            }
            let g = next.fetch_add(1, Ordering::AcqRel);
            (g < n).then_some(g)
        };
        let run = |out: &mut [f32]| {
            run_claimed(
                |x| m.expert_weights(layer, x),
                &a,
                &pairs,
                e,
                out,
                pool,
                &claim,
                None,
            )
        };
        // NaN marks rows nobody wrote.
        let mut outs = [
            vec![f32::NAN; pairs.len() * e],
            vec![f32::NAN; pairs.len() * e],
        ];
        let first = run(&mut outs[0]).expect("first taker");
        limit.store(usize::MAX, Ordering::Release);
        let second = run(&mut outs[1]).expect("second taker");
        assert_eq!(
            first.len(),
            5,
            "{what}: the first two groups (experts 5, 0) hold 5 pairs"
        );
        let mut seen = vec![false; pairs.len()];
        for (done, out) in [first, second].iter().zip(&outs) {
            for pi in 0..pairs.len() {
                let row = &out[pi * e..(pi + 1) * e];
                if done.contains(&(pi as u32)) {
                    assert!(
                        !std::mem::replace(&mut seen[pi], true),
                        "{what}: pair {pi} twice"
                    );
                    assert_eq!(row, &want[pi * e..(pi + 1) * e], "{what}: pair {pi}");
                } else {
                    assert!(
                        row.iter().all(|v| v.is_nan()),
                        "{what}: pair {pi} written, not listed"
                    );
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "{what}: every pair answered");
    }
    // An expert the caller cannot resolve fails the call before any group is taken.
    let taken = AtomicUsize::new(0);
    let claim = |_: usize| Some(taken.fetch_add(1, Ordering::AcqRel));
    let bad = [
        ExpertPair { expert: 0, row: 0 },
        ExpertPair {
            expert: 9999,
            row: 1,
        },
    ];
    let mut out = vec![0.0f32; bad.len() * e];
    assert!(run_claimed(
        |x| m.expert_weights(layer, x),
        &a,
        &bad,
        e,
        &mut out,
        None,
        &claim,
        None
    )
    .is_err());
    assert_eq!(taken.load(Ordering::Acquire), 0);
}

#[test]
fn from_gguf_sees_the_model_bytes() {
    let m = model("tiny-qwen3moe-Q2_K.gguf");
    for (layer, expert) in [(0usize, 0u32), (1, 15), (1, 7)] {
        let a = m.expert_weights(layer, expert).expect("model");
        let b = ExpertWeights::from_gguf(m.gguf(), layer, expert as usize).expect("gguf");
        assert_eq!(a, b);
        assert_eq!((a.n_embd(), a.n_ff()), (m.config().n_embd, a.gate.rows()));
    }
}

#[test]
fn bad_requests_are_errors() {
    let m = model("tiny-qwen3moe-Q4_K_M.gguf");
    let e = m.config().n_embd;
    let w = m.expert_weights(0, 1).expect("expert");
    let a = ActRows::quantize(w.act_type(), &acts(2, e), e).expect("quantize");
    let mut out = vec![0.0f32; e];
    assert!(
        expert_ffn(&w, &a, &[2], &mut out, None).is_err(),
        "row out of range"
    );
    assert!(
        expert_ffn(&w, &a, &[0, 1], &mut out, None).is_err(),
        "output too short"
    );
    let bad = ActRows {
        ty: a.ty,
        n_rows: 3,
        data: a.data.clone(),
    };
    assert!(
        expert_ffn(&w, &bad, &[0], &mut out, None).is_err(),
        "data shorter than n_rows"
    );
    let wrong = ActRows::quantize(GgmlType::Q8_0, &acts(2, e), e).expect("q8_0");
    assert!(
        expert_ffn(&w, &wrong, &[0], &mut out, None).is_err(),
        "activation type mismatch"
    );
    assert!(m.expert_weights(0, 16).is_err() && m.expert_weights(9, 0).is_err());
    let local = LocalExperts::new(m.clone(), None);
    let pairs = [ExpertPair { expert: 99, row: 0 }];
    assert!(
        local.run_experts(0, &a, &pairs, &mut out).is_err(),
        "unknown expert"
    );
}

#[test]
fn local_experts_say_which_pool_they_compute_on() {
    // The engine keeps a pool polling through whole steps only for a backend computing on that
    // very pool: pollers of another pool would take the expert threads' cores.
    let m = model("tiny-qwen3moe-Q2_K.gguf");
    let pool = |n| {
        std::sync::Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("pool"),
        )
    };
    let (engine_pool, other) = (pool(2), pool(2));
    let shared = LocalExperts::new(m.clone(), Some(engine_pool.clone()));
    let separate = LocalExperts::new(m.clone(), Some(other));
    let inline = LocalExperts::new(m.clone(), None);
    assert!(shared.computes_on(&engine_pool));
    assert!(!separate.computes_on(&engine_pool));
    assert!(
        inline.computes_on(&engine_pool),
        "no pool: the engine's own worker computes"
    );
}
