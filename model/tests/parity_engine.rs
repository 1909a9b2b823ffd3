//! Engine behaviour the scheduler relies on: a prompt prefilled in chunks gives the same bits as
//! in one batch; a bad batch (unknown sequence, wrong position, token out of range, KV budget
//! exceeded) is an error that leaves every sequence as it was; removing a sequence frees its KV.

use nightshift_model::{BatchToken, Engine, EngineOptions, LocalExperts, Model, SeqId};
use std::sync::Arc;

mod fixture_util;
use fixture_util::{fixture_path, model};

fn engine(m: &Arc<Model>, budget: usize) -> Engine {
    let backend = Arc::new(LocalExperts::new(m.clone(), None));
    let opts = EngineOptions {
        threads: 2,
        kv_budget_tokens: budget,
        ..Default::default()
    };
    Engine::new(m.clone(), backend, opts).expect("engine")
}

fn toks(seq: SeqId, ids: &[u32], start: u32) -> Vec<BatchToken> {
    ids.iter()
        .enumerate()
        .map(|(i, &t)| BatchToken {
            seq,
            token: t,
            pos: start + i as u32,
            want_logits: true,
        })
        .collect()
}

const PROMPT: [u32; 9] = [584, 72, 101, 327, 111, 343, 262, 108, 100];

#[test]
fn chunked_prefill_equals_one_batch() {
    for name in ["tiny-deepseek2-Q4_K_M.gguf", "tiny-qwen3moe-Q2_K.gguf"] {
        let m = model(name);
        let mut a = engine(&m, 1024);
        let sa = a.add_sequence().expect("seq");
        let whole = a.forward(&toks(sa, &PROMPT, 0)).expect("whole");
        let mut b = engine(&m, 1024);
        let sb = b.add_sequence().expect("seq");
        let mut parts = b.forward(&toks(sb, &PROMPT[..4], 0)).expect("chunk 1");
        parts.extend(b.forward(&toks(sb, &PROMPT[4..], 4)).expect("chunk 2"));
        assert_eq!(whole, parts, "{name}: chunked prefill differs");
    }
}

#[test]
fn bad_batches_are_errors_and_change_nothing() {
    let m = model("tiny-qwen3moe-Q4_K_M.gguf");
    let mut e = engine(&m, 12);
    let s = e.add_sequence().expect("seq");
    e.forward(&toks(s, &PROMPT[..3], 0)).expect("prefill");
    let cases: Vec<(&str, Vec<BatchToken>)> = vec![
        ("unknown sequence", toks(SeqId(7), &[1], 0)),
        ("position gap", toks(s, &[1], 4)),
        ("position repeated", toks(s, &[1], 2)),
        ("token out of range", toks(s, &[100_000], 3)),
        // the budget of 12 positions is one block of 16: 3 + 14 positions need two
        (
            "kv budget",
            toks(s, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], 3),
        ),
    ];
    for (what, batch) in cases {
        assert!(e.forward(&batch).is_err(), "{what}: expected an error");
        assert_eq!(e.seq_len(s), Some(3), "{what}: sequence changed");
        assert_eq!(e.kv_usage().0, 3, "{what}: kv usage changed");
    }
    // Still usable, and identical to a fresh engine's result.
    let next = e.forward(&toks(s, &PROMPT[3..5], 3)).expect("continue");
    let mut f = engine(&m, 12);
    let t = f.add_sequence().expect("seq");
    let fresh = f.forward(&toks(t, &PROMPT[..5], 0)).expect("fresh");
    assert_eq!(next[..], fresh[3..]);
    // Removing frees the budget for another sequence.
    e.remove_sequence(s);
    assert_eq!(e.kv_usage().0, 0);
    let u = e.add_sequence().expect("seq");
    e.forward(&toks(u, &PROMPT, 0)).expect("fits after removal");
}

/// The hyper-parameters llama.cpp derives: deepseek2's YaRN (factor 32, converter-stored
/// yarn_log_multiplier 0.1 = 0.1 * mscale_all_dim) gives kq_scale = (1 + 0.1 ln 32)^2 / sqrt(96)
/// and a rope attn_factor that cancels rope's own YaRN magnitude; qwen3moe is plain NEOX rope.
#[test]
fn config_matches_llama_cpp_hparams() {
    let d = model("tiny-deepseek2-Q2_K.gguf");
    let c = d.config();
    let ln32 = 32f32.ln();
    let mscale = 1.0 + 0.1 * ln32;
    assert!(
        (c.kq_scale - mscale * mscale / 96f32.sqrt()).abs() < 1e-6,
        "kq_scale {}",
        c.kq_scale
    );
    assert!((c.rope.attn_factor - 1.0 / mscale).abs() < 1e-7);
    assert_eq!(
        (c.rope.neox, c.rope.n_dims, c.rope.n_ctx_orig),
        (false, 32, 4096)
    );
    assert_eq!((c.rope.freq_scale, c.rope.ext_factor), (1.0 / 32.0, 1.0));
    let m = c.mla.as_ref().expect("mla");
    assert_eq!(
        (
            m.q_lora_rank,
            m.kv_lora_rank,
            m.qk_nope,
            m.qk_rope,
            m.v_head
        ),
        (128, 128, 64, 32, 64)
    );
    assert_eq!(
        (
            c.n_dense_lead,
            c.n_expert,
            c.n_expert_used,
            c.n_expert_shared
        ),
        (1, 16, 4, 1)
    );
    assert!(c.expert_weights_norm && (c.expert_weights_scale - 2.827).abs() < 1e-6);
    let q = model("tiny-qwen3moe-Q8_0.gguf");
    let c = q.config();
    assert_eq!(
        (c.rope.neox, c.rope.n_dims, c.rope.ext_factor, c.kq_scale),
        (true, 64, 0.0, 0.125)
    );
    assert_eq!((c.n_head, c.n_head_kv, c.head_k), (4, 2, 64));
}

/// A removed sequence's id stays dead: the slot it freed is reused under a new id, and the old
/// id is an unknown sequence rather than an alias of the new one.
#[test]
fn removed_sequence_ids_are_not_reused() {
    let m = model("tiny-qwen3moe-Q4_K_M.gguf");
    let mut e = engine(&m, 64);
    let a = e.add_sequence().expect("a");
    e.forward(&toks(a, &PROMPT[..2], 0)).expect("prefill a");
    e.remove_sequence(a);
    let b = e.add_sequence().expect("b");
    assert_ne!(a, b, "a fresh sequence must not get the removed id");
    assert_eq!(e.seq_len(a), None);
    assert_eq!(e.seq_len(b), Some(0));
    let err = e.forward(&toks(a, &PROMPT[2..3], 2)).expect_err("stale id");
    assert!(err.to_string().contains("unknown sequence"), "{err}");
    e.remove_sequence(a); // a no-op: b stays
    assert_eq!(e.seq_len(b), Some(0));
    e.forward(&toks(b, &PROMPT[..2], 0)).expect("b works");
    assert_eq!(e.kv_usage().0, 2);
}

#[test]
fn weights_on_huge_pages_give_the_same_bits_and_only_the_chosen_bytes_move() {
    use nightshift_model::gguf::Gguf;
    use nightshift_model::{ExpertMemory, LoadOptions};
    for name in ["tiny-deepseek2-Q4_K_M.gguf", "tiny-qwen3moe-Q2_K.gguf"] {
        let open = |huge_pages: bool, experts: ExpertMemory| {
            let g = Gguf::open(&fixture_path(name)).expect("open");
            let opts = LoadOptions {
                huge_pages,
                experts,
            };
            Arc::new(Model::from_gguf_opts(g, opts).expect("model"))
        };
        let mapped = open(false, ExpertMemory::Resident); // no copies at all without huge_pages
        let dense = open(true, ExpertMemory::Mapped);
        let all = open(true, ExpertMemory::Resident);
        assert_eq!(mapped.resident_bytes(), 0);
        let in_map = |m: &Model, bytes: &[u8]| {
            let g = m.gguf();
            g.tensors().any(|t| {
                let d = g.tensor_data(t);
                let (a, b) = (d.as_ptr() as usize, d.as_ptr() as usize + d.len());
                (a..b).contains(&(bytes.as_ptr() as usize))
            })
        };
        let last_moe = |m: &Model| -> Vec<bool> {
            let w = m.weights();
            match &w.layers[w.layers.len() - 1].ffn {
                nightshift_model::weights::FfnWeights::Moe(e) => {
                    [e.gate_exps.data(), e.up_exps.data(), e.down_exps.data()]
                        .iter()
                        .map(|d| in_map(m, d))
                        .collect()
                }
                nightshift_model::weights::FfnWeights::Dense(_) => {
                    panic!("{name}: last layer is MoE")
                }
            }
        };
        // the dense copy holds the output head and every attention matrix, not the experts
        assert!(in_map(&mapped, mapped.weights().output.data()));
        assert!(
            !in_map(&dense, dense.weights().output.data()),
            "{name}: head still mapped"
        );
        assert!(
            dense.resident_bytes() >= dense.weights().output.data().len(),
            "{name}: {} resident bytes, the head alone is {}",
            dense.resident_bytes(),
            dense.weights().output.data().len()
        );
        assert_eq!(last_moe(&mapped), [true; 3]);
        assert_eq!(last_moe(&dense), [true; 3], "{name}: experts were copied");
        // with the experts: every expert byte is in the copy, none read from the map
        assert!(!in_map(&all, all.weights().output.data()));
        assert_eq!(last_moe(&all), [false; 3], "{name}: experts still mapped");
        let expert_bytes = all.weights().expert_bytes() as usize;
        assert!(expert_bytes > 0);
        assert!(
            all.resident_bytes() >= dense.resident_bytes() + expert_bytes,
            "{name}: {} resident bytes, dense {} + experts {expert_bytes}",
            all.resident_bytes(),
            dense.resident_bytes()
        );
        let run = |m: &Arc<Model>| {
            let mut e = engine(m, 1024);
            let s = e.add_sequence().expect("seq");
            let mut out = e.forward(&toks(s, &PROMPT, 0)).expect("prefill");
            out.extend(
                e.forward(&toks(s, &[42], PROMPT.len() as u32))
                    .expect("decode"),
            );
            out
        };
        let bits =
            |v: &Vec<Vec<f32>>| -> Vec<u32> { v.iter().flatten().map(|f| f.to_bits()).collect() };
        let want = bits(&run(&mapped));
        assert_eq!(
            bits(&run(&dense)),
            want,
            "{name}: logits differ with the dense copy"
        );
        assert_eq!(
            bits(&run(&all)),
            want,
            "{name}: logits differ with the experts copied"
        );
    }
}
