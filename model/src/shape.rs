//! The MoE shape of a model, read from its tensor infos: which layers have routed experts, how
//! many experts each has, and the bytes of one expert (gate + up + down as stored). Placement
//! files are validated against it by the coordinator and by every expert node, so both read it
//! through this one function.

use crate::gguf::Gguf;

/// The routed-expert layout of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeShape {
    /// Layer indices with routed experts, ascending (leading dense layers have none).
    pub moe_layers: Vec<usize>,
    /// Experts per MoE layer.
    pub n_experts: usize,
    /// Bytes of one expert's three matrices (the largest over layers).
    pub expert_bytes: u64,
}

/// Reads the MoE shape; `None` when the model has no `ffn_*_exps` tensors.
pub fn moe_shape(g: &Gguf) -> Option<MoeShape> {
    let mut layers: std::collections::BTreeMap<usize, (usize, u64)> = Default::default();
    for t in g.tensors() {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let Some((idx, tail)) = rest.split_once('.') else {
            continue;
        };
        let Ok(layer) = idx.parse::<usize>() else {
            continue;
        };
        if !matches!(
            tail,
            "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight"
        ) {
            continue;
        }
        let n_expert = t.dims.get(2).copied().unwrap_or(0) as usize;
        let per_expert = if n_expert == 0 {
            0
        } else {
            t.size() / n_expert as u64
        };
        let e = layers.entry(layer).or_insert((n_expert, 0));
        e.0 = e.0.max(n_expert);
        e.1 += per_expert;
    }
    let n_experts = layers.values().map(|v| v.0).max()?;
    let expert_bytes = layers.values().map(|v| v.1).max().unwrap_or(0);
    Some(MoeShape {
        moe_layers: layers.keys().copied().collect(),
        n_experts,
        expert_bytes,
    })
}

/// Bytes one decode step reads besides the routed experts: every tensor but the `ffn_*_exps`
/// and the token embedding (of which a step reads one row per token). With the routed experts'
/// bytes it gives the byte bound on batching (`nightshift-atlas report --model`).
pub fn dense_step_bytes(g: &Gguf) -> u64 {
    g.tensors()
        .filter(|t| {
            t.name != "token_embd.weight"
                && !t.name.ends_with("_exps.weight")
                && !t.name.ends_with("_exps.bias")
        })
        .map(|t| t.size())
        .sum()
}
