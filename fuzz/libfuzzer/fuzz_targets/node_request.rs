//! libFuzzer target `node_request`: `nightshift_fuzz::targets::node_request` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run node_request` from
//! `fuzz/libfuzzer`, seeded with `../corpus/node_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::node_request(data));
