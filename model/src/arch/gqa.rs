//! Grouped-query attention of qwen3moe, qwen3 and llama: q/k/v projections, per-head RMSNorm of
//! q and k (the qwen3 archs), rope (NEOX for qwen3, NORM with frequency factors for llama), GQA
//! over the cache with the config's kq scale, output projection (llama.cpp's `qwen3moe`, `qwen3`
//! and `llama` graphs). With a quantized cache, q, k, v and the attention output are rotated as
//! llama.cpp rotates them (`KvType::rotation`).

use super::{attend_all, PushTensor, StepCtx};
use crate::attention::{hadamard_chunks, Heads};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::gen::{Dims, Init};
use crate::gguf::Gguf;
use crate::kv::KvCache;
use crate::ops::{matmul, matmul_many, rms_norm_inplace};
use crate::weights::{load_vec, load_w, no_bias, AttnWeights};

/// Layer `il`'s q/k/v/output projections (and the per-head q/k RMSNorm weights when `qk_norm`).
/// Biases (qwen2-style q/k/v, some llama fine-tunes) are not computed here: such a file is
/// refused rather than run without them.
pub fn weights(
    g: &Gguf,
    c: &ModelConfig,
    il: usize,
    qk_norm: bool,
) -> Result<AttnWeights, ModelError> {
    let p = |s: &str| format!("blk.{il}.{s}");
    let (e, hd) = (c.n_embd, c.head_k);
    for b in ["attn_q", "attn_k", "attn_v", "attn_output"] {
        no_bias(g, &p(&format!("{b}.bias")))?;
    }
    let norm = |s: &str| -> Result<Option<Vec<f32>>, ModelError> {
        if qk_norm {
            load_vec(g, &p(s), hd).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(AttnWeights::Gqa {
        q: load_w(g, &p("attn_q.weight"), &[e, c.n_head * hd])?,
        k: load_w(g, &p("attn_k.weight"), &[e, c.n_head_kv * hd])?,
        v: load_w(g, &p("attn_v.weight"), &[e, c.n_head_kv * hd])?,
        o: load_w(g, &p("attn_output.weight"), &[c.n_head * hd, e])?,
        q_norm: norm("attn_q_norm.weight")?,
        k_norm: norm("attn_k_norm.weight")?,
    })
}

/// `gen-model`: layer `il`'s attention tensors and `ffn_norm`, in the converter's order.
pub fn gen_attn(d: &Dims, il: usize, qk_norm: bool, push: &mut PushTensor<'_>) {
    let p = |s: &str| format!("blk.{il}.{s}");
    let (e, h, kv, hd, m) = (d.embd, d.heads, d.heads_kv, d.head_dim, Init::Matrix(1.0));
    push(p("attn_q.weight"), vec![e, h * hd], m);
    push(p("attn_k.weight"), vec![e, kv * hd], m);
    push(p("attn_v.weight"), vec![e, kv * hd], m);
    if qk_norm {
        push(p("attn_q_norm.weight"), vec![hd], Init::Norm);
        push(p("attn_k_norm.weight"), vec![hd], Init::Norm);
    }
    push(p("attn_output.weight"), vec![h * hd, e], m);
    push(p("ffn_norm.weight"), vec![e], Init::Norm);
}

/// Attention block of layer `il` on normalised rows `h` (n x n_embd) into `out` (n x n_embd).
pub fn attention(
    ctx: &StepCtx<'_>,
    kv: &mut KvCache,
    il: usize,
    h: &[f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let c = ctx.model.config();
    let AttnWeights::Gqa {
        q,
        k,
        v,
        o,
        q_norm,
        k_norm,
    } = &ctx.model.weights().layers[il].attn
    else {
        return Err(ModelError::Tensor {
            name: format!("blk.{il}"),
            msg: "expected gqa attention weights".into(),
        });
    };
    let n = ctx.toks.len();
    let hd = c.head_k;
    let (qw, kw) = (c.n_head * hd, c.n_head_kv * hd);
    let pool = Some(ctx.pool);
    let mut qr = vec![0.0f32; n * qw];
    let mut kr = vec![0.0f32; n * kw];
    let mut vr = vec![0.0f32; n * kw];
    matmul_many(&[q, k, v], h, n, &mut [&mut qr, &mut kr, &mut vr], pool)?;
    if let Some(w) = q_norm {
        rms_norm_inplace(&mut qr, w, c.rms_eps);
    }
    if let Some(w) = k_norm {
        rms_norm_inplace(&mut kr, w, c.rms_eps);
    }
    for (t, rc) in ctx.ropes.iter().enumerate().take(n) {
        for head in qr[t * qw..(t + 1) * qw].chunks_exact_mut(hd) {
            ctx.rope.apply(rc, head);
        }
        for head in kr[t * kw..(t + 1) * kw].chunks_exact_mut(hd) {
            ctx.rope.apply(rc, head);
        }
    }
    // a quantized cache holds rotated rows, as llama.cpp's does (`attn::rotate`)
    let (rot_k, rot_v) = kv.kv_type().rotation(c);
    if rot_k > 0 {
        hadamard_chunks(&mut qr, rot_k);
        hadamard_chunks(&mut kr, rot_k);
    }
    if rot_v > 0 {
        hadamard_chunks(&mut vr, rot_v);
    }
    for (t, tok) in ctx.toks.iter().enumerate() {
        let (k, v) = (&kr[t * kw..(t + 1) * kw], &vr[t * kw..(t + 1) * kw]);
        kv.write(tok.slot, tok.pos, il, k, Some(v));
    }
    let heads = Heads {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        dk: hd,
        dv: hd,
        scale: c.kq_scale,
    };
    let mut att = vec![0.0f32; n * qw];
    attend_all(ctx, kv, il, &qr, heads, false, &mut att);
    if rot_v > 0 {
        hadamard_chunks(&mut att, rot_v);
    }
    matmul(o, 0, &att, n, out, pool)
}
