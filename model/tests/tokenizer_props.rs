//! Tokenizer properties on generated text (deterministic): byte-level BPE is lossless, so
//! decode(encode(s)) == s for any string, streaming decode equals batch decode, and bad
//! `tokenizer.ggml.*` metadata is a typed error.

mod gguf_util;

use nightshift_kernels::rng::SplitMix64;
use std::path::Path;

use gguf_util::Builder;
use nightshift_model::gguf::{Gguf, Value};
use nightshift_model::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

struct Rng(SplitMix64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[(self.next() % xs.len() as u64) as usize]
    }
}

const PIECES: &[&str] = &[
    "the",
    " quick",
    "Name",
    "HTTP",
    "'s",
    "'LL",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    "42",
    "12345",
    "é",
    "ï",
    "—",
    "“",
    "東京",
    "深度",
    "学习",
    "😀",
    "🇯🇵",
    "\u{0301}",
    "\u{00a0}",
    "\u{2028}",
    "\u{85}",
    "<|im_end|>",
    "<|im_start|>",
    "[BOS]",
    "<|",
    "|>",
    "def",
    "(",
    ")",
    ":",
    "_k",
    "=",
    "ǅ",
    "ß",
    "\u{0}",
    "\u{7f}",
    "\u{10ffff}",
    "ⅷ",
    "²",
    "ſ",
];

#[test]
fn encode_decode_is_lossless_and_streams() {
    for name in ["tiny-qwen3moe-Q2_K.gguf", "tiny-deepseek2-Q2_K.gguf"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        let mut rng = Rng(SplitMix64::new(7));
        for case in 0..1500 {
            let n = (rng.next() % 24) as usize;
            let s: String = (0..n).map(|_| *rng.pick(PIECES)).collect();
            for special in [false, true] {
                let ids = tok.encode(&s, false, special);
                assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
                assert_eq!(tok.decode(&ids), s, "{name} case {case} special={special}");
                let mut d = StreamDecoder::new();
                let mut streamed: String = ids.iter().map(|&i| d.push(&tok, i)).collect();
                streamed.push_str(&d.flush());
                assert_eq!(streamed, s, "{name} case {case}");
            }
        }
    }
}

/// A GGUF holding a tiny vocabulary with the given changes.
fn vocab(
    dir: &Path,
    name: &str,
    edit: impl Fn(Builder) -> Builder,
) -> Result<Tokenizer, TokenizerError> {
    let base = Builder::new();
    let p = dir.join(name);
    std::fs::write(&p, edit(base).build().0).unwrap();
    Tokenizer::from_gguf(&Gguf::open(&p).unwrap())
}

fn strs(xs: &[&str]) -> Value {
    Value::Array(xs.iter().map(|s| Value::Str(s.to_string())).collect())
}

#[test]
fn bad_vocab_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let good = |b: Builder| {
        b.kv("tokenizer.ggml.model", Value::Str("gpt2".into()))
            .kv("tokenizer.ggml.pre", Value::Str("qwen2".into()))
            .kv("tokenizer.ggml.tokens", strs(&["a", "b", "ab"]))
            .kv("tokenizer.ggml.merges", strs(&["a b"]))
    };
    let t = vocab(dir.path(), "good.gguf", good).unwrap();
    assert_eq!(t.encode("abab", true, true), vec![2, 2]);
    assert_eq!(
        t.bos(),
        None,
        "gpt2's default id 11 is out of this vocabulary"
    );
    // Bytes without a token are dropped, as llama.cpp does.
    assert_eq!(t.encode("abc", false, false), vec![2]);

    let check = |name: &str, edit: &dyn Fn(Builder) -> Builder, expect: &str| {
        let e = vocab(dir.path(), name, edit).unwrap_err();
        let got = match &e {
            TokenizerError::Gguf(_) => "gguf",
            TokenizerError::MissingKey(_) => "missing",
            TokenizerError::UnsupportedModel(_) => "model",
            TokenizerError::UnsupportedPre(_) => "pre",
            TokenizerError::TokenTypeCount { .. } => "types",
            TokenizerError::EmptyVocab => "empty",
            TokenizerError::Regex(_) => "regex",
        };
        assert_eq!(got, expect, "{name}: {e}");
    };
    check("nomodel.gguf", &|b| b, "missing");
    check(
        "spm.gguf",
        &|b| b.kv("tokenizer.ggml.model", Value::Str("llama".into())),
        "model",
    );
    let gpt2 = |b: Builder| b.kv("tokenizer.ggml.model", Value::Str("gpt2".into()));
    check(
        "pre.gguf",
        &|b| gpt2(b).kv("tokenizer.ggml.pre", Value::Str("tekken".into())),
        "pre",
    );
    check("notokens.gguf", &|b| gpt2(b), "missing");
    check(
        "empty.gguf",
        &|b| gpt2(b).kv("tokenizer.ggml.tokens", Value::Array(vec![])),
        "empty",
    );
    check(
        "tokens-type.gguf",
        &|b| gpt2(b).kv("tokenizer.ggml.tokens", Value::U32(3)),
        "gguf",
    );
    check(
        "types.gguf",
        &|b| {
            good(b).kv(
                "tokenizer.ggml.token_type",
                Value::Array(vec![Value::I32(1)]),
            )
        },
        "types",
    );
    check(
        "nomerges.gguf",
        &|b| gpt2(b).kv("tokenizer.ggml.tokens", strs(&["a"])),
        "missing",
    );
}
