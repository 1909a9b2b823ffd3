//! Scaled dot-product attention of one token over its sequence's cache, as llama.cpp's non-flash
//! path computes it with an F32 cache: `kq = K.q` per head (f32), `soft_max_ext(kq * scale)` with
//! the causal mask, `kqv = V^T.p`. GQA maps query head `h` to kv head `h / (n_head / n_head_kv)`;
//! MLA is the special case of one kv head whose V is a prefix of K.
//!
//! A Q8_0 cache (llama.cpp's `-ctk q8_0 -ctv q8_0`, which runs ggml's flash-attention path with
//! its online softmax) has its own kernel in [`q8`]; [`rotate`] is the Hadamard rotation llama.cpp
//! applies around it on grouped-query models.
//!
//! The portable body here is what every CPU can run (aarch64 runs it as is); on x86-64 the
//! [`crate::dispatch::float_level`] picks the same body compiled for AVX2, or the AVX-512 kernels
//! of `x86_64`, which keep every operation and its order (Rust never fuses or reassociates
//! float operations), so all of them give the same bits. The model crate calls [`attend_heads`]
//! per kv head group; it holds no SIMD code of its own.

pub mod q8;
pub mod rotate;
mod softmax;
#[cfg(target_arch = "x86_64")]
mod x86_64;

use crate::dispatch::FloatLevel;
use crate::formats::{f16_to_f32, f32_to_f16};
pub use softmax::{exp, softmax};

/// Where one sequence's K and V rows live for one layer: in segments of `block` positions (the
/// paged cache's blocks, or one segment for contiguous rows). Position `j` is row `j % block` of
/// segment `j / block`; rows are `k_stride` (`v_stride`) elements apart inside a segment: floats
/// for an F32 view, Q8_0 blocks of 32 for the quantized cache ([`q8`]).
pub struct KvView<'a, T = f32> {
    pub k: &'a [&'a [T]],
    pub k_stride: usize,
    pub v: &'a [&'a [T]],
    pub v_stride: usize,
    /// Positions per segment (at least 1).
    pub block: usize,
    /// Visible positions (0..n_kv).
    pub n_kv: usize,
}

impl<T> KvView<'_, T> {
    /// Segments holding visible positions.
    fn segments(&self) -> usize {
        self.n_kv.div_ceil(self.block.max(1))
    }

    /// Visible rows of segment `s`.
    fn rows(&self, s: usize) -> usize {
        self.block.min(self.n_kv - s * self.block)
    }
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

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums, like ggml's vectorised f32 dot.
    let mut acc = [0.0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    finish_dot(&acc, a, b, n8)
}

/// The end of [`dot`]: its eight partial sums folded pairwise, then the elements from `n8` on
/// added one by one (shared by every variant so all of them keep these bits).
#[inline(always)]
fn finish_dot(acc: &[f32; 8], a: &[f32], b: &[f32], n8: usize) -> f32 {
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in n8..a.len().min(b.len()) {
        s += a[i] * b[i];
    }
    s
}

/// [`dot`] of four rows `a[r]` with one `b`, interleaved (four independent chains); each result
/// has `dot`'s bits.
#[inline(always)]
fn dot4(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    let len = b.len();
    let a = a.map(|r| &r[..len]);
    let n8 = len / 8 * 8;
    let mut acc = [[0.0f32; 8]; 4];
    for c in (0..n8).step_by(8) {
        let cb = &b[c..c + 8];
        for (r, ar) in a.iter().enumerate() {
            let ca = &ar[c..c + 8];
            for i in 0..8 {
                acc[r][i] += ca[i] * cb[i];
            }
        }
    }
    core::array::from_fn(|r| finish_dot(&acc[r], a[r], b, n8))
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
    attend_on(
        crate::dispatch::float_level(),
        q,
        kv,
        hd,
        round_p,
        scores,
        out,
    );
}

/// [`attend`] in the build `level` names (at most the widest this CPU runs).
fn attend_on(
    level: FloatLevel,
    q: &[f32],
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    // one call per kv head: its query heads share every K and V row read
    let g = hd.n_head / hd.n_head_kv;
    for h0 in (0..hd.n_head).step_by(g) {
        attend_heads_on(
            level,
            &q[h0 * hd.dk..(h0 + g) * hd.dk],
            h0,
            g,
            kv,
            hd,
            round_p,
            scores,
            &mut out[h0 * hd.dv..(h0 + g) * hd.dv],
        );
    }
}

/// Attention of the `g` consecutive query heads `h0..h0 + g` of one token, which must share one
/// kv head (GQA groups, MLA): `q` is `g * dk` floats, `out` receives `g * dv`; `scores` is
/// scratch. Each K and V row is read once for the whole group instead of once per head; every
/// head's dot products, softmax and V sums are the same operations in the same order as for a
/// lone head, so the results are identical bit for bit, in every build
/// ([`crate::dispatch::float_level`]).
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let level = crate::dispatch::float_level();
    attend_heads_on(level, q, h0, g, kv, hd, round_p, scores, out);
}

/// [`attend_heads`] in the build `level` names, lowered to what this CPU runs.
#[allow(clippy::too_many_arguments)]
fn attend_heads_on(
    level: FloatLevel,
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match level.min(crate::dispatch::float_level_available()) {
        FloatLevel::Avx512 if x86_64::avx512_fits(g, hd) => {
            // SAFETY: the level is at most the widest this CPU runs, so it has AVX-512 F and DQ.
            unsafe { x86_64::attend_heads_avx512(q, h0, g, kv, hd, round_p, scores, out) };
            return;
        }
        FloatLevel::Avx512 | FloatLevel::Avx2 => {
            // SAFETY: the level is at most the widest this CPU runs, so it has AVX2.
            unsafe { x86_64::attend_heads_avx2(q, h0, g, kv, hd, round_p, scores, out) };
            return;
        }
        FloatLevel::Baseline => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    attend_heads_body::<false>(q, h0, g, kv, hd, round_p, scores, out);
}

/// Query rows a prefill tile holds at most (rows of [`attend_tile`]'s `q` times heads per row).
pub const TILE_ROWS: usize = 128;

/// Bytes of scores a prefill tile holds at most (per worker thread, while it runs).
const TILE_SCORE_BYTES: usize = 8 << 20;

/// Query rows a prefill tile over `n_kv` cached positions should hold: each K and V row is read
/// from memory once per tile, so the more rows the less traffic per row (at depth 16k one kv
/// head's K and V are 16 MiB, a layer's four more than the L3), up to [`TILE_ROWS`] and as
/// long as the tile's scores (`rows * n_kv` floats) fit [`TILE_SCORE_BYTES`]; at least 8 (one
/// token's group of heads).
pub fn tile_rows(n_kv: usize) -> usize {
    (TILE_SCORE_BYTES / 4 / n_kv.max(1)).clamp(8, TILE_ROWS)
}

/// Attention of several query rows of one sequence (a prefill chunk's positions) for the `g`
/// query heads `h0..h0 + g` sharing one kv head: row `t` of `q` (`g * dk` floats at `t * g * dk`)
/// sees positions `0..n_kv[t]` of `kv` (each `n_kv[t]` in `1..=kv.n_kv`), and its `g * dv`
/// outputs go to `out[t * g * dv..]`. Every output has the bits [`attend_heads`] gives that row
/// alone, in every build; the AVX-512 build walks the cache once per tile, a chunk of positions
/// at a time, so each K and V row is read from memory once for all the tile's rows instead of
/// once per row (a chunk of 512 queries over D cached keys is GEMM-shaped).
#[allow(clippy::too_many_arguments)]
pub fn attend_tile(
    q: &[f32],
    n_kv: &[usize],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_tile_on(
        crate::dispatch::float_level(),
        q,
        n_kv,
        h0,
        g,
        kv,
        hd,
        round_p,
        scores,
        out,
    );
}

/// [`attend_tile`] in the build `level` names (at most the widest this CPU runs).
#[allow(clippy::too_many_arguments)]
fn attend_tile_on(
    level: FloatLevel,
    q: &[f32],
    n_kv: &[usize],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (qw, ow) = (g * hd.dk, g * hd.dv);
    let shaped = q.len() >= n_kv.len() * qw
        && out.len() >= n_kv.len() * ow
        && n_kv.iter().all(|&n| n >= 1 && n <= kv.n_kv);
    // a tile of one row (a decode token) gains nothing from the chunked walk, which keeps its
    // V sums in `out` between chunks: the single-row body holds them in registers throughout
    #[cfg(target_arch = "x86_64")]
    if shaped
        && n_kv.len() > 1
        && level.min(crate::dispatch::float_level_available()) == FloatLevel::Avx512
        && x86_64::avx512_fits(g, hd)
        && hd.dv.is_multiple_of(64)
        && kv.bounded(h0 / (hd.n_head / hd.n_head_kv), hd.dk, hd.dv)
    {
        // SAFETY: the level is at most the widest this CPU runs, so it has AVX-512 F and DQ; the
        // shapes, the row counts and the view's bounds were checked just above.
        unsafe { x86_64::attend_tile_avx512(q, n_kv, h0, g, kv, hd, round_p, scores, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = shaped;
    // one row, every other build or shape: row by row, same bits, each row reading the cache
    for (t, &n) in n_kv.iter().enumerate() {
        let view = KvView { n_kv: n, ..*kv };
        attend_heads_on(
            level,
            &q[t * qw..(t + 1) * qw],
            h0,
            g,
            &view,
            hd,
            round_p,
            scores,
            &mut out[t * ow..(t + 1) * ow],
        );
    }
}

/// Each row of `n` scores in `sc` becomes `softmax(row * scale)`, rounded through f16 when the V
/// cache is F16 (`round_p`).
fn probabilities(sc: &mut [f32], n: usize, scale: f32, round_p: bool) {
    for p in sc.chunks_exact_mut(n) {
        softmax(p, scale);
        if round_p {
            p.iter_mut().for_each(|p| *p = f16_to_f32(f32_to_f16(*p)));
        }
    }
}

/// The body of [`attend_heads`]; `AVX2` only when inlined into an AVX2 function.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_heads_body<const AVX2: bool>(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hk = h0 / (hd.n_head / hd.n_head_kv);
    let n = kv.n_kv;
    scores.resize(g * n, 0.0);
    for s in 0..kv.segments() {
        let (rows, j0, seg) = (kv.rows(s), s * kv.block, kv.k[s]);
        let krow = |j: usize| {
            let off = j * kv.k_stride + hk * hd.dk;
            &seg[off..off + hd.dk]
        };
        // Four positions at a time: four independent accumulator chains instead of one (a lone
        // dot product waits on its add latency), each chain exactly `dot`'s.
        let n4 = rows / 4 * 4;
        for j in (0..n4).step_by(4) {
            let k = [krow(j), krow(j + 1), krow(j + 2), krow(j + 3)];
            for t in 0..g {
                let qt = &q[t * hd.dk..(t + 1) * hd.dk];
                #[cfg(target_arch = "x86_64")]
                let d = if AVX2 {
                    // SAFETY: `AVX2` is only set by `attend_heads_avx2`, which needs the feature.
                    unsafe { x86_64::dot4_avx2(k, qt) }
                } else {
                    dot4(k, qt)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let d = dot4(k, qt);
                let at = t * n + j0 + j;
                scores[at..at + 4].copy_from_slice(&d);
            }
        }
        for j in n4..rows {
            for t in 0..g {
                scores[t * n + j0 + j] = dot(krow(j), &q[t * hd.dk..(t + 1) * hd.dk]);
            }
        }
    }
    probabilities(scores, n, hd.scale, round_p);
    #[cfg(target_arch = "x86_64")]
    if AVX2 && (n == 0 || kv.bounded(hk, hd.dk, hd.dv)) {
        for (t, oh) in out.chunks_exact_mut(hd.dv).enumerate() {
            // SAFETY: `AVX2` is only set by `attend_heads_avx2`, which needs the feature; every
            // V row read is inside its segment (checked above).
            unsafe { x86_64::weigh_v_avx2(&scores[t * n..(t + 1) * n], kv, hk * hd.dv, oh) };
        }
        return;
    }
    out.fill(0.0);
    for s in 0..kv.segments() {
        let j0 = s * kv.block;
        for j in 0..kv.rows(s) {
            let off = j * kv.v_stride + hk * hd.dv;
            let v = &kv.v[s][off..off + hd.dv];
            for (t, oh) in out.chunks_exact_mut(hd.dv).enumerate() {
                let p = scores[t * n + j0 + j];
                for (o, &v) in oh.iter_mut().zip(v) {
                    *o += v * p;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
