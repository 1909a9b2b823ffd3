//! What a generated model contains: the hyper-parameters of each preset, the metadata keys
//! llama.cpp reads for qwen3moe, deepseek2, qwen3 and llama, and the tensor list with llama.cpp's
//! names, ggml
//! shapes (dims[0] = row length) and how each tensor is initialised — the same layout as
//! `shared/tools/make_models.py` and llama.cpp's converters.

use super::writer::KvValue;
use super::{Arch, GenError, GenSpec, Preset};

/// Hyper-parameters of one model (sizes only; the quant mix is separate).
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub arch: Arch,
    pub name: String,
    pub ctx: u32,
    pub embd: u64,
    pub n_layer: usize,
    pub heads: u64,
    /// qwen3moe: KV heads and head size
    pub heads_kv: u64,
    pub head_dim: u64,
    /// dense FFN size (the metadata's feed_forward_length; deepseek2's leading dense layers)
    pub ff: u64,
    pub expert_ff: u64,
    pub n_expert: usize,
    pub n_used: usize,
    pub rope_base: f32,
    /// deepseek2 (MLA, YaRN, shared expert, sigmoid routing)
    pub q_lora: u64,
    pub kv_lora: u64,
    pub nope: u64,
    pub rope: u64,
    pub v_head: u64,
    pub n_dense_lead: usize,
    pub n_shared: usize,
    pub yarn_factor: f32,
    pub yarn_orig_ctx: u32,
    pub yarn_log_mul: f32,
    pub weights_scale: f32,
    /// expert groups (written only when Some)
    pub groups: Option<(u32, u32)>,
    /// vocabulary size the preset asks for (None: just the trained tokenizer)
    pub vocab: Option<usize>,
    /// no output.weight: the head is token_embd (Qwen3-0.6B, Llama 3.2 1B/3B)
    pub tied: bool,
    /// llama 3 rope frequency factors written as `rope_freqs.weight` (llama only)
    pub llama3_rope: Option<Llama3Rope>,
}

/// The `rope_scaling` of a Llama 3.x config, from which the converter computes
/// `rope_freqs.weight` (convert_hf_to_gguf's `generate_extra_tensors`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_ctx: u32,
}

impl Llama3Rope {
    /// The factor of rotated pair `i` of `n_rot` dims with rope base `base`: 1 for short
    /// wavelengths, `factor` for long ones, smoothly between.
    /// In f64, as the converter computes them in Python.
    pub fn factor_of(&self, i: usize, n_rot: usize, base: f32) -> f32 {
        let freq = 1.0 / f64::from(base).powf((2 * i) as f64 / n_rot as f64);
        let wavelen = 2.0 * std::f64::consts::PI / freq;
        let ctx = f64::from(self.original_ctx);
        let (low, high, factor) = (
            f64::from(self.low_freq_factor),
            f64::from(self.high_freq_factor),
            f64::from(self.factor),
        );
        let f = if wavelen < ctx / high {
            1.0
        } else if wavelen > ctx / low {
            factor
        } else {
            let smooth = (ctx / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        f as f32
    }
}

impl Dims {
    /// The preset's dims with the spec's overrides (layers, experts, vocab) applied.
    pub fn from_spec(spec: &GenSpec) -> Result<Dims, GenError> {
        let arch = spec.arch;
        let mut d = match (spec.preset, arch) {
            (Preset::Tiny, Arch::Qwen3Moe) => Dims {
                name: "nightshift-tiny-qwen3moe".into(),
                ..qwen_base(256, 2, 4, 2, 64, 512, 256, 16, 4, 512)
            },
            (Preset::Tiny, Arch::Deepseek2) => Dims {
                name: "nightshift-tiny-kimi".into(),
                ..deepseek_base(DeepseekSizes {
                    embd: 256,
                    n_layer: 3,
                    heads: 4,
                    q_lora: 128,
                    kv_lora: 128,
                    nope: 64,
                    rope: 32,
                    v_head: 64,
                    ff: 512,
                    expert_ff: 256,
                    n_expert: 16,
                    n_used: 4,
                    ctx: 512,
                })
            },
            (Preset::Qwen3_30bA3b, Arch::Qwen3Moe) => Dims {
                name: "nightshift-random-qwen3-30b-a3b".into(),
                vocab: Some(151_936),
                ..qwen_base(2048, 48, 32, 4, 128, 6144, 768, 128, 8, 40_960)
            },
            (Preset::Tiny, Arch::Qwen3) => Dims {
                name: "nightshift-tiny-qwen3".into(),
                ..dense_base(Arch::Qwen3, 256, 2, 4, 2, 64, 512, 512)
            },
            (Preset::Tiny, Arch::Llama) => Dims {
                name: "nightshift-tiny-llama".into(),
                rope_base: 500_000.0,
                // Llama 3.1's scaling against a short original context, so the tiny model's
                // pairs span all three regimes (1, smooth, `factor`)
                llama3_rope: Some(Llama3Rope {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_ctx: 8192,
                }),
                ..dense_base(Arch::Llama, 256, 2, 4, 2, 64, 512, 512)
            },
            (Preset::Qwen3_0_6b, Arch::Qwen3) => Dims {
                name: "nightshift-random-qwen3-0.6b".into(),
                vocab: Some(151_936),
                tied: true,
                ..dense_base(Arch::Qwen3, 1024, 28, 16, 8, 128, 3072, 40_960)
            },
            (Preset::KimiK2, Arch::Deepseek2) => Dims {
                name: "nightshift-random-kimi-k2".into(),
                vocab: Some(163_840),
                groups: Some((1, 1)),
                ..deepseek_base(DeepseekSizes {
                    embd: 7168,
                    n_layer: 61,
                    heads: 64,
                    q_lora: 1536,
                    kv_lora: 512,
                    nope: 128,
                    rope: 64,
                    v_head: 128,
                    ff: 18_432,
                    expert_ff: 2048,
                    n_expert: 384,
                    n_used: 8,
                    ctx: 131_072,
                })
            },
            (Preset::DeepseekV3, Arch::Deepseek2) => Dims {
                name: "nightshift-random-deepseek-v3".into(),
                vocab: Some(129_280),
                groups: Some((8, 4)),
                n_dense_lead: 3,
                weights_scale: 2.5,
                yarn_factor: 40.0,
                ..deepseek_base(DeepseekSizes {
                    embd: 7168,
                    n_layer: 61,
                    heads: 128,
                    q_lora: 1536,
                    kv_lora: 512,
                    nope: 128,
                    rope: 64,
                    v_head: 128,
                    ff: 18_432,
                    expert_ff: 2048,
                    n_expert: 256,
                    n_used: 8,
                    ctx: 163_840,
                })
            },
            (p, a) => {
                return Err(GenError::Spec(format!(
                    "preset `{}` is a {} model, found --arch {}",
                    p.name(),
                    p.arch().map_or_else(Arch::names, |a| a.name().to_string()),
                    a.name()
                )))
            }
        };
        if let Some(n) = spec.layers {
            if n == 0 {
                return Err(GenError::Spec("expected at least 1 layer, found 0".into()));
            }
            d.n_layer = n;
            d.n_dense_lead = d.n_dense_lead.min(n);
        }
        if let Some(n) = spec.experts {
            if !arch.is_moe() {
                return Err(GenError::Spec(format!(
                    "expected no --experts for the dense {} arch, found {n}",
                    arch.name()
                )));
            }
            if n == 0 {
                return Err(GenError::Spec("expected at least 1 expert, found 0".into()));
            }
            d.n_expert = n;
            d.n_used = d.n_used.min(n);
            d.groups = d.groups.map(|g| fit_groups(g, n, d.n_used));
        }
        if spec.vocab.is_some() {
            d.vocab = spec.vocab;
        }
        if let Some(name) = &spec.name {
            d.name = name.clone();
        }
        if let Some(c) = spec.ctx {
            if c == 0 {
                return Err(GenError::Spec(
                    "expected a context of at least 1, found 0".into(),
                ));
            }
            d.ctx = c;
        }
        Ok(d)
    }

    /// n_head / n_head_kv as llama.cpp's quantizer sees it.
    pub fn n_gqa(&self) -> usize {
        (self.heads / self.heads_kv.max(1)) as usize
    }
}

#[allow(clippy::too_many_arguments)]
fn qwen_base(
    embd: u64,
    n_layer: usize,
    heads: u64,
    heads_kv: u64,
    head_dim: u64,
    ff: u64,
    expert_ff: u64,
    n_expert: usize,
    n_used: usize,
    ctx: u32,
) -> Dims {
    Dims {
        arch: Arch::Qwen3Moe,
        name: String::new(),
        ctx,
        embd,
        n_layer,
        heads,
        heads_kv,
        head_dim,
        ff,
        expert_ff,
        n_expert,
        n_used,
        rope_base: 1e6,
        q_lora: 0,
        kv_lora: 0,
        nope: 0,
        rope: 0,
        v_head: 0,
        n_dense_lead: 0,
        n_shared: 0,
        yarn_factor: 0.0,
        yarn_orig_ctx: 0,
        yarn_log_mul: 0.0,
        weights_scale: 0.0,
        groups: None,
        vocab: None,
        tied: false,
        llama3_rope: None,
    }
}

/// A dense qwen3 or llama model: qwen3moe's attention sizes and a SwiGLU FFN of `ff` in every
/// layer, no experts.
#[allow(clippy::too_many_arguments)]
fn dense_base(
    arch: Arch,
    embd: u64,
    n_layer: usize,
    heads: u64,
    heads_kv: u64,
    head_dim: u64,
    ff: u64,
    ctx: u32,
) -> Dims {
    Dims {
        arch,
        expert_ff: 0,
        n_expert: 0,
        n_used: 0,
        ..qwen_base(embd, n_layer, heads, heads_kv, head_dim, ff, 0, 0, 0, ctx)
    }
}

struct DeepseekSizes {
    embd: u64,
    n_layer: usize,
    heads: u64,
    q_lora: u64,
    kv_lora: u64,
    nope: u64,
    rope: u64,
    v_head: u64,
    ff: u64,
    expert_ff: u64,
    n_expert: usize,
    n_used: usize,
    ctx: u32,
}

fn deepseek_base(s: DeepseekSizes) -> Dims {
    Dims {
        arch: Arch::Deepseek2,
        name: String::new(),
        ctx: s.ctx,
        embd: s.embd,
        n_layer: s.n_layer,
        heads: s.heads,
        heads_kv: 1,
        head_dim: 0,
        ff: s.ff,
        expert_ff: s.expert_ff,
        n_expert: s.n_expert,
        n_used: s.n_used,
        rope_base: 50_000.0,
        q_lora: s.q_lora,
        kv_lora: s.kv_lora,
        nope: s.nope,
        rope: s.rope,
        v_head: s.v_head,
        n_dense_lead: 1,
        n_shared: 1,
        yarn_factor: 32.0,
        yarn_orig_ctx: 4096,
        yarn_log_mul: 0.1,
        weights_scale: 2.827,
        groups: None,
        vocab: None,
        tied: false,
        llama3_rope: None,
    }
}

/// The architecture's hyper-parameter keys, in the order make_models.py writes them.
pub fn arch_metadata(d: &Dims) -> Vec<(String, KvValue)> {
    let a = d.arch.name();
    let k = |s: &str| format!("{a}.{s}");
    let u = |v: u64| KvValue::U32(v as u32);
    let mut kv = vec![
        (k("context_length"), KvValue::U32(d.ctx)),
        (k("embedding_length"), u(d.embd)),
        (k("block_count"), u(d.n_layer as u64)),
        (k("feed_forward_length"), u(d.ff)),
        (k("attention.head_count"), u(d.heads)),
        (k("attention.head_count_kv"), u(d.heads_kv)),
    ];
    kv.extend(d.arch.spec().gen_metadata(d, &k));
    kv
}

/// How a tensor's f32 values are drawn (before quantization).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// N(0,1) × scale (the token embedding: large on purpose, see make_models.py)
    Gaussian(f32),
    /// N(0,1) × gain / sqrt(row length): every weight matrix and expert stack
    Matrix(f32),
    /// 1 + 0.1·N(0,1): RMS norm weights
    Norm,
    /// A token embedding that is also the output head (tied): `Gaussian(EMBD_SCALE)` for the
    /// rows of real tokens, zero rows for the `[PAD<n>]` fillers (see `Head`).
    TiedEmbd { live_rows: u64 },
    /// `rope_freqs.weight`: llama 3's per-pair factors, computed (not drawn).
    RopeFreqs(Llama3Rope, f32),
    /// The output head: `Matrix(gain)` for the rows of real tokens, zero rows for the
    /// `[PAD<n>]` fillers from `live_rows` on. Their logits are then 0 while real tokens' spread
    /// around it, so a random model still picks real tokens and its text is visible (with random
    /// rows, 151k fillers against a few hundred real tokens won nearly every step, and fillers
    /// render as nothing).
    Head { gain: f32, live_rows: u64 },
}

/// Embedding scale of make_models.py (keeps branch noise small relative to the residual).
pub const EMBD_SCALE: f32 = 200.0;
/// Router and output gains of make_models.py.
pub const ROUTER_GAIN: f32 = 4.0;
pub const OUTPUT_GAIN: f32 = 4.0;

/// Every tensor of the model in file order: (name, ggml dims, init); the first `n_live` of the
/// `n_vocab` tokens are real (the rest are padding fillers).
pub fn tensor_list(d: &Dims, n_vocab: u64, n_live: u64) -> Vec<(String, Vec<u64>, Init)> {
    let mut t: Vec<(String, Vec<u64>, Init)> = Vec::new();
    let e = d.embd;
    let mut push = |name: String, dims: Vec<u64>, init: Init| t.push((name, dims, init));
    let embd_init = if d.tied {
        Init::TiedEmbd { live_rows: n_live }
    } else {
        Init::Gaussian(EMBD_SCALE)
    };
    push("token_embd.weight".into(), vec![e, n_vocab], embd_init);
    if let Some(r) = d.llama3_rope {
        push(
            "rope_freqs.weight".into(),
            vec![d.head_dim / 2],
            Init::RopeFreqs(r, d.rope_base),
        );
    }
    for i in 0..d.n_layer {
        push(format!("blk.{i}.attn_norm.weight"), vec![e], Init::Norm);
        d.arch.spec().gen_layer(d, i, &mut push);
    }
    push("output_norm.weight".into(), vec![e], Init::Norm);
    if !d.tied {
        push(
            "output.weight".into(),
            vec![e, n_vocab],
            Init::Head {
                gain: OUTPUT_GAIN,
                live_rows: n_live,
            },
        );
    }
    t
}

/// The preset's expert groups `(groups, used)` for `n` experts of which `n_used` are routed, as
/// llama.cpp accepts them: fewer groups than experts, dividing them, fewer used than groups, and
/// the used groups holding at least `n_used` experts. The preset's grouping when it still fits,
/// otherwise the most groups below it that do, otherwise none (one group).
fn fit_groups((groups, used): (u32, u32), n: usize, n_used: usize) -> (u32, u32) {
    (2..=groups as usize)
        .rev()
        .find_map(|g| {
            let u = (used as usize).min(g - 1);
            (g < n && n.is_multiple_of(g) && u * (n / g) >= n_used).then_some((g as u32, u as u32))
        })
        .unwrap_or((1, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_experts_keep_groups_llama_cpp_loads() {
        // DeepSeek-V3: 8 groups (4 used) of 256 experts, 8 routed
        assert_eq!(fit_groups((8, 4), 256, 8), (8, 4));
        assert_eq!(fit_groups((8, 4), 64, 8), (8, 4));
        // 16 experts: 8 groups of 2, 4 used hold exactly 8
        assert_eq!(fit_groups((8, 4), 16, 8), (8, 4));
        // 12 experts: 8 does not divide them; 6 groups of 2 with 4 used hold 8
        assert_eq!(fit_groups((8, 4), 12, 8), (6, 4));
        // 8 experts all routed: no grouping leaves 8 selectable
        assert_eq!(fit_groups((8, 4), 8, 8), (1, 1));
        // 8 experts, 2 routed: 4 groups of 2 (llama.cpp needs fewer groups than experts)
        assert_eq!(fit_groups((8, 4), 8, 2), (4, 3));
        assert_eq!(fit_groups((1, 1), 8, 2), (1, 1));
    }

    #[test]
    fn llama3_rope_factors_run_from_one_to_factor() {
        // Llama 3.1 8B: base 500000, 128 rotated dims, factor 8, low 1, high 4, 8192 positions
        let r = Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_ctx: 8192,
        };
        let f: Vec<f32> = (0..64).map(|i| r.factor_of(i, 128, 500_000.0)).collect();
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        // short wavelengths (< 2048) untouched, long ones (> 8192) divided by 8, 6 between
        assert_eq!(f.iter().filter(|&&x| x == 1.0).count(), 29);
        assert_eq!(f.iter().filter(|&&x| x == 8.0).count(), 29);
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0));
    }
}
