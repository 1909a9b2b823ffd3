//! libFuzzer target `placement`: `nightshift_fuzz::targets::placement` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run placement` from
//! `fuzz/libfuzzer`, seeded with `../corpus/placement`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::placement(data));
