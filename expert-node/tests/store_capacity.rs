//! The store enforces the node's `memory_bytes` on resident experts: a load that would exceed it
//! fails whole with an error saying the need and the capacity, before anything is copied; cold
//! (mapped) experts do not count; experts already resident cost nothing again; a drop frees room.

#[path = "../../model/tests/fixture_util/locate.rs"]
mod locate;

use std::sync::Arc;

use nightshift_expert_node::store::{ExpertStore, StoreError};
use nightshift_model::expert::ExpertWeights;
use nightshift_model::gguf::Gguf;

fn model() -> Arc<Gguf> {
    let p = locate::fixture_path("tiny-qwen3moe-Q2_K.gguf");
    Arc::new(Gguf::open(&p).expect("fixture"))
}

fn expert_bytes(g: &Gguf) -> u64 {
    let w = ExpertWeights::from_gguf(g, 0, 0).expect("expert 0");
    w.bytes() as u64
}

/// The model, one expert's bytes and a one-thread pool to load on.
fn setup() -> (Arc<Gguf>, u64, rayon::ThreadPool) {
    let g = model();
    let one = expert_bytes(&g);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    (g, one, pool)
}

#[test]
fn resident_loads_respect_capacity() {
    let (g, one, pool) = setup();
    let store = ExpertStore::new(g, false).with_capacity(2 * one);

    assert_eq!(
        store.load(&[(0, 0), (0, 1)], true, &pool).expect("two fit"),
        2
    );
    assert_eq!(store.resident_bytes(), 2 * one);
    // Already resident: no new bytes.
    store
        .load(&[(0, 1)], true, &pool)
        .expect("re-load of a resident expert");
    // Cold experts are mapped, not copied: they do not count.
    store
        .load(&[(0, 2), (0, 3)], false, &pool)
        .expect("cold loads");

    let before = store.inventory();
    match store.load(&[(0, 2), (1, 5)], true, &pool) {
        Err(e @ StoreError::OverCapacity { needed, capacity }) => {
            assert_eq!((needed, capacity), (4 * one, 2 * one));
            assert_eq!(
                e.to_string(),
                format!(
                    "loading would hold {} bytes of resident experts, capacity memory_bytes is {}",
                    4 * one,
                    2 * one
                )
            );
        }
        other => panic!("expected OverCapacity, found {other:?}"),
    }
    assert_eq!(store.inventory(), before, "a refused load changes nothing");

    // Duplicates in one request count once; a drop makes room.
    assert_eq!(store.drop_experts(&[(0, 0)]).expect("drop"), 1);
    store
        .load(&[(0, 2), (0, 2)], true, &pool)
        .expect("upgrade fits after the drop");
    assert_eq!(store.resident_bytes(), 2 * one);
    assert!(store
        .inventory()
        .iter()
        .any(|h| (h.layer, h.expert, h.resident) == (0, 2, true)));
}

#[test]
fn zero_capacity_is_unlimited() {
    let (g, _, pool) = setup();
    let store = ExpertStore::new(g, false).with_capacity(0);
    let all: Vec<(u32, u32)> = (0..16).map(|e| (0, e)).collect();
    assert_eq!(store.load(&all, true, &pool).expect("unlimited"), 16);
}

/// With a staging cache, the capacity the resident copies leave is lent to it
/// (`ColdCache::lend`): a load takes the loan back before copying (the cache evicts at once),
/// a refused load leaves it, a drop gives the freed bytes back.
#[test]
fn the_capacity_resident_copies_leave_is_lent_to_the_staging_cache() {
    use std::time::{Duration, Instant};

    use nightshift_model::cold::ColdCache;

    let (g, one, pool) = setup();
    let cache = Arc::new(ColdCache::new(g.clone(), 1).expect("cache"));
    let foot = cache.footprint(1, 0).expect("footprint");
    let store = ExpertStore::new(g, false).with_capacity(6 * one);
    store.load(&[(0, 0)], true, &pool).expect("one resident");
    let cold: Vec<(u32, u32)> = (0..8).map(|e| (1, e)).collect();
    store.load(&cold, false, &pool).expect("cold");
    let store = store.with_cold_cache(cache.clone());
    assert_eq!(cache.lent(), 5 * one);
    assert_eq!(store.spare(store.resident_bytes()), 5 * one);

    // fill the cache with cold experts of layer 1, as the coordinator's hints do
    let fits = (cache.capacity() / foot) as usize;
    assert!(fits >= 2, "the loan holds {fits} experts");
    let hinted: Vec<u32> = (0..fits as u32).collect();
    store.hint(1, &hinted);
    let t = Instant::now();
    while !hinted.iter().all(|&e| cache.is_ready(1, e)) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "hinted experts never read"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(cache.held_bytes() > foot);

    // three more resident: the loan shrinks to 2 experts' bytes and the cache evicts at once
    store
        .load(&[(0, 1), (0, 2), (0, 3)], true, &pool)
        .expect("fits");
    assert_eq!(cache.lent(), 2 * one);
    assert!(
        cache.held_bytes() <= cache.capacity(),
        "{} held, capacity {}",
        cache.held_bytes(),
        cache.capacity()
    );
    assert!(store.resident_bytes() + cache.lent() <= 6 * one);

    // refused: nothing moves
    assert!(store.load(&[(0, 4), (0, 5), (0, 6)], true, &pool).is_err());
    assert_eq!(cache.lent(), 2 * one);

    // a drop gives the freed bytes back
    assert_eq!(store.drop_experts(&[(0, 1), (0, 2)]).expect("drop"), 2);
    assert_eq!(cache.lent(), 4 * one);

    // a capacity beyond the memory left is lent only up to the bound
    let (g, _, _) = setup();
    let cache = Arc::new(ColdCache::new(g.clone(), 1).expect("cache"));
    let store = ExpertStore::new(g, false).with_capacity(6 * one);
    store.load(&[(0, 0)], true, &pool).expect("one resident");
    let store = store
        .with_loan_bound(3 * one)
        .with_cold_cache(cache.clone());
    assert_eq!(cache.lent(), 2 * one);
    assert_eq!(store.drop_experts(&[(0, 0)]).expect("drop"), 1);
    assert_eq!(cache.lent(), 3 * one);
}
