//! The in-process memory budget: an engine whose experts are partly resident copies
//! (`ExpertResidency`) and partly the mapped file, with the one-layer-ahead prefetch, gives the
//! same logits bit for bit as the plain engine (both architectures), also when the resident set
//! is replaced between steps; the set never exceeds its budget (a set that does not fit is
//! refused whole), and the prefetch scores its predictions.

use std::sync::Arc;

use nightshift_model::prefetch::{ColdReads, Prefetcher};
use nightshift_model::resident::{ExpertResidency, ResidencyError};
use nightshift_model::sampler::argmax;
use nightshift_model::{Engine, EngineOptions, ExpertBackend, LocalExperts, Model};

mod fixture_util;
use fixture_util::{all_experts, expert_bytes, mapped};

const PROMPT: [u32; 6] = [407, 550, 566, 544, 543, 570];

/// Prefill, then `n` greedy steps; `between(i)` runs before step i. Every logits row.
fn run(
    model: &Arc<Model>,
    backend: Arc<dyn ExpertBackend>,
    n: usize,
    mut between: impl FnMut(usize),
) -> Vec<Vec<f32>> {
    let pool = nightshift_model::build_pool(1).expect("pool");
    let mut e = Engine::new(
        model.clone(),
        backend,
        EngineOptions {
            pool: Some(pool),
            ..Default::default()
        },
    )
    .expect("engine");
    let seq = e.add_sequence().expect("seq");
    let mut rows = e.prefill_all(seq, &PROMPT).expect("prefill");
    for i in 0..n {
        between(i);
        let tok = argmax(rows.last().expect("row"));
        rows.push(e.prefill(seq, &[tok]).expect("step"));
    }
    rows
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn check(name: &str) {
    let model = mapped(name);
    let want = bits(&run(
        &model,
        Arc::new(LocalExperts::new(model.clone(), None)),
        6,
        |_| {},
    ));
    let all = all_experts(&model);
    let size = |set: &[(u32, u32)]| expert_bytes(&model, set);
    // arenas align each matrix to a cache line
    let slack = 192 * (all.len() as u64 / 3);
    // a third of the experts fit; start with every third one, switch to the others midway
    let first: Vec<(u32, u32)> = all.iter().copied().step_by(3).take(all.len() / 3).collect();
    let second: Vec<(u32, u32)> = all
        .iter()
        .copied()
        .skip(1)
        .step_by(3)
        .take(all.len() / 3)
        .collect();
    let budget = size(&first).max(size(&second));
    assert!(size(&all) > 2 * budget);
    let residency = Arc::new(ExpertResidency::new(budget));
    let moved = residency
        .set(model.gguf(), &first, None)
        .expect("first set");
    assert_eq!(moved.loaded, first.len());
    assert!(residency.resident_bytes() <= budget && residency.arena_bytes() <= budget + slack);
    let prefetch = Arc::new(Prefetcher::new(model.clone()).expect("prefetch thread"));
    let backend = Arc::new(
        LocalExperts::new(model.clone(), None)
            .with_residency(residency.clone())
            .with_prefetch(prefetch.clone()),
    );
    let got = bits(&run(&model, backend, 6, |i| {
        if i == 3 {
            let m = residency
                .set(model.gguf(), &second, None)
                .expect("second set");
            assert_eq!((m.loaded, m.dropped), (second.len(), first.len()));
            assert_eq!(residency.experts(), {
                let mut s = second.clone();
                s.sort_unstable();
                s
            });
        }
    }));
    assert_eq!(
        got, want,
        "{name}: a partly resident engine changed the logits"
    );
    assert!(residency.arena_bytes() <= budget + slack);
    let st = prefetch.stats();
    assert!(st.predicted > 0 && st.used > 0, "{name}: {st:?}");
    assert!(
        st.predicted_used <= st.predicted.min(st.used),
        "{name}: {st:?}"
    );
    assert!(st.cold_requested <= st.cold_needed, "{name}: {st:?}");
    // every request is accounted for: in time or late when used, wasted when not
    assert_eq!(st.in_time + st.late, st.cold_requested, "{name}: {st:?}");
    assert!(st.wasted <= st.issued, "{name}: {st:?}");
    assert!(st.issued >= st.cold_requested + st.wasted, "{name}: {st:?}");
    assert!(st.summary().contains("precision"), "{}", st.summary());
    // the cold path reads whole experts: each cold expert a decode step's layer used was
    // requested by the prediction or read as the layer started (the first MoE layer, never
    // predicted, only the latter)
    assert_eq!(prefetch.cold_reads(), ColdReads::WholeExperts);
    assert!(
        st.demand + st.cold_requested >= st.cold_needed && st.demand > 0,
        "{name}: {st:?}"
    );

    // a set over the budget is refused and the old one stays
    let before = residency.experts();
    let err = residency
        .set(model.gguf(), &all, None)
        .expect_err("over budget");
    assert!(matches!(err, ResidencyError::OverBudget { .. }), "{err}");
    assert!(err.to_string().contains("memory budget"), "{err}");
    assert_eq!(residency.experts(), before);
    // and an unknown expert is an error, not a panic
    assert!(residency.set(model.gguf(), &[(0, 99_999)], None).is_err());
}

#[test]
fn partly_resident_experts_give_identical_logits_qwen3moe() {
    check("tiny-qwen3moe-Q4_K_M.gguf");
}

#[test]
fn partly_resident_experts_give_identical_logits_deepseek2() {
    check("tiny-deepseek2-Q2_K.gguf");
}
