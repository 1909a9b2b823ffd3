//! libFuzzer target `tokenize`: `nightshift_fuzz::targets::tokenize` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run tokenize` from
//! `fuzz/libfuzzer`, seeded with `../corpus/tokenize`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::tokenize(data));
