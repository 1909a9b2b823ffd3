//! x86_64 tiers: AVX2 and AVX-512-VNNI (placeholder until the x86 kernels land: no type has a
//! path yet, so dispatch falls back to the scalar reference).

use crate::GgmlType;

/// AVX2 capability: only constructible when the CPU has AVX2 + FMA + F16C.
#[derive(Clone, Copy, Debug)]
pub struct Avx2 {
    _private: (),
}

impl Avx2 {
    /// Returns the capability when this CPU can run the tier.
    pub fn new() -> Option<Avx2> {
        None
    }

    /// `out[r * n + j] = W[r] . x[j]` for `rows` weight rows of `ty` and `n` activation rows of
    /// `ty.vec_dot_type()`; lengths are validated by the caller. Returns false when this tier has
    /// no path for `ty` (the caller then uses the scalar reference).
    pub fn gemm_block(self, _ty: GgmlType, _k: usize, _w: &[u8], _rows: usize, _x: &[u8], _n: usize, _out: &mut [f32]) -> bool {
        false
    }
}

/// AVX-512-VNNI capability (AVX-512F/BW/VL + VNNI).
#[derive(Clone, Copy, Debug)]
pub struct Avx512Vnni {
    _private: (),
}

impl Avx512Vnni {
    /// Returns the capability when this CPU can run the tier.
    pub fn new() -> Option<Avx512Vnni> {
        None
    }

    /// Same contract as [`Avx2::gemm_block`].
    pub fn gemm_block(self, _ty: GgmlType, _k: usize, _w: &[u8], _rows: usize, _x: &[u8], _n: usize, _out: &mut [f32]) -> bool {
        false
    }
}
