//! Grouped-query attention of qwen3moe, qwen3 and llama: q/k/v projections, per-head RMSNorm of
//! q and k (the qwen3 archs), rope (NEOX for qwen3, NORM with frequency factors for llama), GQA
//! over the cache with the config's kq scale, output projection (llama.cpp's `qwen3moe`, `qwen3`
//! and `llama` graphs).

use super::{attend_all, StepCtx};
use crate::attention::Heads;
use crate::error::ModelError;
use crate::kv::KvCache;
use crate::ops::{matmul, matmul_many, rms_norm_inplace};
use crate::weights::AttnWeights;

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
    for (t, tok) in ctx.toks.iter().enumerate() {
        let rc = &ctx.ropes[t];
        for head in qr[t * qw..(t + 1) * qw].chunks_exact_mut(hd) {
            ctx.rope.apply(rc, head);
        }
        for head in kr[t * kw..(t + 1) * kw].chunks_exact_mut(hd) {
            ctx.rope.apply(rc, head);
        }
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
    matmul(o, 0, &att, n, out, pool)
}
