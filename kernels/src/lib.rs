//! nightshift-kernels: ggml's block formats, exact scalar reference kernels, and SIMD tiers
//! (AVX2, AVX-512-VNNI, NEON, dotprod, i8mm) that reproduce the scalar path bit for bit.
//!
//! Everything above this crate (model, expert nodes, benches) only sees [`GgmlType`], the
//! row-level functions and [`gemm`]; which SIMD tier runs is decided once in `dispatch`.

pub mod arch;
pub mod formats;

pub use formats::GgmlType;
