//! deepseek2 (DeepSeek-V3 / Kimi K2) attention: multi-head latent attention in llama.cpp's
//! absorbed form. q = q_b(norm(q_a(x))); the latent kv = norm(kv_a(x)[..kv_lora]) and k_pe =
//! rope(kv_a(x)[kv_lora..]) form one 576-wide (kv_lora + rope) cached row shared by all heads;
//! each head's q_nope is mapped into latent space by `attn_k_b`, attention runs over the latent
//! cache (V = the latent part), and `attn_v_b` decompresses each head's result before `attn_output`.
//! Rope is NORM (interleaved) with YaRN on the rope part only; the kq scale carries mscale^2.

use super::{attend_all, StepCtx};
use crate::attention::Heads;
use crate::error::ModelError;
use crate::kv::KvCache;
use crate::ops::{matmul, matmul_many, matmul_q, quantize_rows, rms_norm_inplace};
use crate::weights::AttnWeights;
use rayon::prelude::*;

/// Attention block of layer `il` on normalised rows `h` (n x n_embd) into `out` (n x n_embd).
pub fn attention(
    ctx: &StepCtx<'_>,
    cache: &mut KvCache,
    il: usize,
    h: &[f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let c = ctx.model.config();
    let AttnWeights::Mla {
        q_a,
        q_b,
        kv_a_mqa,
        kv_a_norm,
        k_b,
        v_b,
        o,
    } = &ctx.model.weights().layers[il].attn
    else {
        return Err(ModelError::Tensor {
            name: format!("blk.{il}"),
            msg: "expected mla attention weights".into(),
        });
    };
    let m = c.mla.as_ref().ok_or_else(|| ModelError::Config {
        key: "mla".into(),
        msg: "expected mla dims".into(),
    })?;
    let n = ctx.toks.len();
    let nh = c.n_head;
    let (nope, rope, lora, vh) = (m.qk_nope, m.qk_rope, m.kv_lora_rank, m.v_head);
    let qk = nope + rope;
    let kvw = lora + rope;
    let pool = Some(ctx.pool);

    // q projections and the latent kv + k_pe, the projections of `h` in one parallel region.
    let mut q = vec![0.0f32; n * nh * qk];
    let mut kv = vec![0.0f32; n * kvw];
    if let Some((qa_w, qa_norm)) = q_a {
        let mut qa = vec![0.0f32; n * m.q_lora_rank];
        matmul_many(&[qa_w, kv_a_mqa], h, n, &mut [&mut qa, &mut kv], pool)?;
        rms_norm_inplace(&mut qa, qa_norm, c.rms_eps);
        matmul(q_b, 0, &qa, n, &mut q, pool)?;
    } else {
        matmul_many(&[q_b, kv_a_mqa], h, n, &mut [&mut q, &mut kv], pool)?;
    }
    for (t, tok) in ctx.toks.iter().enumerate() {
        let rc = &ctx.ropes[t];
        let row = &mut kv[t * kvw..(t + 1) * kvw];
        ctx.rope.apply(rc, &mut row[lora..]);
        rms_norm_inplace(&mut row[..lora], kv_a_norm, c.rms_eps);
        for head in q[t * nh * qk..(t + 1) * nh * qk].chunks_exact_mut(qk) {
            ctx.rope.apply(rc, &mut head[nope..]);
        }
        cache.write(tok.slot, tok.pos, il, row, None);
    }
    // Absorb attn_k_b: per head, q_nope (nope) -> latent (lora); full query = [latent, q_pe].
    // Heads run in parallel, each gemm on one thread (many small matrices).
    let absorbed: Vec<Result<Vec<f32>, ModelError>> = ctx.pool.install(|| {
        (0..nh)
            .into_par_iter()
            .map(|hh| {
                let mut qn = vec![0.0f32; n * nope];
                for t in 0..n {
                    let src = &q[(t * nh + hh) * qk..(t * nh + hh) * qk + nope];
                    qn[t * nope..(t + 1) * nope].copy_from_slice(src);
                }
                let xq = quantize_rows(k_b.ty.vec_dot_type(), &qn, nope)?;
                let mut qa = vec![0.0f32; n * lora];
                matmul_q(k_b, hh, &xq, n, &mut qa, None)?;
                Ok(qa)
            })
            .collect()
    });
    let mut qfull = vec![0.0f32; n * nh * kvw];
    for (hh, qa) in absorbed.into_iter().enumerate() {
        let qa = qa?;
        for t in 0..n {
            let dst = &mut qfull[(t * nh + hh) * kvw..(t * nh + hh + 1) * kvw];
            dst[..lora].copy_from_slice(&qa[t * lora..(t + 1) * lora]);
            dst[lora..].copy_from_slice(&q[(t * nh + hh) * qk + nope..(t * nh + hh + 1) * qk]);
        }
    }
    let heads = Heads {
        n_head: nh,
        n_head_kv: 1,
        dk: kvw,
        dv: lora,
        scale: c.kq_scale,
    };
    let mut lat = vec![0.0f32; n * nh * lora];
    attend_all(ctx, cache, il, &qfull, heads, true, &mut lat);
    // Decompress with attn_v_b per head (heads in parallel), then the output projection.
    let decomp: Vec<Result<Vec<f32>, ModelError>> = ctx.pool.install(|| {
        (0..nh)
            .into_par_iter()
            .map(|hh| {
                let mut lh = vec![0.0f32; n * lora];
                for t in 0..n {
                    lh[t * lora..(t + 1) * lora]
                        .copy_from_slice(&lat[(t * nh + hh) * lora..(t * nh + hh + 1) * lora]);
                }
                let mut vo = vec![0.0f32; n * vh];
                matmul(v_b, hh, &lh, n, &mut vo, None)?;
                Ok(vo)
            })
            .collect()
    });
    let mut vcat = vec![0.0f32; n * nh * vh];
    for (hh, vo) in decomp.into_iter().enumerate() {
        let vo = vo?;
        for t in 0..n {
            vcat[(t * nh + hh) * vh..(t * nh + hh + 1) * vh]
                .copy_from_slice(&vo[t * vh..(t + 1) * vh]);
        }
    }
    matmul(o, 0, &vcat, n, out, pool)
}
