//! `ModelConfig`: the hyper-parameters of a qwen3moe, deepseek2, qwen3 or llama GGUF, read from
//! its metadata exactly as llama.cpp's hparams/cparams loading does (including YaRN's attention
//! factor, deepseek2's pre-scaled `kq_scale` and llama's rope frequency factors), so the forward
//! pass never looks at metadata again.

use crate::arch::MoeParams;
use crate::error::ModelError;
use crate::gguf::{Gguf, Metadata};

/// The architectures the engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3-MoE: GQA attention with per-head q/k RMSNorm, NEOX rope, softmax routing.
    Qwen3Moe,
    /// DeepSeek-V3 / Kimi K2: MLA attention, YaRN, sigmoid routing, shared expert.
    Deepseek2,
    /// Dense Qwen3 (0.6B ... 32B): qwen3moe's attention (per-head q/k RMSNorm, NEOX rope) and a
    /// SwiGLU FFN in every layer.
    Qwen3,
    /// Dense Llama 3.x: GQA without q/k norms, NORM rope with optional frequency factors
    /// (`rope_freqs.weight`), SwiGLU FFN in every layer.
    Llama,
}

impl Arch {
    /// `general.architecture` of the arch.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Deepseek2 => "deepseek2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }
}

/// How router logits become expert probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// Rotary embedding parameters as ggml's `rope_ext` receives them.
#[derive(Clone, Debug)]
pub struct RopeConfig {
    /// Number of rotated dimensions.
    pub n_dims: usize,
    /// NEOX (halves) rather than NORM (interleaved pairs).
    pub neox: bool,
    /// Per rotated pair divisors of the rotation frequency (llama 3's `rope_freqs.weight`,
    /// `n_dims / 2` floats), as ggml's `rope_ext` takes them.
    pub freq_factors: Option<Vec<f32>>,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    /// The `attn_factor` handed to rope (YaRN magnitude correction).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: u32,
}

/// MLA dimensions (deepseek2).
#[derive(Clone, Debug)]
pub struct MlaConfig {
    /// 0 when the model has a plain `attn_q` (the "lite" variant).
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    /// Non-rotated part of a query/key head.
    pub qk_nope: usize,
    /// Rotated part of a query/key head (= rope dims).
    pub qk_rope: usize,
    /// Value head size after decompression with `attn_v_b`.
    pub v_head: usize,
}

/// Parsed hyper-parameters.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Key head size as cached (gqa archs: head_dim; deepseek2: kv_lora + rope).
    pub head_k: usize,
    /// Value head size as cached (gqa archs: head_dim; deepseek2: kv_lora).
    pub head_v: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope: RopeConfig,
    /// Softmax scale of attention scores.
    pub kq_scale: f32,
    pub mla: Option<MlaConfig>,
    /// Routed experts per MoE layer (0 for the dense archs).
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_dense: usize,
    pub n_expert_shared: usize,
    /// Leading dense layers (deepseek2's first; every layer of the dense archs).
    pub n_dense_lead: usize,
    pub expert_weights_norm: bool,
    pub expert_weights_scale: f32,
    pub gating: Gating,
    pub n_expert_groups: usize,
    pub n_group_used: usize,
}

/// What every arch's hyper-parameters are read from: the metadata and the values read before
/// the arch-specific part (`ArchSpec::hparams`), with key readers that prefix the arch's name.
pub struct Hparams<'a> {
    pub md: &'a Metadata,
    pub arch: Arch,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Key head size as cached.
    pub head_k: usize,
    /// Rotated dims.
    pub n_rot: usize,
    /// `feed_forward_length` (0 when absent).
    pub n_ff_dense: usize,
    pub freq_scale: f32,
    /// The attention factor rope receives (YaRN's magnitude correction included).
    pub attn_factor: f32,
    /// `yarn_log_multiplier` as llama.cpp uses it (deepseek2's converter factor undone).
    pub yarn_log_mul: f32,
}

impl Hparams<'_> {
    /// `<arch>.<name>`.
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch.name())
    }
    pub fn req_u32(&self, name: &str) -> Result<usize, ModelError> {
        req_u32(self.md, &self.key(name))
    }
    pub fn opt_u32(&self, name: &str, default: usize) -> Result<usize, ModelError> {
        opt_u32(self.md, &self.key(name), default)
    }
    pub fn opt_f32(&self, name: &str, default: f32) -> Result<f32, ModelError> {
        opt_f32(self.md, &self.key(name), default)
    }
    pub fn opt_bool(&self, name: &str, default: bool) -> Result<bool, ModelError> {
        Ok(self.md.get_bool(&self.key(name))?.unwrap_or(default))
    }
    /// A bad-metadata error for key `<arch>.<name>`.
    pub fn bad(&self, name: &str, msg: String) -> ModelError {
        bad(&self.key(name), msg)
    }
}

fn req_u32(md: &Metadata, key: &str) -> Result<usize, ModelError> {
    md.get_u32(key)?
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Config {
            key: key.to_string(),
            msg: "expected an integer, found nothing".into(),
        })
}

fn opt_u32(md: &Metadata, key: &str, default: usize) -> Result<usize, ModelError> {
    Ok(md.get_u32(key)?.map(|v| v as usize).unwrap_or(default))
}

fn opt_f32(md: &Metadata, key: &str, default: f32) -> Result<f32, ModelError> {
    Ok(md.get_f32(key)?.unwrap_or(default))
}

fn bad(key: &str, msg: String) -> ModelError {
    ModelError::Config {
        key: key.to_string(),
        msg,
    }
}

/// llama.cpp's `get_mscale` (YaRN magnitude for a context extension `scale`).
fn get_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl ModelConfig {
    /// Reads the hyper-parameters of a qwen3moe, deepseek2, qwen3 or llama file.
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig, ModelError> {
        let arch_name = g.arch()?.to_string();
        let arch = Arch::from_name(&arch_name)
            .ok_or_else(|| ModelError::UnsupportedArch(arch_name.clone()))?;
        let spec = arch.spec();
        let md = g.metadata();
        let k = |s: &str| format!("{arch_name}.{s}");
        let n_embd = req_u32(md, &k("embedding_length"))?;
        let n_layer = req_u32(md, &k("block_count"))?;
        let n_head = req_u32(md, &k("attention.head_count"))?;
        let n_head_kv = opt_u32(md, &k("attention.head_count_kv"), n_head)?;
        let n_ctx_train = opt_u32(md, &k("context_length"), 4096)?;
        let rms_eps = md
            .get_f32(&k("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| {
                bad(
                    &k("attention.layer_norm_rms_epsilon"),
                    "expected a float, found nothing".into(),
                )
            })?;
        let head_k = opt_u32(md, &k("attention.key_length"), n_embd / n_head.max(1))?;
        let head_v = opt_u32(md, &k("attention.value_length"), head_k)?;
        let n_vocab = match md.get_str_array("tokenizer.ggml.tokens")? {
            Some(t) => t.len(),
            None => match g.tensor("token_embd.weight") {
                Some(t) if t.dims.len() >= 2 => t.dims[1] as usize,
                _ => {
                    return Err(bad(
                        "tokenizer.ggml.tokens",
                        "expected a token list, found nothing".into(),
                    ))
                }
            },
        };
        if n_embd == 0 || n_layer == 0 || n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                &k("attention.head_count"),
                format!("expected non-zero sizes with head_count divisible by head_count_kv, found embd {n_embd} layers {n_layer} heads {n_head}/{n_head_kv}"),
            ));
        }

        if head_k == 0 || head_v == 0 {
            return Err(bad(
                &k("attention.key_length"),
                format!("expected non-zero key/value lengths, found {head_k}/{head_v}"),
            ));
        }

        // Rope and YaRN, as llama_context sets up cparams.
        let n_rot = opt_u32(md, &k("rope.dimension_count"), head_k)?;
        if n_rot == 0 || n_rot % 2 != 0 {
            return Err(bad(
                &k("rope.dimension_count"),
                format!("expected an even, non-zero number of rotated dims, found {n_rot}"),
            ));
        }
        let freq_base = opt_f32(md, &k("rope.freq_base"), 10000.0)?;
        let scaling = md
            .get_str(&k("rope.scaling.type"))?
            .unwrap_or("linear")
            .to_string();
        if !matches!(scaling.as_str(), "none" | "linear" | "yarn") {
            return Err(bad(
                &k("rope.scaling.type"),
                format!("expected none, linear or yarn, found {scaling}"),
            ));
        }
        let factor = opt_f32(md, &k("rope.scaling.factor"), 0.0)?;
        let mut freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
        if scaling == "none" {
            freq_scale = 1.0;
        }
        let yarn = scaling == "yarn";
        let ext_factor = if yarn { 1.0f32 } else { 0.0 };
        let mut yarn_log_mul = opt_f32(md, &k("rope.scaling.yarn_log_multiplier"), 0.0)?;
        if spec.yarn_mscale_all_dims() {
            // llama.cpp [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter stores 0.1 * mscale_all_dim;
            // cancel that factor so the value is mscale_all_dim again.
            yarn_log_mul /= 0.1;
        }
        let rope_attn_factor = opt_f32(md, &k("rope.scaling.attn_factor"), 1.0)?;
        let n_ctx_orig = opt_u32(md, &k("rope.scaling.original_context_length"), 0)?;
        let n_ctx_orig = if n_ctx_orig == 0 {
            n_ctx_train
        } else {
            n_ctx_orig
        } as u32;
        let mut attn_factor = 1.0f32;
        if ext_factor != 0.0 {
            let factor = 1.0 / freq_scale;
            if yarn_log_mul != 0.0 {
                let mscale_all_dims = yarn_log_mul;
                let mscale = if spec.yarn_mscale_all_dims() && mscale_all_dims != 1.0 {
                    mscale_all_dims
                } else {
                    1.0
                };
                attn_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dims);
            } else {
                attn_factor = get_mscale(factor, 1.0);
            }
            attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        attn_factor *= rope_attn_factor;
        // llama.cpp reads `rope_freqs.weight` for llama only (llama 3's long-context factors).
        let freq_factors = if spec.rope_freq_factors() && g.tensor("rope_freqs.weight").is_some() {
            Some(crate::weights::load_w(g, "rope_freqs.weight", &[n_rot / 2])?.to_f32()?)
        } else {
            None
        };
        let rope = RopeConfig {
            n_dims: n_rot,
            neox: spec.rope_neox(),
            freq_factors,
            freq_base,
            freq_scale,
            ext_factor,
            attn_factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig,
        };

        if arch.is_gqa() && (n_rot != head_k || head_k != head_v) {
            return Err(bad(
                &k("rope.dimension_count"),
                format!("expected rope dims == key length == value length, found {n_rot}, {head_k}, {head_v}"),
            ));
        }
        let n_ff_dense = opt_u32(md, &k("feed_forward_length"), 0)?;
        let h = Hparams {
            md,
            arch,
            n_embd,
            n_layer,
            n_head,
            head_k,
            n_rot,
            n_ff_dense,
            freq_scale,
            attn_factor,
            yarn_log_mul,
        };
        let p = spec.hparams(&h)?;
        let moe = p.moe.unwrap_or(MoeParams {
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
            n_expert_shared: 0,
            weights_norm: false,
            weights_scale: 0.0,
            gating: Gating::Softmax,
            n_groups: 1,
            n_group_used: 1,
        });
        Ok(ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_k,
            head_v,
            n_ctx_train,
            rms_eps,
            rope,
            kq_scale: p.kq_scale,
            mla: p.mla,
            n_expert: moe.n_expert,
            n_expert_used: moe.n_expert_used,
            n_ff_exp: moe.n_ff_exp,
            n_ff_dense,
            n_expert_shared: moe.n_expert_shared,
            n_dense_lead: p.n_dense_lead,
            expert_weights_norm: moe.weights_norm,
            expert_weights_scale: moe.weights_scale,
            gating: moe.gating,
            n_expert_groups: moe.n_groups,
            n_group_used: moe.n_group_used,
        })
    }

    /// Floats one token occupies in one layer's K (and V) cache.
    pub fn kv_floats_per_token(&self) -> (usize, usize) {
        if self.arch.is_gqa() {
            (self.n_head_kv * self.head_k, self.n_head_kv * self.head_v)
        } else {
            // MLA: the latent + rope row; V is a view of its first kv_lora floats.
            (self.head_k, 0)
        }
    }

    /// Whether layer `il` is a MoE layer (deepseek2's leading layers and every layer of the dense
    /// archs are dense).
    pub fn is_moe_layer(&self, il: usize) -> bool {
        il >= self.n_dense_lead
    }
}
