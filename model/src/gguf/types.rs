//! ggml tensor type ids as they appear in GGUF files, with the block geometry the reader needs to
//! check that every tensor's byte size is consistent. The reader validates sizes with this table
//! on its own (a file-format fact), then maps the id to the kernels' [`GgmlType`].

use nightshift_kernels::GgmlType;

/// Geometry of one ggml type: elements per block and bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeLayout {
    pub name: &'static str,
    pub block_len: u64,
    pub block_bytes: u64,
}

const fn layout(name: &'static str, block_len: u64, block_bytes: u64) -> Option<TypeLayout> {
    Some(TypeLayout {
        name,
        block_len,
        block_bytes,
    })
}

/// The layout of ggml type `id`, for every type a GGUF file can hold (ids of removed types and
/// unknown ids give `None`).
pub fn type_layout(id: u32) -> Option<TypeLayout> {
    match id {
        0 => layout("F32", 1, 4),
        1 => layout("F16", 1, 2),
        2 => layout("Q4_0", 32, 18),
        3 => layout("Q4_1", 32, 20),
        6 => layout("Q5_0", 32, 22),
        7 => layout("Q5_1", 32, 24),
        8 => layout("Q8_0", 32, 34),
        9 => layout("Q8_1", 32, 36),
        10 => layout("Q2_K", 256, 84),
        11 => layout("Q3_K", 256, 110),
        12 => layout("Q4_K", 256, 144),
        13 => layout("Q5_K", 256, 176),
        14 => layout("Q6_K", 256, 210),
        15 => layout("Q8_K", 256, 292),
        16 => layout("IQ2_XXS", 256, 66),
        17 => layout("IQ2_XS", 256, 74),
        18 => layout("IQ3_XXS", 256, 98),
        19 => layout("IQ1_S", 256, 50),
        20 => layout("IQ4_NL", 32, 18),
        21 => layout("IQ3_S", 256, 110),
        22 => layout("IQ2_S", 256, 82),
        23 => layout("IQ4_XS", 256, 136),
        24 => layout("I8", 1, 1),
        25 => layout("I16", 1, 2),
        26 => layout("I32", 1, 4),
        27 => layout("I64", 1, 8),
        28 => layout("F64", 1, 8),
        29 => layout("IQ1_M", 256, 56),
        30 => layout("BF16", 1, 2),
        34 => layout("TQ1_0", 256, 54),
        35 => layout("TQ2_0", 256, 66),
        39 => layout("MXFP4", 32, 17),
        40 => layout("NVFP4", 64, 36),
        41 => layout("Q1_0", 128, 18),
        42 => layout("Q2_0", 64, 18),
        _ => None,
    }
}

/// The kernels' type for ggml id `id`, if the kernels support it.
pub fn kernel_type(id: u32) -> Option<GgmlType> {
    GgmlType::from_id(id)
}
