//! Per-architecture SIMD tiers. Each tier is a capability type that can only be constructed when
//! the CPU has the feature; `dispatch` picks one at run time. `capability_tier!` declares one such
//! type (detection + the `gemm_block` entry point), so every tier has the same shape.

/// Declares a capability type: `new()` returns it only when `$detect` holds on this CPU, and
/// `gemm_block` computes a [`Tile`](crate::Tile) (`out[r * n + j] = W[r] . x[j]`) by calling
/// `$run($level, tile)`; it returns false when the tier has no path for the tile's type (the
/// caller then uses the scalar reference on the same tile).
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

            /// `out[r * n + j] = W[r] . x[j]` over `tile`, bit-identical to the scalar
            /// reference; false (nothing promised about `out`) when this tier has no path for
            /// the tile's type.
            pub fn gemm_block(self, tile: &mut $crate::Tile<'_>) -> bool {
                // Repacked weights reach only the aarch64 tiers' own checks (`aarch64::run`).
                if !cfg!(target_arch = "aarch64")
                    && tile.w().layout() != $crate::formats::repack::Layout::Gguf
                {
                    return false;
                }
                $run($level, tile)
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
