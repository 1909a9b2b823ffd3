//! Golden vectors from ggml for MXFP4, NVFP4, Q1_0 and Q2_0 (tests/golden-fp, written by its
//! `gen.py` from llama-cpp-python 0.3.36's ggml): dequantization, Q8_0 activation quantization,
//! weight quantization (ggml's reference quantizers), `vec_dot` against ggml's generic C, and
//! `gemm` on every available tier must reproduce ggml's bytes and float bits exactly. The rows
//! include zero, constant, subnormal-scale and large blocks.

mod common;

use std::path::Path;

use common::golden::{self, Kind};

fn kinds() -> Vec<Kind> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden-fp");
    golden::load(&dir).expect("golden fixtures load")
}

/// Runs one check over every kind and reports all failures at once.
fn run(name: &str, check: impl Fn(&Kind) -> Result<(), String>) {
    let kinds = kinds();
    let mut names: Vec<&str> = kinds.iter().map(|g| g.ty.name()).collect();
    names.sort_unstable();
    assert_eq!(names, ["MXFP4", "NVFP4", "Q1_0", "Q2_0"], "fixture kinds");
    golden::run_all(&kinds, name, check);
}

#[test]
fn fp_dequantize_matches_ggml() {
    run("dequantize", golden::check_dequantize);
}

#[test]
fn fp_activation_quantization_matches_ggml() {
    run(
        "activation quantization",
        golden::check_quantize_activations,
    );
}

#[test]
fn fp_weight_quantization_matches_ggml() {
    run("weight quantization", golden::check_quantize_weights);
}

#[test]
fn fp_vec_dot_matches_ggml_generic() {
    run("vec_dot", golden::check_vec_dot);
}

#[test]
fn fp_gemm_on_every_tier_matches_ggml_generic() {
    run("gemm on every tier", golden::check_gemm_every_tier);
}
