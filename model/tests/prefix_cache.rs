//! The paged KV cache and its prefix cache on the fixture models: a request that starts from
//! cached blocks (another request's prompt, a running sequence's, a whole prompt's, a fork)
//! gives the logits of the same request computed cold, bit for bit, with F32, F16 and Q8_0
//! caches on qwen3moe, deepseek2 and the dense qwen3 and llama; the budget is kept in blocks.
//! Prompts admitted together share the blocks the first of them computes (the others wait, then
//! take them), with the same bits.

use nightshift_model::{Engine, EngineOptions, KvType, LocalExperts, Model, ModelError, SeqId};
use std::sync::Arc;

mod fixture_util;
use fixture_util::kv::{engine, same_bits, tokens};
use fixture_util::model;

/// Greedy tokens decoded after each prompt.
const DECODE: usize = 3;

fn finish(e: &mut Engine, seq: SeqId, prompt: &[u32], cached: usize) -> Vec<Vec<f32>> {
    fixture_util::kv::finish(e, seq, prompt, cached, DECODE)
}

const MODELS: [&str; 4] = [
    "tiny-qwen3moe-Q4_K_M.gguf",
    "tiny-deepseek2-Q4_K_M.gguf",
    "tiny-qwen3-Q4_K_M.gguf",
    "tiny-llama-Q4_K_M.gguf",
];

/// The same rows from a fresh engine (nothing cached).
fn cold(m: &Arc<Model>, ty: KvType, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut e = engine(m, ty, false);
    let (s, cached) = e.admit(prompt, prompt.len() + 8, true).expect("admit");
    assert_eq!(cached, 0);
    finish(&mut e, s, prompt, 0)
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

#[test]
fn prompts_admitted_together_share_the_blocks_the_first_computes() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        for ty in [KvType::F32, KvType::F16] {
            let what = format!("{name} {ty:?}");
            // 40 shared tokens (2 full blocks + 8), then each prompt's own
            let shared = tokens(40, 21, vocab);
            let mut pa = shared.clone();
            pa.extend(tokens(7, 22, vocab));
            let mut pb = shared.clone();
            pb.extend(tokens(9, 23, vocab));
            let want = cold(&m, ty, &pb);
            let mut e = engine(&m, ty, true);
            let (a, ca) = e.admit(&pa, pa.len() + 8, true).expect("admit a");
            let (b, cb) = e.admit(&pb, pb.len() + 8, true).expect("admit b");
            assert_eq!((ca, cb), (0, 0), "{what}: nothing is cached yet");
            let reserved = e.kv_stats().reserved_blocks;
            let at = e.attach(b).expect("attach");
            assert_eq!((at.len, at.wait), (0, true), "{what}: a computes block 0");
            assert!(!e.attach(a).expect("attach").wait, "{what}: a never waits");
            e.prefill(a, &pa[..20]).expect("a's first chunk");
            let at = e.attach(b).expect("attach");
            assert_eq!(
                (at.len, at.taken, at.wait),
                (16, 16, true),
                "{what}: block 0 taken"
            );
            e.prefill(a, &pa[20..]).expect("a's rest");
            let at = e.attach(b).expect("attach");
            assert_eq!(
                (at.len, at.taken, at.wait),
                (32, 16, false),
                "{what}: block 1 taken, block 2 is b's own"
            );
            let st = e.kv_stats();
            assert_eq!(st.attached_tokens, 32, "{what}: attached positions counted");
            assert_eq!(
                st.reserved_blocks,
                reserved - 3 - 2,
                "{what}: a took 3 of its promised blocks, b needs the 2 it shares no more"
            );
            same_bits(&finish(&mut e, b, &pb, 32), &want, &what);
            // a claimant that leaves before computing: its waiters compute for themselves
            let mut pc = shared.clone();
            pc.extend(tokens(5, 24, vocab));
            let fresh = tokens(40, 25, vocab);
            let mut pd = fresh.clone();
            pd.extend(tokens(3, 26, vocab));
            let mut pe = fresh;
            pe.extend(tokens(4, 27, vocab));
            let (d, _) = e.admit(&pd, pd.len() + 8, true).expect("admit d");
            let (f, _) = e.admit(&pe, pe.len() + 8, true).expect("admit e");
            assert!(e.attach(f).expect("attach").wait, "{what}: d computes");
            e.remove_sequence(d);
            assert!(!e.attach(f).expect("attach").wait, "{what}: d left");
            let (c, cc) = e.admit(&pc, pc.len() + 8, true).expect("admit c");
            assert_eq!(cc, 32, "{what}: the shared blocks are cached now");
            e.remove_sequence(c);
            e.remove_sequence(f);
            e.remove_sequence(a);
            e.remove_sequence(b);
            assert_eq!(
                e.kv_stats().pending_blocks,
                0,
                "{what}: no claim outlives its sequence"
            );
        }
    }
}
