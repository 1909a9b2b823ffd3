//! Per-architecture SIMD tiers. Each tier is a capability type that can only be constructed when
//! the CPU has the feature; `dispatch` picks one at run time. `capability_tier!` declares one such
//! type (detection + the `gemm_block` entry point), so every tier has the same shape.

/// Declares a capability type: `new()` returns it only when `$detect` holds on this CPU, and
/// `gemm_block` computes `out[r * n + j] = W[r] . x[j]` for `rows` weight rows of `ty` (k elements
/// each, contiguous) and `n` activation rows of `ty.vec_dot_type()` by calling
/// `$run($level, ...)`; it returns false when the tier has no path for `ty` (the caller then uses
/// the scalar reference).
macro_rules! capability_tier {
    ($(#[$doc:meta])* $name:ident, detect: $detect:expr, run: $run:ident($level:expr)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            _private: (),
        }

        impl $name {
            /// Returns the capability when this CPU can run the tier.
            pub fn new() -> Option<$name> {
                ($detect).then_some($name { _private: () })
            }

            /// `out[r * n + j] = W[r] . x[j]`, bit-identical to the scalar reference; false when
            /// this tier has no path for `ty`.
            #[allow(clippy::too_many_arguments)]
            pub fn gemm_block(
                self,
                ty: $crate::GgmlType,
                k: usize,
                w: &[u8],
                rows: usize,
                x: &[u8],
                n: usize,
                out: &mut [f32],
            ) -> bool {
                $run($level, ty, k, w, rows, x, n, out)
            }
        }
    };
}

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod iq_tile;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;
