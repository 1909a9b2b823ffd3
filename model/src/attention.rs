//! Attention of one token over its sequence's cache, as llama.cpp's non-flash path computes it.
//! The computation (portable body, SIMD builds, the CPU choice between them) lives in the kernels
//! crate, [`nightshift_kernels::attn`]; the model crate holds no CPU-specific code and calls it
//! through these names (`arch::attend_all` per tile of a sequence's tokens and kv head group, the attention bench per
//! token).

pub use nightshift_kernels::attn::q8::{attend_heads_q8, Q8Scratch};
pub use nightshift_kernels::attn::rotate::hadamard_chunks;
pub use nightshift_kernels::attn::{attend, attend_heads, attend_tile, tile_rows, Heads, KvView};
