//! Test-only: what the KV-cache tests (prefix cache, disk tier) share — an engine over a fixture
//! with a 512-position budget, seeded prompts, prefill-then-greedy logits rows, and the bitwise
//! comparison of those rows.

use nightshift_model::{Engine, EngineOptions, KvType, LocalExperts, Model, SeqId};
use std::sync::Arc;

/// An engine over `m` (2 threads, 512 cached positions, prefix cache on or off) with a `ty` cache.
pub fn engine(m: &Arc<Model>, ty: KvType, prefix: bool) -> Engine {
    let backend = Arc::new(LocalExperts::new(m.clone(), None));
    let opts = EngineOptions {
        threads: 2,
        kv_budget_tokens: 512,
        prefix_cache: prefix,
        ..Default::default()
    };
    let mut e = Engine::new(m.clone(), backend, opts).expect("engine");
    e.set_kv_type(ty).expect("kv type");
    e
}

/// `n` token ids below `vocab` from `seed`.
pub fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) % (vocab as u32 - 1) + 1
        })
        .collect()
}

/// Prefills what `seq` has not cached of `prompt`, then greedy-decodes `decode` tokens: every
/// logits row from the prompt's last position on.
pub fn finish(
    e: &mut Engine,
    seq: SeqId,
    prompt: &[u32],
    cached: usize,
    decode: usize,
) -> Vec<Vec<f32>> {
    let mut rows = vec![e.prefill(seq, &prompt[cached..]).expect("prefill")];
    for _ in 0..decode {
        let next = nightshift_model::sampler::argmax(rows.last().expect("row"));
        rows.push(e.prefill(seq, &[next]).expect("decode"));
    }
    rows
}

/// Asserts `a` and `b` are the same rows, bit for bit.
pub fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: row count");
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        let same = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{what}: row {r} differs from the cold computation");
    }
}
