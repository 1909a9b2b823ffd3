//! The crate's one error type. Every function that takes bytes or lengths from outside checks
//! them up front and returns a [`KernelError`] instead of panicking or reading out of bounds.

/// What went wrong in a kernel call: bad lengths, a `k` that does not fit the block size, an
/// operation a type does not support, or an unusable SIMD tier.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// `k` must be a whole number of blocks.
    #[error("row length {k} is not a multiple of the {ty} block length {block_len}")]
    KNotMultiple {
        ty: &'static str,
        k: usize,
        block_len: usize,
    },
    /// A buffer has the wrong size.
    #[error("{what}: expected {expected} bytes, found {found}")]
    Length {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// A byte buffer is not a whole number of blocks.
    #[error("{what}: expected a multiple of {block_bytes} bytes, found {found}")]
    Ragged {
        what: &'static str,
        block_bytes: usize,
        found: usize,
    },
    /// An f32 buffer has the wrong number of elements.
    #[error("{what}: expected {expected} elements, found {found}")]
    Elements {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// The operation exists in ggml for other types only.
    #[error("{op} is not supported for {ty}")]
    Unsupported { op: &'static str, ty: &'static str },
    /// A GEMM's activation rows do not fit its weight rows (type or row length).
    #[error("gemm operands: expected {expected}, found {found}")]
    Operands { expected: String, found: String },
    /// A size computation overflowed `usize`.
    #[error("{what} overflows: {detail}")]
    Overflow { what: &'static str, detail: String },
    /// Rows asked of a matrix that are not all inside it.
    #[error("weight matrix: expected rows within 0..{rows}, found {start}..{end}")]
    Rows {
        start: usize,
        end: usize,
        rows: usize,
    },
    /// A weight matrix cannot have (or is not in) a repacked layout (`formats::repack`).
    #[error("weight layout {layout}: expected {expected}, found {found}")]
    Layout {
        layout: &'static str,
        expected: String,
        found: String,
    },
    /// The requested SIMD tier cannot run on this CPU (or this build's architecture).
    #[error("kernel tier {tier} is not available on this cpu (available: {available})")]
    TierUnavailable {
        tier: &'static str,
        available: String,
    },
    /// `NIGHTSHIFT_KERNEL` names no known tier.
    #[error("NIGHTSHIFT_KERNEL: expected one of scalar|avx2|avx512vnni|neon|dotprod|i8mm, found {found:?}")]
    UnknownTier { found: String },
}
