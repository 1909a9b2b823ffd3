//! What the planner needs to know about a model: the bytes a decode step reads (dense weights
//! on the coordinator, one routed expert on a node), the activation row a node receives, and
//! the KV cache a position costs. Read from a GGUF file's tensor infos and hyper-parameters, or
//! from a `gen-model` preset's plan (`model::gen::plan`: the same tensor list and per-tensor
//! types `gen-model` would write, without writing it), so the shapes have one home.

use std::path::Path;

use nightshift_kernels::GgmlType;
use nightshift_model::gen::{self, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::gguf::Gguf;
use nightshift_model::ModelConfig;

use super::PlanError;

/// The sizes of one model that the planner's cost terms use.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelCost {
    /// What the model is (preset and quant, or the file name).
    pub name: String,
    pub n_embd: usize,
    pub n_layer: usize,
    /// MoE layers (the ones with routed experts).
    pub moe_layers: usize,
    pub n_expert: usize,
    pub n_used: usize,
    /// Bytes of one routed expert (gate + up + down, averaged over the MoE layers).
    pub expert_bytes: u64,
    /// The expert's gate/up and down types and its FFN width (what the calibration measures).
    pub expert_type: GgmlType,
    pub expert_down_type: GgmlType,
    pub expert_ff: usize,
    /// Shared-expert bytes of all MoE layers (part of `dense_bytes`; what the overlap hides).
    pub shared_bytes: u64,
    /// Weights every token reads on the coordinator: attention, dense FFNs, shared experts,
    /// routers, norms and the output head (not the token embedding: one row is looked up).
    pub dense_bytes: u64,
    /// The token embedding (held by the coordinator, barely read).
    pub embd_bytes: u64,
    /// Bytes of one activation row as sent to a node (the experts' activation type).
    pub act_row_bytes: u64,
    /// KV cache values of one position over all layers (`KvLayout`'s widths times layers).
    pub kv_floats_per_pos: u64,
}

impl ModelCost {
    /// All the model's tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        self.embd_bytes + self.dense_bytes + self.all_expert_bytes()
    }

    /// Bytes of every routed expert of every MoE layer (what the nodes hold, one copy).
    pub fn all_expert_bytes(&self) -> u64 {
        self.expert_bytes * (self.n_expert * self.moe_layers) as u64
    }

    /// From a preset name and quant mix, e.g. `kimi-k2` and `UD-Q2_K_XL`.
    pub fn from_preset(preset: &str, quant: &str) -> Result<ModelCost, PlanError> {
        let preset: Preset = preset
            .parse()
            .map_err(|e| PlanError::Model(format!("{e}")))?;
        let quant: QuantMix = quant
            .parse()
            .map_err(|e| PlanError::Model(format!("{e}")))?;
        let arch = preset.arch().ok_or_else(|| {
            PlanError::Model(format!(
                "expected a preset with a real model's shape, found `{}`",
                preset.name()
            ))
        })?;
        Self::from_spec(&GenSpec::new(preset, arch, quant))
    }

    /// From what `gen-model` would write for `spec` (its plan: no file is written).
    pub fn from_spec(spec: &GenSpec) -> Result<ModelCost, PlanError> {
        let plan = gen::plan(spec).map_err(|e| PlanError::Model(e.to_string()))?;
        let d = &plan.dims;
        // as the engine caches it (`ModelConfig::kv_floats_per_token`): MLA keeps the
        // compressed latent plus the rope key (V is a view of it), the GQA archs K and V heads;
        // tests/plan_cluster.rs checks this against a generated file's config
        let kv_row = match d.arch {
            Arch::Deepseek2 => d.kv_lora + d.rope,
            _ => 2 * d.heads_kv * d.head_dim,
        };
        let tensors = plan
            .tensors
            .iter()
            .map(|(t, _)| {
                let bytes = t.n_bytes().map_err(|e| PlanError::Model(e.to_string()))?;
                Ok((t.name.as_str(), t.ty, t.dims.as_slice(), bytes))
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        Self::from_tensors(
            format!("{} {}", spec.preset.name(), spec.quant.name()),
            d.embd as usize,
            d.n_layer,
            d.n_used,
            kv_row * d.n_layer as u64,
            &tensors,
        )
    }

    /// From a GGUF file's tensor infos and hyper-parameters (the data is not read).
    pub fn from_gguf(path: &Path) -> Result<ModelCost, PlanError> {
        let g = Gguf::open(path).map_err(|e| PlanError::Model(e.to_string()))?;
        let c = ModelConfig::from_gguf(&g).map_err(|e| PlanError::Model(e.to_string()))?;
        let tensors: Vec<_> = g
            .tensors()
            .map(|t| (t.name.as_str(), t.ty, t.dims.as_slice(), t.size()))
            .collect();
        let (k, v) = c.kv_floats_per_token();
        let kv_row = (k + v) as u64;
        Self::from_tensors(
            path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            ),
            c.n_embd,
            c.n_layer,
            c.n_expert_used,
            kv_row * c.n_layer as u64,
            &tensors,
        )
    }

    fn from_tensors(
        name: String,
        n_embd: usize,
        n_layer: usize,
        n_used: usize,
        kv_floats_per_pos: u64,
        tensors: &[(&str, GgmlType, &[u64], u64)],
    ) -> Result<ModelCost, PlanError> {
        let (mut dense, mut embd, mut experts) = (0u64, 0u64, 0u64);
        let mut moe_layers = std::collections::BTreeSet::new();
        let (mut n_expert, mut expert_type, mut expert_ff) = (0usize, None, 0usize);
        let (mut down_type, mut shared) = (None, 0u64);
        for &(name, ty, dims, bytes) in tensors {
            if name == "token_embd.weight" {
                embd += bytes;
            } else if name.ends_with("_exps.weight") {
                experts += bytes;
                let layer = name
                    .strip_prefix("blk.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|i| i.parse::<usize>().ok());
                moe_layers.insert(layer);
                n_expert = n_expert.max(dims.get(2).copied().unwrap_or(0) as usize);
                if name.ends_with("ffn_gate_exps.weight") {
                    expert_type = Some(ty);
                    expert_ff = dims.get(1).copied().unwrap_or(0) as usize;
                } else if name.ends_with("ffn_down_exps.weight") {
                    down_type = Some(ty);
                }
            } else {
                dense += bytes;
                if name.contains("_shexp.") {
                    shared += bytes;
                }
            }
        }
        let (Some(expert_type), Some(expert_down_type), true) =
            (expert_type, down_type, n_expert > 0 && n_used > 0)
        else {
            return Err(PlanError::Model(format!(
                "{name}: expected a mixture-of-experts model (ffn_*_exps tensors), found a dense one"
            )));
        };
        let moe = moe_layers.len();
        let act = nightshift_model::expert::act_type_for(expert_type, expert_type);
        let act_row_bytes = act
            .row_bytes(n_embd)
            .map_err(|e| PlanError::Model(format!("{name}: activation rows: {e}")))?
            as u64;
        Ok(ModelCost {
            name,
            n_embd,
            n_layer,
            moe_layers: moe,
            n_expert,
            n_used,
            expert_bytes: experts / (n_expert * moe) as u64,
            expert_type,
            expert_down_type,
            expert_ff,
            shared_bytes: shared,
            dense_bytes: dense,
            embd_bytes: embd,
            act_row_bytes,
            kv_floats_per_pos,
        })
    }
}
