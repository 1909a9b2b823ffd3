//! The KV cache: per sequence, per layer, the K rows (and V rows, except for MLA whose values are
//! the first `kv_lora_rank` floats of each latent K row) of every position so far, stored as f32
//! or f16 like llama.cpp's `type_k`/`type_v` (F32 is the parity reference; F16 halves the memory).

use nightshift_kernels::formats::{f16_to_f32, f32_to_f16};

/// Element type of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F32,
    F16,
}

/// A growable buffer of cached floats.
#[derive(Clone)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl KvBuf {
    pub fn new(ty: KvType) -> KvBuf {
        match ty {
            KvType::F32 => KvBuf::F32(Vec::new()),
            KvType::F16 => KvBuf::F16(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn grow_to(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) if v.len() < n => v.resize(n, 0.0),
            KvBuf::F16(v) if v.len() < n => v.resize(n, 0),
            _ => {}
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.truncate(n),
            KvBuf::F16(v) => v.truncate(n),
        }
    }

    /// Stores `src` at float offset `off` (rounded to f16 for an F16 cache, like ggml_cpy).
    pub fn write(&mut self, off: usize, src: &[f32]) {
        match self {
            KvBuf::F32(v) => v[off..off + src.len()].copy_from_slice(src),
            KvBuf::F16(v) => {
                for (d, &s) in v[off..off + src.len()].iter_mut().zip(src) {
                    *d = f32_to_f16(s);
                }
            }
        }
    }

    /// The first `n` floats, borrowed (F32) or converted into `scratch` (F16).
    pub fn floats<'a>(&'a self, n: usize, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        match self {
            KvBuf::F32(v) => &v[..n],
            KvBuf::F16(v) => {
                scratch.clear();
                scratch.extend(v[..n].iter().map(|&h| f16_to_f32(h)));
                scratch
            }
        }
    }
}

/// One layer's cache of one sequence: `len * k_width` and `len * v_width` floats.
#[derive(Clone)]
pub struct LayerKv {
    pub k: KvBuf,
    pub v: KvBuf,
}

/// The cache of one sequence.
#[derive(Clone)]
pub struct SeqKv {
    /// Positions committed (attention of the next token sees 0..len).
    pub len: usize,
    pub ty: KvType,
    pub layers: Vec<LayerKv>,
}

impl SeqKv {
    pub fn new(n_layer: usize, ty: KvType) -> SeqKv {
        SeqKv {
            len: 0,
            ty,
            layers: vec![
                LayerKv {
                    k: KvBuf::new(ty),
                    v: KvBuf::new(ty)
                };
                n_layer
            ],
        }
    }

    /// Makes room for `n` positions (K rows of `kw` floats, V rows of `vw`).
    pub fn reserve_to(&mut self, n: usize, kw: usize, vw: usize) {
        for l in &mut self.layers {
            l.k.grow_to(n * kw);
            l.v.grow_to(n * vw);
        }
    }

    /// Drops rows beyond `len` (after a failed step).
    pub fn truncate(&mut self, kw: usize, vw: usize) {
        for l in &mut self.layers {
            l.k.truncate(self.len * kw);
            l.v.truncate(self.len * vw);
        }
    }

    /// Bytes held by this sequence's cache.
    pub fn bytes(&self) -> usize {
        let per = match self.ty {
            KvType::F32 => 4,
            KvType::F16 => 2,
        };
        self.layers
            .iter()
            .map(|l| (l.k.len() + l.v.len()) * per)
            .sum()
    }
}
