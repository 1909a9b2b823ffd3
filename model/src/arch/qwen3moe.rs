//! qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder): grouped-query attention with per-head
//! q/k RMSNorm and NEOX rope, then routed experts with softmax gating over all experts and
//! renormalised top-k weights, no shared expert (llama.cpp's `qwen3moe` graph).

use super::{gqa, moe_counts, ArchParams, ArchSpec, MoeParams, PushTensor, TokenizerFacts};
use crate::config::{Gating, Hparams};
use crate::error::ModelError;
use crate::gen::{Dims, Init, KvValue};

/// The qwen3moe spec.
pub struct Qwen3Moe;

/// Qwen's ChatML specials, template and ids (shared with dense qwen3: a draft model must share
/// its target's vocabulary).
pub(crate) fn qwen_tokenizer() -> TokenizerFacts {
    TokenizerFacts {
        specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        chat_template: concat!(
            "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']",
            " + '<|im_end|>' + '\\n' }}{%- endfor %}",
            "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
        ),
        pre: "qwen2",
        bos: "<|endoftext|>",
        eos: "<|im_end|>",
        pad: "<|endoftext|>",
        add_bos: false,
    }
}

/// The key/value length and rope keys qwen3 and qwen3moe write.
pub(crate) fn qwen_metadata(d: &Dims, k: &dyn Fn(&str) -> String) -> Vec<(String, KvValue)> {
    let u = |v: u64| KvValue::U32(v as u32);
    vec![
        (k("attention.key_length"), u(d.head_dim)),
        (k("attention.value_length"), u(d.head_dim)),
        (k("rope.freq_base"), KvValue::F32(d.rope_base)),
        (k("attention.layer_norm_rms_epsilon"), KvValue::F32(1e-6)),
    ]
}

impl ArchSpec for Qwen3Moe {
    fn moe(&self) -> bool {
        true
    }
    fn rope_neox(&self) -> bool {
        true
    }
    fn hparams(&self, h: &Hparams<'_>) -> Result<ArchParams, ModelError> {
        let (n_expert, n_expert_used, n_ff_exp) = moe_counts(h)?;
        Ok(ArchParams {
            kq_scale: 1.0 / (h.head_k as f32).sqrt(),
            mla: None,
            n_dense_lead: 0,
            moe: Some(MoeParams {
                n_expert,
                n_expert_used,
                n_ff_exp,
                n_expert_shared: 0,
                weights_norm: true,
                weights_scale: h.opt_f32("expert_weights_scale", 0.0)?,
                gating: Gating::Softmax,
                n_groups: 1,
                n_group_used: 1,
            }),
        })
    }
    fn qk_norm(&self) -> bool {
        true
    }
    fn gen_metadata(&self, d: &Dims, k: &dyn Fn(&str) -> String) -> Vec<(String, KvValue)> {
        let u = |v: u64| KvValue::U32(v as u32);
        let mut kv = qwen_metadata(d, k);
        kv.push((k("expert_count"), u(d.n_expert as u64)));
        kv.push((k("expert_used_count"), u(d.n_used as u64)));
        kv.push((k("expert_feed_forward_length"), u(d.expert_ff)));
        kv
    }
    fn gen_layer(&self, d: &Dims, il: usize, push: &mut PushTensor<'_>) {
        gqa::gen_attn(d, il, true, push);
        gen_routed(d, il, push);
    }
    fn tokenizer(&self) -> TokenizerFacts {
        qwen_tokenizer()
    }
}

/// The router and the stacked routed experts of a MoE layer, in the converter's order.
pub(crate) fn gen_routed(d: &Dims, il: usize, push: &mut PushTensor<'_>) {
    let p = |s: &str| format!("blk.{il}.{s}");
    let (e, x, f, m) = (d.embd, d.n_expert as u64, d.expert_ff, Init::Matrix(1.0));
    push(
        p("ffn_gate_inp.weight"),
        vec![e, x],
        Init::Matrix(crate::gen::layout::ROUTER_GAIN),
    );
    push(p("ffn_gate_exps.weight"), vec![e, f, x], m);
    push(p("ffn_up_exps.weight"), vec![e, f, x], m);
    push(p("ffn_down_exps.weight"), vec![f, e, x], m);
}
