//! libFuzzer target `template_source`: `nightshift_fuzz::targets::template_source` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run template_source` from
//! `fuzz/libfuzzer`, seeded with `../corpus/template_source`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::template_source(data));
