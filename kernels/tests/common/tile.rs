//! Builds the [`Tile`] a tier's `gemm_block` takes from the loose buffers the tier tests
//! generate (weights `rows x k` of `ty`, `n` activation rows of its vec-dot type, `rows * n`
//! outputs); a test bug, not a kernel failure, when they do not fit, so it panics.

#![allow(dead_code)]

use nightshift_kernels::{GgmlType, QMatrix, Tile};

/// The tile over these buffers (panics when they do not fit each other).
pub fn tile<'a>(
    ty: GgmlType,
    k: usize,
    w: &'a [u8],
    rows: usize,
    x: &'a [u8],
    n: usize,
    out: &'a mut [f32],
) -> Tile<'a> {
    let w = QMatrix::new(ty, rows, k, w).expect("weight rows fit");
    let x = QMatrix::activations(&w, x, n).expect("activation rows fit");
    Tile::new(w, x, out).expect("output fits")
}
