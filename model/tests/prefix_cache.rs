//! The paged KV cache and its prefix cache on the fixture models: a request that starts from
//! cached blocks (another request's prompt, a running sequence's, a whole prompt's, a fork)
//! gives the logits of the same request computed cold, bit for bit, with F32, F16 and Q8_0
//! caches on qwen3moe, deepseek2 and the dense qwen3 and llama; the budget is kept in blocks.

use nightshift_model::{Engine, EngineOptions, KvType, LocalExperts, Model, ModelError, SeqId};
use std::sync::Arc;

mod fixture_util;
use fixture_util::model;

const MODELS: [&str; 4] = [
    "tiny-qwen3moe-Q4_K_M.gguf",
    "tiny-deepseek2-Q4_K_M.gguf",
    "tiny-qwen3-Q4_K_M.gguf",
    "tiny-llama-Q4_K_M.gguf",
];

fn engine(m: &Arc<Model>, ty: KvType, prefix: bool) -> Engine {
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
fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) % (vocab as u32 - 1) + 1
        })
        .collect()
}

/// Prefills what `seq` has not cached of `prompt`, then greedy-decodes 3 tokens: every logits
/// row from the prompt's last position on.
fn finish(e: &mut Engine, seq: SeqId, prompt: &[u32], cached: usize) -> Vec<Vec<f32>> {
    let mut rows = vec![e.prefill(seq, &prompt[cached..]).expect("prefill")];
    for _ in 0..3 {
        let next = nightshift_model::sampler::argmax(rows.last().expect("row"));
        rows.push(e.prefill(seq, &[next]).expect("decode"));
    }
    rows
}

/// The same rows from a fresh engine (nothing cached).
fn cold(m: &Arc<Model>, ty: KvType, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut e = engine(m, ty, false);
    let (s, cached) = e.admit(prompt, prompt.len() + 8, true).expect("admit");
    assert_eq!(cached, 0);
    finish(&mut e, s, prompt, 0)
}

fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: row count");
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        let same = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{what}: row {r} differs from the cold computation");
    }
}

#[test]
fn cached_prefixes_give_the_bits_of_cold_computation() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let what = format!("{name} {ty:?}");
            let prompt = tokens(41, 3, vocab);
            let want = cold(&m, ty, &prompt);
            let mut e = engine(&m, ty, true);
            // an earlier request sharing the first 37 tokens: blocks 0 and 1 become cached
            let mut first = prompt[..37].to_vec();
            first.extend(tokens(6, 9, vocab));
            let (a, _) = e.admit(&first, 50, true).expect("admit");
            e.prefill(a, &first).expect("first request");
            e.remove_sequence(a);
            let (b, cached) = e.admit(&prompt, prompt.len() + 8, true).expect("admit");
            assert_eq!(cached, 32, "{what}: two full blocks cached");
            same_bits(&finish(&mut e, b, &prompt, cached), &want, &what);
            e.remove_sequence(b);
            // the whole prompt is cached now, in its blocks 0..=1 and (with the decoded tokens)
            // block 2 is partial: the hit stops at 32 again
            let (c, cached) = e.admit(&prompt, prompt.len() + 8, true).expect("admit");
            assert_eq!(cached, 32, "{what}: partial blocks are not cached");
            same_bits(&finish(&mut e, c, &prompt, cached), &want, &what);
            let st = e.kv_stats();
            assert_eq!(st.hit_tokens, 64, "{what}: hits counted");
        }
    }
}

#[test]
fn a_whole_cached_prompt_and_a_running_sequences_blocks_give_cold_bits() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let what = format!("{name} {ty:?}");
            // exactly two blocks: the last position lies in a cached block and is recomputed
            // in a copy of it
            let prompt = tokens(32, 5, vocab);
            let want = cold(&m, ty, &prompt);
            let mut e = engine(&m, ty, true);
            let (a, _) = e.admit(&prompt, 40, true).expect("admit");
            let got_a = finish(&mut e, a, &prompt, 0);
            same_bits(&got_a, &want, &what);
            // while `a` runs, a second sequence with the same prompt shares its blocks
            let (b, cached) = e.admit(&prompt, 40, true).expect("admit");
            assert_eq!(cached, 31, "{what}: all but the last prompt position");
            same_bits(&finish(&mut e, b, &prompt, cached), &want, &what);
            // and `a` is unaffected by `b`'s copy-on-write
            let next = nightshift_model::sampler::argmax(got_a.last().expect("row"));
            let mut f = engine(&m, ty, false);
            let (s, _) = f.admit(&prompt, 40, true).expect("admit");
            let mut cold_a = finish(&mut f, s, &prompt, 0);
            cold_a.push(f.prefill(s, &[next]).expect("decode"));
            let mut a_rows = got_a;
            a_rows.push(e.prefill(a, &[next]).expect("decode"));
            same_bits(&a_rows, &cold_a, &what);
        }
    }
}

#[test]
fn a_forked_sequence_continues_like_a_cold_one() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        let prompt = tokens(21, 7, vocab); // the last block is partly filled and shared
        let (x, y) = (tokens(1, 11, vocab)[0], tokens(1, 12, vocab)[0]);
        let mut e = engine(&m, KvType::F32, true);
        let s = e.add_sequence().expect("seq");
        e.prefill(s, &prompt).expect("prefill");
        let f = e.fork_sequence(s).expect("fork");
        let got_f = e.prefill(f, &[y]).expect("fork decodes");
        let got_s = e.prefill(s, &[x]).expect("origin decodes");
        for (tok, got) in [(x, got_s), (y, got_f)] {
            let mut full = prompt.clone();
            full.push(tok);
            let mut c = engine(&m, KvType::F32, false);
            let cs = c.add_sequence().expect("seq");
            let want = c.prefill(cs, &full).expect("cold");
            same_bits(&[got], &[want], name);
        }
    }
}

#[test]
fn admission_waits_for_blocks_and_steps_never_run_out() {
    let m = model(MODELS[0]);
    let backend = Arc::new(LocalExperts::new(m.clone(), None));
    let opts = EngineOptions {
        threads: 2,
        kv_budget_tokens: 64, // 4 blocks
        ..Default::default()
    };
    let mut e = Engine::new(m.clone(), backend, opts).expect("engine");
    let (a, _) = e.admit(&[1, 2, 3], 40, true).expect("3 blocks promised");
    assert!(matches!(
        e.admit(&[4, 5], 20, true),
        Err(ModelError::KvFull(_))
    ));
    assert!(
        e.admit(&[4, 5], 100, true).is_err(),
        "beyond the whole pool"
    );
    let toks: Vec<u32> = (1..=40).collect();
    e.prefill(a, &toks).expect("a uses its promise");
    e.remove_sequence(a);
    let (b, _) = e.admit(&[4, 5], 20, true).expect("room again");
    e.prefill(b, &[4, 5]).expect("b");
    let st = e.kv_stats();
    assert_eq!(st.capacity_blocks, 4);
    assert_eq!(st.used_blocks, 1);
}
