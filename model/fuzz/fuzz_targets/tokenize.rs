//! Fuzz target: any text through the kimi-k2 fixture tokenizer (with and without special-token
//! parsing) must round-trip through decode and through the stream decoder, and never panic.
//! Run with `cargo +nightly fuzz run tokenize` from `model/`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nightshift_model::gguf::Gguf;
use nightshift_model::tokenizer::{StreamDecoder, Tokenizer};

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/tiny-deepseek2-Q2_K.gguf"
        );
        let g = Gguf::open(std::path::Path::new(p)).expect("fixture");
        Tokenizer::from_gguf(&g).expect("tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tok = tokenizer();
    for special in [false, true] {
        let ids = tok.encode(&text, false, special);
        assert_eq!(tok.decode(&ids), text);
        let mut d = StreamDecoder::new();
        let mut s: String = ids.iter().map(|&i| d.push(tok, i)).collect();
        s.push_str(&d.flush());
        assert_eq!(s, text);
    }
});
