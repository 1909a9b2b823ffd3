//! Everything that differs between the architectures, one file per architecture.
//!
//! An [`ArchSpec`] says how an arch reads its hyper-parameters (`config.rs` reads the keys every
//! arch shares, then asks the spec for the rest), which attention tensors a layer has
//! (`weights.rs` loads the FFN and the rest, which only depend on the config), runs its
//! attention block (`engine.rs` calls it per layer), and what `gen-model` writes for it (metadata
//! keys, a layer's tensors in the converter's order, the tokenizer's specials and template).
//! Adding an architecture is one new file here plus its line in [`Arch`] and [`Arch::spec`].
//!
//! - `qwen3moe`, `qwen3`, `llama`: grouped-query attention (`gqa`), MoE or dense SwiGLU FFNs.
//! - `deepseek2`: multi-head latent attention, YaRN, sigmoid-gated routing with a shared expert.
//! - `attend`: the step context and the causal attention over the paged cache that every
//!   attention block ends in.

mod attend;
pub mod deepseek2;
pub mod gqa;
pub mod llama;
pub mod qwen3;
pub mod qwen3moe;

pub use attend::{attend_all, StepCtx, Tok};

use crate::config::{Arch, Gating, Hparams, MlaConfig, ModelConfig};
use crate::error::ModelError;
use crate::gen::{Dims, Init, KvValue};
use crate::gguf::Gguf;
use crate::kv::KvCache;
use crate::weights::AttnWeights;

/// The arch-specific part of a [`ModelConfig`] (what [`Hparams`] does not hold).
#[derive(Clone, Debug)]
pub struct ArchParams {
    /// Softmax scale of attention scores.
    pub kq_scale: f32,
    pub mla: Option<MlaConfig>,
    /// Leading dense layers (every layer of a dense arch).
    pub n_dense_lead: usize,
    /// Routed experts (None: a dense arch).
    pub moe: Option<MoeParams>,
}

/// Routed-expert hyper-parameters of a MoE arch.
#[derive(Clone, Debug)]
pub struct MoeParams {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_expert_shared: usize,
    pub weights_norm: bool,
    pub weights_scale: f32,
    pub gating: Gating,
    pub n_groups: usize,
    pub n_group_used: usize,
}

/// What `gen-model` writes as an arch's tokenizer besides the trained BPE vocabulary.
pub struct TokenizerFacts {
    /// Special tokens appended after the BPE vocabulary (CONTROL type).
    pub specials: &'static [&'static str],
    /// `tokenizer.chat_template` when the user gives none.
    pub chat_template: &'static str,
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// Which of `specials` are BOS, EOS (end of turn) and padding.
    pub bos: &'static str,
    pub eos: &'static str,
    pub pad: &'static str,
    pub add_bos: bool,
}

/// How `gen-model` receives one tensor: name, ggml dims, how its values are drawn.
pub type PushTensor<'a> = dyn FnMut(String, Vec<u64>, Init) + 'a;

/// One architecture, as the loader, the engine and `gen-model` see it.
pub trait ArchSpec: Sync {
    /// Whether the arch has routed experts (dense archs make no `ExpertBackend` call).
    fn moe(&self) -> bool;
    /// Whether attention is multi-head latent (one shared latent row per position) rather than
    /// grouped-query over per-head K/V rows.
    fn mla(&self) -> bool {
        false
    }
    /// NEOX (halves) rope rather than NORM (interleaved pairs).
    fn rope_neox(&self) -> bool;
    /// Whether a `rope_freqs.weight` tensor, when present, divides the rope frequencies
    /// (llama.cpp reads it for llama only).
    fn rope_freq_factors(&self) -> bool {
        false
    }
    /// Whether YaRN's `yarn_log_multiplier` is deepseek2's (stored as 0.1·mscale_all_dim, the
    /// attention factor taking both mscales as llama.cpp's deepseek2 path does).
    fn yarn_mscale_all_dims(&self) -> bool {
        false
    }
    /// The arch-specific hyper-parameters (the shared ones are already in `h`).
    fn hparams(&self, h: &Hparams<'_>) -> Result<ArchParams, ModelError>;
    /// Whether grouped-query attention normalises each q and k head (RMSNorm: the qwen3 archs).
    fn qk_norm(&self) -> bool {
        false
    }
    /// The attention tensors of layer `il`, shape-checked against `c` (by default the GQA
    /// projections).
    fn attn_weights(
        &self,
        g: &Gguf,
        c: &ModelConfig,
        il: usize,
    ) -> Result<AttnWeights, ModelError> {
        gqa::weights(g, c, il, self.qk_norm())
    }
    /// The attention block of layer `il` on normalised rows `h` (n × n_embd) into `out` (by
    /// default grouped-query attention).
    fn attention(
        &self,
        ctx: &StepCtx<'_>,
        kv: &mut KvCache,
        il: usize,
        h: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        gqa::attention(ctx, kv, il, h, out)
    }
    /// `gen-model`: the arch's hyper-parameter keys after the shared ones, in the converter's
    /// order; `key` prefixes a name with the arch.
    fn gen_metadata(&self, d: &Dims, key: &dyn Fn(&str) -> String) -> Vec<(String, KvValue)>;
    /// `gen-model`: layer `il`'s tensors after `attn_norm`, in the converter's order.
    fn gen_layer(&self, d: &Dims, il: usize, push: &mut PushTensor<'_>);
    /// `gen-model`: the tokenizer's specials, template and special ids.
    fn tokenizer(&self) -> TokenizerFacts;
}

impl Arch {
    /// Every arch, in the order error messages list them.
    pub const ALL: [Arch; 4] = [Arch::Qwen3Moe, Arch::Deepseek2, Arch::Qwen3, Arch::Llama];

    /// The arch's spec.
    pub fn spec(self) -> &'static dyn ArchSpec {
        match self {
            Arch::Qwen3Moe => &qwen3moe::Qwen3Moe,
            Arch::Deepseek2 => &deepseek2::Deepseek2,
            Arch::Qwen3 => &qwen3::Qwen3,
            Arch::Llama => &llama::Llama,
        }
    }

    /// The arch named `name` (GGUF `general.architecture`), if the engine runs it.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// "qwen3moe, deepseek2, qwen3 or llama", for error messages.
    pub fn names() -> String {
        let n: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        format!("{} or {}", n[..n.len() - 1].join(", "), n[n.len() - 1])
    }

    /// Whether the arch has routed experts (qwen3 and llama are dense: no `ExpertBackend` call).
    pub fn is_moe(self) -> bool {
        self.spec().moe()
    }

    /// Whether attention is grouped-query over per-head K/V rows (everything but deepseek2's MLA).
    pub fn is_gqa(self) -> bool {
        !self.spec().mla()
    }
}

/// A SwiGLU FFN of `d.ff` (dense layers of every arch), in the converter's order.
pub(crate) fn gen_dense_ffn(d: &Dims, il: usize, push: &mut PushTensor<'_>) {
    let p = |s: &str| format!("blk.{il}.{s}");
    let (e, m) = (d.embd, Init::Matrix(1.0));
    push(p("ffn_gate.weight"), vec![e, d.ff], m);
    push(p("ffn_up.weight"), vec![e, d.ff], m);
    push(p("ffn_down.weight"), vec![d.ff, e], m);
}

/// The routed experts' counts every MoE arch reads the same way: `expert_count`,
/// `expert_used_count` and the expert FFN length (from `feed_forward_length / used` when absent).
pub(crate) fn moe_counts(h: &Hparams<'_>) -> Result<(usize, usize, usize), ModelError> {
    let n_expert = h.opt_u32("expert_count", 0)?;
    let n_used = h.opt_u32("expert_used_count", 0)?;
    if n_expert == 0 || n_used == 0 || n_used > n_expert {
        return Err(h.bad(
            "expert_used_count",
            format!("expected 0 < expert_used_count <= expert_count, found {n_used} of {n_expert}"),
        ));
    }
    let ff = h.opt_u32("expert_feed_forward_length", 0)?;
    let ff = if ff == 0 { h.n_ff_dense / n_used } else { ff };
    if ff == 0 {
        return Err(h.bad(
            "expert_feed_forward_length",
            "expected a non-zero expert feed-forward length, found 0".into(),
        ));
    }
    Ok((n_expert, n_used, ff))
}

/// The params of a dense qwen3 or llama file: every layer a SwiGLU FFN of
/// `feed_forward_length`, no experts, kq scale `kq_scale`.
pub(crate) fn dense_params(h: &Hparams<'_>, kq_scale: f32) -> Result<ArchParams, ModelError> {
    if h.n_ff_dense == 0 {
        return Err(h.bad(
            "feed_forward_length",
            "expected a non-zero feed-forward length, found 0".into(),
        ));
    }
    let n_expert = h.opt_u32("expert_count", 0)?;
    if n_expert != 0 {
        return Err(h.bad(
            "expert_count",
            format!(
                "expected no experts in a dense {} model, found {n_expert}",
                h.arch.name()
            ),
        ));
    }
    Ok(ArchParams {
        kq_scale,
        mla: None,
        n_dense_lead: h.n_layer,
        moe: None,
    })
}
