//! Scaled dot-product attention of one token over its sequence's cache, as llama.cpp's non-flash
//! path computes it with an F32 cache: `kq = K.q` per head (f32), `soft_max_ext(kq * scale)` with
//! the causal mask, `kqv = V^T.p`. GQA maps query head `h` to kv head `h / (n_head / n_head_kv)`;
//! MLA is the special case of one kv head whose V is a prefix of K.

use crate::ops::softmax;
use nightshift_kernels::formats::{f16_to_f32, f32_to_f16};

/// Where one sequence's K and V rows live for one layer.
pub struct KvView<'a> {
    pub k: &'a [f32],
    pub k_stride: usize,
    pub v: &'a [f32],
    pub v_stride: usize,
    /// Visible positions (0..n_kv).
    pub n_kv: usize,
}

/// Head geometry of an attention call.
#[derive(Clone, Copy)]
pub struct Heads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub dk: usize,
    pub dv: usize,
    pub scale: f32,
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums, like ggml's vectorised f32 dot.
    let mut acc = [0.0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Attention of one token: `q` is `n_head * dk`, `out` is `n_head * dv`; `scores` is scratch.
/// With `round_p` the probabilities are rounded to f16 before weighting V (an F16 V cache).
pub fn attend(
    q: &[f32],
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    for h in 0..hd.n_head {
        let qh = &q[h * hd.dk..(h + 1) * hd.dk];
        attend_head(
            qh,
            h,
            kv,
            hd,
            round_p,
            scores,
            &mut out[h * hd.dv..(h + 1) * hd.dv],
        );
    }
}

/// Attention of query head `h` of one token: `qh` is `dk` floats, `oh` receives `dv`.
pub fn attend_head(
    qh: &[f32],
    h: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    oh: &mut [f32],
) {
    let hk = h / (hd.n_head / hd.n_head_kv);
    scores.resize(kv.n_kv, 0.0);
    for (j, s) in scores.iter_mut().enumerate() {
        let off = j * kv.k_stride + hk * hd.dk;
        *s = dot(&kv.k[off..off + hd.dk], qh);
    }
    softmax(scores, hd.scale);
    if round_p {
        scores
            .iter_mut()
            .for_each(|p| *p = f16_to_f32(f32_to_f16(*p)));
    }
    oh.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        let off = j * kv.v_stride + hk * hd.dv;
        for (o, &v) in oh.iter_mut().zip(&kv.v[off..off + hd.dv]) {
            *o += v * p;
        }
    }
}
