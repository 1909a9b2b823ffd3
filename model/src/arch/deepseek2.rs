//! deepseek2 (DeepSeek-V3 / Kimi K2) attention: multi-head latent attention in llama.cpp's
//! absorbed form. q = q_b(norm(q_a(x))); the latent kv = norm(kv_a(x)[..kv_lora]) and k_pe =
//! rope(kv_a(x)[kv_lora..]) form one 576-wide (kv_lora + rope) cached row shared by all heads;
//! each head's q_nope is mapped into latent space by `attn_k_b`, attention runs over the latent
//! cache (V = the latent part), and `attn_v_b` decompresses each head's result before `attn_output`.
//! Rope is NORM (interleaved) with YaRN on the rope part only; the kq scale carries mscale^2.

use super::{attend_all, gen_dense_ffn, moe_counts, ArchParams, ArchSpec, MoeParams, PushTensor};
use super::{StepCtx, TokenizerFacts};
use crate::attention::Heads;
use crate::config::{Gating, Hparams, MlaConfig, ModelConfig};
use crate::error::ModelError;
use crate::gen::{Dims, Init, KvValue};
use crate::gguf::Gguf;
use crate::kv::KvCache;
use crate::ops::{matmul, matmul_many, matmul_q, quantize_rows, rms_norm_inplace};
use crate::weights::{load_vec, load_w, tensor_err, AttnWeights};
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

/// The deepseek2 spec.
pub struct Deepseek2;

impl ArchSpec for Deepseek2 {
    fn moe(&self) -> bool {
        true
    }
    fn mla(&self) -> bool {
        true
    }
    fn rope_neox(&self) -> bool {
        false
    }
    fn yarn_mscale_all_dims(&self) -> bool {
        true
    }
    fn hparams(&self, h: &Hparams<'_>) -> Result<ArchParams, ModelError> {
        let (n_expert, n_expert_used, n_ff_exp) = moe_counts(h)?;
        let n_rot = h.n_rot;
        let q_lora_rank = h.opt_u32("attention.q_lora_rank", 0)?;
        let kv_lora_rank = h.req_u32("attention.kv_lora_rank")?;
        let head_k_mla = h.req_u32("attention.key_length_mla")?;
        let v_head = h.req_u32("attention.value_length_mla")?;
        let head_v = h.opt_u32("attention.value_length", h.head_k)?;
        if head_k_mla <= n_rot
            || v_head == 0
            || kv_lora_rank == 0
            || h.head_k != kv_lora_rank + n_rot
            || head_v != kv_lora_rank
        {
            return Err(h.bad(
                "attention.key_length_mla",
                format!(
                    "expected key_length_mla > rope dims and key/value length = kv_lora+rope/kv_lora (absorbed MLA), found {head_k_mla}, {}, {head_v}",
                    h.head_k
                ),
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
        let (fs, yl) = (h.freq_scale, h.yarn_log_mul);
        let attn_factor_org = h.attn_factor * (1.0 + 0.1 * (1.0 / fs).ln());
        let mscale = attn_factor_org * (1.0 + 0.1 * yl * (1.0 / fs).ln());
        let kq_scale = 1.0 * mscale * mscale / (head_k_mla as f32).sqrt();
        let gating = match h.opt_u32("expert_gating_func", 1)? {
            0 | 1 => Gating::Softmax,
            2 => Gating::Sigmoid,
            other => {
                return Err(h.bad(
                    "expert_gating_func",
                    format!("expected 1 (softmax) or 2 (sigmoid), found {other}"),
                ))
            }
        };
        let groups = h.opt_u32("expert_group_count", 1)?.max(1);
        let used = h.opt_u32("expert_group_used_count", 1)?.max(1);
        check_groups(n_expert, groups, used).map_err(|m| h.bad("expert_group_count", m))?;
        Ok(ArchParams {
            kq_scale,
            mla: Some(mla),
            n_dense_lead: h.opt_u32("leading_dense_block_count", 0)?,
            moe: Some(MoeParams {
                n_expert,
                n_expert_used,
                n_ff_exp,
                n_expert_shared: h.opt_u32("expert_shared_count", 0)?,
                weights_norm: h.opt_bool("expert_weights_norm", false)?,
                weights_scale: h.opt_f32("expert_weights_scale", 0.0)?,
                gating,
                n_groups: groups,
                n_group_used: used,
            }),
        })
    }
    fn attn_weights(
        &self,
        g: &Gguf,
        c: &ModelConfig,
        il: usize,
    ) -> Result<AttnWeights, ModelError> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let e = c.n_embd;
        let m = c
            .mla
            .as_ref()
            .ok_or_else(|| tensor_err("mla", "expected mla config".into()))?;
        let qk = m.qk_nope + m.qk_rope;
        let (q_a, q_b) = if m.q_lora_rank > 0 {
            (
                Some((
                    load_w(g, &p("attn_q_a.weight"), &[e, m.q_lora_rank])?,
                    load_vec(g, &p("attn_q_a_norm.weight"), m.q_lora_rank)?,
                )),
                load_w(g, &p("attn_q_b.weight"), &[m.q_lora_rank, c.n_head * qk])?,
            )
        } else {
            (None, load_w(g, &p("attn_q.weight"), &[e, c.n_head * qk])?)
        };
        Ok(AttnWeights::Mla {
            q_a,
            q_b,
            kv_a_mqa: load_w(
                g,
                &p("attn_kv_a_mqa.weight"),
                &[e, m.kv_lora_rank + m.qk_rope],
            )?,
            kv_a_norm: load_vec(g, &p("attn_kv_a_norm.weight"), m.kv_lora_rank)?,
            k_b: load_w(
                g,
                &p("attn_k_b.weight"),
                &[m.qk_nope, m.kv_lora_rank, c.n_head],
            )?,
            v_b: load_w(
                g,
                &p("attn_v_b.weight"),
                &[m.kv_lora_rank, m.v_head, c.n_head],
            )?,
            o: load_w(g, &p("attn_output.weight"), &[c.n_head * m.v_head, e])?,
        })
    }
    fn attention(
        &self,
        ctx: &StepCtx<'_>,
        kv: &mut KvCache,
        il: usize,
        h: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        attention(ctx, kv, il, h, out)
    }
    fn gen_metadata(&self, d: &Dims, k: &dyn Fn(&str) -> String) -> Vec<(String, KvValue)> {
        let u = |v: u64| KvValue::U32(v as u32);
        let mut kv = vec![
            (k("attention.key_length"), u(d.kv_lora + d.rope)),
            (k("attention.value_length"), u(d.kv_lora)),
            (k("attention.key_length_mla"), u(d.nope + d.rope)),
            (k("attention.value_length_mla"), u(d.v_head)),
            (k("rope.dimension_count"), u(d.rope)),
            (k("rope.freq_base"), KvValue::F32(d.rope_base)),
            (k("rope.scaling.type"), KvValue::Str("yarn".into())),
            (k("rope.scaling.factor"), KvValue::F32(d.yarn_factor)),
            (
                k("rope.scaling.original_context_length"),
                KvValue::U32(d.yarn_orig_ctx),
            ),
            (
                k("rope.scaling.yarn_log_multiplier"),
                KvValue::F32(d.yarn_log_mul),
            ),
            (k("attention.layer_norm_rms_epsilon"), KvValue::F32(1e-6)),
            (k("attention.q_lora_rank"), u(d.q_lora)),
            (k("attention.kv_lora_rank"), u(d.kv_lora)),
            (k("leading_dense_block_count"), u(d.n_dense_lead as u64)),
            (k("expert_count"), u(d.n_expert as u64)),
            (k("expert_used_count"), u(d.n_used as u64)),
            (k("expert_shared_count"), u(d.n_shared as u64)),
            (k("expert_feed_forward_length"), u(d.expert_ff)),
            (k("expert_weights_scale"), KvValue::F32(d.weights_scale)),
            (k("expert_weights_norm"), KvValue::Bool(true)),
            (k("expert_gating_func"), KvValue::U32(2)), // sigmoid
        ];
        if let Some((g, gu)) = d.groups {
            kv.push((k("expert_group_count"), KvValue::U32(g)));
            kv.push((k("expert_group_used_count"), KvValue::U32(gu)));
        }
        kv
    }
    fn gen_layer(&self, d: &Dims, il: usize, push: &mut PushTensor<'_>) {
        let p = |s: &str| format!("blk.{il}.{s}");
        let (e, h, m) = (d.embd, d.heads, Init::Matrix(1.0));
        push(p("attn_q_a.weight"), vec![e, d.q_lora], m);
        push(p("attn_q_a_norm.weight"), vec![d.q_lora], Init::Norm);
        push(
            p("attn_q_b.weight"),
            vec![d.q_lora, h * (d.nope + d.rope)],
            m,
        );
        push(p("attn_kv_a_mqa.weight"), vec![e, d.kv_lora + d.rope], m);
        push(p("attn_kv_a_norm.weight"), vec![d.kv_lora], Init::Norm);
        push(p("attn_k_b.weight"), vec![d.nope, d.kv_lora, h], m);
        push(p("attn_v_b.weight"), vec![d.kv_lora, d.v_head, h], m);
        push(p("attn_output.weight"), vec![h * d.v_head, e], m);
        push(p("ffn_norm.weight"), vec![e], Init::Norm);
        if il < d.n_dense_lead {
            gen_dense_ffn(d, il, push);
            return;
        }
        let (x, f) = (d.n_expert as u64, d.expert_ff);
        push(
            p("ffn_gate_inp.weight"),
            vec![e, x],
            Init::Matrix(crate::gen::layout::ROUTER_GAIN),
        );
        push(p("exp_probs_b.bias"), vec![x], Init::Gaussian(0.1));
        push(p("ffn_gate_exps.weight"), vec![e, f, x], m);
        push(p("ffn_up_exps.weight"), vec![e, f, x], m);
        push(p("ffn_down_exps.weight"), vec![f, e, x], m);
        let fs = f * d.n_shared as u64;
        push(p("ffn_gate_shexp.weight"), vec![e, fs], m);
        push(p("ffn_up_shexp.weight"), vec![e, fs], m);
        push(p("ffn_down_shexp.weight"), vec![fs, e], m);
    }
    fn tokenizer(&self) -> TokenizerFacts {
        TokenizerFacts {
            specials: &[
                "[BOS]",
                "[EOS]",
                "<|im_end|>",
                "<|im_user|>",
                "<|im_assistant|>",
                "<|im_system|>",
                "<|im_middle|>",
            ],
            chat_template: concat!(
                "{%- for message in messages -%}{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>",
                "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>{%- else -%}",
                "<|im_assistant|>assistant<|im_middle|>{%- endif -%}{{ message['content'] }}<|im_end|>{%- endfor -%}",
                "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
            ),
            pre: "kimi-k2",
            bos: "[BOS]",
            eos: "<|im_end|>",
            pad: "[EOS]",
            add_bos: true,
        }
    }
}

/// llama.cpp's loader checks of expert groups (it aborts on anything else): with more than one
/// group, fewer groups than experts, dividing them, and fewer used than groups.
fn check_groups(n_expert: usize, groups: usize, used: usize) -> Result<(), String> {
    if groups > 1 && (!n_expert.is_multiple_of(groups) || groups >= n_expert || used >= groups) {
        return Err(format!(
            "expected fewer groups than the {n_expert} experts, dividing them, and fewer used \
             than groups, found {groups} groups, {used} used"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod group_tests {
    use super::check_groups;

    #[test]
    fn expert_groups_follow_llama_cpps_checks() {
        assert!(check_groups(256, 8, 4).is_ok());
        assert!(check_groups(16, 1, 1).is_ok());
        assert!(check_groups(8, 8, 4).is_err(), "as many groups as experts");
        assert!(
            check_groups(12, 8, 4).is_err(),
            "groups not dividing the experts"
        );
        assert!(check_groups(256, 8, 8).is_err(), "every group used");
    }
}
