//! Speculative decoding's engine side on the fixture models: a verification step (the decode
//! token plus draft tokens as rows of one step) gives every row the bits of one-token decode
//! steps; cutting rejected drafts off the cache ([`Engine::truncate`]) leaves the sequence
//! exactly as if they had never been fed, and keeps them out of the prefix cache; the draft
//! model drafts the target's greedy continuation when it is the target (several sequences in
//! shared draft steps too), and refuses a model with another vocabulary.

use nightshift_model::sampler::argmax;
use nightshift_model::spec::{DraftModel, DraftRequest, Drafter};
use nightshift_model::{BatchToken, Engine, EngineOptions, LocalExperts, Model, SeqId};
use std::sync::Arc;

mod fixture_util;
use fixture_util::model;

const MODELS: [&str; 2] = ["tiny-qwen3moe-Q4_K_M.gguf", "tiny-deepseek2-Q4_K_M.gguf"];

fn engine(m: &Arc<Model>) -> Engine {
    let backend = Arc::new(LocalExperts::new(m.clone(), None));
    let opts = EngineOptions {
        threads: 2,
        kv_budget_tokens: 1024,
        ..Default::default()
    };
    Engine::new(m.clone(), backend, opts).expect("engine")
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

/// Greedy continuation of `prompt` by one-token steps: (tokens, the logits of each step).
fn greedy(m: &Arc<Model>, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut e = engine(m);
    let s = e.add_sequence().expect("seq");
    let mut rows = vec![e.prefill(s, prompt).expect("prefill")];
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(rows.last().expect("row"));
        out.push(t);
        rows.push(e.prefill(s, &[t]).expect("decode"));
    }
    (out, rows)
}

fn rows_of(seq: SeqId, start: usize, toks: &[u32]) -> Vec<BatchToken> {
    toks.iter()
        .enumerate()
        .map(|(i, &token)| BatchToken {
            seq,
            token,
            pos: (start + i) as u32,
            want_logits: true,
        })
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn verification_rows_and_rollback_give_the_bits_of_plain_decoding() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        // 29 prompt tokens: the drafts cross the block boundary at 32
        let prompt = tokens(29, 5, vocab);
        let (cont, want) = greedy(&m, &prompt, 9);
        let mut e = engine(&m);
        let s = e.add_sequence().expect("seq");
        let first = e.prefill(s, &prompt).expect("prefill");
        assert!(same_bits(&first, &want[0]), "{name}: prefill");
        // step 1: the decode token and 4 right drafts: every row is a one-token step's
        let mut toks = vec![cont[0]];
        toks.extend_from_slice(&cont[1..5]);
        let batch = rows_of(s, prompt.len(), &toks);
        let out = e.forward_drafts(&batch, &[(s, 4)]).expect("verify");
        for (j, row) in out.iter().enumerate() {
            assert!(same_bits(row, &want[1 + j]), "{name}: verification row {j}");
        }
        e.truncate(s, prompt.len() + 5).expect("settle");
        // step 2: the next token and 3 drafts, the second one wrong
        let mut wrong = cont[6..9].to_vec();
        wrong[1] = (wrong[1] + 1) % vocab as u32;
        let mut toks = vec![cont[5]];
        toks.extend_from_slice(&wrong);
        let at = prompt.len() + 5;
        let out = e
            .forward_drafts(&rows_of(s, at, &toks), &[(s, 3)])
            .expect("verify");
        assert!(same_bits(&out[0], &want[6]) && same_bits(&out[1], &want[7]));
        // keep the decode token and the first draft; the rest is rolled back
        e.truncate(s, at + 2).expect("rollback");
        assert_eq!(e.seq_len(s), Some(at + 2));
        let next = e.prefill(s, &[cont[7]]).expect("after rollback");
        assert!(
            same_bits(&next, &want[8]),
            "{name}: a step after the rollback"
        );
    }
}

#[test]
fn rejected_drafts_never_enter_the_prefix_cache() {
    let m = model(MODELS[0]);
    let vocab = m.config().n_vocab;
    let block = 16;
    let prompt = tokens(14, 8, vocab);
    let mut e = engine(&m);
    let (s, _) = e.admit(&prompt, 64, true).expect("admit");
    e.prefill(s, &prompt).expect("prefill");
    // drafts fill block 0 and reach into block 1; all rejected but the decode token
    let drafts = tokens(6, 99, vocab);
    let mut toks = vec![7];
    toks.extend_from_slice(&drafts);
    e.forward_drafts(&rows_of(s, 14, &toks), &[(s, 6)])
        .expect("verify");
    e.truncate(s, 15).expect("rollback");
    let kept = [&prompt[..], &[7]].concat();
    e.remove_sequence(s);
    // a prompt made of the rejected text finds nothing cached past the verified positions
    let mut rejected = kept.clone();
    rejected.extend_from_slice(&drafts);
    rejected.extend(tokens(20, 3, vocab));
    let (r, cached) = e.admit(&rejected, 64, true).expect("admit");
    assert_eq!(
        cached, 0,
        "block 0 held rejected drafts and must not be cached"
    );
    e.remove_sequence(r);
    // once verified text fills a block, it is cached
    let (s, _) = e.admit(&kept, 64, true).expect("admit");
    e.prefill(s, &kept).expect("prefill");
    let more = tokens(4, 11, vocab);
    e.forward_drafts(&rows_of(s, 15, &more), &[(s, 3)])
        .expect("verify");
    e.truncate(s, 19).expect("settle: all accepted");
    e.remove_sequence(s);
    let mut again = kept.clone();
    again.extend_from_slice(&more);
    again.extend(tokens(5, 4, vocab));
    let (r, cached) = e.admit(&again, 64, true).expect("admit");
    assert_eq!(cached, block, "the verified block is cached");
    e.remove_sequence(r);
}

#[test]
fn the_target_as_its_own_draft_model_drafts_its_greedy_continuation() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        let prompt = tokens(20, 2, vocab);
        let (cont, _) = greedy(&m, &prompt, 12);
        let pool = nightshift_model::build_pool(2).expect("pool");
        let mut d = DraftModel::new(m.clone(), &m, pool, 256).expect("draft model");
        let mut seq = prompt.clone();
        let draft = d
            .draft(&DraftRequest {
                key: 1,
                tokens: &seq,
                extra: &[],
                extra_from: 0,
                max: 5,
            })
            .expect("draft");
        assert_eq!(draft, cont[..5], "{name}");
        // the verifier accepted 2 and corrected the third: the drafter rolls back and goes on
        seq.extend_from_slice(&cont[..3]);
        let draft = d
            .draft(&DraftRequest {
                key: 1,
                tokens: &seq,
                extra: &[],
                extra_from: 0,
                max: 6,
            })
            .expect("draft");
        assert_eq!(draft, cont[3..9], "{name} after a rollback");
        d.end(1, &seq);
    }
}

#[test]
fn sequences_draft_together_in_shared_draft_steps() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        let prompts: Vec<Vec<u32>> = (0..3)
            .map(|k| tokens(12 + 4 * k, 30 + k as u32, vocab))
            .collect();
        let conts: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&m, p, 10).0).collect();
        let pool = nightshift_model::build_pool(2).expect("pool");
        let mut d = DraftModel::new(m.clone(), &m, pool, 512).expect("draft model");
        let maxes = [4usize, 6, 2];
        let reqs: Vec<DraftRequest> = prompts
            .iter()
            .zip(maxes)
            .enumerate()
            .map(|(k, (p, max))| DraftRequest {
                key: k as u64,
                tokens: p,
                extra: &[],
                extra_from: 0,
                max,
            })
            .collect();
        let before = d.engine().profile().steps;
        let got = d.draft_many(&reqs);
        for (k, g) in got.into_iter().enumerate() {
            assert_eq!(
                g.expect("draft"),
                conts[k][..maxes[k]],
                "{name} sequence {k}"
            );
        }
        // one step feeds the prompts, then one per further token of the longest draft
        assert_eq!(
            d.engine().profile().steps - before,
            6,
            "{name}: shared steps"
        );
        // each sequence accepted some of its draft: all roll back and go on together
        let seqs: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&conts)
            .zip([1usize, 5, 2])
            .map(|((p, c), kept)| [&p[..], &c[..kept]].concat())
            .collect();
        let reqs: Vec<DraftRequest> = seqs
            .iter()
            .enumerate()
            .map(|(k, s)| DraftRequest {
                key: k as u64,
                tokens: s,
                extra: &[],
                extra_from: 0,
                max: 3,
            })
            .collect();
        for (k, (g, kept)) in d
            .draft_many(&reqs)
            .into_iter()
            .zip([1usize, 5, 2])
            .enumerate()
        {
            assert_eq!(
                g.expect("draft"),
                conts[k][kept..kept + 3],
                "{name} {k} after rollback"
            );
        }
        for (k, s) in seqs.iter().enumerate() {
            d.end(k as u64, s);
        }
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let q = model(MODELS[0]);
    let k = model(MODELS[1]);
    let pool = nightshift_model::build_pool(1).expect("pool");
    match DraftModel::new(k, &q, pool, 64) {
        Ok(_) => panic!("a deepseek2 fixture cannot draft for the qwen3moe one"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("draft model: expected the target's vocabulary"),
                "{msg}"
            );
        }
    }
}
