//! The prefix cache with the experts on nodes (`--nodes 2`, real processes on loopback): only
//! the coordinator's KV cache changes, so a request that starts from another request's cached
//! blocks gives the logits of the same request computed cold in process, bit for bit, with F32,
//! F16 and Q8_0 caches, on qwen3moe and deepseek2.

mod support;

use support::cluster::{assert_bits_equal, launch, nodes};
use support::fixture as data;

use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, RemoteOptions};
use nightshift_model::{Engine, EngineOptions, ExpertBackend, KvType, LocalExperts, Model};

fn engine(model: &Arc<Model>, backend: Arc<dyn ExpertBackend>, ty: KvType) -> Engine {
    let pool = nightshift_model::build_pool(1).expect("pool");
    let mut e = Engine::new(
        model.clone(),
        backend,
        EngineOptions {
            pool: Some(pool),
            kv_budget_tokens: 1024,
            ..Default::default()
        },
    )
    .expect("engine");
    e.set_kv_type(ty).expect("kv type");
    e
}

/// `n` token ids below `vocab`.
fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) % (vocab as u32 - 1) + 1
        })
        .collect()
}

/// Admits `prompt`, prefills what is not cached and decodes 3 greedy tokens: the cached
/// positions and every logits row from the prompt's last position on.
fn serve_one(e: &mut Engine, prompt: &[u32]) -> (usize, Vec<Vec<f32>>) {
    let (s, cached) = e.admit(prompt, prompt.len() + 8, true).expect("admit");
    let mut rows = vec![e.prefill(s, &prompt[cached..]).expect("prefill")];
    for _ in 0..3 {
        let next = nightshift_model::sampler::argmax(rows.last().expect("row"));
        rows.push(e.prefill(s, &[next]).expect("decode"));
    }
    e.remove_sequence(s);
    (cached, rows)
}

fn check(file: &str) {
    let path = data(file);
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let vocab = model.config().n_vocab;
    let cluster = launch(
        &path,
        Placement::round_robin(nodes(2), &shape.moe_layers, shape.n_experts),
    );
    let opts = RemoteOptions {
        deadline: Duration::from_secs(10),
        ..Default::default()
    };
    let remote = support::cluster::connect(&model, &cluster, opts);
    let prompt = tokens(40, 17, vocab);
    let mut other = prompt[..35].to_vec();
    other.extend(tokens(5, 23, vocab));
    for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let local: Arc<dyn ExpertBackend> = Arc::new(LocalExperts::new(model.clone(), None));
        let (_, want) = serve_one(&mut engine(&model, local, ty), &prompt);
        let mut e = engine(&model, remote.clone(), ty);
        let (cached, _) = serve_one(&mut e, &other);
        assert_eq!(cached, 0);
        let (cached, got) = serve_one(&mut e, &prompt);
        assert_eq!(
            cached, 32,
            "{file} {ty:?}: two blocks from the first request"
        );
        assert_bits_equal(&got, &want, &format!("{file} {ty:?} over 2 nodes"));
    }
    let st = remote.take_stats();
    assert!(st.calls > 0 && st.errors == 0, "{st:?}");
}

#[test]
fn cached_prefixes_over_two_nodes_give_cold_bits_qwen3moe() {
    check("tiny-qwen3moe-Q2_K.gguf");
}

#[test]
fn cached_prefixes_over_two_nodes_give_cold_bits_deepseek2() {
    check("tiny-deepseek2-Q4_K_M.gguf");
}
