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

#[test]
fn resident_loads_respect_capacity() {
    let g = model();
    let one = expert_bytes(&g);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
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
    let g = model();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let store = ExpertStore::new(g, false).with_capacity(0);
    let all: Vec<(u32, u32)> = (0..16).map(|e| (0, e)).collect();
    assert_eq!(store.load(&all, true, &pool).expect("unlimited"), 16);
}
