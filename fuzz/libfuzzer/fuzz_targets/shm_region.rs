//! libFuzzer target `shm_region`: `nightshift_fuzz::targets::shm_region` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run shm_region` from
//! `fuzz/libfuzzer`, seeded with `../corpus/shm_region`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::shm_region(data));
