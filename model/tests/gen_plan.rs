//! `gen::plan`: presets have the real models' sizes, llama.cpp's per-tensor types, and bad specs
//! are errors. Only plans, no files: these run in milliseconds.

use nightshift_kernels::GgmlType;
use nightshift_model::gen::{plan, Arch, GenSpec, Preset, QuantMix};

fn spec(preset: Preset, arch: Arch, quant: QuantMix) -> GenSpec {
    GenSpec::new(preset, arch, quant)
}

fn ty_of(p: &nightshift_model::gen::Plan, name: &str) -> GgmlType {
    p.tensors
        .iter()
        .find(|t| t.0.name == name)
        .map(|t| t.0.ty)
        .unwrap_or_else(|| panic!("no {name}"))
}

fn dims_of(p: &nightshift_model::gen::Plan, name: &str) -> Vec<u64> {
    p.tensors
        .iter()
        .find(|t| t.0.name == name)
        .map(|t| t.0.dims.clone())
        .unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn real_presets_have_the_real_parameter_counts() {
    // Qwen3-30B-A3B: 30.5 B parameters; Kimi K2: 1.03 T (both with their real vocabularies)
    let check = |preset, arch, lo: f64, hi: f64| {
        let p = plan(&spec(preset, arch, QuantMix::Q4KM)).expect("plan");
        let n = p.n_params() as f64;
        assert!(
            n > lo && n < hi,
            "{preset:?}: {n:e} parameters, expected in {lo:e}..{hi:e}"
        );
    };
    check(Preset::Qwen3_30bA3b, Arch::Qwen3Moe, 30.3e9, 30.7e9);
    check(Preset::KimiK2, Arch::Deepseek2, 1.02e12, 1.04e12);
    // DeepSeek-V3: 671 B without its multi-token-prediction module
    check(Preset::DeepseekV3, Arch::Deepseek2, 0.665e12, 0.677e12);
}

#[test]
fn deepseek_v3_and_ud_q2_k_xl() {
    let mut s = spec(Preset::DeepseekV3, Arch::Deepseek2, QuantMix::UdQ2KXl);
    s.layers = Some(4);
    s.vocab = Some(4096);
    let p = plan(&s).expect("plan");
    assert_eq!(
        (p.dims.n_dense_lead, p.dims.n_expert, p.dims.heads),
        (3, 256, 128)
    );
    assert_eq!(p.dims.groups, Some((8, 4)));
    assert_eq!(ty_of(&p, "blk.3.ffn_gate_exps.weight"), GgmlType::Q2_K);
    assert_eq!(ty_of(&p, "blk.3.ffn_down_exps.weight"), GgmlType::Q3_K);
    assert_eq!(ty_of(&p, "blk.3.ffn_down_shexp.weight"), GgmlType::Q6_K);
    assert_eq!(ty_of(&p, "blk.0.attn_q_a.weight"), GgmlType::Q4_K);
    assert_eq!(ty_of(&p, "blk.0.ffn_down.weight"), GgmlType::Q6_K);
    assert!(p.tensors.iter().all(|t| !t.0.name.starts_with("blk.4.")));
    assert_eq!(
        "ud-q2_k_xl".parse::<QuantMix>().expect("parse"),
        QuantMix::UdQ2KXl
    );
    assert_eq!(
        "deepseek-v3".parse::<Preset>().expect("parse"),
        Preset::DeepseekV3
    );
}

#[test]
fn qwen3_30b_shapes_and_q4_k_m_types() {
    let p = plan(&spec(Preset::Qwen3_30bA3b, Arch::Qwen3Moe, QuantMix::Q4KM)).expect("plan");
    assert_eq!(p.dims.n_layer, 48);
    assert_eq!(p.n_vocab, 151_936);
    let check = |name: &str, dims: &[u64], ty: GgmlType| {
        assert_eq!(dims_of(&p, name), dims, "{name} dims");
        assert_eq!(ty_of(&p, name), ty, "{name} type");
    };
    check("token_embd.weight", &[2048, 151_936], GgmlType::Q4_K);
    check("output.weight", &[2048, 151_936], GgmlType::Q6_K);
    check("blk.0.attn_q.weight", &[2048, 4096], GgmlType::Q4_K);
    check("blk.0.attn_k.weight", &[2048, 512], GgmlType::Q4_K);
    check("blk.0.attn_v.weight", &[2048, 512], GgmlType::Q6_K); // use_more_bits(0, 48)
    check("blk.6.attn_v.weight", &[2048, 512], GgmlType::Q4_K);
    check("blk.8.attn_v.weight", &[2048, 512], GgmlType::Q6_K);
    check("blk.0.attn_output.weight", &[4096, 2048], GgmlType::Q4_K);
    check("blk.0.ffn_gate_inp.weight", &[2048, 128], GgmlType::F32);
    check(
        "blk.0.ffn_gate_exps.weight",
        &[2048, 768, 128],
        GgmlType::Q4_K,
    );
    check(
        "blk.0.ffn_down_exps.weight",
        &[768, 2048, 128],
        GgmlType::Q6_K,
    );
    check(
        "blk.7.ffn_down_exps.weight",
        &[768, 2048, 128],
        GgmlType::Q4_K,
    );
    check(
        "blk.47.ffn_down_exps.weight",
        &[768, 2048, 128],
        GgmlType::Q6_K,
    );
    check("blk.0.attn_q_norm.weight", &[128], GgmlType::F32);
}

#[test]
fn kimi_k2_shapes_and_q2_k_types() {
    let mut s = spec(Preset::KimiK2, Arch::Deepseek2, QuantMix::Q2K);
    s.layers = Some(3);
    s.experts = Some(16);
    s.vocab = Some(4096);
    let p = plan(&s).expect("plan");
    let check = |name: &str, dims: &[u64], ty: GgmlType| {
        assert_eq!(dims_of(&p, name), dims, "{name} dims");
        assert_eq!(ty_of(&p, name), ty, "{name} type");
    };
    check("blk.0.attn_q_a.weight", &[7168, 1536], GgmlType::Q2_K);
    check("blk.0.attn_q_b.weight", &[1536, 64 * 192], GgmlType::Q2_K);
    check("blk.0.attn_kv_a_mqa.weight", &[7168, 576], GgmlType::Q2_K);
    check("blk.0.attn_k_b.weight", &[128, 512, 64], GgmlType::Q4_0); // 128 % 256: fallback
    check("blk.0.attn_v_b.weight", &[512, 128, 64], GgmlType::Q2_K);
    check("blk.0.attn_output.weight", &[8192, 7168], GgmlType::Q3_K);
    check("blk.0.ffn_gate.weight", &[7168, 18_432], GgmlType::Q2_K);
    check("blk.0.ffn_down.weight", &[18_432, 7168], GgmlType::Q3_K);
    check(
        "blk.1.ffn_gate_exps.weight",
        &[7168, 2048, 16],
        GgmlType::Q2_K,
    );
    check(
        "blk.1.ffn_down_exps.weight",
        &[2048, 7168, 16],
        GgmlType::Q3_K,
    );
    check("blk.2.ffn_down_shexp.weight", &[2048, 7168], GgmlType::Q3_K);
    check("blk.1.exp_probs_b.bias", &[16], GgmlType::F32);
    check("output.weight", &[7168, 4096], GgmlType::Q6_K);
    assert!(p.tensors.iter().all(|t| !t.0.name.starts_with("blk.3.")));
    let keys: Vec<&str> = p.metadata.iter().map(|kv| kv.0.as_str()).collect();
    for k in [
        "deepseek2.expert_group_count",
        "deepseek2.rope.scaling.yarn_log_multiplier",
        "deepseek2.attention.key_length_mla",
        "tokenizer.chat_template",
    ] {
        assert!(keys.contains(&k), "missing {k}");
    }
}

#[test]
fn eight_experts_bump_attention_like_llama_cpp() {
    let mut s = spec(Preset::Qwen3_30bA3b, Arch::Qwen3Moe, QuantMix::Q4KM);
    s.experts = Some(8);
    s.layers = Some(2);
    s.vocab = Some(1024);
    let p = plan(&s).expect("plan");
    assert_eq!(ty_of(&p, "blk.0.attn_k.weight"), GgmlType::Q8_0);
    assert_eq!(ty_of(&p, "blk.0.attn_v.weight"), GgmlType::Q8_0);
    assert_eq!(ty_of(&p, "blk.0.attn_output.weight"), GgmlType::Q5_K);
}

#[test]
fn bad_specs_are_errors() {
    let check = |s: GenSpec, expect: &str| {
        let e = plan(&s).expect_err("should fail").to_string();
        assert!(e.contains(expect), "{e:?} should contain {expect:?}");
    };
    check(
        spec(Preset::KimiK2, Arch::Qwen3Moe, QuantMix::Q2K),
        "is a deepseek2 model",
    );
    let mut s = spec(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q2K);
    s.vocab = Some(10);
    check(s, "expected a vocab of at least");
    let mut s = spec(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q2K);
    s.layers = Some(0);
    check(s, "expected at least 1 layer");
    assert!("Q5_K_M".parse::<QuantMix>().is_err());
    assert!("mistral".parse::<Arch>().is_err());
    let mut s = spec(Preset::Tiny, Arch::Qwen3, QuantMix::Q2K);
    s.experts = Some(4);
    check(s, "expected no --experts for the dense qwen3 arch");
    check(
        spec(Preset::Qwen3_0_6b, Arch::Llama, QuantMix::Q4KM),
        "is a qwen3 model",
    );
}

#[test]
fn qwen3_0_6b_is_dense_tied_and_typed_like_llama_quantize() {
    let p = plan(&spec(Preset::Qwen3_0_6b, Arch::Qwen3, QuantMix::Q4KM)).expect("plan");
    // Qwen3-0.6B: 0.596 B parameters with its tied embedding
    let n = p.n_params() as f64;
    assert!(n > 0.59e9 && n < 0.60e9, "{n:e} parameters");
    assert_eq!(p.dims.n_layer, 28);
    assert_eq!(p.n_vocab, 151_936);
    assert!(p.tensors.iter().all(|t| t.0.name != "output.weight"));
    assert!(p.tensors.iter().all(|t| !t.0.name.contains("exps")));
    let check = |name: &str, dims: &[u64], ty: GgmlType| {
        assert_eq!(dims_of(&p, name), dims, "{name} dims");
        assert_eq!(ty_of(&p, name), ty, "{name} type");
    };
    // the tied embedding is the head: quantized as output.weight would be
    check("token_embd.weight", &[1024, 151_936], GgmlType::Q6_K);
    check("blk.0.attn_q.weight", &[1024, 2048], GgmlType::Q4_K);
    check("blk.0.attn_k.weight", &[1024, 1024], GgmlType::Q4_K);
    check("blk.0.attn_v.weight", &[1024, 1024], GgmlType::Q6_K); // use_more_bits(0, 28)
    check("blk.4.attn_v.weight", &[1024, 1024], GgmlType::Q4_K);
    check("blk.0.attn_q_norm.weight", &[128], GgmlType::F32);
    check("blk.0.ffn_gate.weight", &[1024, 3072], GgmlType::Q4_K);
    check("blk.0.ffn_down.weight", &[3072, 1024], GgmlType::Q6_K);
    check("blk.4.ffn_down.weight", &[3072, 1024], GgmlType::Q4_K);
    let keys: Vec<&str> = p.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert!(keys.contains(&"qwen3.feed_forward_length"));
    assert!(!keys.iter().any(|k| k.contains("expert")));
    // --leave-output-tensor names output.weight only: the tied head is still quantized
    let mut s = spec(Preset::Qwen3_0_6b, Arch::Qwen3, QuantMix::Q8_0);
    s.leave_output = true;
    s.layers = Some(1);
    assert_eq!(
        ty_of(&plan(&s).expect("plan"), "token_embd.weight"),
        GgmlType::Q8_0
    );
}

#[test]
fn tiny_dense_models_share_the_moe_vocabularies_and_attention() {
    let moe = plan(&spec(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q8_0)).expect("plan");
    let q = plan(&spec(Preset::Tiny, Arch::Qwen3, QuantMix::Q8_0)).expect("plan");
    // a draft model must tokenize as its target
    let tokens = |p: &nightshift_model::gen::Plan| {
        p.metadata
            .iter()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .map(|(_, v)| format!("{v:?}"))
    };
    assert_eq!(tokens(&q), tokens(&moe));
    assert_eq!(
        dims_of(&q, "blk.1.attn_k.weight"),
        dims_of(&moe, "blk.1.attn_k.weight")
    );
    assert_eq!(dims_of(&q, "blk.1.ffn_up.weight"), vec![256, 512]);
    let l = plan(&spec(Preset::Tiny, Arch::Llama, QuantMix::Q4KM)).expect("plan");
    assert_eq!(dims_of(&l, "rope_freqs.weight"), vec![32]);
    assert_eq!(ty_of(&l, "rope_freqs.weight"), GgmlType::F32);
    assert!(l
        .tensors
        .iter()
        .all(|t| !t.0.name.contains("_norm.weight") || !t.0.name.contains("attn_q")));
    assert_eq!(ty_of(&l, "output.weight"), GgmlType::Q6_K);
}
