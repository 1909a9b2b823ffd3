//! The KV cache: per sequence, per layer, the K rows (and V rows, except for MLA whose values are
//! the first `kv_lora_rank` floats of each latent K row) of every position so far, stored as f32
//! like llama.cpp's `type_k = type_v = F32` cache.

/// One layer's cache of one sequence: `len * k_width` and `len * v_width` floats.
#[derive(Default, Clone)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The cache of one sequence.
#[derive(Clone)]
pub struct SeqKv {
    /// Positions committed (attention of the next token sees 0..len).
    pub len: usize,
    pub layers: Vec<LayerKv>,
}

impl SeqKv {
    pub fn new(n_layer: usize) -> SeqKv {
        SeqKv {
            len: 0,
            layers: vec![LayerKv::default(); n_layer],
        }
    }

    /// Makes room for `n` positions (K rows of `kw` floats, V rows of `vw`).
    pub fn reserve_to(&mut self, n: usize, kw: usize, vw: usize) {
        for l in &mut self.layers {
            if l.k.len() < n * kw {
                l.k.resize(n * kw, 0.0);
            }
            if l.v.len() < n * vw {
                l.v.resize(n * vw, 0.0);
            }
        }
    }

    /// Drops rows beyond `len` (after a failed step).
    pub fn truncate(&mut self, kw: usize, vw: usize) {
        for l in &mut self.layers {
            l.k.truncate(self.len * kw);
            l.v.truncate(self.len * vw);
        }
    }
}
