//! Loading the dense archs (qwen3, llama): generated files give the config llama.cpp derives
//! (no experts, NEOX or NORM rope, llama 3's frequency factors, tied heads), and files that lack
//! what the forward pass needs, or carry what it does not compute (biases, experts), are typed
//! errors naming the key or tensor, never panics or silently other models.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nightshift_kernels::GgmlType;
use nightshift_model::gen::layout::Init;
use nightshift_model::gen::TensorDecl;
use nightshift_model::gen::{plan, write_plan, Arch, GenSpec, KvValue, Plan, Preset, QuantMix};
use nightshift_model::gguf::Gguf;
use nightshift_model::weights::{AttnWeights, FfnWeights};
use nightshift_model::{BatchToken, Engine, EngineOptions, LocalExperts, Model};

mod fixture_util;

fn tiny(arch: Arch) -> Plan {
    plan(&GenSpec::new(Preset::Tiny, arch, QuantMix::Q8_0)).expect("plan")
}

fn write(dir: &Path, name: &str, p: &Plan) -> PathBuf {
    let path = dir.join(name);
    write_plan(p, 7, &path, &mut |_| {}).expect("write");
    path
}

fn load_err(path: &Path) -> String {
    let g = Gguf::open(path).expect("open");
    match Model::from_gguf_with(g, false) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn dense_configs_follow_llama_cpp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Model::load(&write(dir.path(), "q.gguf", &tiny(Arch::Qwen3))).expect("qwen3 loads");
    let c = q.config();
    assert_eq!(c.arch, nightshift_model::Arch::Qwen3);
    assert_eq!((c.n_expert, c.n_ff_dense, c.n_layer), (0, 512, 2));
    assert!(c.rope.neox && c.rope.freq_factors.is_none());
    assert_eq!(c.kq_scale, 1.0 / 8.0);
    assert!((0..c.n_layer).all(|il| !c.is_moe_layer(il)));
    for l in &q.weights().layers {
        assert!(matches!(&l.ffn, FfnWeights::Dense(_)));
        assert!(matches!(
            &l.attn,
            AttnWeights::Gqa {
                q_norm: Some(_),
                k_norm: Some(_),
                ..
            }
        ));
    }
    assert_eq!(q.expert_act_type(0), None);

    let l = Model::load(&write(dir.path(), "l.gguf", &tiny(Arch::Llama))).expect("llama loads");
    let c = l.config();
    assert_eq!(c.arch, nightshift_model::Arch::Llama);
    assert!(!c.rope.neox);
    assert_eq!(c.rms_eps, 1e-5);
    let ff = c
        .rope
        .freq_factors
        .as_ref()
        .expect("rope_freqs.weight read");
    assert_eq!(ff.len(), 32);
    assert!(ff[0] == 1.0 && ff[31] == 8.0, "{ff:?}");
    assert!(matches!(
        &l.weights().layers[0].attn,
        AttnWeights::Gqa {
            q_norm: None,
            k_norm: None,
            ..
        }
    ));
    // llama's `attention.scale` replaces 1/sqrt(head_dim) when set (llama.cpp's llama graph)
    let mut p = tiny(Arch::Llama);
    p.metadata
        .push(("llama.attention.scale".into(), KvValue::F32(0.0625)));
    let l = Model::load(&write(dir.path(), "ls.gguf", &p)).expect("loads");
    assert_eq!(l.config().kq_scale, 0.0625);
}

/// A tied model (qwen3-0.6b: no output.weight) runs with token_embd as its head: the filler
/// tokens' embedding rows are zero, so their logits are exactly 0, the real tokens' are not.
#[test]
fn tied_head_is_the_token_embedding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = GenSpec::new(Preset::Qwen3_0_6b, Arch::Qwen3, QuantMix::Q4KM);
    spec.layers = Some(1);
    spec.vocab = Some(640);
    let p = plan(&spec).expect("plan");
    assert!(p.tensors.iter().all(|t| t.0.name != "output.weight"));
    let model = Model::load(&write(dir.path(), "tied.gguf", &p)).expect("loads");
    let w = model.weights();
    assert_eq!(w.output.name, "token_embd.weight");
    assert_eq!(w.output.ty, GgmlType::Q6_K);
    let backend = Arc::new(LocalExperts::new(model.clone(), None));
    let mut e = Engine::new(
        model.clone(),
        backend,
        EngineOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .expect("engine");
    let s = e.add_sequence().expect("seq");
    let logits = e
        .forward(&[BatchToken {
            seq: s,
            token: 40,
            pos: 0,
            want_logits: true,
        }])
        .expect("forward")
        .pop()
        .expect("row");
    assert_eq!(logits.len(), 640);
    // 587 real tokens (the trained BPE and qwen's specials), then [PAD<n>] fillers
    assert!(logits[..587].iter().all(|x| x.is_finite() && *x != 0.0));
    assert!(logits[587..].iter().all(|&x| x == 0.0));
}

#[test]
fn missing_or_unsupported_parts_are_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let drop_key = |arch: Arch, key: &str| {
        let mut p = tiny(arch);
        p.metadata.retain(|(k, _)| k != key);
        p
    };
    let e = load_err(&write(
        dir.path(),
        "noff.gguf",
        &drop_key(Arch::Qwen3, "qwen3.feed_forward_length"),
    ));
    assert!(e.contains("qwen3.feed_forward_length"), "{e}");
    let e = load_err(&write(
        dir.path(),
        "noeps.gguf",
        &drop_key(Arch::Llama, "llama.attention.layer_norm_rms_epsilon"),
    ));
    assert!(e.contains("llama.attention.layer_norm_rms_epsilon"), "{e}");

    let mut p = tiny(Arch::Qwen3);
    p.tensors.retain(|t| t.0.name != "blk.1.attn_k_norm.weight");
    let e = load_err(&write(dir.path(), "nonorm.gguf", &p));
    assert!(
        e.contains("blk.1.attn_k_norm.weight") && e.contains("found nothing"),
        "{e}"
    );

    // a bias the forward pass would not add
    let mut p = tiny(Arch::Llama);
    p.tensors.push((
        TensorDecl {
            name: "blk.0.attn_q.bias".into(),
            ty: GgmlType::F32,
            dims: vec![256],
        },
        Init::Norm,
    ));
    let e = load_err(&write(dir.path(), "bias.gguf", &p));
    assert!(
        e.contains("blk.0.attn_q.bias") && e.contains("expected no such bias"),
        "{e}"
    );

    // a llama with experts (Mixtral) is not a dense llama
    let mut p = tiny(Arch::Llama);
    p.metadata
        .push(("llama.expert_count".into(), KvValue::U32(8)));
    let e = load_err(&write(dir.path(), "moe.gguf", &p));
    assert!(e.contains("llama.expert_count"), "{e}");

    // a rope scaling the engine does not compute
    let mut p = tiny(Arch::Llama);
    p.metadata.push((
        "llama.rope.scaling.type".into(),
        KvValue::Str("longrope".into()),
    ));
    let e = load_err(&write(dir.path(), "longrope.gguf", &p));
    assert!(
        e.contains("rope.scaling.type") && e.contains("longrope"),
        "{e}"
    );
}

/// The tiny qwen3 is a draft model for the tiny qwen3moe (issue 20 item 1c): same vocabulary,
/// token for token; the tiny llama's is another one.
#[test]
fn tiny_qwen3_can_draft_for_tiny_qwen3moe() {
    use nightshift_model::spec::draft_model::check_vocab;
    let load = |n: &str| Model::load(&fixture_util::fixture_path(n)).expect("fixture loads");
    let target = load("tiny-qwen3moe-Q4_K_M.gguf");
    check_vocab(&load("tiny-qwen3-Q8_0.gguf"), &target).expect("qwen3 drafts for qwen3moe");
    assert!(check_vocab(&load("tiny-llama-Q8_0.gguf"), &target).is_err());
}
