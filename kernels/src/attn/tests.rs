//! Grouped heads, the 4-position chains, the portable body, each build the dispatch picks
//! (baseline, AVX2, AVX-512) and paged views (rows in blocks) against the plain
//! one-head-at-a-time computation over contiguous rows, and tiles of query rows against each row
//! alone: every output bit must match.

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

/// The portable body (what aarch64 runs) over every group of query heads sharing a kv head.
fn portable_body(
    q: &[f32],
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
) -> Vec<f32> {
    let per = hd.n_head / hd.n_head_kv;
    let mut out = vec![0f32; hd.n_head * hd.dv];
    for h0 in (0..hd.n_head).step_by(per) {
        attend_heads_body::<false>(
            &q[h0 * hd.dk..(h0 + per) * hd.dk],
            h0,
            per,
            kv,
            hd,
            round_p,
            scores,
            &mut out[h0 * hd.dv..(h0 + per) * hd.dv],
        );
    }
    out
}

/// One head the plain way (the code before grouping; `kv` is one contiguous segment): `dot` per position, softmax, f16
/// rounding, then V weighted position by position into the output.
fn reference_head(qh: &[f32], h: usize, kv: &KvView<'_>, hd: Heads, round_p: bool, oh: &mut [f32]) {
    let hk = h / (hd.n_head / hd.n_head_kv);
    let mut scores: Vec<f32> = (0..kv.n_kv)
        .map(|j| {
            let off = j * kv.k_stride + hk * hd.dk;
            dot(&kv.k[0][off..off + hd.dk], qh)
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
        for (o, &v) in oh.iter_mut().zip(&kv.v[0][off..off + hd.dv]) {
            *o += v * p;
        }
    }
}

#[test]
fn mla_views_give_the_bits_of_single_heads() {
    // absorbed MLA: one kv head whose V is the first dv floats of each K row
    let (n_head, dk, dv) = (16, 576, 512);
    let hd = Heads {
        n_head,
        n_head_kv: 1,
        dk,
        dv,
        scale: 0.07,
    };
    for &n_kv in &[1, 5, 64] {
        let k = values(n_kv * dk, 7 + n_kv as u32);
        let q = values(n_head * dk, 9);
        let ks = [&k[..]];
        let kv = KvView {
            k: &ks,
            k_stride: dk,
            v: &ks,
            v_stride: dk,
            block: n_kv,
            n_kv,
        };
        let mut want = vec![0f32; n_head * dv];
        for h in 0..n_head {
            reference_head(
                &q[h * dk..(h + 1) * dk],
                h,
                &kv,
                hd,
                false,
                &mut want[h * dv..(h + 1) * dv],
            );
        }
        let mut scores = Vec::new();
        for g in [2, 4, 8, 16] {
            let mut got = vec![0f32; n_head * dv];
            for h0 in (0..n_head).step_by(g) {
                attend_heads(
                    &q[h0 * dk..(h0 + g) * dk],
                    h0,
                    g,
                    &kv,
                    hd,
                    false,
                    &mut scores,
                    &mut got[h0 * dv..(h0 + g) * dv],
                );
            }
            assert_eq!(bits(&got), bits(&want), "n_kv {n_kv} group {g}");
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
        // Qwen3-30B-A3B's heads, and a 16-head group over one 64-wide kv head (4 pairs
        // per block, 128 outputs)
        (32, 4, 128, 128),
        (16, 1, 64, 128),
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
                let (ks, vs) = ([&k[..]], [&v[..]]);
                let kv = KvView {
                    k: &ks,
                    k_stride: n_head_kv * dk,
                    v: &vs,
                    v_stride: n_head_kv * dv,
                    block: n_kv,
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
                let portable = portable_body(&q, &kv, hd, round_p, &mut scores);
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
                    // attend_heads takes AVX-512 where it can: the AVX2 build on its own
                    #[cfg(target_arch = "x86_64")]
                    if crate::dispatch::float_level_available() >= FloatLevel::Avx2 {
                        for h0 in (0..n_head).step_by(g) {
                            // SAFETY: the CPU runs AVX2, checked just above.
                            unsafe {
                                x86_64::attend_heads_avx2(
                                    &q[h0 * dk..(h0 + g) * dk],
                                    h0,
                                    g,
                                    &kv,
                                    hd,
                                    round_p,
                                    &mut scores,
                                    &mut got[h0 * dv..(h0 + g) * dv],
                                )
                            };
                        }
                        assert_eq!(bits(&got), bits(&want), "avx2, group {g}");
                    }
                    g *= 2;
                }
                let mut all = vec![0f32; n_head * dv];
                attend(&q, &kv, hd, round_p, &mut scores, &mut all);
                assert_eq!(bits(&all), bits(&want), "attend, n_kv {n_kv}");
            }
        }
    }
}

/// Splits `rows` rows of `width` floats into segments of `block` rows (the last padded with
/// garbage rows, as a partly filled cache block holds).
fn paged(x: &[f32], width: usize, rows: usize, block: usize) -> Vec<Vec<f32>> {
    (0..rows.div_ceil(block))
        .map(|s| {
            let mut seg = x[s * block * width..((s + 1) * block).min(rows) * width].to_vec();
            seg.resize(block * width, 7.5e3);
            seg
        })
        .collect()
}

#[test]
fn paged_views_give_the_bits_of_contiguous_rows() {
    // GQA (dv 128 and 44: the 64-wide and the tail paths) and MLA (V = K prefix)
    for &(n_head, n_head_kv, dk, dv, mla) in &[
        (8, 2, 64, 128, false),
        (4, 1, 72, 44, false),
        (16, 1, 576, 512, true),
    ] {
        for &n_kv in &[1, 5, 16, 17, 40] {
            for &block in &[1, 3, 4, 16] {
                for round_p in [false, true] {
                    let hd = Heads {
                        n_head,
                        n_head_kv,
                        dk,
                        dv,
                        scale: 0.1,
                    };
                    let (kw, vw) = if mla {
                        (dk, dk)
                    } else {
                        (n_head_kv * dk, n_head_kv * dv)
                    };
                    let k = values(n_kv * kw, 11 + n_kv as u32);
                    let v = if mla { k.clone() } else { values(n_kv * vw, 5) };
                    let q = values(n_head * dk, 13);
                    let (ks, vs) = ([&k[..]], [&v[..]]);
                    let whole = KvView {
                        k: &ks,
                        k_stride: kw,
                        v: &vs,
                        v_stride: vw,
                        block: n_kv,
                        n_kv,
                    };
                    let (kp, vp) = (paged(&k, kw, n_kv, block), paged(&v, vw, n_kv, block));
                    let kr: Vec<&[f32]> = kp.iter().map(|s| &s[..]).collect();
                    let vr: Vec<&[f32]> = vp.iter().map(|s| &s[..]).collect();
                    let view = KvView {
                        k: &kr,
                        k_stride: kw,
                        v: &vr,
                        v_stride: vw,
                        block,
                        n_kv,
                    };
                    let mut scores = Vec::new();
                    let mut want = vec![0f32; n_head * dv];
                    attend(&q, &whole, hd, round_p, &mut scores, &mut want);
                    let mut got = vec![0f32; n_head * dv];
                    attend(&q, &view, hd, round_p, &mut scores, &mut got);
                    let what = format!("heads {n_head}/{n_head_kv} n_kv {n_kv} block {block}");
                    assert_eq!(bits(&got), bits(&want), "{what}");
                    let portable = portable_body(&q, &view, hd, round_p, &mut scores);
                    assert_eq!(bits(&portable), bits(&want), "portable, {what}");
                    // every build the dispatch can pick (levels above this CPU's run lower)
                    for level in [FloatLevel::Baseline, FloatLevel::Avx2, FloatLevel::Avx512] {
                        let mut at = vec![0f32; n_head * dv];
                        attend_on(level, &q, &view, hd, round_p, &mut scores, &mut at);
                        assert_eq!(bits(&at), bits(&want), "{level:?}, {what}");
                    }
                    #[cfg(target_arch = "x86_64")]
                    if crate::dispatch::float_level_available() >= FloatLevel::Avx2 {
                        let mut avx2 = vec![0f32; n_head * dv];
                        let per = n_head / n_head_kv;
                        for h0 in (0..n_head).step_by(per) {
                            // SAFETY: the CPU runs AVX2, checked just above.
                            unsafe {
                                x86_64::attend_heads_avx2(
                                    &q[h0 * dk..(h0 + per) * dk],
                                    h0,
                                    per,
                                    &view,
                                    hd,
                                    round_p,
                                    &mut scores,
                                    &mut avx2[h0 * dv..(h0 + per) * dv],
                                )
                            };
                        }
                        assert_eq!(bits(&avx2), bits(&want), "avx2, {what}");
                    }
                }
            }
        }
    }
}

#[test]
fn tiles_give_the_bits_of_each_row_alone() {
    // Qwen3's GQA heads (dv 128: the AVX-512 tile), a 44-wide dv (row by row) and MLA; tiles of
    // consecutive positions (the causal diagonal inside and across chunks) and of unrelated
    // depths, over contiguous and paged rows
    for &(n_head, n_head_kv, dk, dv, mla) in &[
        (32, 4, 128, 128, false),
        (4, 1, 72, 44, false),
        (16, 1, 576, 512, true),
    ] {
        let n = 53;
        let (kw, vw) = if mla {
            (dk, dk)
        } else {
            (n_head_kv * dk, n_head_kv * dv)
        };
        let k = values(n * kw, 21);
        let v = if mla { k.clone() } else { values(n * vw, 22) };
        let hd = Heads {
            n_head,
            n_head_kv,
            dk,
            dv,
            scale: 0.09,
        };
        let per = n_head / n_head_kv;
        for n_kv in [
            (37..=n).collect::<Vec<_>>(),
            vec![1, 2, 3],
            vec![9, 40, 1, 53, 17, 16],
            vec![53],
        ] {
            let rows = n_kv.len();
            let q = values(rows * n_head * dk, 23);
            for &block in &[16, 5, n] {
                let (kp, vp) = (paged(&k, kw, n, block), paged(&v, vw, n, block));
                let kr: Vec<&[f32]> = kp.iter().map(|s| &s[..]).collect();
                let vr: Vec<&[f32]> = vp.iter().map(|s| &s[..]).collect();
                let view = KvView {
                    k: &kr,
                    k_stride: kw,
                    v: &vr,
                    v_stride: vw,
                    block,
                    n_kv: n,
                };
                for round_p in [false, true] {
                    let mut scores = Vec::new();
                    for g in [2, per.min(8)] {
                        for h0 in (0..n_head).step_by(g) {
                            // the tile's rows: each token's heads h0..h0 + g
                            let qt: Vec<f32> = (0..rows)
                                .flat_map(|t| {
                                    let a = t * n_head * dk + h0 * dk;
                                    q[a..a + g * dk].to_vec()
                                })
                                .collect();
                            let mut want = vec![0f32; rows * g * dv];
                            for (t, &nt) in n_kv.iter().enumerate() {
                                let one = KvView { n_kv: nt, ..view };
                                attend_heads(
                                    &qt[t * g * dk..(t + 1) * g * dk],
                                    h0,
                                    g,
                                    &one,
                                    hd,
                                    round_p,
                                    &mut scores,
                                    &mut want[t * g * dv..(t + 1) * g * dv],
                                );
                            }
                            let what = format!(
                                "heads {n_head}/{n_head_kv} dv {dv} block {block} n_kv {n_kv:?} group {g} h0 {h0} round {round_p}"
                            );
                            for level in
                                [FloatLevel::Baseline, FloatLevel::Avx2, FloatLevel::Avx512]
                            {
                                let mut got = vec![f32::NAN; rows * g * dv];
                                attend_tile_on(
                                    level,
                                    &qt,
                                    &n_kv,
                                    h0,
                                    g,
                                    &view,
                                    hd,
                                    round_p,
                                    &mut scores,
                                    &mut got,
                                );
                                assert_eq!(bits(&got), bits(&want), "{level:?}, {what}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One random tile: head shape `(n_head_kv, heads per kv head, dk, dv)`, cache positions and
/// block size, group size (index into the even divisors), the rows' visible positions (a
/// prefill chunk's consecutive ones or arbitrary), f16 probabilities, data seed.
type TileCase = (
    (usize, usize, usize, usize),
    usize,
    usize,
    usize,
    Vec<usize>,
    bool,
    bool,
    u32,
);

fn tile_case() -> impl proptest::strategy::Strategy<Value = TileCase> {
    use proptest::prelude::*;
    (
        prop::sample::select(vec![
            (2, 8, 128, 128),
            (1, 4, 72, 44),
            (2, 2, 64, 64),
            (1, 8, 16, 192),
            (1, 2, 8, 64),
        ]),
        1usize..400,
        1usize..40,
        0usize..4,
        prop::collection::vec(1usize..400, 1..7),
        any::<bool>(),
        any::<bool>(),
        any::<u32>(),
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// Every build's tile (and the dispatched single row) against the portable body run on each
    /// row alone, over random depths, block sizes, group sizes, row counts and causal patterns.
    #[test]
    fn random_tiles_give_the_portable_bits_of_each_row(
        (shape, n, block, gi, rows_kv, diag, round_p, seed) in tile_case()
    ) {
        let (n_head_kv, per, dk, dv) = shape;
        let n_head = n_head_kv * per;
        let hd = Heads { n_head, n_head_kv, dk, dv, scale: 0.11 };
        let (kw, vw) = (n_head_kv * dk, n_head_kv * dv);
        let (k, v) = (values(n * kw, seed), values(n * vw, seed ^ 0x5555));
        let n_kv: Vec<usize> = if diag {
            let rows = rows_kv.len().min(n);
            (n + 1 - rows..=n).collect()
        } else {
            rows_kv.iter().map(|&x| x.min(n)).collect()
        };
        let (kp, vp) = (paged(&k, kw, n, block), paged(&v, vw, n, block));
        let kr: Vec<&[f32]> = kp.iter().map(|s| &s[..]).collect();
        let vr: Vec<&[f32]> = vp.iter().map(|s| &s[..]).collect();
        let view = KvView { k: &kr, k_stride: kw, v: &vr, v_stride: vw, block, n_kv: n };
        let gs: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|g| per % g == 0).collect();
        let g = gs[gi % gs.len()];
        let rows = n_kv.len();
        let h0 = (seed as usize % (n_head / g)) * g;
        let q = values(rows * g * dk, seed.wrapping_add(3));
        let mut scores = Vec::new();
        let mut want = vec![0f32; rows * g * dv];
        for (t, &nt) in n_kv.iter().enumerate() {
            let one = KvView { n_kv: nt, ..view };
            attend_heads_body::<false>(
                &q[t * g * dk..(t + 1) * g * dk],
                h0,
                g,
                &one,
                hd,
                round_p,
                &mut scores,
                &mut want[t * g * dv..(t + 1) * g * dv],
            );
        }
        for level in [FloatLevel::Baseline, FloatLevel::Avx2, FloatLevel::Avx512] {
            let mut got = vec![f32::NAN; rows * g * dv];
            attend_tile_on(level, &q, &n_kv, h0, g, &view, hd, round_p, &mut scores, &mut got);
            proptest::prop_assert_eq!(bits(&got), bits(&want), "{:?} tile, g {}", level, g);
            let mut one_row = vec![f32::NAN; g * dv];
            let last = rows - 1;
            let one = KvView { n_kv: n_kv[last], ..view };
            attend_heads_on(
                level,
                &q[last * g * dk..],
                h0,
                g,
                &one,
                hd,
                round_p,
                &mut scores,
                &mut one_row,
            );
            proptest::prop_assert_eq!(
                bits(&one_row),
                bits(&want[last * g * dv..]),
                "{:?} one row, g {}",
                level,
                g
            );
        }
    }
}
