//! Two micro-batches (issue 23, overlap b): with the nodes reached over the network (data links,
//! or the gRPC streams alone), a step of
//! several sequences runs as two halves whose layer calls alternate. The logits of every step are
//! bit-identical to the in-process engine's for qwen3moe and deepseek2 (shared expert), for
//! decode steps of 2, 3 and 5 sequences and for a step mixing one sequence's prefill chunk with
//! the others' decode tokens (uneven halves), with micro-batches on and off, over both transports,
//! with the overlaps chosen per step shape from measured steps (the default: the first steps of
//! a shape try each mode in turn) and with the shared-expert overlap in every step.

mod support;

use std::sync::Arc;

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, RemoteOptions};
use nightshift_model::{BatchToken, Engine, ExpertBackend, LocalExperts, Model, SeqId};
use support::cluster::{assert_bits_equal, connect, launch, nodes};
use support::{engine, fixture};

/// Prefills `seqs` sequences with different prompts, then runs the steps of the script: three
/// decode steps of all of them, one step where the first sequence feeds a 5-token chunk while the
/// others decode, one more decode of all. Returns every logits row of every step.
fn script(e: &mut Engine, seqs: usize, n_vocab: u32) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let mut ids: Vec<(SeqId, u32)> = Vec::new();
    for s in 0..seqs {
        let seq = e.add_sequence().expect("sequence");
        let prompt: Vec<u32> = (0..4 + s as u32)
            .map(|i| (i * 37 + s as u32 * 11 + 400) % n_vocab)
            .collect();
        out.extend(e.prefill_all(seq, &prompt).expect("prefill"));
        ids.push((seq, prompt.len() as u32));
    }
    let tok = |step: u32, s: usize| (step * 31 + s as u32 * 17 + 405) % n_vocab;
    let step_all = |e: &mut Engine, ids: &mut Vec<(SeqId, u32)>, step: u32, chunk: usize| {
        let mut batch = Vec::new();
        for (s, (seq, pos)) in ids.iter_mut().enumerate() {
            let n = if s == 0 { chunk } else { 1 };
            for i in 0..n {
                batch.push(BatchToken {
                    seq: *seq,
                    token: tok(step + i as u32, s),
                    pos: *pos,
                    want_logits: true,
                });
                *pos += 1;
            }
        }
        e.forward(&batch).expect("step")
    };
    for step in 0..3 {
        out.extend(step_all(e, &mut ids, step, 1));
    }
    out.extend(step_all(e, &mut ids, 3, 5));
    out.extend(step_all(e, &mut ids, 9, 1));
    out
}

#[test]
fn micro_batches_over_streams_match_in_process() {
    for file in ["tiny-qwen3moe-Q2_K.gguf", "tiny-deepseek2-Q4_K_M.gguf"] {
        let path = fixture(file);
        let model = Model::load(&path).expect("model");
        let n_vocab = model.config().n_vocab as u32;
        let shape = model_shape(&model).expect("shape");
        let cluster = launch(
            &path,
            Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts),
        );
        for seqs in [2, 3, 5] {
            let local: Arc<dyn ExpertBackend> = Arc::new(LocalExperts::new(model.clone(), None));
            let want = script(&mut engine(&model, local), seqs, n_vocab);
            for (micro_batches, net_links, always) in [
                (true, 2, false),
                (false, 2, false),
                (true, 0, false),
                (false, 0, false),
                (true, 2, true),
                (false, 0, true),
            ] {
                let r = connect(
                    &model,
                    &cluster,
                    RemoteOptions {
                        shm_pairs: 0,
                        micro_batches,
                        net_links,
                        overlap_always: always,
                        ..Default::default()
                    },
                );
                assert!(r.overlaps() && r.micro_batches() == micro_batches);
                assert_eq!(r.overlap_always(), always);
                let got = script(&mut engine(&model, r.clone()), seqs, n_vocab);
                assert_bits_equal(
                    &got,
                    &want,
                    &format!(
                        "{file}, {seqs} sequences, micro-batches {micro_batches}, {net_links} data links, overlap always {always}"
                    ),
                );
                let st = r.take_stats();
                assert!(
                    st.calls > 0 && st.shm_calls == 0 && st.errors == 0,
                    "{st:?}"
                );
                // both halves' calls can be out on a node's two links at once
                assert_eq!(st.link_calls == st.calls, net_links > 0, "{st:?}");
            }
        }
    }
}
