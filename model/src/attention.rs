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

/// [`dot4`] with AVX2 intrinsics: one 8-lane register per chain, lane `i` the same sums as
/// `dot`'s `acc[i]`, then `dot`'s reduction and tail; same bits.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot4_avx2(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    use core::arch::x86_64::*;
    let len = b.len();
    let a = a.map(|r| &r[..len]);
    let n8 = len / 8 * 8;
    let mut acc = [_mm256_setzero_ps(); 4];
    for c in (0..n8).step_by(8) {
        // SAFETY: c + 8 <= n8 <= len, and every row holds `len` floats.
        let vb = _mm256_loadu_ps(b.as_ptr().add(c));
        for (r, ar) in a.iter().enumerate() {
            let va = _mm256_loadu_ps(ar.as_ptr().add(c));
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(va, vb));
        }
    }
    let mut x = [[0.0f32; 8]; 4];
    for (xr, v) in x.iter_mut().zip(acc) {
        _mm256_storeu_ps(xr.as_mut_ptr(), v);
    }
    core::array::from_fn(|r| finish_dot(&x[r], a[r], b, n8))
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
    // one call per kv head: its query heads share every K and V row read
    let g = hd.n_head / hd.n_head_kv;
    for h0 in (0..hd.n_head).step_by(g) {
        attend_heads(
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
    attend_heads(qh, h, 1, kv, hd, round_p, scores, oh);
}

/// Attention of the `g` consecutive query heads `h0..h0 + g` of one token, which must share one
/// kv head (GQA groups, MLA): `q` is `g * dk` floats, `out` receives `g * dv`; `scores` is
/// scratch. Each K and V row is read once for the whole group instead of once per head; every
/// head's dot products, softmax and V sums are the same operations in the same order as for a
/// lone head, so the results are identical bit for bit.
///
/// On x86-64 CPUs with AVX2 the same code runs compiled for AVX2 (the build targets baseline
/// x86-64, i.e. SSE2): 8-lane vectors instead of 4, same operations in the same order (Rust never
/// fuses or reassociates float operations), same bits.
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
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { attend_heads_avx2(q, h0, g, kv, hd, round_p, scores, out) };
        return;
    }
    attend_heads_body::<false>(q, h0, g, kv, hd, round_p, scores, out);
}

/// [`attend_heads`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_heads_avx2(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_heads_body::<true>(q, h0, g, kv, hd, round_p, scores, out);
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
    let krow = |j: usize| {
        let off = j * kv.k_stride + hk * hd.dk;
        &kv.k[off..off + hd.dk]
    };
    // Four positions at a time: four independent accumulator chains instead of one (a lone
    // dot product waits on its add latency), each chain exactly `dot`'s.
    let n4 = n / 4 * 4;
    for j in (0..n4).step_by(4) {
        let k = [krow(j), krow(j + 1), krow(j + 2), krow(j + 3)];
        for t in 0..g {
            let qt = &q[t * hd.dk..(t + 1) * hd.dk];
            #[cfg(target_arch = "x86_64")]
            let d = if AVX2 {
                // SAFETY: `AVX2` is only set by `attend_heads_avx2`, which needs the feature.
                unsafe { dot4_avx2(k, qt) }
            } else {
                dot4(k, qt)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let d = dot4(k, qt);
            scores[t * n + j..t * n + j + 4].copy_from_slice(&d);
        }
    }
    for j in n4..n {
        for t in 0..g {
            scores[t * n + j] = dot(krow(j), &q[t * hd.dk..(t + 1) * hd.dk]);
        }
    }
    for p in scores.chunks_exact_mut(n) {
        softmax(p, hd.scale);
        if round_p {
            p.iter_mut().for_each(|p| *p = f16_to_f32(f32_to_f16(*p)));
        }
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        let base = hk * hd.dv;
        // the last V row read ends at (n - 1) * v_stride + base + dv
        if n == 0 || (n - 1) * kv.v_stride + base + hd.dv <= kv.v.len() {
            for (t, oh) in out.chunks_exact_mut(hd.dv).enumerate() {
                // SAFETY: `AVX2` is only set by `attend_heads_avx2`, which needs the feature;
                // every V row read is inside `kv.v` (checked above).
                unsafe { weigh_v_avx2(&scores[t * n..(t + 1) * n], kv.v, kv.v_stride, base, oh) };
            }
            return;
        }
    }
    out.fill(0.0);
    for j in 0..n {
        let off = j * kv.v_stride + hk * hd.dv;
        let v = &kv.v[off..off + hd.dv];
        for (t, oh) in out.chunks_exact_mut(hd.dv).enumerate() {
            let p = scores[t * n + j];
            for (o, &v) in oh.iter_mut().zip(v) {
                *o += v * p;
            }
        }
    }
}

/// `oh[e] = sum over j (in order, from 0.0) of v[j * stride + base + e] * p[j]`, 64 outputs at a
/// time kept in eight registers across all positions (the portable loop re-loads and stores
/// the outputs at every position). Same operations per output, same order, same bits.
///
/// # Safety
/// The CPU must have AVX2; `v` must hold `(p.len() - 1) * stride + base + oh.len()` floats.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn weigh_v_avx2(p: &[f32], v: &[f32], stride: usize, base: usize, oh: &mut [f32]) {
    use core::arch::x86_64::*;
    let dv = oh.len();
    let vp = v.as_ptr().add(base);
    let mut e0 = 0;
    while e0 + 64 <= dv {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pj);
            let row = vp.add(j * stride + e0);
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(row.add(8 * c)), pv));
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(oh.as_mut_ptr().add(e0 + 8 * c), *a);
        }
        e0 += 64;
    }
    while e0 + 8 <= dv {
        let mut acc = _mm256_setzero_ps();
        for (j, &pj) in p.iter().enumerate() {
            let row = vp.add(j * stride + e0);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(row), _mm256_set1_ps(pj)));
        }
        _mm256_storeu_ps(oh.as_mut_ptr().add(e0), acc);
        e0 += 8;
    }
    for (e, o) in oh.iter_mut().enumerate().skip(e0) {
        let mut acc = 0.0f32;
        for (j, &pj) in p.iter().enumerate() {
            acc += *vp.add(j * stride + e) * pj;
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    //! Grouped heads, the 4-position chains, the portable body and the AVX2 build against the
    //! plain one-head-at-a-time computation: every output bit must match.

    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// One head the plain way (the code before grouping): `dot` per position, softmax, f16
    /// rounding, then V weighted position by position into the output.
    fn reference_head(
        qh: &[f32],
        h: usize,
        kv: &KvView<'_>,
        hd: Heads,
        round_p: bool,
        oh: &mut [f32],
    ) {
        let hk = h / (hd.n_head / hd.n_head_kv);
        let mut scores: Vec<f32> = (0..kv.n_kv)
            .map(|j| {
                let off = j * kv.k_stride + hk * hd.dk;
                dot(&kv.k[off..off + hd.dk], qh)
            })
            .collect();
        softmax(&mut scores, hd.scale);
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

    #[test]
    fn groups_chains_and_avx2_give_the_bits_of_single_heads() {
        // dk 72 has a tail after the 8-wide chunks, dv 44 and 139 after the 64- and 8-wide ones;
        // n_kv values cover the 4-position remainder
        for &(n_head, n_head_kv, dk, dv) in &[
            (8, 2, 64, 64),
            (8, 1, 72, 44),
            (4, 4, 16, 16),
            (2, 1, 24, 139),
        ] {
            for &n_kv in &[1, 3, 4, 7, 33] {
                for round_p in [false, true] {
                    let hd = Heads {
                        n_head,
                        n_head_kv,
                        dk,
                        dv,
                        scale: 0.125,
                    };
                    let k = values(n_kv * n_head_kv * dk, 1 + n_kv as u32);
                    let v = values(n_kv * n_head_kv * dv, 2 + n_kv as u32);
                    let q = values(n_head * dk, 3);
                    let kv = KvView {
                        k: &k,
                        k_stride: n_head_kv * dk,
                        v: &v,
                        v_stride: n_head_kv * dv,
                        n_kv,
                    };
                    let mut scores = Vec::new();
                    let mut want = vec![0f32; n_head * dv];
                    for h in 0..n_head {
                        reference_head(
                            &q[h * dk..(h + 1) * dk],
                            h,
                            &kv,
                            hd,
                            round_p,
                            &mut want[h * dv..(h + 1) * dv],
                        );
                    }
                    // the portable body (what aarch64 runs) must give the same bits too
                    let mut portable = vec![0f32; n_head * dv];
                    let per = n_head / n_head_kv;
                    for h0 in (0..n_head).step_by(per) {
                        attend_heads_body::<false>(
                            &q[h0 * dk..(h0 + per) * dk],
                            h0,
                            per,
                            &kv,
                            hd,
                            round_p,
                            &mut scores,
                            &mut portable[h0 * dv..(h0 + per) * dv],
                        );
                    }
                    assert_eq!(bits(&portable), bits(&want), "portable body, n_kv {n_kv}");
                    let per_kv = n_head / n_head_kv;
                    let mut g = 1;
                    while g <= per_kv {
                        let mut got = vec![0f32; n_head * dv];
                        for h0 in (0..n_head).step_by(g) {
                            attend_heads(
                                &q[h0 * dk..(h0 + g) * dk],
                                h0,
                                g,
                                &kv,
                                hd,
                                round_p,
                                &mut scores,
                                &mut got[h0 * dv..(h0 + g) * dv],
                            );
                        }
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "heads {n_head}/{n_head_kv} dk {dk} n_kv {n_kv} group {g} round {round_p}"
                        );
                        g *= 2;
                    }
                    let mut all = vec![0f32; n_head * dv];
                    attend(&q, &kv, hd, round_p, &mut scores, &mut all);
                    assert_eq!(bits(&all), bits(&want), "attend, n_kv {n_kv}");
                }
            }
        }
    }
}
