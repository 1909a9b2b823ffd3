//! Per-architecture SIMD tiers. Each tier is a capability type that can only be constructed when
//! the CPU has the feature; `dispatch` picks one at run time.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;
