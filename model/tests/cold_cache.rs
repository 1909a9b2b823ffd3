//! The cold-expert staging cache (`nightshift_model::cold`): an engine whose non-resident
//! experts are read whole into the cache gives the same logits bit for bit as the plain engine
//! (both architectures), with one read in flight or several, whether the cache holds one expert (every call streams its cold
//! experts through it, evicting as it goes) or many (decode steps hit), with and without the
//! one-layer-ahead prediction reading into it; the cache stays within its capacity between
//! calls, holds the file's bytes, and refuses misuse with an error; a read a call waits for while
//! the same thread holds the full cache's only copy is served over the capacity, not deadlocked.

use std::sync::Arc;

use nightshift_model::cold::ColdCache;
use nightshift_model::prefetch::Prefetcher;
use nightshift_model::resident::ExpertResidency;
use nightshift_model::sampler::argmax;
use nightshift_model::{Engine, EngineOptions, ExpertBackend, LocalExperts, Model};

mod fixture_util;
use fixture_util::{all_experts, expert_bytes, mapped};

const PROMPT: [u32; 11] = [407, 550, 566, 544, 543, 570, 407, 12, 99, 566, 31];

/// Prefill, then `n` greedy steps, on a pool of `threads`; the bits of every logits row.
fn run(model: &Arc<Model>, backend: Arc<dyn ExpertBackend>, n: usize) -> Vec<Vec<u32>> {
    let threads = 2;
    let pool = nightshift_model::build_pool(threads).expect("pool");
    let mut e = Engine::new(
        model.clone(),
        backend,
        EngineOptions {
            pool: Some(pool),
            threads,
            ..Default::default()
        },
    )
    .expect("engine");
    let seq = e.add_sequence().expect("seq");
    let mut rows = e.prefill_all(seq, &PROMPT).expect("prefill");
    for _ in 0..n {
        let tok = argmax(rows.last().expect("row"));
        rows.push(e.prefill(seq, &[tok]).expect("step"));
    }
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn check(name: &str) {
    let model = mapped(name);
    let pool = nightshift_model::build_pool(2).expect("pool");
    let want = run(
        &model,
        Arc::new(LocalExperts::new(model.clone(), Some(pool.clone()))),
        6,
    );
    let all = all_experts(&model);
    let cache_probe = ColdCache::new(model.clone(), 0).expect("cache");
    let largest = all
        .iter()
        .map(|&(l, e)| cache_probe.footprint(l as usize, e).expect("footprint"))
        .max()
        .expect("experts");
    drop(cache_probe);
    // every fourth expert resident, the rest cold
    let resident: Vec<(u32, u32)> = all.iter().copied().step_by(4).collect();
    // one read in flight, or several (`--cold-io-depth`): the same bits
    for (experts_held, predict, depth) in [
        (1u64, false, 1),
        (1, true, 4),
        (12, true, 1),
        (12, true, 4),
        (12, false, 4),
    ] {
        let residency = Arc::new(ExpertResidency::new(u64::MAX));
        residency
            .set(model.gguf(), &resident, None)
            .expect("resident set");
        let capacity = experts_held * largest;
        let cache =
            Arc::new(ColdCache::with_io_depth(model.clone(), capacity, depth).expect("cache"));
        let mut local = LocalExperts::new(model.clone(), Some(pool.clone()))
            .with_residency(residency)
            .with_cold_cache(cache.clone());
        let mut prefetch = None;
        if predict {
            let p = Arc::new(
                Prefetcher::new(model.clone())
                    .expect("prefetch thread")
                    .with_cold_cache(cache.clone()),
            );
            local = local.with_prefetch(p.clone());
            prefetch = Some(p);
        }
        let got = run(&model, Arc::new(local), 6);
        let what = format!(
            "{name}, cache of {experts_held} experts, prediction {predict}, {depth} reads in flight"
        );
        assert_eq!(got, want, "{what}: the staged cold path changed the logits");
        let st = cache.stats();
        assert!(st.misses > 0 && st.bytes_read > 0, "{what}: {st:?}");
        assert!(
            cache.held_bytes() <= capacity,
            "{what}: {} bytes held over a capacity of {capacity}",
            cache.held_bytes()
        );
        if experts_held == 1 {
            // one expert at a time: every call beyond the first expert evicts
            assert!(st.evicted > 0, "{what}: {st:?}");
        } else {
            // decode steps reuse what the prompt brought in
            assert!(st.hits > 0, "{what}: {st:?}");
        }
        if let Some(p) = prefetch {
            // the prediction scored every MoE layer's experts for the cache's eviction order
            // (the first by its own router): finite scores for all of them
            let ne = model.config().n_expert as u32;
            for l in (0..model.config().n_layer).filter(|&l| model.config().is_moe_layer(l)) {
                for e in 0..ne {
                    let s = cache.score_of(l, e);
                    assert!(
                        s.is_some_and(f32::is_finite),
                        "{what}: layer {l} expert {e}: {s:?}"
                    );
                }
            }
            let ps = p.stats();
            assert!(ps.issued > 0, "{what}: {ps:?}");
            assert_eq!(ps.in_time + ps.late, ps.cold_requested, "{what}: {ps:?}");
            if experts_held > 1 {
                assert!(st.prefetched > 0, "{what}: {st:?}");
            }
        }
        assert!(st.summary().contains("cold cache"), "{}", st.summary());
    }
}

#[test]
fn staged_cold_experts_give_identical_logits_qwen3moe() {
    check("tiny-qwen3moe-Q4_K_M.gguf");
}

#[test]
fn staged_cold_experts_give_identical_logits_deepseek2() {
    check("tiny-deepseek2-Q2_K.gguf");
}

#[test]
fn the_cache_holds_the_files_bytes_and_refuses_misuse() {
    let model = mapped("tiny-qwen3moe-Q4_K_M.gguf");
    let all = all_experts(&model);
    let cache = ColdCache::new(model.clone(), 1 << 30).expect("cache");
    for &(l, e) in all.iter().take(9) {
        cache.demand(l as usize, e).expect("demand");
    }
    for &(l, e) in all.iter().take(9) {
        let c = cache
            .take(l as usize, e, true)
            .expect("read")
            .expect("a copy after waiting");
        let w = model.expert_weights(l as usize, e).expect("expert");
        let got = c.weights(w.clone()).expect("views");
        assert_eq!(
            got.gate.bytes(),
            w.gate.bytes(),
            "layer {l} expert {e} gate"
        );
        assert_eq!(got.up.bytes(), w.up.bytes(), "layer {l} expert {e} up");
        assert_eq!(
            got.down.bytes(),
            w.down.bytes(),
            "layer {l} expert {e} down"
        );
        assert!(c.footprint() >= (w.gate.bytes().len() * 3) as u64);
        assert!(cache.is_ready(l as usize, e));
    }
    // taking what was never demanded, and unknown experts, are errors
    let (l, e) = all[20];
    assert!(!cache.is_ready(l as usize, e));
    let err = cache.take(l as usize, e, true).expect_err("not demanded");
    assert!(err.to_string().contains("without being demanded"), "{err}");
    assert!(cache.demand(l as usize, 99_999).is_err());
    assert!(cache.prefetch(l as usize, &[99_999]).is_err());
    let st = cache.stats();
    assert_eq!((st.misses, st.hits), (9, 0), "{st:?}");

    // predictions still queued when their layer starts are dropped, the others read; either
    // way the layer's demands are served with the file's bytes
    let layer = all[0].0;
    let later: Vec<u32> = all
        .iter()
        .filter(|k| k.0 == layer)
        .map(|k| k.1)
        .skip(9)
        .collect();
    assert!(!later.is_empty());
    cache.prefetch(layer as usize, &later).expect("prefetch");
    let dropped = cache.settle(layer as usize);
    assert!(dropped <= later.len());
    assert_eq!(cache.stats().dropped, dropped as u64);
    for &e in &later {
        cache.demand(layer as usize, e).expect("demand");
        let c = cache
            .take(layer as usize, e, true)
            .expect("read")
            .expect("a copy after waiting");
        let w = model.expert_weights(layer as usize, e).expect("expert");
        assert_eq!(
            c.weights(w.clone()).expect("views").down.bytes(),
            w.down.bytes()
        );
    }
}

/// A call holding the one copy a full cache has, then demanding another on the same thread (an
/// expert node's pool worker that took up a second call while it joined) is served: the read
/// goes over the capacity after a bounded wait instead of waiting forever for the copy held.
#[test]
fn a_read_waited_for_under_a_held_copy_goes_over_the_capacity() {
    let model = mapped("tiny-qwen3moe-Q4_K_M.gguf");
    let all = all_experts(&model);
    let probe = ColdCache::new(model.clone(), 0).expect("probe");
    let one = all
        .iter()
        .map(|&(l, e)| probe.footprint(l as usize, e).expect("footprint"))
        .max()
        .expect("experts");
    drop(probe);
    let cache = Arc::new(ColdCache::new(model.clone(), one).expect("cache"));
    let (tx, rx) = std::sync::mpsc::channel();
    let c = cache.clone();
    let (a, b) = (all[0], all[1]);
    std::thread::spawn(move || {
        let r = (|| {
            c.demand(a.0 as usize, a.1)?;
            let held = c.take(a.0 as usize, a.1, true)?.expect("first copy");
            c.demand(b.0 as usize, b.1)?;
            let second = c.take(b.0 as usize, b.1, true)?.expect("second copy");
            Ok::<_, nightshift_model::ExpertError>(held.footprint() + second.footprint())
        })();
        let _ = tx.send(r);
    });
    let both = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the second read was served within 20 s")
        .expect("reads");
    assert!(
        both > one,
        "two copies ({both} bytes) held over a capacity of {one}"
    );
    assert!(cache.held_bytes() > one);
    assert_eq!(cache.stats().misses, 2);
}

/// A residency lends the staging cache what its budget leaves (`nightshift-atlas plan
/// --resident-share`): the cache grows by it, gives it back before a larger set is copied, and
/// the engine's logits stay the plain engine's bit for bit with part of the budget in the cache.
#[test]
fn the_budget_a_resident_set_leaves_goes_to_the_staging_cache() {
    let model = mapped("tiny-qwen3moe-Q4_K_M.gguf");
    let pool = nightshift_model::build_pool(2).expect("pool");
    let want = run(
        &model,
        Arc::new(LocalExperts::new(model.clone(), Some(pool.clone()))),
        6,
    );
    let all = all_experts(&model);
    let size = |set: &[(u32, u32)]| expert_bytes(&model, set);
    let half: Vec<(u32, u32)> = all.iter().copied().step_by(2).collect();
    let quarter: Vec<(u32, u32)> = all.iter().copied().step_by(4).collect();
    let budget = size(&half);
    let residency = Arc::new(ExpertResidency::new(budget));
    residency.set(model.gguf(), &quarter, None).expect("set");
    let cache = Arc::new(ColdCache::with_io_depth(model.clone(), 1 << 20, 2).expect("cache"));
    residency.lend_spare_to(cache.clone());
    assert_eq!(cache.lent(), budget - size(&quarter));
    assert_eq!(cache.capacity(), (1 << 20) + budget - size(&quarter));
    let local = LocalExperts::new(model.clone(), Some(pool.clone()))
        .with_residency(residency.clone())
        .with_cold_cache(cache.clone());
    let got = run(&model, Arc::new(local), 6);
    assert_eq!(got, want, "a budget lent to the cache changed the logits");
    assert!(cache.held_bytes() <= cache.capacity());
    // the whole budget resident: the loan is taken back and the cache is within its own size
    residency.set(model.gguf(), &half, None).expect("set");
    assert_eq!(cache.lent(), 0);
    assert!(cache.held_bytes() <= 1 << 20, "{} held", cache.held_bytes());
    // a set over the budget is refused and the loan stays what the kept set leaves
    assert!(residency.set(model.gguf(), &all, None).is_err());
    assert_eq!(cache.lent(), 0);
    residency.set(model.gguf(), &[], None).expect("set");
    assert_eq!(cache.lent(), budget);
}
