//! Every pre-tokenizer against llama.cpp's, on a vocabulary made to show where each one splits:
//! `tests/data/tokenizer-pre-ids.json` holds a byte-level BPE whose merges join every adjacent
//! byte pair of its 26 multilingual strings (so a piece boundary is exactly where two bytes stay
//! apart), and the ids llama.cpp's own tokenizer gave for each string under each
//! `tokenizer.ggml.pre` (llama-cpp-python, vocab only). The same vocabulary must give them
//! exactly. This covers the pre-tokenizers the shipped fixtures do not use (`deepseek-llm`,
//! `deepseek-coder`, `deepseek-v3`, `llama3`, `gpt-2`, `default`) and checks the others again.

mod gguf_util;

use gguf_util::Builder;
use nightshift_model::gguf::{Gguf, Value};
use nightshift_model::tokenizer::Tokenizer;
use serde_json::Value as Json;

fn strs(v: &Json) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_pre_tokenizer_splits_as_llama_cpp() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let want: Json = serde_json::from_str(
        &std::fs::read_to_string(data.join("tokenizer-pre-ids.json")).unwrap(),
    )
    .unwrap();
    let tokens = strs(&want["tokens"]);
    let merges = strs(&want["merges"]);
    let strings = strs(&want["strings"]);
    let n = tokens.len();
    // the last two tokens are BOS and EOS (control), the rest normal
    let types: Vec<Value> = (0..n)
        .map(|i| Value::I32(if i + 2 >= n { 3 } else { 1 }))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (pre, ids) in want["pre"].as_object().unwrap() {
        let (bytes, _) = Builder::new()
            .kv("general.architecture", Value::Str("deepseek2".into()))
            .kv("tokenizer.ggml.model", Value::Str("gpt2".into()))
            .kv("tokenizer.ggml.pre", Value::Str(pre.clone()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(tokens.iter().map(|t| Value::Str(t.clone())).collect()),
            )
            .kv("tokenizer.ggml.token_type", Value::Array(types.clone()))
            .kv(
                "tokenizer.ggml.merges",
                Value::Array(merges.iter().map(|m| Value::Str(m.clone())).collect()),
            )
            .kv("tokenizer.ggml.bos_token_id", Value::U32(n as u32 - 2))
            .kv("tokenizer.ggml.eos_token_id", Value::U32(n as u32 - 1))
            .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
            .build();
        let path = dir.path().join(format!("{pre}.gguf"));
        std::fs::write(&path, bytes).unwrap();
        let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        let mut wrong = Vec::new();
        for (s, ids) in strings.iter().zip(ids.as_array().unwrap()) {
            let ids: Vec<u32> = ids
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(s, false, false);
            if got != ids {
                wrong.push(format!("{s:?}: ours {got:?}, llama.cpp {ids:?}"));
            }
            checked += 1;
        }
        assert!(wrong.is_empty(), "{pre}:\n{}", wrong.join("\n"));
    }
    assert_eq!(checked, 8 * strings.len());
}
