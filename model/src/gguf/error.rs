//! Errors of the GGUF reader. A GGUF file is untrusted input: every way it can be malformed is a
//! [`FormatError`] variant, wrapped with the file and byte offset in [`GgufError::Format`], so
//! that a bad model file is reported precisely instead of panicking or reading out of bounds.

use std::path::PathBuf;

/// Everything that can go wrong opening a GGUF file or reading its metadata.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: expected a GGUF file, found {found}", path = path.display())]
    NotAFile { path: PathBuf, found: &'static str },
    #[error(
        "{detail}; replace model files by writing a new file and renaming it over the old one"
    )]
    Changed { detail: String },
    #[error("{path}: at byte {offset}: {kind}", path = path.display())]
    Format {
        path: PathBuf,
        offset: u64,
        kind: FormatError,
    },
    #[error("{path}: {kind}", path = path.display())]
    Split { path: PathBuf, kind: SplitError },
    #[error("metadata key {key}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key} is missing")]
    MissingKey { key: String },
}

impl GgufError {
    /// The format problem, if this is one (tests and callers that branch on the kind).
    pub fn format_kind(&self) -> Option<&FormatError> {
        match self {
            GgufError::Format { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

/// How the bytes of one GGUF file are malformed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    #[error("expected magic \"GGUF\", found {found:02x?}")]
    BadMagic { found: Vec<u8> },
    #[error("expected gguf version 2 or 3, found {0}")]
    UnsupportedVersion(u32),
    #[error("truncated {what}: needs {need} bytes, only {have} left")]
    Truncated { what: String, need: u64, have: u64 },
    #[error("{what} count {count} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge {
        what: String,
        count: u64,
        remaining: u64,
    },
    #[error("{what} is not valid utf-8")]
    InvalidUtf8 { what: String },
    #[error("unknown metadata value type {ty} for {what}")]
    BadValueType { what: String, ty: u32 },
    #[error("arrays nested deeper than {max} levels in {what}")]
    NestingTooDeep { what: String, max: usize },
    #[error("duplicate metadata key {0}")]
    DuplicateKey(String),
    #[error("general.alignment must be a non-zero power of two, found {0}")]
    BadAlignment(u64),
    #[error("general.alignment must be an integer, found {0}")]
    AlignmentType(String),
    #[error("tensor {name}: expected at most 4 dimensions, found {n_dims}")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor {name}: dimension {dim} is too large")]
    DimTooLarge { name: String, dim: u64 },
    #[error("tensor {name}: element count overflows")]
    ShapeOverflow { name: String },
    #[error("tensor {name}: unknown ggml type {id}")]
    UnknownTensorType { name: String, id: u32 },
    #[error("tensor {name}: type {ty} is not supported by the kernels")]
    UnsupportedTensorType { name: String, ty: &'static str },
    #[error("tensor {name}: row length {ne0} is not a multiple of the {ty} block length {block}")]
    RowNotBlockMultiple {
        name: String,
        ty: &'static str,
        ne0: u64,
        block: u64,
    },
    #[error("tensor {name}: offset {offset} is not a multiple of the alignment {align}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        align: u64,
    },
    #[error("tensor {name}: bytes {start}..{end} are outside the file of {file_len} bytes")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensor {name} overlaps tensor {other}")]
    TensorOverlap { name: String, other: String },
    #[error("duplicate tensor name {0}")]
    DuplicateTensor(String),
}

impl FormatError {
    /// A stable short name for the kind of problem (used by data-driven tests and logs).
    pub fn code(&self) -> &'static str {
        match self {
            FormatError::BadMagic { .. } => "bad_magic",
            FormatError::UnsupportedVersion(_) => "unsupported_version",
            FormatError::Truncated { .. } => "truncated",
            FormatError::CountTooLarge { .. } => "count_too_large",
            FormatError::InvalidUtf8 { .. } => "invalid_utf8",
            FormatError::BadValueType { .. } => "bad_value_type",
            FormatError::NestingTooDeep { .. } => "nesting_too_deep",
            FormatError::DuplicateKey(_) => "duplicate_key",
            FormatError::BadAlignment(_) => "bad_alignment",
            FormatError::AlignmentType(_) => "alignment_type",
            FormatError::TooManyDims { .. } => "too_many_dims",
            FormatError::DimTooLarge { .. } => "dim_too_large",
            FormatError::ShapeOverflow { .. } => "shape_overflow",
            FormatError::UnknownTensorType { .. } => "unknown_tensor_type",
            FormatError::UnsupportedTensorType { .. } => "unsupported_tensor_type",
            FormatError::RowNotBlockMultiple { .. } => "row_not_block_multiple",
            FormatError::MisalignedTensor { .. } => "misaligned_tensor",
            FormatError::TensorOutOfBounds { .. } => "tensor_out_of_bounds",
            FormatError::TensorOverlap { .. } => "tensor_overlap",
            FormatError::DuplicateTensor(_) => "duplicate_tensor",
        }
    }
}

/// How a set of split files (`NAME-00001-of-0000N.gguf`) does not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SplitError {
    #[error(
        "split.count is {count} but the file name does not follow NAME-00001-of-{count:05}.gguf"
    )]
    UnnamedSplit { count: u64 },
    #[error("expected split.count {expected}, found {found}")]
    CountMismatch { expected: u64, found: u64 },
    #[error("expected split.no {expected}, found {found}")]
    NumberMismatch { expected: u64, found: u64 },
    #[error("expected {expected} tensors over all splits (split.tensors.count), found {found}")]
    TensorCountMismatch { expected: u64, found: u64 },
    #[error("split.count must be between 1 and 9999, found {0}")]
    BadCount(u64),
    #[error("split key {key}: expected an integer, found {found}")]
    KeyType { key: String, found: String },
    #[error("tensor {0} appears in more than one split")]
    DuplicateTensor(String),
}

impl SplitError {
    /// A stable short name for the kind of problem.
    pub fn code(&self) -> &'static str {
        match self {
            SplitError::UnnamedSplit { .. } => "unnamed_split",
            SplitError::CountMismatch { .. } => "split_count_mismatch",
            SplitError::NumberMismatch { .. } => "split_number_mismatch",
            SplitError::TensorCountMismatch { .. } => "split_tensor_count_mismatch",
            SplitError::BadCount(_) => "split_bad_count",
            SplitError::KeyType { .. } => "split_key_type",
            SplitError::DuplicateTensor(_) => "split_duplicate_tensor",
        }
    }
}
