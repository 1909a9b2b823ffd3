//! `ModelConfig`: the hyper-parameters of a qwen3moe, deepseek2, qwen3 or llama GGUF, read from
//! its metadata exactly as llama.cpp's hparams/cparams loading does (including YaRN's attention
//! factor, deepseek2's pre-scaled `kq_scale` and llama's rope frequency factors), so the forward
//! pass never looks at metadata again.

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

    /// Whether the arch has routed experts (qwen3 and llama are dense: no `ExpertBackend` call).
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Deepseek2)
    }

    /// Whether attention is grouped-query over per-head K/V rows (everything but deepseek2's MLA).
    pub fn is_gqa(self) -> bool {
        !matches!(self, Arch::Deepseek2)
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
        let arch = match arch_name.as_str() {
            "qwen3moe" => Arch::Qwen3Moe,
            "deepseek2" => Arch::Deepseek2,
            "qwen3" => Arch::Qwen3,
            "llama" => Arch::Llama,
            other => return Err(ModelError::UnsupportedArch(other.to_string())),
        };
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
        if arch == Arch::Deepseek2 {
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
                let mscale = if arch == Arch::Deepseek2 && mscale_all_dims != 1.0 {
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
        let freq_factors = match arch {
            Arch::Llama if g.tensor("rope_freqs.weight").is_some() => {
                Some(crate::weights::load_w(g, "rope_freqs.weight", &[n_rot / 2])?.to_f32()?)
            }
            _ => None,
        };
        let rope = RopeConfig {
            n_dims: n_rot,
            neox: matches!(arch, Arch::Qwen3Moe | Arch::Qwen3),
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
        if !arch.is_moe() {
            return dense_config(DenseParts {
                md,
                arch,
                key: &k,
                n_vocab,
                n_embd,
                n_layer,
                n_head,
                n_head_kv,
                head_k,
                n_ctx_train,
                rms_eps,
                rope,
                n_ff: n_ff_dense,
            });
        }
        let n_expert = opt_u32(md, &k("expert_count"), 0)?;
        let n_expert_used = opt_u32(md, &k("expert_used_count"), 0)?;
        if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
            return Err(bad(
                &k("expert_used_count"),
                format!("expected 0 < expert_used_count <= expert_count, found {n_expert_used} of {n_expert}"),
            ));
        }
        let n_ff_exp = opt_u32(md, &k("expert_feed_forward_length"), 0)?;
        let n_ff_exp = if n_ff_exp == 0 {
            n_ff_dense / n_expert_used
        } else {
            n_ff_exp
        };
        if n_ff_exp == 0 {
            return Err(bad(
                &k("expert_feed_forward_length"),
                "expected a non-zero expert feed-forward length, found 0".into(),
            ));
        }

        let (
            kq_scale,
            mla,
            n_expert_shared,
            n_dense_lead,
            norm_w,
            w_scale,
            gating,
            groups,
            groups_used,
        ) = match arch {
            Arch::Qwen3Moe => {
                let scale = opt_f32(md, &k("expert_weights_scale"), 0.0)?;
                (
                    1.0 / (head_k as f32).sqrt(),
                    None,
                    0,
                    0,
                    true,
                    scale,
                    Gating::Softmax,
                    1,
                    1,
                )
            }
            // the dense archs returned through `dense_config` above
            Arch::Qwen3 | Arch::Llama => {
                return Err(bad(
                    &k("expert_count"),
                    format!("expected no experts in a dense {arch_name} model, found {n_expert}"),
                ))
            }
            Arch::Deepseek2 => {
                let q_lora_rank = opt_u32(md, &k("attention.q_lora_rank"), 0)?;
                let kv_lora_rank = req_u32(md, &k("attention.kv_lora_rank"))?;
                let head_k_mla = req_u32(md, &k("attention.key_length_mla"))?;
                let v_head = req_u32(md, &k("attention.value_length_mla"))?;
                if head_k_mla <= n_rot
                    || v_head == 0
                    || kv_lora_rank == 0
                    || head_k != kv_lora_rank + n_rot
                    || head_v != kv_lora_rank
                {
                    return Err(bad(
                        &k("attention.key_length_mla"),
                        format!("expected key_length_mla > rope dims and key/value length = kv_lora+rope/kv_lora (absorbed MLA), found {head_k_mla}, {head_k}, {head_v}"),
                    ));
                }
                let mla = MlaConfig {
                    q_lora_rank,
                    kv_lora_rank,
                    qk_nope: head_k_mla - n_rot,
                    qk_rope: n_rot,
                    v_head,
                };
                // llama.cpp's deepseek2 graph: undo the YaRN adjustment of attn_factor, then pre-scale kq.
                let attn_factor_org = attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln());
                let mscale = attn_factor_org * (1.0 + 0.1 * yarn_log_mul * (1.0 / freq_scale).ln());
                let kq_scale = 1.0 * mscale * mscale / (head_k_mla as f32).sqrt();
                let shared = opt_u32(md, &k("expert_shared_count"), 0)?;
                let lead = opt_u32(md, &k("leading_dense_block_count"), 0)?;
                let norm_w = md.get_bool(&k("expert_weights_norm"))?.unwrap_or(false);
                let scale = opt_f32(md, &k("expert_weights_scale"), 0.0)?;
                let gating = match opt_u32(md, &k("expert_gating_func"), 1)? {
                    0 | 1 => Gating::Softmax,
                    2 => Gating::Sigmoid,
                    other => {
                        return Err(bad(
                            &k("expert_gating_func"),
                            format!("expected 1 (softmax) or 2 (sigmoid), found {other}"),
                        ))
                    }
                };
                let groups = opt_u32(md, &k("expert_group_count"), 1)?.max(1);
                let used = opt_u32(md, &k("expert_group_used_count"), 1)?.max(1);
                if n_expert % groups != 0 || used > groups {
                    return Err(bad(
                        &k("expert_group_count"),
                        format!("expected groups dividing {n_expert} experts and used <= groups, found {groups} groups, {used} used"),
                    ));
                }
                (
                    kq_scale,
                    Some(mla),
                    shared,
                    lead,
                    norm_w,
                    scale,
                    gating,
                    groups,
                    used,
                )
            }
        };
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
            kq_scale,
            mla,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_dense,
            n_expert_shared,
            n_dense_lead,
            expert_weights_norm: norm_w,
            expert_weights_scale: w_scale,
            gating,
            n_expert_groups: groups,
            n_group_used: groups_used,
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

/// What [`dense_config`] needs from `ModelConfig::from_gguf`.
struct DenseParts<'a, K: Fn(&str) -> String> {
    md: &'a Metadata,
    arch: Arch,
    key: &'a K,
    n_vocab: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_k: usize,
    n_ctx_train: usize,
    rms_eps: f32,
    rope: RopeConfig,
    n_ff: usize,
}

/// The config of a dense qwen3 or llama file: every layer a SwiGLU FFN of `feed_forward_length`,
/// kq scale 1/sqrt(head_dim) (llama: `attention.scale` when set, as llama.cpp's llama graph).
fn dense_config<K: Fn(&str) -> String>(p: DenseParts<'_, K>) -> Result<ModelConfig, ModelError> {
    let k = p.key;
    if p.n_ff == 0 {
        return Err(bad(
            &k("feed_forward_length"),
            "expected a non-zero feed-forward length, found 0".into(),
        ));
    }
    let n_expert = opt_u32(p.md, &k("expert_count"), 0)?;
    if n_expert != 0 {
        return Err(bad(
            &k("expert_count"),
            format!(
                "expected no experts in a dense {} model, found {n_expert}",
                p.arch.name()
            ),
        ));
    }
    let mut kq_scale = 1.0 / (p.head_k as f32).sqrt();
    if p.arch == Arch::Llama {
        let s = opt_f32(p.md, &k("attention.scale"), 0.0)?;
        if s != 0.0 {
            kq_scale = s;
        }
    }
    Ok(ModelConfig {
        arch: p.arch,
        n_vocab: p.n_vocab,
        n_embd: p.n_embd,
        n_layer: p.n_layer,
        n_head: p.n_head,
        n_head_kv: p.n_head_kv,
        head_k: p.head_k,
        head_v: p.head_k,
        n_ctx_train: p.n_ctx_train,
        rms_eps: p.rms_eps,
        rope: p.rope,
        kq_scale,
        mla: None,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        n_ff_dense: p.n_ff,
        n_expert_shared: 0,
        n_dense_lead: p.n_layer,
        expert_weights_norm: false,
        expert_weights_scale: 0.0,
        gating: Gating::Softmax,
        n_expert_groups: 1,
        n_group_used: 1,
    })
}
