//! The FFN half of a block: dense SwiGLU (deepseek2's leading layers and shared expert) and the MoE
//! layer as llama.cpp's `build_moe_ffn` computes it: router logits (f32), softmax or sigmoid,
//! selection bias (`exp_probs_b`, selection only), optional group-limited top-k, top-k in
//! descending order, weights renormalised (sum clamped >= 6.1035e-5) and scaled. The routed experts
//! run behind the `ExpertBackend` seam on activations quantized once (`ActRows`): `moe_route`
//! routes and quantizes, the engine makes the expert call, and `moe_combine` weights each expert
//! row and sums in top-k order.

use crate::config::{Gating, ModelConfig};
use crate::error::ModelError;
use crate::expert::{act_type_for, ActRows, ExpertPair};
use crate::ops::{matmul, matmul_many, sigmoid, softmax, swiglu};
use crate::weights::{DenseFfn, MoeWeights};
use rayon::ThreadPool;

/// Dense SwiGLU FFN: down(silu(gate.h) * up.h) for n rows.
pub fn dense_ffn(
    d: &DenseFfn,
    h: &[f32],
    n: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ModelError> {
    let f = d.gate.ne[1];
    let mut g = vec![0.0f32; n * f];
    let mut u = vec![0.0f32; n * f];
    matmul_many(&[&d.gate, &d.up], h, n, &mut [&mut g, &mut u], pool)?;
    swiglu(&mut g, &u);
    matmul(&d.down, 0, &g, n, out, pool)
}

/// Top `k` indices of `v`, largest first (ties: lower index first).
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| {
        v[b].partial_cmp(&v[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

/// The router's probability of each expert for one token's router `logits` (the model's gating:
/// softmax or sigmoid), before any selection bias.
pub fn gate_probs(c: &ModelConfig, logits: &[f32]) -> Vec<f32> {
    let mut probs = logits.to_vec();
    match c.gating {
        Gating::Softmax => softmax(&mut probs, 1.0),
        Gating::Sigmoid => probs.iter_mut().for_each(|p| *p = sigmoid(*p)),
    }
    probs
}

/// Routing of one token: selected experts (top-k order) and their weights.
pub fn route(c: &ModelConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<usize>, Vec<f32>) {
    let probs = gate_probs(c, logits);
    let mut sel: Vec<f32> = match bias {
        Some(b) => probs.iter().zip(b).map(|(p, b)| p + b).collect(),
        None => probs.clone(),
    };
    if c.n_expert_groups > 1 {
        let per = c.n_expert / c.n_expert_groups;
        let scores: Vec<f32> = sel
            .chunks_exact(per)
            .map(|g| {
                let t = top_k(g, 2.min(per));
                let s: f64 = t.iter().map(|&i| g[i] as f64).sum();
                s as f32
            })
            .collect();
        let keep = top_k(&scores, c.n_group_used);
        for (gi, g) in sel.chunks_exact_mut(per).enumerate() {
            if !keep.contains(&gi) {
                g.fill(f32::NEG_INFINITY);
            }
        }
    }
    let chosen = top_k(&sel, c.n_expert_used);
    let mut w: Vec<f32> = chosen.iter().map(|&e| probs[e]).collect();
    if c.expert_weights_norm {
        let sum = w.iter().map(|&x| x as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        w.iter_mut().for_each(|x| *x /= sum);
    }
    let s = c.expert_weights_scale;
    if s != 0.0 && s != 1.0 {
        w.iter_mut().for_each(|x| *x *= s);
    }
    (chosen, w)
}

/// Told every MoE layer's routing: `pairs` row-major with `n_expert_used` experts per token row
/// (in top-k order) and `weights` the matching routing weights (ExpertAtlas records these).
pub trait RouteObserver: Send + Sync {
    fn observe(&self, layer: usize, pairs: &[ExpertPair], weights: &[f32]);
}

/// A MoE layer's routing of one batch: what goes to the experts and how their outputs combine.
pub struct Routed {
    /// (expert, row) pairs, row-major in top-k order.
    pub pairs: Vec<ExpertPair>,
    /// The routing weight of each pair.
    pub weights: Vec<f32>,
    /// The chosen experts of each row (top-k order).
    pub chosen: Vec<Vec<usize>>,
    /// The rows quantized once to the experts' activation type.
    pub acts: ActRows,
    /// Time of the router GEMM.
    pub router: std::time::Duration,
}

/// Routes n normalised rows `h` of layer `il`: router logits (f32), top-k, routing weights,
/// and the rows quantized once for the experts. Tells `observer` the decisions.
#[allow(clippy::too_many_arguments)]
pub fn moe_route(
    c: &ModelConfig,
    il: usize,
    mw: &MoeWeights,
    h: &[f32],
    n: usize,
    observer: Option<&dyn RouteObserver>,
    pool: Option<&ThreadPool>,
) -> Result<Routed, ModelError> {
    let e = c.n_embd;
    let ne = c.n_expert;
    let used = c.n_expert_used;
    let mut logits = vec![0.0f32; n * ne];
    let t_router = std::time::Instant::now();
    match &mw.gate_inp_packed {
        Some(packed) => packed.gemm(&h[..n * e], n, &mut logits, pool)?,
        None => matmul(&mw.gate_inp, 0, h, n, &mut logits, pool)?,
    }
    let router = t_router.elapsed();
    let mut pairs = Vec::with_capacity(n * used);
    let mut weights = Vec::with_capacity(n * used);
    let mut chosen_all = Vec::with_capacity(n);
    for t in 0..n {
        let (chosen, w) = route(c, &logits[t * ne..(t + 1) * ne], mw.exp_probs_b.as_deref());
        for &x in &chosen {
            pairs.push(ExpertPair {
                expert: x as u32,
                row: t as u32,
            });
        }
        weights.extend_from_slice(&w);
        chosen_all.push(chosen);
    }
    if let Some(o) = observer {
        o.observe(il, &pairs, &weights);
    }
    let acts = ActRows::quantize(act_type_for(mw.gate_exps.ty, mw.up_exps.ty), &h[..n * e], e)?;
    Ok(Routed {
        pairs,
        weights,
        chosen: chosen_all,
        acts,
        router,
    })
}

/// Sums the expert outputs `eo` (one row per pair of `r`) with their routing weights into
/// `out`, each row's experts in top-k order, as llama.cpp does.
pub fn moe_combine(c: &ModelConfig, r: &Routed, eo: &[f32], n: usize, out: &mut [f32]) {
    let e = c.n_embd;
    let used = c.n_expert_used;
    for t in 0..n {
        let o = &mut out[t * e..(t + 1) * e];
        for k in 0..used {
            let wk = r.weights[t * used + k];
            let row = &eo[(t * used + k) * e..(t * used + k + 1) * e];
            if k == 0 {
                for (a, &b) in o.iter_mut().zip(row) {
                    *a = b * wk;
                }
            } else {
                for (a, &b) in o.iter_mut().zip(row) {
                    *a += b * wk;
                }
            }
        }
    }
}
