//! libFuzzer target `tool_calls`: `nightshift_fuzz::targets::tool_calls` (the same target the test suite's
//! stable driver runs), for long coverage-guided runs: `cargo +nightly fuzz run tool_calls` from
//! `fuzz/libfuzzer`, seeded with `../corpus/tool_calls`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nightshift_fuzz::targets::tool_calls(data));
