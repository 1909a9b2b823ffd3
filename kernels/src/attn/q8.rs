//! Attention of one token over a Q8_0 K/V cache, as llama.cpp computes it with `-ctk q8_0 -ctv
//! q8_0`. A quantized V cache makes llama.cpp run ggml's flash-attention path
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`; a Q8_0 cache never takes its tiled or
//! split-KV variants, which need F32/F16 K and V), so this is that path's arithmetic, not the
//! `soft_max`/`mul_mat` one of [`super::attend_heads`]:
//!
//! - K and V rows are stored per position, not transposed, quantized in blocks of 32 along the
//!   head dimension (each kv head's `dk` elements are `dk / 32` whole blocks);
//! - each query head is quantized to Q8_0 (K's `vec_dot_type`) once, and `s = K_j . q` is
//!   `ggml_vec_dot_q8_0_q8_0`, then `s * scale` plus the causal mask's 0 (masked positions are
//!   skipped, so only positions `0..n_kv` are visited, in order);
//! - online softmax per head: on a new maximum `M` the accumulator is scaled by
//!   `exp(M_old - M)` and `v` is added with weight 1, otherwise with weight `exp(s - M)`;
//!   `S = S * ms + vs`; V rows are dequantized to f32 (`dequantize_row_q8_0`, exact) and added
//!   with `ggml_vec_mad_f32` (`acc += v * w`);
//! - finally `acc *= 1 / S`.
//!
//! Every float operation is elementwise or in position order, so grouping the query heads that
//! share a kv head (each K and V row read and dequantized once for the group), the paged
//! segments and the AVX2 build (the same body compiled for 8-lane vectors) all give the same bits.

use super::{Heads, KvView};
use crate::dispatch::FloatLevel;
use crate::formats::{BlockQ8_0, QK};
use crate::scalar::legacy::{dequantize_q8_0, quantize_q8_0, vec_dot_q8_0};

/// Scratch of [`attend_heads_q8`], kept between calls by its caller.
#[derive(Default)]
pub struct Q8Scratch {
    /// The group's query heads quantized to Q8_0.
    q: Vec<BlockQ8_0>,
    /// One V row dequantized.
    v: Vec<f32>,
    /// Running maximum and sum of each head.
    m: Vec<f32>,
    s: Vec<f32>,
}

/// Whether heads of `hd` fit a Q8_0 cache: both head sizes whole blocks of 32 (what llama.cpp
/// checks before it accepts `-ctk q8_0 -ctv q8_0`).
pub fn fits(hd: Heads) -> bool {
    hd.dk > 0 && hd.dk.is_multiple_of(QK) && hd.dv.is_multiple_of(QK)
}

/// Attention of the `g` consecutive query heads `h0..h0 + g` of one token, which share one kv
/// head, over a Q8_0 view (`k_stride`, `v_stride` in blocks; with MLA the V rows are the first
/// `dv / 32` blocks of the K rows): `q` is `g * dk` floats, `out` receives `g * dv`. `fits(hd)`
/// must hold. Same bits in every build ([`crate::dispatch::float_level`]).
#[allow(clippy::too_many_arguments)]
pub fn attend_heads_q8(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_, BlockQ8_0>,
    hd: Heads,
    scratch: &mut Q8Scratch,
    out: &mut [f32],
) {
    attend_heads_q8_on(
        crate::dispatch::float_level(),
        q,
        h0,
        g,
        kv,
        hd,
        scratch,
        out,
    );
}

/// [`attend_heads_q8`] in the build `level` names, lowered to what this CPU runs (AVX-512
/// machines run the AVX2 build: the integer dots need no wider registers to stay memory-bound).
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_heads_q8_on(
    level: FloatLevel,
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_, BlockQ8_0>,
    hd: Heads,
    scratch: &mut Q8Scratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if level.min(crate::dispatch::float_level_available()) >= FloatLevel::Avx2 {
        // SAFETY: the level is at most the widest this CPU runs, so it has AVX2.
        unsafe { body_avx2(q, h0, g, kv, hd, scratch, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    body(q, h0, g, kv, hd, scratch, out);
}

/// The body compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn body_avx2(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_, BlockQ8_0>,
    hd: Heads,
    scratch: &mut Q8Scratch,
    out: &mut [f32],
) {
    body(q, h0, g, kv, hd, scratch, out);
}

/// The portable body (see the module docs for the operations and their order).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn body(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_, BlockQ8_0>,
    hd: Heads,
    scratch: &mut Q8Scratch,
    out: &mut [f32],
) {
    let hk = h0 / (hd.n_head / hd.n_head_kv);
    let (dv, bk, bv) = (hd.dv, hd.dk / QK, hd.dv / QK);
    let zero = BlockQ8_0 {
        d: [0; 2],
        qs: [0; QK],
    };
    let Q8Scratch {
        q: qq,
        v: v32,
        m,
        s,
    } = scratch;
    qq.clear();
    qq.resize(g * bk, zero);
    for (x, y) in q.chunks_exact(hd.dk).zip(qq.chunks_exact_mut(bk)).take(g) {
        quantize_q8_0(x, y);
    }
    v32.clear();
    v32.resize(dv, 0.0);
    m.clear();
    m.resize(g, f32::NEG_INFINITY);
    s.clear();
    s.resize(g, 0.0);
    let out = &mut out[..g * dv];
    out.fill(0.0);
    for seg in 0..kv.segments() {
        let (ks, vs) = (kv.k[seg], kv.v[seg]);
        for j in 0..kv.rows(seg) {
            let ko = j * kv.k_stride + hk * bk;
            let krow = &ks[ko..ko + bk];
            let vo = j * kv.v_stride + hk * bv;
            dequantize_q8_0(&vs[vo..vo + bv], v32);
            for (t, acc) in out.chunks_exact_mut(dv).enumerate() {
                // the mask adds 0.0 to a visible position's score
                let sc = vec_dot_q8_0(krow, &qq[t * bk..(t + 1) * bk]) * hd.scale + 0.0;
                let old = m[t];
                let (mut ms, mut w) = (1.0f32, 1.0f32);
                if sc > old {
                    m[t] = sc;
                    ms = (old - sc).exp();
                    acc.iter_mut().for_each(|a| *a *= ms);
                } else {
                    w = (sc - old).exp();
                }
                for (a, &v) in acc.iter_mut().zip(v32.iter()) {
                    *a += v * w;
                }
                s[t] = s[t] * ms + w;
            }
        }
    }
    for (acc, &sum) in out.chunks_exact_mut(dv).zip(s.iter()) {
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        acc.iter_mut().for_each(|a| *a *= inv);
    }
}

#[cfg(test)]
mod tests {
    //! Grouped heads, paged segments and every build against one head at a time over contiguous
    //! rows written out the plain way; and the Q8_0 result against f32 attention.

    use super::*;
    use crate::formats::BlockQ8_0;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        crate::rng::SplitMix64::new(seed).signed_units(len)
    }

    fn quantized(x: &[f32]) -> Vec<BlockQ8_0> {
        let mut b = vec![
            BlockQ8_0 {
                d: [0; 2],
                qs: [0; QK]
            };
            x.len() / QK
        ];
        quantize_q8_0(x, &mut b);
        b
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// One head, written out as ggml's loop: quantize q, then per position dot, online softmax,
    /// V dequantized and added; contiguous rows.
    fn reference_head(
        qh: &[f32],
        h: usize,
        k: &[BlockQ8_0],
        v: &[BlockQ8_0],
        n_kv: usize,
        hd: Heads,
        oh: &mut [f32],
    ) {
        let hk = h / (hd.n_head / hd.n_head_kv);
        let (bk, bv) = (hd.dk / QK, hd.dv / QK);
        let qq = quantized(qh);
        let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
        let mut v32 = vec![0f32; hd.dv];
        oh.fill(0.0);
        for j in 0..n_kv {
            let ko = (j * hd.n_head_kv + hk) * bk;
            let mut sc = vec_dot_q8_0(&k[ko..ko + bk], &qq);
            sc *= hd.scale;
            sc += 0.0;
            let mold = m;
            let mut ms = 1.0f32;
            let mut vs = 1.0f32;
            if sc > m {
                m = sc;
                ms = (mold - m).exp();
                for o in oh.iter_mut() {
                    *o *= ms;
                }
            } else {
                vs = (sc - m).exp();
            }
            let vo = (j * hd.n_head_kv + hk) * bv;
            dequantize_q8_0(&v[vo..vo + bv], &mut v32);
            for (o, &x) in oh.iter_mut().zip(&v32) {
                *o += x * vs;
            }
            s = s * ms + vs;
        }
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        for o in oh.iter_mut() {
            *o *= inv;
        }
    }

    #[test]
    fn groups_segments_and_builds_give_the_bits_of_single_heads() {
        for &(n_head, n_head_kv, dk, dv) in &[(4, 2, 64, 64), (8, 1, 128, 128), (32, 4, 128, 128)] {
            for &n_kv in &[1, 5, 16, 37] {
                let hd = Heads {
                    n_head,
                    n_head_kv,
                    dk,
                    dv,
                    scale: 0.125,
                };
                let k = quantized(&values(n_kv * n_head_kv * dk, 1 + n_kv as u64));
                let v = quantized(&values(n_kv * n_head_kv * dv, 2 + n_kv as u64));
                let q = values(n_head * dk, 3);
                let mut want = vec![0f32; n_head * dv];
                for h in 0..n_head {
                    let (qh, oh) = (&q[h * dk..(h + 1) * dk], &mut want[h * dv..(h + 1) * dv]);
                    reference_head(qh, h, &k, &v, n_kv, hd, oh);
                }
                let (kst, vst) = (n_head_kv * dk / QK, n_head_kv * dv / QK);
                for block in [n_kv, 4, 16] {
                    // segments of `block` positions; the last one padded with other rows
                    let pad = |x: &[BlockQ8_0], st: usize| -> Vec<Vec<BlockQ8_0>> {
                        (0..n_kv.div_ceil(block))
                            .map(|s| {
                                let mut seg =
                                    x[s * block * st..x.len().min((s + 1) * block * st)].to_vec();
                                seg.resize(block * st, x[0]);
                                seg
                            })
                            .collect()
                    };
                    let (kp, vp) = (pad(&k, kst), pad(&v, vst));
                    let ks: Vec<&[BlockQ8_0]> = kp.iter().map(|s| &s[..]).collect();
                    let vs: Vec<&[BlockQ8_0]> = vp.iter().map(|s| &s[..]).collect();
                    let view = KvView {
                        k: &ks,
                        k_stride: kst,
                        v: &vs,
                        v_stride: vst,
                        block,
                        n_kv,
                    };
                    let per = n_head / n_head_kv;
                    let mut scratch = Q8Scratch::default();
                    for level in [FloatLevel::Baseline, FloatLevel::Avx2, FloatLevel::Avx512] {
                        let mut g = 1;
                        while g <= per {
                            let mut got = vec![0f32; n_head * dv];
                            for h0 in (0..n_head).step_by(g) {
                                attend_heads_q8_on(
                                    level,
                                    &q[h0 * dk..(h0 + g) * dk],
                                    h0,
                                    g,
                                    &view,
                                    hd,
                                    &mut scratch,
                                    &mut got[h0 * dv..(h0 + g) * dv],
                                );
                            }
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "heads {n_head}/{n_head_kv} n_kv {n_kv} block {block} \
                                 group {g} {level:?}"
                            );
                            g *= 2;
                        }
                    }
                }
            }
        }
    }

    /// MLA: one kv head whose V rows are the first `dv / 32` blocks of the K rows.
    #[test]
    fn mla_view_reads_v_from_the_k_rows() {
        let (n_head, dk, dv, n_kv) = (4, 160, 128, 9);
        let hd = Heads {
            n_head,
            n_head_kv: 1,
            dk,
            dv,
            scale: 0.1,
        };
        let k = quantized(&values(n_kv * dk, 7));
        let v: Vec<BlockQ8_0> = k
            .chunks_exact(dk / QK)
            .flat_map(|r| r[..dv / QK].to_vec())
            .collect();
        let q = values(n_head * dk, 8);
        let mut want = vec![0f32; n_head * dv];
        for h in 0..n_head {
            let (qh, oh) = (&q[h * dk..(h + 1) * dk], &mut want[h * dv..(h + 1) * dv]);
            reference_head(qh, h, &k, &v, n_kv, hd, oh);
        }
        let ks = [&k[..]];
        let view = KvView {
            k: &ks,
            k_stride: dk / QK,
            v: &ks,
            v_stride: dk / QK,
            block: n_kv,
            n_kv,
        };
        let mut got = vec![0f32; n_head * dv];
        attend_heads_q8(
            &q,
            0,
            n_head,
            &view,
            hd,
            &mut Q8Scratch::default(),
            &mut got,
        );
        assert_eq!(bits(&got), bits(&want));
    }

    /// The quantized cache is attention: close to the f32 softmax(K.q) V of the same rows.
    #[test]
    fn close_to_f32_attention() {
        let (n_head, n_head_kv, d, n_kv) = (4, 2, 64, 23);
        let hd = Heads {
            n_head,
            n_head_kv,
            dk: d,
            dv: d,
            scale: 0.125,
        };
        let kf = values(n_kv * n_head_kv * d, 11);
        let vf = values(n_kv * n_head_kv * d, 12);
        let q = values(n_head * d, 13);
        let (kq, vq) = (quantized(&kf), quantized(&vf));
        let (ks, vs) = ([&kq[..]], [&vq[..]]);
        let view = KvView {
            k: &ks,
            k_stride: n_head_kv * d / QK,
            v: &vs,
            v_stride: n_head_kv * d / QK,
            block: n_kv,
            n_kv,
        };
        let mut got = vec![0f32; n_head * d];
        let mut scratch = Q8Scratch::default();
        for h0 in (0..n_head).step_by(2) {
            let (qg, og) = (&q[h0 * d..(h0 + 2) * d], &mut got[h0 * d..(h0 + 2) * d]);
            attend_heads_q8(qg, h0, 2, &view, hd, &mut scratch, og);
        }
        let (kfs, vfs) = ([&kf[..]], [&vf[..]]);
        let fview = KvView {
            k: &kfs,
            k_stride: n_head_kv * d,
            v: &vfs,
            v_stride: n_head_kv * d,
            block: n_kv,
            n_kv,
        };
        let mut want = vec![0f32; n_head * d];
        super::super::attend(&q, &fview, hd, false, &mut Vec::new(), &mut want);
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |w, (a, b)| w.max((a - b).abs()));
        assert!(worst < 2e-2, "q8_0 attention {worst} away from f32");
        assert!(worst > 0.0, "q8_0 rounding should move something");
    }
}
