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
    let facts = arch.spec().tokenizer();
    for s in facts.specials {
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
    let (pre, bos, eos, pad, add_bos) = (
        facts.pre,
        id(facts.bos),
        id(facts.eos),
        id(facts.pad),
        facts.add_bos,
    );
    // a template that ends turns with DeepSeek's sentence marker stops there
    let eos = if extra.iter().any(|(m, _)| m == "<｜end▁of▁sentence｜>") {
        id("<｜end▁of▁sentence｜>")
    } else {
        eos
    };
    let template = template.unwrap_or(facts.chat_template);
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
