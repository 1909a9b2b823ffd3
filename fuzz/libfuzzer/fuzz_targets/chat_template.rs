//! libFuzzer target `chat_template`: `nightshift_fuzz::targets::chat_template` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run chat_template` from
//! `fuzz/libfuzzer`, seeded with `../corpus/chat_template`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::chat_template(data));
