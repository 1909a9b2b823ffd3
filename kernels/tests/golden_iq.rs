//! Golden vectors from ggml for the i-quants and ternary types (tests/golden-iq, copied from
//! shared/fixtures/kernels-iq; weights quantized by ggml, several with an importance matrix):
//! dequantization, Q8_K/Q8_0 activation quantization, `vec_dot` against ggml's generic C, and
//! `gemm` on every available tier must reproduce ggml's bytes and float bits exactly.

mod common;

use std::path::Path;

use common::golden::{self, Kind};
use nightshift_kernels::GgmlType;

fn kinds() -> Vec<Kind> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden-iq");
    golden::load(&dir).expect("golden fixtures load")
}

/// Runs one check over every kind and reports all failures at once.
fn run(name: &str, check: impl Fn(&Kind) -> Result<(), String>) {
    let kinds = kinds();
    let mut names: Vec<&str> = kinds.iter().map(|g| g.ty.name()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_NL", "IQ4_XS",
            "TQ1_0", "TQ2_0"
        ],
        "fixture kinds"
    );
    golden::run_all(&kinds, name, check);
}

#[test]
fn iq_dequantize_matches_ggml() {
    run("dequantize", golden::check_dequantize);
}

#[test]
fn iq_activation_quantization_matches_ggml() {
    run(
        "activation quantization",
        golden::check_quantize_activations,
    );
}

#[test]
fn iq_vec_dot_matches_ggml_generic() {
    run("vec_dot", golden::check_vec_dot);
}

#[test]
fn iq_gemm_on_every_tier_matches_ggml_generic() {
    run("gemm on every tier", golden::check_gemm_every_tier);
}

#[test]
fn iq_types_have_no_weight_quantizer() {
    for g in kinds() {
        assert!(!g.ty.has_quantizer(), "{}", g.ty);
        let mut q = vec![0u8; g.ty.row_bytes(g.k).expect("row bytes")];
        let r = nightshift_kernels::quantize_row(g.ty, &g.w_f32[..g.k], &mut q);
        assert!(
            matches!(r, Err(nightshift_kernels::KernelError::Unsupported { .. })),
            "{}: {r:?}",
            g.ty
        );
    }
    assert!(GgmlType::Q4_K.has_quantizer());
}
