//! The tokenizer against llama.cpp: every `tokenize` entry and prompt of every fixture's
//! expected.json (qwen2 and kimi-k2 pre-tokenizers) must give llama.cpp's ids exactly; decoding
//! gives the text back, and streaming decoding never emits a partial UTF-8 character.

use std::path::{Path, PathBuf};

use nightshift_model::gguf::Gguf;
use nightshift_model::tokenizer::{PreTokenizer, StreamDecoder, Tokenizer};
use serde_json::Value;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// (gguf path, expected.json) for every fixture (not the `<model>.kv-<type>` expectations of
/// another cache type: same file, same tokenizer).
fn fixtures() -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if let Some(stem) = name
            .strip_suffix(".expected.json")
            .filter(|s| !s.contains(".kv-"))
        {
            let json: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            out.push((data_dir().join(format!("{stem}.gguf")), json));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 7, "fixtures missing: {}", out.len());
    out
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn encode_matches_llama_cpp() {
    let mut checked = 0;
    let all = fixtures();
    let n_fixtures = all.len();
    for (path, json) in all {
        let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        for case in json["tokenize"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let add_bos = case["add_bos"].as_bool().unwrap();
            let special = case["special"].as_bool().unwrap();
            let got = tok.encode(text, add_bos, special);
            assert_eq!(got, ids(&case["ids"]), "{}: {text:?}", path.display());
            checked += 1;
        }
        for p in json["prompts"].as_array().unwrap() {
            let text = p["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(text, true, true),
                ids(&p["ids"]),
                "{}: {text:?}",
                path.display()
            );
            checked += 1;
        }
    }
    // Every fixture has 9 cases (7 tokenizer strings, 2 prompts): none was skipped.
    assert_eq!(checked, n_fixtures * 9);
}

#[test]
fn vocab_facts() {
    let q = Tokenizer::from_gguf(&Gguf::open(&data_dir().join("tiny-qwen3moe-Q2_K.gguf")).unwrap())
        .unwrap();
    assert_eq!(q.pre_tokenizer(), PreTokenizer::Qwen2);
    assert_eq!(q.vocab_size(), 587);
    assert!(!q.add_bos());
    assert_eq!(q.bos(), q.token_id("<|endoftext|>"));
    assert_eq!(q.eos(), q.token_id("<|im_end|>"));
    assert_eq!(q.eog_ids(), vec![584, 586]);
    assert!(q.is_eog(586) && q.is_eog(584) && !q.is_eog(585) && !q.is_eog(10));
    // parse_special off: control tokens are plain text.
    assert_eq!(q.encode("<|im_end|>", false, true), vec![586]);
    assert!(!q.encode("<|im_end|>", false, false).contains(&586));

    let k =
        Tokenizer::from_gguf(&Gguf::open(&data_dir().join("tiny-deepseek2-Q2_K.gguf")).unwrap())
            .unwrap();
    assert_eq!(k.pre_tokenizer(), PreTokenizer::KimiK2);
    assert!(k.add_bos());
    assert_eq!(k.bos(), k.token_id("[BOS]"));
    assert_eq!(k.eos(), k.token_id("<|im_end|>"));
    assert!(k.is_eog(k.token_id("<|im_end|>").unwrap()));
    assert_eq!(k.encode("", true, true), vec![k.bos().unwrap()]);
    assert_eq!(k.encode("", false, true), Vec::<u32>::new());
    assert_eq!(k.token_bytes(u32::MAX), b"");
}

#[test]
fn decode_round_trips() {
    for (path, json) in fixtures() {
        let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        for case in json["tokenize"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let mut ids = ids(&case["ids"]);
            if tok.add_bos() {
                assert_eq!(ids.remove(0), tok.bos().unwrap());
            }
            assert_eq!(tok.decode(&ids), text, "{}", path.display());
        }
    }
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let tok =
        Tokenizer::from_gguf(&Gguf::open(&data_dir().join("tiny-deepseek2-Q4_K_M.gguf")).unwrap())
            .unwrap();
    let text = "unicode: café naïve — “quotes” 東京 深度学习 😀";
    let ids = tok.encode(text, false, true);
    // The fixture vocabulary has no multi-byte merges: every non-ASCII char spans several tokens.
    assert!(ids.len() > text.chars().count());
    let mut d = StreamDecoder::new();
    let mut pieces = Vec::new();
    let mut held_back = 0;
    for &id in &ids {
        let s = d.push(&tok, id);
        if s.is_empty() {
            held_back += 1;
        }
        assert!(
            !s.contains('\u{fffd}'),
            "partial character emitted after token {id}"
        );
        pieces.push(s);
    }
    pieces.push(d.flush());
    assert_eq!(pieces.concat(), text);
    assert_eq!(
        held_back,
        text.chars().map(|c| c.len_utf8() - 1).sum::<usize>()
    );
    // Every emitted piece is whole characters: the emoji arrives in one piece.
    assert!(pieces.iter().any(|p| p == "😀"));
}
