//! libFuzzer target `gguf`: `nightshift_fuzz::targets::gguf` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run gguf` from
//! `fuzz/libfuzzer`, seeded with `../corpus/gguf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::gguf(data));
