//! Mixes shaped like Unsloth's dynamic GGUFs (`UD-IQ1_S`, `UD-IQ2_XXS`, `UD-Q2_K_XL` of
//! DeepSeek-V3 / Kimi K2), and the writer of their i-quant tensors.
//!
//! The recipe (per tensor name, not llama-quantize's rules): routed experts' gate/up in the
//! mix's type (IQ1_S, IQ2_XXS or Q2_K) and their `ffn_down` one step higher (IQ2_XXS, IQ3_XXS or
//! Q3_K),
//! attention Q4_K with `attn_output` Q5_K and the value paths (`attn_v`, `attn_kv_b`, `attn_v_b`)
//! Q6_K, dense FFNs Q4_K with `ffn_down` Q6_K, shared experts and the output head Q6_K,
//! `token_embd` Q4_K, routers and norms F32. Rows that are not whole 256-element blocks fall back
//! as llama.cpp does (i-quants to IQ4_NL, K-quants as in `mix::fallback`).
//!
//! NightShift has no i-quant quantizer (ggml's are importance-matrix searches), so i-quant
//! tensors are **random valid blocks**, not quantized floats: every index, sign and scale byte
//! drawn from the row's random stream, then each block's f16 scale set so that the block's
//! dequantized RMS equals the RMS of the Gaussian values the other types quantize. A model
//! written this way has the statistics of a random-weight model and exercises every grid entry.

use nightshift_kernels::formats::f32_to_f16;
use nightshift_kernels::formats::set_iq_scale;
use nightshift_kernels::{dequantize_row, GgmlType};

use super::mix::fallback;
use super::rng::SplitMix64;
use super::QuantMix;

/// The expert types of an i-quant mix: (gate/up, down); `None` for the llama.cpp mixes.
pub fn expert_types(mix: QuantMix) -> Option<(GgmlType, GgmlType)> {
    match mix {
        QuantMix::UdIq1S => Some((GgmlType::IQ1_S, GgmlType::IQ2_XXS)),
        QuantMix::UdIq2Xxs => Some((GgmlType::IQ2_XXS, GgmlType::IQ3_XXS)),
        QuantMix::UdQ2KXl => Some((GgmlType::Q2_K, GgmlType::Q3_K)),
        _ => None,
    }
}

/// The type of tensor `name` (ggml dims `dims`) under an i-quant mix, or `None` when `mix` is
/// not one (the caller then follows llama.cpp's rules).
pub fn tensor_type(
    mix: QuantMix,
    name: &str,
    dims: &[u64],
    leave_output: bool,
) -> Option<GgmlType> {
    let (experts, down) = expert_types(mix)?;
    if !super::mix::allows_quantization(name, dims.len(), leave_output) {
        return Some(GgmlType::F32);
    }
    let ty = if name.contains("_exps.weight") {
        if name.contains("ffn_down") {
            down
        } else {
            experts
        }
    } else if name == "output.weight"
        || name.contains("_shexp.weight")
        || name.contains("attn_v.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v_b.weight")
    {
        GgmlType::Q6_K
    } else if name.contains("attn_output.weight") {
        GgmlType::Q5_K
    } else if name.contains("ffn_down") {
        GgmlType::Q6_K
    } else {
        GgmlType::Q4_K
    };
    let ncols = dims.first().copied().unwrap_or(0);
    Some(
        if ty.is_iq() && !ncols.is_multiple_of(ty.block_len() as u64) {
            fallback(GgmlType::IQ4_NL, ncols)
        } else {
            fallback(ty, ncols)
        },
    )
}

/// Writes one row of random valid `ty` blocks into `dst`, each block's scale chosen so that
/// its dequantized RMS is the RMS of the matching `vals` (all-zero values give a zero scale).
pub fn random_row(
    ty: GgmlType,
    vals: &[f32],
    rng: &mut SplitMix64,
    dst: &mut [u8],
) -> Result<(), nightshift_kernels::KernelError> {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    let mut deq = vec![0f32; bl];
    for (v, blk) in vals.chunks_exact(bl).zip(dst.chunks_exact_mut(bb)) {
        for c in blk.chunks_mut(8) {
            let r = rng.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
        set_iq_scale(ty, blk, f32_to_f16(1.0))?;
        dequantize_row(ty, blk, &mut deq)?;
        let rms = |x: &[f32]| (x.iter().map(|a| a * a).sum::<f32>() / x.len() as f32).sqrt();
        let unit = rms(&deq);
        let d = if unit > 0.0 { rms(v) / unit } else { 0.0 };
        set_iq_scale(ty, blk, f32_to_f16(d))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ud_mixes_put_experts_in_i_quants_and_keep_routers_f32() {
        let t = |mix, name: &str, dims: &[u64]| tensor_type(mix, name, dims, false);
        let exps = [1024u64, 512, 8];
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.3.ffn_gate_exps.weight", &exps),
            Some(GgmlType::IQ1_S)
        );
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.3.ffn_down_exps.weight", &exps),
            Some(GgmlType::IQ2_XXS)
        );
        assert_eq!(
            t(QuantMix::UdIq2Xxs, "blk.3.ffn_up_exps.weight", &exps),
            Some(GgmlType::IQ2_XXS)
        );
        assert_eq!(
            t(QuantMix::UdIq2Xxs, "blk.3.ffn_down_exps.weight", &exps),
            Some(GgmlType::IQ3_XXS)
        );
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.3.ffn_gate_inp.weight", &[1024, 8]),
            Some(GgmlType::F32)
        );
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.3.attn_norm.weight", &[1024]),
            Some(GgmlType::F32)
        );
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.3.ffn_up_shexp.weight", &[1024, 512]),
            Some(GgmlType::Q6_K)
        );
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.0.attn_q_a.weight", &[1024, 512]),
            Some(GgmlType::Q4_K)
        );
        // rows of 96: no 256-element block, IQ4_NL (32) instead
        assert_eq!(
            t(QuantMix::UdIq1S, "blk.3.ffn_down_exps.weight", &[96, 64, 8]),
            Some(GgmlType::IQ4_NL)
        );
        assert_eq!(t(QuantMix::Q4KM, "blk.3.ffn_down_exps.weight", &exps), None);
    }

    #[test]
    fn random_blocks_have_the_values_rms() {
        for ty in [
            GgmlType::IQ1_S,
            GgmlType::IQ2_XXS,
            GgmlType::IQ3_XXS,
            GgmlType::IQ4_NL,
            GgmlType::IQ1_M,
        ] {
            let k = 512;
            let mut rng = SplitMix64::new(3);
            let vals: Vec<f32> = (0..k).map(|_| 0.02 * rng.gaussian()).collect();
            let mut row = vec![0u8; ty.row_bytes(k).expect("k fits")];
            random_row(ty, &vals, &mut rng, &mut row).expect("valid type");
            let mut deq = vec![0f32; k];
            dequantize_row(ty, &row, &mut deq).expect("valid row");
            let rms = |x: &[f32]| (x.iter().map(|a| a * a).sum::<f32>() / x.len() as f32).sqrt();
            let (got, want) = (rms(&deq), rms(&vals));
            assert!((got / want - 1.0).abs() < 0.05, "{ty}: rms {got} vs {want}");
        }
    }
}
