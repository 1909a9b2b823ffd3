//! aarch64 tiers: NEON, dotprod (SDOT) and i8mm (SMMLA) (placeholder until the Arm kernels land:
//! no type has a path yet, so dispatch falls back to the scalar reference).

use crate::GgmlType;

macro_rules! placeholder_tier {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            _private: (),
        }

        impl $name {
            /// Returns the capability when this CPU can run the tier.
            pub fn new() -> Option<$name> {
                None
            }

            /// `out[r * n + j] = W[r] . x[j]`; false when the tier has no path for `ty`.
            pub fn gemm_block(self, _ty: GgmlType, _k: usize, _w: &[u8], _rows: usize, _x: &[u8], _n: usize, _out: &mut [f32]) -> bool {
                false
            }
        }
    };
}

placeholder_tier!(Neon, "NEON (Advanced SIMD) capability.");
placeholder_tier!(Dotprod, "NEON + SDOT capability.");
placeholder_tier!(I8mm, "NEON + SDOT + SMMLA capability.");
