//! Placeholder: the block formats land with the kernels issue.

/// ggml's tensor types, with the numeric ids used in GGUF files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
}
