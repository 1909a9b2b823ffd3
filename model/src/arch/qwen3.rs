//! qwen3 (dense Qwen3 0.6B … 32B, the draft models of Qwen3-MoE targets): qwen3moe's attention
//! (per-head q/k RMSNorm, NEOX rope) and a SwiGLU FFN in every layer; same vocabulary as qwen3moe.

use super::qwen3moe::{qwen_metadata, qwen_tokenizer};
use super::TokenizerFacts;
use super::{dense_params, gen_dense_ffn, gqa, ArchParams, ArchSpec, PushTensor};
use crate::config::Hparams;
use crate::error::ModelError;
use crate::gen::{Dims, KvValue};

/// The qwen3 spec.
pub struct Qwen3;

impl ArchSpec for Qwen3 {
    fn moe(&self) -> bool {
        false
    }
    fn rope_neox(&self) -> bool {
        true
    }
    fn hparams(&self, h: &Hparams<'_>) -> Result<ArchParams, ModelError> {
        dense_params(h, 1.0 / (h.head_k as f32).sqrt())
    }
    fn qk_norm(&self) -> bool {
        true
    }
    fn gen_metadata(&self, d: &Dims, k: &dyn Fn(&str) -> String) -> Vec<(String, KvValue)> {
        qwen_metadata(d, k)
    }
    fn gen_layer(&self, d: &Dims, il: usize, push: &mut PushTensor<'_>) {
        gqa::gen_attn(d, il, true, push);
        gen_dense_ffn(d, il, push);
    }
    fn tokenizer(&self) -> TokenizerFacts {
        qwen_tokenizer()
    }
}
