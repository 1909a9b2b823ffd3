//! libFuzzer target `atlas`: `nightshift_fuzz::targets::atlas` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run atlas` from
//! `fuzz/libfuzzer`, seeded with `../corpus/atlas`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::atlas(data));
