//! Resident copies (one arena per load, on huge pages where the kernel allows) hold exactly the
//! mapped bytes of every matrix, live outside the file map, survive drops of the other experts of
//! their load, and a cold expert upgraded to resident gets its own copy.

#[path = "../../model/tests/fixture_util/locate.rs"]
mod locate;

use std::sync::Arc;

use nightshift_expert_node::store::ExpertStore;
use nightshift_model::expert::ExpertWeights;
use nightshift_model::gguf::Gguf;

fn model() -> Arc<Gguf> {
    let p = locate::fixture_path("tiny-qwen3moe-Q2_K.gguf");
    Arc::new(Gguf::open(&p).expect("fixture"))
}

/// (bytes of gate, up, down, and whether each lies inside the file map) as the store serves them.
fn served(store: &ExpertStore, g: &Gguf, layer: u32, expert: u32) -> (Vec<Vec<u8>>, bool) {
    store
        .with_layer(layer, |get| {
            let w = get(expert).expect("held");
            let mats = [w.gate, w.up, w.down].map(|m| m.bytes());
            let mapped = ExpertWeights::from_gguf(g, layer as usize, expert as usize).expect("w");
            let in_map = mats
                .iter()
                .zip([mapped.gate, mapped.up, mapped.down].map(|m| m.bytes()))
                .all(|(a, b)| a.as_ptr() == b.as_ptr());
            (mats.iter().map(|m| m.to_vec()).collect(), in_map)
        })
        .expect("layer")
}

fn file_bytes(g: &Gguf, layer: u32, expert: u32) -> Vec<Vec<u8>> {
    let w = ExpertWeights::from_gguf(g, layer as usize, expert as usize).expect("w");
    [w.gate, w.up, w.down].map(|m| m.bytes().to_vec()).into()
}

#[test]
fn resident_copies_hold_the_mapped_bytes() {
    let g = model();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    let store = ExpertStore::new(g.clone(), false);
    // a duplicate in one load, and experts of two layers
    let keys = [(0, 0), (0, 3), (1, 5), (0, 3), (1, 0)];
    store.load(&keys, true, &pool).expect("resident load");
    store.load(&[(0, 1)], false, &pool).expect("cold load");
    for &(l, e) in &keys {
        let (bytes, in_map) = served(&store, &g, l, e);
        assert!(!in_map, "({l}, {e}) is served from the file map");
        assert_eq!(bytes, file_bytes(&g, l, e), "({l}, {e}) copy differs");
    }
    let (bytes, in_map) = served(&store, &g, 0, 1);
    assert!(in_map, "a cold expert must stay mapped");
    assert_eq!(bytes, file_bytes(&g, 0, 1));

    // dropping the others of its load leaves a copy intact
    store.drop_experts(&[(0, 0), (1, 5), (1, 0)]).expect("drop");
    assert_eq!(served(&store, &g, 0, 3).0, file_bytes(&g, 0, 3));

    // cold -> resident: its own copy, same bytes
    store.load(&[(0, 1)], true, &pool).expect("upgrade");
    let (bytes, in_map) = served(&store, &g, 0, 1);
    assert!(!in_map, "the upgraded expert still reads the map");
    assert_eq!(bytes, file_bytes(&g, 0, 1));
    let e = ExpertWeights::from_gguf(&g, 0, 0).expect("w");
    let one = e.bytes() as u64;
    assert_eq!(store.resident_bytes(), 2 * one);
}
