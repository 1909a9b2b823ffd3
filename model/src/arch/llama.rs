//! llama (Llama 3.x): grouped-query attention without q/k norms, NORM rope divided by the
//! optional per-pair frequency factors (`rope_freqs.weight`, llama 3's long-context scaling),
//! kq scale `attention.scale` when set, a SwiGLU FFN in every layer (llama.cpp's `llama` graph).

use super::TokenizerFacts;
use super::{dense_params, gen_dense_ffn, gqa, ArchParams, ArchSpec, PushTensor};
use crate::config::Hparams;
use crate::error::ModelError;
use crate::gen::{Dims, KvValue};

/// The llama spec.
pub struct Llama;

impl ArchSpec for Llama {
    fn moe(&self) -> bool {
        false
    }
    fn rope_neox(&self) -> bool {
        false
    }
    fn rope_freq_factors(&self) -> bool {
        true
    }
    fn hparams(&self, h: &Hparams<'_>) -> Result<ArchParams, ModelError> {
        let s = h.opt_f32("attention.scale", 0.0)?;
        let kq_scale = if s != 0.0 {
            s
        } else {
            1.0 / (h.head_k as f32).sqrt()
        };
        dense_params(h, kq_scale)
    }
    fn gen_metadata(&self, d: &Dims, k: &dyn Fn(&str) -> String) -> Vec<(String, KvValue)> {
        vec![
            (k("rope.freq_base"), KvValue::F32(d.rope_base)),
            (k("attention.layer_norm_rms_epsilon"), KvValue::F32(1e-5)),
            (k("rope.dimension_count"), KvValue::U32(d.head_dim as u32)),
        ]
    }
    fn gen_layer(&self, d: &Dims, il: usize, push: &mut PushTensor<'_>) {
        gqa::gen_attn(d, il, false, push);
        gen_dense_ffn(d, il, push);
    }
    fn tokenizer(&self) -> TokenizerFacts {
        TokenizerFacts {
            specials: &[
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ],
            chat_template: concat!(
                "{%- for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'",
                " + message['content'] + '<|eot_id|>' }}{%- endfor %}",
                "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
            ),
            pre: "llama-bpe",
            bos: "<|begin_of_text|>",
            eos: "<|eot_id|>",
            pad: "<|end_of_text|>",
            add_bos: true,
        }
    }
}
