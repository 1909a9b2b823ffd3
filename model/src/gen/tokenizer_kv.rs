//! The tokenizer metadata of generated models: the trained byte-level BPE, each architecture's
//! special tokens (CONTROL), optional `[PAD<n>]` filler tokens (UNUSED) up to the asked vocab
//! size, BOS/EOS/PAD ids, add_bos and the chat template — the keys llama.cpp's vocab loader reads.
//! A model given another chat template (`gen-model --chat-template`) also gets the markers that
//! template writes as tokens, typed as the real models have them: `<|...|>` and `<｜...｜>`
//! CONTROL, `<tool_call>`-style tags USER_DEFINED.

use super::bpe::{train_bpe, CORPUS, DEFAULT_MERGES};
use super::writer::KvValue;
use super::{Arch, GenError};

/// llama.cpp token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// Tags Qwen3 templates write that are USER_DEFINED tokens in the real vocabulary.
const TAGS: [&str; 6] = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

/// The markers `template` writes: `<|name|>`, `<｜name｜>` (CONTROL) and the [`TAGS`]
/// (USER_DEFINED), in order of first appearance.
pub fn template_markers(template: &str) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = Vec::new();
    let mut add = |m: &str, ty: i32| {
        if !out.iter().any(|(x, _)| x == m) {
            out.push((m.to_string(), ty));
        }
    };
    for (i, _) in template.char_indices() {
        let rest = &template[i..];
        for (open, close) in [("<|", "|>"), ("<｜", "｜>")] {
            if let Some(body) = rest.strip_prefix(open) {
                if let Some(end) = body.find(close) {
                    let name = &body[..end];
                    let plain = !name.is_empty()
                        && name.chars().count() <= 40
                        && name
                            .chars()
                            .all(|c| !c.is_whitespace() && !"<>|｜'\"{}".contains(c));
                    if plain {
                        add(&rest[..open.len() + end + close.len()], CONTROL);
                    }
                }
            }
        }
        for t in TAGS {
            if rest.starts_with(t) {
                add(t, USER_DEFINED);
            }
        }
    }
    out
}
const UNUSED: i32 = 5;

/// Special tokens appended after the BPE vocabulary.
pub fn specials(arch: Arch) -> &'static [&'static str] {
    match arch {
        // dense qwen3 shares qwen3moe's vocabulary (a draft model must)
        Arch::Qwen3Moe | Arch::Qwen3 => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        Arch::Llama => &[
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        Arch::Deepseek2 => &[
            "[BOS]",
            "[EOS]",
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
        ],
    }
}

/// The chat template stored in `tokenizer.chat_template` (ChatML for Qwen3, Kimi K2's format,
/// Llama 3's header format; the BOS comes from `add_bos`, not the template).
pub fn chat_template(arch: Arch) -> &'static str {
    match arch {
        Arch::Llama => concat!(
            "{%- for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'",
            " + message['content'] + '<|eot_id|>' }}{%- endfor %}",
            "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
        ),
        Arch::Qwen3Moe | Arch::Qwen3 => concat!(
            "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']",
            " + '<|im_end|>' + '\\n' }}{%- endfor %}",
            "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
        ),
        Arch::Deepseek2 => concat!(
            "{%- for message in messages -%}{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>",
            "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>{%- else -%}",
            "<|im_assistant|>assistant<|im_middle|>{%- endif -%}{{ message['content'] }}<|im_end|>{%- endfor -%}",
            "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
        ),
    }
}

/// The tokenizer keys (in make_models.py's order), the vocabulary size, and how many of its
/// tokens come before the `[PAD<n>]` fillers (the BPE vocabulary and the specials).
pub fn tokenizer_metadata(
    arch: Arch,
    vocab: Option<usize>,
    template: Option<&str>,
) -> Result<(Vec<(String, KvValue)>, usize, usize), GenError> {
    let text = CORPUS.repeat(3);
    let (mut tokens, merges) = train_bpe(&text, DEFAULT_MERGES);
    let mut types = vec![NORMAL; tokens.len()];
    let first_special = tokens.len();
    for s in specials(arch) {
        tokens.push((*s).to_string());
        types.push(CONTROL);
    }
    let extra = template.map(template_markers).unwrap_or_default();
    for (m, ty) in &extra {
        if !tokens.iter().any(|t| t == m) {
            tokens.push(m.clone());
            types.push(*ty);
        }
    }
    let live = tokens.len();
    if let Some(n) = vocab {
        if n < tokens.len() {
            return Err(GenError::Spec(format!(
                "expected a vocab of at least {} (bytes, merges and specials), found {n}",
                tokens.len()
            )));
        }
        for i in tokens.len()..n {
            tokens.push(format!("[PAD{i}]"));
            types.push(UNUSED);
        }
    }
    let id = |s: &str| {
        let at = tokens[first_special..]
            .iter()
            .position(|x| x == s)
            .unwrap_or(0);
        KvValue::U32((first_special + at) as u32)
    };
    let (pre, bos, eos, pad, add_bos) = match arch {
        Arch::Llama => (
            "llama-bpe",
            id("<|begin_of_text|>"),
            id("<|eot_id|>"),
            id("<|end_of_text|>"),
            true,
        ),
        Arch::Qwen3Moe | Arch::Qwen3 => (
            "qwen2",
            id("<|endoftext|>"),
            id("<|im_end|>"),
            id("<|endoftext|>"),
            false,
        ),
        Arch::Deepseek2 => ("kimi-k2", id("[BOS]"), id("<|im_end|>"), id("[EOS]"), true),
    };
    // a template that ends turns with DeepSeek's sentence marker stops there
    let eos = if extra.iter().any(|(m, _)| m == "<｜end▁of▁sentence｜>") {
        id("<｜end▁of▁sentence｜>")
    } else {
        eos
    };
    let template = template.unwrap_or(chat_template(arch));
    let n_vocab = tokens.len();
    let s = |k: &str| k.to_string();
    let kv = vec![
        (s("tokenizer.ggml.model"), KvValue::Str("gpt2".into())),
        (s("tokenizer.ggml.pre"), KvValue::Str(pre.into())),
        (s("tokenizer.ggml.tokens"), KvValue::strs(&tokens)),
        (
            s("tokenizer.ggml.token_type"),
            KvValue::Array(types.into_iter().map(KvValue::I32).collect()),
        ),
        (s("tokenizer.ggml.merges"), KvValue::strs(&merges)),
        (s("tokenizer.ggml.bos_token_id"), bos),
        (s("tokenizer.ggml.eos_token_id"), eos),
        (s("tokenizer.ggml.padding_token_id"), pad),
        (s("tokenizer.ggml.add_bos_token"), KvValue::Bool(add_bos)),
        (s("tokenizer.chat_template"), KvValue::Str(template.into())),
    ];
    Ok((kv, n_vocab, live))
}
