//! Golden vectors from ggml (tests/golden, copied from shared/fixtures/kernels): for every type,
//! dequantization, activation and weight quantization, `vec_dot` and `gemm` on every available
//! tier must reproduce ggml's bytes and float bits exactly.

mod common;

use std::path::Path;

use common::golden::{self, Kind};

fn kinds() -> Vec<Kind> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    golden::load(&dir).expect("golden fixtures load")
}

/// Runs one check over every kind and reports all failures at once.
fn run(name: &str, check: impl Fn(&Kind) -> Result<(), String>) {
    let kinds = kinds();
    assert_eq!(kinds.len(), 10, "fixture kinds");
    golden::run_all(&kinds, name, check);
}

#[test]
fn dequantize_matches_ggml() {
    run("dequantize", golden::check_dequantize);
}

#[test]
fn activation_quantization_matches_ggml() {
    run(
        "activation quantization",
        golden::check_quantize_activations,
    );
}

#[test]
fn weight_quantization_matches_ggml() {
    run("weight quantization", golden::check_quantize_weights);
}

#[test]
fn vec_dot_matches_ggml_generic() {
    run("vec_dot", golden::check_vec_dot);
}

#[test]
fn gemm_on_every_tier_matches_ggml_generic() {
    run("gemm on every tier", golden::check_gemm_every_tier);
}
