//! The coordinator's prefetch hints on a node's store (`ExpertStore::hint`): experts a hint
//! names that the node does not hold (another layer, out of range, any id) are ignored and
//! counted, never a panic; held cold experts are read ahead into the staging cache and scored
//! against the call that follows (in time when read by then); resident ones need no read; and
//! the call's outputs are the bits of a store without a cache.

#[path = "../../model/tests/fixture_util/locate.rs"]
mod locate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_expert_node::store::ExpertStore;
use nightshift_model::cold::ColdCache;
use nightshift_model::expert::ExpertWeights;
use nightshift_model::gguf::Gguf;
use nightshift_model::{ActRows, ExpertPair};

#[test]
fn hints_read_held_cold_experts_ahead_and_ignore_the_rest() {
    let g =
        Arc::new(Gguf::open(&locate::fixture_path("tiny-qwen3moe-Q2_K.gguf")).expect("fixture"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    // layer 1: experts 0..4 resident, 4..8 cold; layer 0: 0..8 cold; nothing else held
    let load = |store: &ExpertStore| {
        store
            .load(&[(1, 0), (1, 1), (1, 2), (1, 3)], true, &pool)
            .expect("resident");
        let cold: Vec<(u32, u32)> = (4..8)
            .map(|e| (1, e))
            .chain((0..8).map(|e| (0, e)))
            .collect();
        store.load(&cold, false, &pool).expect("cold");
    };
    let cache = Arc::new(ColdCache::new(g.clone(), 64 << 20).expect("cache"));
    let store = ExpertStore::new(g.clone(), false).with_cold_cache(cache.clone());
    load(&store);
    let plain = ExpertStore::new(g.clone(), false);
    load(&plain);

    store.hint(999, &[1, 2]);
    store.hint(1, &[9, u32::MAX, 5, 0, 5]);
    store.hint(0, &[]);
    let st = store.hint_stats();
    assert_eq!((st.hints, st.ignored), (3, 4), "{st:?}");
    // 5 is held and cold: read ahead once; 0 is resident
    assert_eq!(st.prefetch.issued, 1, "{st:?}");
    let t = Instant::now();
    while !cache.is_ready(1, 5) {
        assert!(t.elapsed() < Duration::from_secs(10), "expert 5 never read");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!cache.is_ready(1, 9) && !cache.is_ready(999, 1));

    // a call of layer 1 using 5 (hinted), 6 (cold, not hinted) and 0 (resident)
    let w = ExpertWeights::from_gguf(&g, 1, 0).expect("weights");
    let n_embd = w.n_embd();
    let x: Vec<f32> = (0..2 * n_embd).map(|i| (i as f32 * 0.37).sin()).collect();
    let acts = ActRows::quantize(w.act_type(), &x, n_embd).expect("acts");
    let pairs: Vec<ExpertPair> = [(5, 0), (6, 1), (0, 0), (5, 1)]
        .iter()
        .map(|&(expert, row)| ExpertPair { expert, row })
        .collect();
    let mut out = vec![0f32; pairs.len() * n_embd];
    store
        .run(1, &acts, &pairs, n_embd, &mut out, Some(&pool))
        .expect("run");
    let mut want = vec![0f32; pairs.len() * n_embd];
    plain
        .run(1, &acts, &pairs, n_embd, &mut want, Some(&pool))
        .expect("run without a cache");
    assert!(
        out.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "outputs differ with a hint"
    );
    let p = store.hint_stats().prefetch;
    assert_eq!(
        (p.cold_needed, p.cold_requested, p.in_time),
        (2, 1, 1),
        "{p:?}"
    );
    assert_eq!((p.used, p.predicted_used), (3, 2), "{p:?}");
    assert_eq!(cache.stats().prefetched, 1);
    // a store without a cache takes hints without reading anything
    plain.hint(1, &[5, 77]);
    let q = plain.hint_stats();
    assert_eq!((q.hints, q.ignored, q.prefetch.issued), (1, 1, 0), "{q:?}");
}
