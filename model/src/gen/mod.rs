//! Random-weight model generation in llama.cpp's exact GGUF layout (`nightshift gen-model`).
//!
//! [`generate`] writes a qwen3moe, deepseek2 (Kimi K2), dense qwen3 or llama model — the `tiny`
//! fixture shapes or real Qwen3-30B-A3B / Kimi K2 / Qwen3-0.6B shapes, optionally with fewer
//! layers/experts — with weights drawn
//! deterministically from a seed and quantized by the kernels' `quantize_row` in one of
//! llama.cpp's quant mixes (or Unsloth-shaped i-quant mixes, whose i-quant tensors are random
//! valid blocks: `iq_mix`), plus a trained byte-level BPE tokenizer and chat template, so the file
//! runs end to end here and in llama.cpp. The data is streamed tensor by tensor, a chunk of rows
//! at a time (rows quantized in parallel on rayon's pool), so multi-GB files need little RAM.
//!
//! Submodules: `writer` (streaming GGUF v3), `layout` (presets, metadata, tensor list), `mix`
//! (llama-quantize's per-tensor types), `iq_mix` (UD-IQ1_S / UD-IQ2_XXS / UD-Q2_K_XL), `bpe` +
//! `tokenizer_kv` (tokenizer), `rng` (seeded streams), `skew` (the residual-stream construction
//! for realistically skewed, local routing instead of uniform), `skew_model` (published
//! statistics to a router logit's variance shares), `skew_fit` (those shares corrected by
//! simulating top-k routing on captured router inputs) and `calibrate` (the two passes that
//! measure the generated file, on `calib_prompts`, and write its routers with those shares).

pub mod bpe;
pub mod calib_prompts;
pub mod calibrate;
pub mod iq_mix;
pub mod layout;
pub mod mix;
pub mod rng;
pub mod skew;
pub mod skew_fit;
pub mod skew_model;
pub mod tokenizer_kv;
pub mod writer;

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use nightshift_kernels::{quantize_row, GgmlType};
use rayon::prelude::*;

pub use layout::{Dims, Init};
pub use skew::RoutingSkew;
pub use writer::{GgufWriter, KvValue, TensorDecl};

/// Errors of model generation.
#[derive(thiserror::Error, Debug)]
pub enum GenError {
    #[error("invalid generation spec: {0}")]
    Spec(String),
    #[error("tensor `{tensor}` has an unusable shape: {detail}")]
    Shape { tensor: String, detail: String },
    #[error("gguf stream: {0}")]
    Stream(String),
    #[error("quantizing `{tensor}` to {ty}: {detail}")]
    Quantize {
        tensor: String,
        ty: &'static str,
        detail: String,
    },
    #[error("writing {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("calibrating the skewed routers: {0}")]
    Calibrate(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The architectures `gen-model` writes: the engine's own (`config::Arch`), named as in GGUF
/// `general.architecture`.
pub use crate::config::Arch;

impl FromStr for Arch {
    type Err = GenError;
    fn from_str(s: &str) -> Result<Self, GenError> {
        Arch::from_name(s)
            .ok_or_else(|| GenError::Spec(format!("expected arch {}, found `{s}`", Arch::names())))
    }
}

/// Size presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// The reference fixtures' shapes (make_models.py): embd 256, 16 experts, 2 or 3 layers
    /// (the dense archs: the same attention, a 512-wide FFN, 2 layers).
    Tiny,
    /// Qwen3-30B-A3B: embd 2048, 48 layers, 128 experts (8 used), expert ff 768, heads 32/4.
    Qwen3_30bA3b,
    /// Kimi K2: embd 7168, 61 layers (1 dense), 384 experts (8 used), MLA, YaRN ×32.
    KimiK2,
    /// DeepSeek-V3: Kimi K2's layer shapes with 128 heads, 3 dense layers, 256 experts (8 used)
    /// in 8 groups (4 used), YaRN ×40, vocabulary 129,280.
    DeepseekV3,
    /// Qwen3-0.6B (dense): embd 1024, 28 layers, heads 16/8 of 128, ff 3072, tied embeddings,
    /// Qwen3-30B-A3B's vocabulary (its draft model).
    Qwen3_0_6b,
}

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Qwen3_30bA3b => "qwen3-30b-a3b",
            Preset::KimiK2 => "kimi-k2",
            Preset::DeepseekV3 => "deepseek-v3",
            Preset::Qwen3_0_6b => "qwen3-0.6b",
        }
    }

    /// The architecture a preset implies (tiny exists for every arch).
    pub fn arch(self) -> Option<Arch> {
        match self {
            Preset::Tiny => None,
            Preset::Qwen3_30bA3b => Some(Arch::Qwen3Moe),
            Preset::KimiK2 | Preset::DeepseekV3 => Some(Arch::Deepseek2),
            Preset::Qwen3_0_6b => Some(Arch::Qwen3),
        }
    }
}

impl FromStr for Preset {
    type Err = GenError;
    fn from_str(s: &str) -> Result<Self, GenError> {
        match s {
            "tiny" => Ok(Preset::Tiny),
            "qwen3-30b-a3b" => Ok(Preset::Qwen3_30bA3b),
            "kimi-k2" => Ok(Preset::KimiK2),
            "deepseek-v3" => Ok(Preset::DeepseekV3),
            "qwen3-0.6b" => Ok(Preset::Qwen3_0_6b),
            _ => Err(GenError::Spec(format!(
                "expected preset tiny, qwen3-30b-a3b, kimi-k2, deepseek-v3 or qwen3-0.6b, found `{s}`"
            ))),
        }
    }
}

/// llama.cpp quantization mixes (`llama-quantize` ftypes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMix {
    Q2K,
    Q4KM,
    Q8_0,
    F16,
    /// Unsloth-shaped `UD-IQ1_S` (see `iq_mix`)
    UdIq1S,
    /// Unsloth-shaped `UD-IQ2_XXS` (see `iq_mix`)
    UdIq2Xxs,
    /// Unsloth-shaped `UD-Q2_K_XL` (see `iq_mix`: its K-quant sibling)
    UdQ2KXl,
    /// llama.cpp's `MXFP4_MOE`: routed experts MXFP4, every other quantized tensor Q8_0
    Mxfp4Moe,
}

impl QuantMix {
    pub fn name(self) -> &'static str {
        match self {
            QuantMix::Q2K => "Q2_K",
            QuantMix::Q4KM => "Q4_K_M",
            QuantMix::Q8_0 => "Q8_0",
            QuantMix::F16 => "F16",
            QuantMix::UdIq1S => "UD-IQ1_S",
            QuantMix::UdIq2Xxs => "UD-IQ2_XXS",
            QuantMix::UdQ2KXl => "UD-Q2_K_XL",
            QuantMix::Mxfp4Moe => "MXFP4_MOE",
        }
    }

    /// llama.cpp's `llama_ftype` value (`general.file_type`).
    pub fn file_type(self) -> u32 {
        match self {
            QuantMix::Q2K => 10,
            QuantMix::Q4KM => 15,
            QuantMix::Q8_0 => 7,
            QuantMix::F16 => 1,
            QuantMix::UdIq1S => 24,
            QuantMix::UdIq2Xxs => 19,
            QuantMix::UdQ2KXl => 10,
            QuantMix::Mxfp4Moe => 38,
        }
    }
}

impl FromStr for QuantMix {
    type Err = GenError;
    fn from_str(s: &str) -> Result<Self, GenError> {
        match s.to_ascii_uppercase().as_str() {
            "Q2_K" => Ok(QuantMix::Q2K),
            "Q4_K_M" => Ok(QuantMix::Q4KM),
            "Q8_0" => Ok(QuantMix::Q8_0),
            "F16" => Ok(QuantMix::F16),
            "UD-IQ1_S" => Ok(QuantMix::UdIq1S),
            "UD-IQ2_XXS" => Ok(QuantMix::UdIq2Xxs),
            "UD-Q2_K_XL" => Ok(QuantMix::UdQ2KXl),
            "MXFP4_MOE" => Ok(QuantMix::Mxfp4Moe),
            _ => Err(GenError::Spec(format!(
                "expected quant Q2_K, Q4_K_M, Q8_0, F16, UD-IQ1_S, UD-IQ2_XXS, UD-Q2_K_XL or MXFP4_MOE, found `{s}`"
            ))),
        }
    }
}

/// Everything that determines a generated file (same spec, same bytes).
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    pub arch: Arch,
    pub preset: Preset,
    pub layers: Option<usize>,
    pub experts: Option<usize>,
    pub vocab: Option<usize>,
    pub seed: u64,
    pub quant: QuantMix,
    /// keep output.weight F32 (`llama-quantize --leave-output-tensor`, as the fixtures do)
    pub leave_output: bool,
    /// general.name (default: derived from the preset)
    pub name: Option<String>,
    /// `tokenizer.chat_template` (default: the architecture's own); its special markers become
    /// tokens of the vocabulary.
    pub chat_template: Option<String>,
    /// `context_length` (default: the preset's).
    pub ctx: Option<u32>,
    /// How routers are drawn (`skew`): uniform (the default, the fixtures' weights) or skewed.
    pub routing: RoutingSkew,
}

impl GenSpec {
    /// A spec with the preset's own architecture and defaults: seed 7, nothing shrunk.
    pub fn new(preset: Preset, arch: Arch, quant: QuantMix) -> GenSpec {
        GenSpec {
            arch,
            preset,
            layers: None,
            experts: None,
            vocab: None,
            seed: 7,
            quant,
            leave_output: false,
            name: None,
            chat_template: None,
            ctx: None,
            routing: RoutingSkew::Uniform,
        }
    }
}

impl GenSpec {
    /// The demo model `nightshift serve` uses without --model: tiny qwen3moe, Q4_K_M, seed 7.
    pub fn demo() -> GenSpec {
        GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM)
    }

    /// A file name that encodes every field of the spec (the cache key of [`ensure_cached`]).
    pub fn file_name(&self) -> String {
        let opt = |p: &str, v: Option<usize>| v.map_or(String::new(), |v| format!("-{p}{v}"));
        let name = self.name.as_deref().map_or(String::new(), |n| {
            let safe: String = n
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            format!("-n{safe}")
        });
        // a template is named by a hash of its text (FNV-1a, mixed)
        let template = self.chat_template.as_deref().map_or(String::new(), |t| {
            format!("-t{:08x}", rng::tensor_seed(0, t) as u32)
        });
        let routing = match self.routing {
            RoutingSkew::Uniform => String::new(),
            r => format!("-r{}", r.name()),
        };
        format!(
            "{}-{}{}{}{}{}-s{}{}{}{}{}-{}.gguf",
            self.preset.name(),
            self.arch.name(),
            opt("L", self.layers),
            opt("X", self.experts),
            opt("V", self.vocab),
            opt("C", self.ctx.map(|c| c as usize)),
            self.seed,
            if self.leave_output { "-f32out" } else { "" },
            name,
            template,
            routing,
            self.quant.name()
        )
    }
}

/// Returns `dir/<spec.file_name()>`, generating it first unless it is already there (generation
/// writes `.partial` and renames, so an interrupted run never leaves a file that looks complete).
pub fn ensure_cached(
    spec: &GenSpec,
    dir: &Path,
    progress: &mut dyn FnMut(&GenProgress<'_>),
) -> Result<PathBuf, GenError> {
    let path = dir.join(spec.file_name());
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|source| GenError::File {
        path: dir.to_path_buf(),
        source,
    })?;
    generate(spec, &path, progress)?;
    Ok(path)
}

/// The complete content of a file to be generated, minus the weights themselves.
#[derive(Clone, Debug)]
pub struct Plan {
    pub dims: Dims,
    pub n_vocab: usize,
    pub metadata: Vec<(String, KvValue)>,
    /// tensors in file order, with how their values are drawn
    pub tensors: Vec<(TensorDecl, Init)>,
    /// how the routers are drawn
    pub routing: RoutingSkew,
    /// what the calibration pass of skewed routing measured and derived (after [`generate`])
    pub calibration: Option<calibrate::Calibration>,
}

impl Plan {
    /// Bytes of tensor data (excluding header and padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(t, _)| t.n_bytes().unwrap_or(0))
            .sum()
    }

    /// Parameters (elements of all tensors).
    pub fn n_params(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(t, _)| t.dims.iter().product::<u64>())
            .sum()
    }
}

/// Works out metadata, tensor names, shapes and types for a spec, without writing anything.
pub fn plan(spec: &GenSpec) -> Result<Plan, GenError> {
    let dims = Dims::from_spec(spec)?;
    skew::Shaper::new(&dims, spec.routing)?;
    let (tok_kv, n_vocab, n_live) =
        tokenizer_kv::tokenizer_metadata(dims.arch, dims.vocab, spec.chat_template.as_deref())?;
    let mut metadata = vec![
        (
            "general.architecture".to_string(),
            KvValue::Str(dims.arch.name().into()),
        ),
        ("general.name".to_string(), KvValue::Str(dims.name.clone())),
    ];
    metadata.extend(tok_kv);
    metadata.extend(layout::arch_metadata(&dims));
    metadata.push(("general.quantization_version".into(), KvValue::U32(2)));
    metadata.push((
        "general.file_type".into(),
        KvValue::U32(spec.quant.file_type()),
    ));
    let list = layout::tensor_list(&dims, n_vocab as u64, n_live as u64);
    let mut cx = mix::MixContext {
        n_layer: dims.n_layer,
        n_expert: dims.n_expert,
        n_gqa: dims.n_gqa(),
        n_attention_wv: list
            .iter()
            .filter(|t| t.0.contains("attn_v.weight"))
            .count(),
        i_attention_wv: 0,
        leave_output: spec.leave_output,
        tied: dims.tied,
    };
    let mut tensors = Vec::with_capacity(list.len());
    for (name, shape, init) in list {
        let ty = mix::tensor_type(spec.quant, &name, &shape, &mut cx);
        let decl = TensorDecl {
            name,
            ty,
            dims: shape,
        };
        decl.n_bytes()?;
        tensors.push((decl, init));
    }
    Ok(Plan {
        dims,
        n_vocab,
        metadata,
        tensors,
        routing: spec.routing,
        calibration: None,
    })
}

/// Progress of [`generate`], reported after every chunk of rows.
#[derive(Clone, Debug)]
pub struct GenProgress<'a> {
    pub tensor: &'a str,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// f32 elements generated per chunk (bounds RAM to ~this × 4 bytes plus the quantized chunk).
const CHUNK_ELEMS: u64 = 1 << 23;

/// Generates the model of `spec` into `path` (written to `path.partial` then renamed, so a
/// half-written file never looks complete). Skewed routing writes `path.uncalibrated` first,
/// calibrates its routers in place (`calibrate`) and then renames it. Returns the plan that was
/// written.
pub fn generate(
    spec: &GenSpec,
    path: &Path,
    progress: &mut dyn FnMut(&GenProgress<'_>),
) -> Result<Plan, GenError> {
    let mut plan = plan(spec)?;
    let Some(shaper) = skew::Shaper::new(&plan.dims, plan.routing)? else {
        write_plan(&plan, spec.seed, path, progress)?;
        return Ok(plan);
    };
    let mut first = path.as_os_str().to_owned();
    first.push(".uncalibrated");
    let first = PathBuf::from(first);
    write_plan(&plan, spec.seed, &first, progress)?;
    let cal = calibrate::calibrate(
        &first,
        plan.dims.arch,
        shaper.topic_channels(),
        shaper.params().scale,
        spec.seed,
    )?;
    std::fs::rename(&first, path).map_err(|source| GenError::File {
        path: path.to_path_buf(),
        source,
    })?;
    plan.calibration = Some(cal);
    Ok(plan)
}

/// Writes `plan` (as [`plan`] made it, or altered: tests drop keys or add tensors) with weights
/// drawn from `seed`, as [`generate`] does.
pub fn write_plan(
    plan: &Plan,
    seed: u64,
    path: &Path,
    progress: &mut dyn FnMut(&GenProgress<'_>),
) -> Result<(), GenError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    let file_err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| GenError::File { path: p, source }
    };
    let file = File::create(&tmp).map_err(file_err(&tmp))?;
    let decls: Vec<TensorDecl> = plan.tensors.iter().map(|t| t.0.clone()).collect();
    let mut w = GgufWriter::new(
        BufWriter::with_capacity(1 << 20, file),
        &plan.metadata,
        &decls,
    )?;
    let total = plan.data_bytes();
    let mut done = 0u64;
    let mut buf: Vec<u8> = Vec::new();
    let shaper = skew::Shaper::new(&plan.dims, plan.routing)?;
    for (decl, init) in &plan.tensors {
        let tseed = rng::tensor_seed(seed, &decl.name);
        let k = decl.row_len();
        let n_rows = decl.n_rows();
        let row_bytes = decl.ty.row_bytes(k as usize).map_err(|e| GenError::Shape {
            tensor: decl.name.clone(),
            detail: e.to_string(),
        })?;
        let rows_per_chunk = (CHUNK_ELEMS / k.max(1)).max(1);
        let mut row = 0u64;
        while row < n_rows {
            let n = rows_per_chunk.min(n_rows - row);
            buf.resize(n as usize * row_bytes, 0);
            fill_rows(
                decl,
                *init,
                tseed,
                row,
                &mut buf,
                row_bytes,
                shaper.as_ref(),
            )?;
            w.write_data(&buf)?;
            row += n;
            done += buf.len() as u64;
            progress(&GenProgress {
                tensor: &decl.name,
                bytes_done: done,
                bytes_total: total,
            });
        }
    }
    let out = w.finish()?;
    let file = out.into_inner().map_err(|e| GenError::Io(e.into_error()))?;
    file.sync_all().map_err(file_err(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(file_err(path))?;
    Ok(())
}

/// Draws rows `first_row..` of a tensor and stores them, quantized, into `out` (whole rows);
/// `shaper` rewrites the rows skewed routing shapes.
fn fill_rows(
    decl: &TensorDecl,
    init: Init,
    seed: u64,
    first_row: u64,
    out: &mut [u8],
    row_bytes: usize,
    shaper: Option<&skew::Shaper>,
) -> Result<(), GenError> {
    let k = decl.row_len() as usize;
    let scale = match init {
        Init::Gaussian(s) => s,
        Init::TiedEmbd { .. } => layout::EMBD_SCALE,
        Init::Matrix(gain) | Init::Head { gain, .. } => gain / (k as f32).sqrt(),
        Init::Norm => 0.1,
        Init::RopeFreqs(..) => 0.0,
    };
    let live_rows = match init {
        Init::Head { live_rows, .. } | Init::TiedEmbd { live_rows } => live_rows,
        _ => u64::MAX,
    };
    let offset = if init == Init::Norm { 1.0 } else { 0.0 };
    let ty = decl.ty;
    out.par_chunks_mut(row_bytes).enumerate().try_for_each_init(
        || vec![0f32; k],
        |vals, (i, dst)| {
            let mut r = rng::row_rng(seed, first_row + i as u64);
            if let Init::RopeFreqs(r, base) = init {
                for (j, v) in vals.iter_mut().enumerate() {
                    *v = r.factor_of(j, 2 * k, base);
                }
            } else if first_row + i as u64 >= live_rows {
                vals.fill(0.0);
            } else {
                for v in vals.iter_mut() {
                    *v = offset + scale * r.gaussian();
                }
            }
            if let Some(s) = shaper {
                s.shape_row(&decl.name, first_row + i as u64, vals, &mut r);
            }
            if ty == GgmlType::F32 {
                for (d, v) in dst.chunks_exact_mut(4).zip(vals.iter()) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                return Ok(());
            }
            let written = if ty.has_quantizer() {
                quantize_row(ty, vals, dst)
            } else {
                iq_mix::random_row(ty, vals, &mut r, dst)
            };
            written.map_err(|e| GenError::Quantize {
                tensor: decl.name.clone(),
                ty: ty.name(),
                detail: e.to_string(),
            })
        },
    )
}
