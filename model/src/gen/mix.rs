//! Per-tensor type choice of llama.cpp's quantization mixes (`llama-quantize` ftypes Q2_K,
//! Q4_K_M, Q8_0, F16 and MXFP4_MOE), following `llama_tensor_get_type` in llama.cpp's src/llama-quant.cpp:
//! which tensors are quantized at all, the bumps for attn_v / ffn_down / attn_output / output,
//! the 8-expert special cases, and the fallback for rows that do not fit the block size.

use nightshift_kernels::GgmlType;

use super::QuantMix;

/// What the rules need to know about the model, plus llama.cpp's running attn_v counter.
#[derive(Clone, Debug)]
pub struct MixContext {
    pub n_layer: usize,
    pub n_expert: usize,
    /// n_head / n_head_kv
    pub n_gqa: usize,
    /// number of attn_v-like tensors in the model
    pub n_attention_wv: usize,
    /// attn_v-like tensors seen so far (llama.cpp's `i_attention_wv`)
    pub i_attention_wv: usize,
    /// `llama-quantize --leave-output-tensor`: keep output.weight as it is (F32 here)
    pub leave_output: bool,
    /// no output.weight: token_embd is the head and is quantized as the head
    pub tied: bool,
}

/// llama.cpp's `use_more_bits`: first and last eighth of the layers, and every third between.
pub fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Whether llama.cpp quantizes this tensor at all (2-D+ weights that are not norms or routers).
pub fn allows_quantization(name: &str, n_dims: usize, leave_output: bool) -> bool {
    n_dims >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !(leave_output && name == "output.weight")
        && !name.contains("ffn_gate_inp.weight")
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn base_type(mix: QuantMix) -> GgmlType {
    match mix {
        QuantMix::Q2K => GgmlType::Q2_K,
        QuantMix::Q4KM => GgmlType::Q4_K,
        QuantMix::Q8_0 | QuantMix::Mxfp4Moe => GgmlType::Q8_0,
        QuantMix::F16 => GgmlType::F16,
        // i-quant mixes have their own rules (`iq_mix`); Q4_K is their dense type
        QuantMix::UdIq1S | QuantMix::UdIq2Xxs | QuantMix::UdQ2KXl => GgmlType::Q4_K,
    }
}

fn is_quantized(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The type llama-quantize gives tensor `name` (ggml dims `dims`, source F32) under `mix`.
pub fn tensor_type(mix: QuantMix, name: &str, dims: &[u64], cx: &mut MixContext) -> GgmlType {
    // llama.cpp (`has_tied_embeddings`) quantizes a token embedding that is also the head as the
    // head; --leave-output-tensor names output.weight only, so it does not keep this one F32
    if cx.tied && name == "token_embd.weight" {
        let mut head = MixContext {
            leave_output: false,
            ..cx.clone()
        };
        return tensor_type(mix, "output.weight", dims, &mut head);
    }
    if let Some(ty) = super::iq_mix::tensor_type(mix, name, dims, cx.leave_output) {
        return ty;
    }
    if !allows_quantization(name, dims.len(), cx.leave_output) {
        return GgmlType::F32;
    }
    let mut ty = base_type(mix);
    if !is_quantized(ty) {
        return ty;
    }
    let ncols = dims.first().copied().unwrap_or(0);
    if mix == QuantMix::Mxfp4Moe {
        // 3-D (expert) tensors MXFP4, every other one Q8_0, the head included; no bumps
        let experts = dims.get(2).is_some_and(|&n| n > 1);
        let ty = if experts { GgmlType::MXFP4 } else { ty };
        return fallback(ty, ncols);
    }
    let n_expert8 = cx.n_expert == 8;
    if name == "output.weight" {
        if ncols % ty.block_len() as u64 != 0 {
            ty = GgmlType::Q8_0;
        } else if ty != GgmlType::Q8_0 {
            ty = GgmlType::Q6_K;
        }
    } else if name == "token_embd.weight" {
        // unchanged for these mixes
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        match mix {
            QuantMix::Q2K => {
                ty = if cx.n_gqa >= 4 {
                    GgmlType::Q4_K
                } else {
                    GgmlType::Q3_K
                }
            }
            QuantMix::Q4KM if use_more_bits(cx.i_attention_wv, cx.n_attention_wv) => {
                ty = GgmlType::Q6_K
            }
            _ => {}
        }
        if n_expert8 {
            ty = GgmlType::Q8_0;
        }
        cx.i_attention_wv += 1;
    } else if name.contains("attn_k.weight") {
        if n_expert8 {
            ty = GgmlType::Q8_0;
        }
    } else if name.contains("attn_q.weight") {
        // unchanged for these mixes
    } else if name.contains("attn_output.weight") {
        if n_expert8 {
            if matches!(mix, QuantMix::Q2K | QuantMix::Q4KM) {
                ty = GgmlType::Q5_K;
            }
        } else if mix == QuantMix::Q2K {
            ty = GgmlType::Q3_K;
        }
    } else if name.contains("ffn_up") || name.contains("ffn_gate") {
        // unchanged for these mixes
    } else if name.contains("ffn_down") {
        let i_layer = layer_of(name).unwrap_or(0);
        match mix {
            QuantMix::Q2K => ty = GgmlType::Q3_K,
            QuantMix::Q4KM if use_more_bits(i_layer, cx.n_layer) => ty = GgmlType::Q6_K,
            _ => {}
        }
    }
    fallback(ty, ncols)
}

/// llama.cpp's `tensor_type_fallback`: rows that are not a whole number of blocks.
// `%` rather than `is_multiple_of`: the workspace's rust-version is 1.85
#[allow(clippy::manual_is_multiple_of)]
pub fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    if ncols % ty.block_len() as u64 == 0 {
        return ty;
    }
    let alt = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if ncols % alt.block_len() as u64 != 0 {
        GgmlType::F16
    } else {
        alt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp() {
        let picks = |n: usize| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
        assert_eq!(picks(2), vec![1]);
        assert_eq!(picks(3), vec![2]);
        assert_eq!(picks(8), vec![0, 3, 6, 7]);
        assert_eq!(picks(48).len(), 6 + 6 + 12);
    }

    #[test]
    fn fallbacks() {
        let check = |ty, n, expect| assert_eq!(fallback(ty, n), expect, "{ty:?} {n}");
        check(GgmlType::Q4_K, 256, GgmlType::Q4_K);
        check(GgmlType::Q4_K, 128, GgmlType::Q5_0);
        check(GgmlType::Q2_K, 64, GgmlType::Q4_0);
        check(GgmlType::Q3_K, 64, GgmlType::Q4_0);
        check(GgmlType::Q6_K, 96, GgmlType::Q8_0);
        check(GgmlType::Q5_K, 32, GgmlType::Q5_1);
        check(GgmlType::Q4_K, 48, GgmlType::F16);
        check(GgmlType::Q8_0, 48, GgmlType::F16);
        check(GgmlType::MXFP4, 48, GgmlType::F16);
        check(GgmlType::MXFP4, 64, GgmlType::MXFP4);
    }

    #[test]
    fn mxfp4_moe_puts_experts_in_mxfp4_and_the_rest_in_q8_0() {
        let mut cx = MixContext {
            n_layer: 2,
            n_expert: 8,
            n_gqa: 2,
            n_attention_wv: 2,
            i_attention_wv: 0,
            leave_output: false,
            tied: false,
        };
        let mut t = |name: &str, dims: &[u64]| tensor_type(QuantMix::Mxfp4Moe, name, dims, &mut cx);
        assert_eq!(
            t("blk.1.ffn_down_exps.weight", &[256, 512, 8]),
            GgmlType::MXFP4
        );
        assert_eq!(
            t("blk.1.ffn_gate_exps.weight", &[512, 256, 8]),
            GgmlType::MXFP4
        );
        assert_eq!(
            t("blk.1.ffn_down_shexp.weight", &[256, 512]),
            GgmlType::Q8_0
        );
        assert_eq!(t("blk.0.attn_v.weight", &[512, 128]), GgmlType::Q8_0);
        assert_eq!(t("output.weight", &[512, 1000]), GgmlType::Q8_0);
        assert_eq!(t("token_embd.weight", &[512, 1000]), GgmlType::Q8_0);
        assert_eq!(t("blk.0.attn_norm.weight", &[512]), GgmlType::F32);
        assert_eq!(t("blk.1.ffn_gate_inp.weight", &[512, 8]), GgmlType::F32);
    }
}
