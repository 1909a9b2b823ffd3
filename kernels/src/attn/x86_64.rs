//! The x86-64 builds of the attention body: AVX2 (the portable body compiled for 8-lane vectors,
//! with its dot products and V sums in intrinsics) and AVX-512 F/DQ (query heads in pairs per
//! register, every K and V load serving several heads; a prefill tile's query rows flattened into
//! those register blocks, the cache walked once per tile). Each keeps the portable body's
//! operations in its order, so all builds give the same bits; `super` picks one by
//! [`crate::dispatch::float_level`].

use super::{attend_heads_body, finish_dot, probabilities, Heads, KvView};

impl KvView<'_> {
    /// Whether every visible row of kv head `hk` (`dk` K floats, `dv` V floats each) lies inside
    /// its segment: what the unchecked SIMD paths rely on.
    pub(super) fn bounded(&self, hk: usize, dk: usize, dv: usize) -> bool {
        self.block > 0
            && self.k.len() >= self.segments()
            && self.v.len() >= self.segments()
            && (0..self.segments()).all(|s| {
                let r = self.rows(s);
                (r - 1) * self.k_stride + hk * dk + dk <= self.k[s].len()
                    && (r - 1) * self.v_stride + hk * dv + dv <= self.v[s].len()
            })
    }
}

/// [`super::dot4`] with AVX2 intrinsics: one 8-lane register per chain, lane `i` the same sums as
/// `dot`'s `acc[i]`, then `dot`'s reduction and tail; same bits.
///
/// # Safety
/// The CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot4_avx2(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
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
}

/// The shapes the AVX-512 path takes: query heads in pairs and whole 8-wide K chunks (every
/// model we serve: head_k 128 for Qwen3, 576 for MLA).
pub(super) fn avx512_fits(g: usize, hd: Heads) -> bool {
    g.is_multiple_of(2) && hd.dk.is_multiple_of(8) && hd.dk > 0
}

/// [`super::attend_heads`] with AVX-512, same bits as [`attend_heads_body`].
///
/// K.q: each dot keeps `dot`'s eight partial sums, as one 256-bit half of a zmm register: the
/// low half for query head `2i`, the high half for head `2i + 1` (the queries interleaved once per
/// call), against the K chunk broadcast to both halves, so every K load serves two heads and
/// up to 4 positions x 4 head pairs run as 16 independent chains. The halves are then folded in
/// `finish_dot`'s order. V: up to 4 heads x 64 outputs in 16 registers across all positions,
/// each V load serving every head of the block; per output the same products added in the same
/// order as the portable loop.
///
/// # Safety
/// The CPU must have AVX-512 F and DQ; `avx512_fits(g, hd)` must hold.
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_heads_avx512(
    q: &[f32],
    h0: usize,
    g: usize,
    kv: &KvView<'_>,
    hd: Heads,
    round_p: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let hk = h0 / (hd.n_head / hd.n_head_kv);
        let n = kv.n_kv;
        let (dk, dv) = (hd.dk, hd.dv);
        let nc = dk / 8;
        if n == 0 || q.len() < g * dk || out.len() < g * dv || !kv.bounded(hk, dk, dv) {
            // nothing to read, or a view the fast path cannot bound: the checked portable code
            attend_heads_body::<false>(q, h0, g, kv, hd, round_p, scores, out);
            return;
        }
        let (sc, qi) = score_rows(scores, q, g, n, dk);
        let np = g / 2;
        for s in 0..kv.segments() {
            let kb = kv.k[s].as_ptr().add(hk * dk);
            let seg = Seg {
                rows: kv.rows(s),
                j0: s * kv.block,
                n,
            };
            let mut p0 = 0;
            while p0 + 4 <= np {
                qk_pairs::<4>(
                    qi.as_ptr().add(p0 * nc * 16),
                    p0,
                    nc,
                    kb,
                    kv.k_stride,
                    seg,
                    sc,
                );
                p0 += 4;
            }
            while p0 < np {
                qk_pairs::<1>(
                    qi.as_ptr().add(p0 * nc * 16),
                    p0,
                    nc,
                    kb,
                    kv.k_stride,
                    seg,
                    sc,
                );
                p0 += 1;
            }
        }
        probabilities(sc, n, hd.scale, round_p);
        if !dv.is_multiple_of(64) {
            for (t, oh) in out[..g * dv].chunks_exact_mut(dv).enumerate() {
                weigh_v_avx2(&sc[t * n..(t + 1) * n], kv, hk * dv, oh);
            }
            return;
        }
        let op = out.as_mut_ptr();
        for e0 in (0..dv).step_by(64) {
            let mut t0 = 0;
            while t0 + 4 <= g {
                weigh_v_heads::<4>(sc, t0, kv, hk * dv, e0, op, dv);
                t0 += 4;
            }
            while t0 + 2 <= g {
                weigh_v_heads::<2>(sc, t0, kv, hk * dv, e0, op, dv);
                t0 += 2;
            }
        }
    }
}

/// Splits `scores` into the score rows of `rows` query heads over `n` positions and the queries
/// interleaved by head pairs: `qi[(pair * nc + c) * 16 ..]` holds chunk `c` of head `2 * pair`,
/// then of head `2 * pair + 1` (the layout `qk_pairs` reads).
fn score_rows<'s>(
    scores: &'s mut Vec<f32>,
    q: &[f32],
    rows: usize,
    n: usize,
    dk: usize,
) -> (&'s mut [f32], &'s mut [f32]) {
    scores.clear();
    scores.resize(rows * n + rows * dk, 0.0);
    let (sc, qi) = scores.split_at_mut(rows * n);
    for (pair, dst) in qi.chunks_exact_mut(2 * dk).enumerate() {
        for (c, d) in dst.chunks_exact_mut(16).enumerate() {
            let a = 2 * pair * dk + 8 * c;
            d[..8].copy_from_slice(&q[a..a + 8]);
            d[8..].copy_from_slice(&q[a + dk..a + dk + 8]);
        }
    }
    (sc, qi)
}

/// Positions a tile's chunk holds at most: its K rows (and then its V rows) are read by every
/// query row of the tile while they sit in L1 (16 x 128 floats of one Qwen3 kv head: 8 KiB).
const TILE_CHUNK: usize = 16;

/// [`super::attend_tile`] with AVX-512: the tile's query rows flattened to `n_kv.len() * g` rows
/// of one head each (row `t * g + h`), and [`attend_heads_avx512`]'s register blocks run over
/// them instead of one token's heads. The cache is walked chunk by chunk (at most
/// [`TILE_CHUNK`] positions, never across a segment); a chunk every row sees is scored for all
/// rows in blocks of 4 pairs, the chunks on the causal diagonal row by row over the positions
/// that row sees. V is weighed chunk by chunk too, the accumulators kept in `out` between chunks
/// (an exact f32 store and load), so each output is the same sum in the same order as
/// [`weigh_v_heads`] adds it: same bits as each row alone.
///
/// # Safety
/// The CPU must have AVX-512 F and DQ; `avx512_fits(g, hd)`, `hd.dv % 64 == 0` and
/// `kv.bounded(hk, dk, dv)` must hold; `q` holds `n_kv.len() * g * dk` floats, `out`
/// `n_kv.len() * g * dv`, and every `n_kv[t]` is in `1..=kv.n_kv`.
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_tile_avx512(
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
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, the shapes and bounds it names), which is what every
    // operation below relies on.
    unsafe {
        let hk = h0 / (hd.n_head / hd.n_head_kv);
        let n = kv.n_kv;
        let (dk, dv) = (hd.dk, hd.dv);
        let nc = dk / 8;
        let rows = n_kv.len() * g;
        let (np, pg) = (rows / 2, g / 2);
        let min_n = n_kv.iter().copied().min().unwrap_or(0);
        let (sc, qi) = score_rows(scores, q, rows, n, dk);
        // the chunks of the view: (segment, first row in it, rows, first position)
        let chunks = (0..kv.segments()).flat_map(|s| {
            let r = kv.rows(s);
            (0..r)
                .step_by(TILE_CHUNK)
                .map(move |r0| (s, r0, TILE_CHUNK.min(r - r0), s * kv.block + r0))
        });
        // pair blocks of 4, then single pairs, over pairs p0..p1 at chunk rows `seg.rows`
        let pairs = |p0: usize, p1: usize, kb: *const f32, seg: Seg, sc: &mut [f32]| {
            let mut p = p0;
            while p + 4 <= p1 {
                qk_pairs::<4>(
                    qi.as_ptr().add(p * nc * 16),
                    p,
                    nc,
                    kb,
                    kv.k_stride,
                    seg,
                    sc,
                );
                p += 4;
            }
            while p < p1 {
                qk_pairs::<1>(
                    qi.as_ptr().add(p * nc * 16),
                    p,
                    nc,
                    kb,
                    kv.k_stride,
                    seg,
                    sc,
                );
                p += 1;
            }
        };
        for (s, r0, len, j0) in chunks.clone() {
            let kb = kv.k[s].as_ptr().add(r0 * kv.k_stride + hk * dk);
            if j0 + len <= min_n {
                pairs(0, np, kb, Seg { rows: len, j0, n }, sc);
                continue;
            }
            for (t, &nt) in n_kv.iter().enumerate() {
                let seen = nt.min(j0 + len).saturating_sub(j0);
                if seen > 0 {
                    pairs(t * pg, (t + 1) * pg, kb, Seg { rows: seen, j0, n }, sc);
                }
            }
        }
        for (t, &nt) in n_kv.iter().enumerate() {
            for h in 0..g {
                let r = (t * g + h) * n;
                probabilities(&mut sc[r..r + nt], nt, hd.scale, round_p);
            }
        }
        let op = out.as_mut_ptr();
        // row blocks of 4, then pairs, over rows f0..f1 for outputs e0..e0 + 64
        let weigh = |f0: usize, f1: usize, vb: *const f32, seg: Seg, e0: usize| {
            let mut f = f0;
            while f + 4 <= f1 {
                weigh_v_rows::<4>(sc.as_ptr(), f, vb, kv.v_stride, seg, op, dv, e0);
                f += 4;
            }
            while f + 2 <= f1 {
                weigh_v_rows::<2>(sc.as_ptr(), f, vb, kv.v_stride, seg, op, dv, e0);
                f += 2;
            }
        };
        for (s, r0, len, j0) in chunks {
            let vb = kv.v[s].as_ptr().add(r0 * kv.v_stride + hk * dv);
            for e0 in (0..dv).step_by(64) {
                if j0 + len <= min_n {
                    weigh(0, rows, vb, Seg { rows: len, j0, n }, e0);
                    continue;
                }
                for (t, &nt) in n_kv.iter().enumerate() {
                    let seen = nt.min(j0 + len).saturating_sub(j0);
                    if seen > 0 {
                        weigh(t * g, (t + 1) * g, vb, Seg { rows: seen, j0, n }, e0);
                    }
                }
            }
        }
    }
}

/// Rows `f0 .. f0 + PH` of a tile, outputs `e0 .. e0 + 64`, over the `seg.rows` positions of
/// one chunk from position `seg.j0` (V rows at `vb`, `stride` apart): the accumulators start at
/// 0.0 on the first chunk (`seg.j0 == 0`) and at what `out` holds after the previous one
/// otherwise, then add `v[j][e] * p[f][j]` in position order, as [`weigh_v_heads`] does.
///
/// # Safety
/// AVX-512 F; rows `0..seg.rows` of `vb` hold `e0 + 64` floats; `out` holds `(f0 + PH) * dv`
/// floats and `sc` `(f0 + PH) * seg.n`, with `seg.j0 + seg.rows <= seg.n`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh_v_rows<const PH: usize>(
    sc: *const f32,
    f0: usize,
    vb: *const f32,
    stride: usize,
    seg: Seg,
    out: *mut f32,
    dv: usize,
    e0: usize,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        use core::arch::x86_64::*;
        let mut acc = [[_mm512_setzero_ps(); 4]; PH];
        if seg.j0 > 0 {
            for (h, a) in acc.iter_mut().enumerate() {
                for (c, ac) in a.iter_mut().enumerate() {
                    *ac = _mm512_loadu_ps(out.add((f0 + h) * dv + e0 + 16 * c));
                }
            }
        }
        let sp = sc.add(f0 * seg.n + seg.j0);
        for jj in 0..seg.rows {
            let row = vb.add(jj * stride + e0);
            let v = [
                _mm512_loadu_ps(row),
                _mm512_loadu_ps(row.add(16)),
                _mm512_loadu_ps(row.add(32)),
                _mm512_loadu_ps(row.add(48)),
            ];
            for (h, a) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(*sp.add(h * seg.n + jj));
                for (ac, &vc) in a.iter_mut().zip(&v) {
                    *ac = _mm512_add_ps(*ac, _mm512_mul_ps(vc, p));
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (c, &ac) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add((f0 + h) * dv + e0 + 16 * c), ac);
            }
        }
    }
}

/// The positions of one segment of a view: `rows` of them from position `j0`, of `n` in all
/// (the scores of head `h` at position `j` are `sc[h * n + j]`).
#[derive(Clone, Copy)]
struct Seg {
    rows: usize,
    j0: usize,
    n: usize,
}

/// Scores of head pairs `p0 .. p0 + PC` (heads `2 * p0 ..`) at the positions of one segment
/// into `sc` (`sc[h * n + j]`).
///
/// # Safety
/// AVX-512 F/DQ; `qi` holds `PC` interleaved pairs of `nc` chunks; rows `0..seg.rows` of `kb`
/// (stride `stride`) hold `8 * nc` floats each; `sc` holds `2 * (p0 + PC) * seg.n` floats and
/// `seg.j0 + seg.rows <= seg.n`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn qk_pairs<const PC: usize>(
    qi: *const f32,
    p0: usize,
    nc: usize,
    kb: *const f32,
    stride: usize,
    seg: Seg,
    sc: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let mut j = 0;
        while j + 4 <= seg.rows {
            qk_block::<PC, 4>(qi, p0, nc, kb, stride, j, seg, sc);
            j += 4;
        }
        while j < seg.rows {
            qk_block::<PC, 1>(qi, p0, nc, kb, stride, j, seg, sc);
            j += 1;
        }
    }
}

/// [`qk_pairs`] for rows `j .. j + PN` of the segment.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn qk_block<const PC: usize, const PN: usize>(
    qi: *const f32,
    p0: usize,
    nc: usize,
    kb: *const f32,
    stride: usize,
    j: usize,
    seg: Seg,
    sc: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        use core::arch::x86_64::*;
        let n = seg.n;
        let mut acc = [[_mm512_setzero_ps(); PN]; PC];
        for c in 0..nc {
            let mut k = [_mm512_setzero_ps(); PN];
            for (p, kp) in k.iter_mut().enumerate() {
                *kp = _mm512_broadcast_f32x8(_mm256_loadu_ps(kb.add((j + p) * stride + 8 * c)));
            }
            for (pc, row) in acc.iter_mut().enumerate() {
                let qv = _mm512_loadu_ps(qi.add((pc * nc + c) * 16));
                for (a, &kp) in row.iter_mut().zip(&k) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(kp, qv));
                }
            }
        }
        let jg = seg.j0 + j;
        for (pc, row) in acc.iter().enumerate() {
            let h = 2 * (p0 + pc);
            for (p, &a) in row.iter().enumerate() {
                // finish_dot on both halves: lanes i + (i + 4), then adjacent, then the two pairs
                let s = _mm512_add_ps(a, _mm512_shuffle_f32x4::<0b10_11_00_01>(a, a));
                let t = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
                let u = _mm512_add_ps(t, _mm512_permute_ps::<0b01_00_11_10>(t));
                sc[h * n + jg + p] = _mm512_cvtss_f32(u);
                sc[(h + 1) * n + jg + p] = _mm512_cvtss_f32(_mm512_shuffle_f32x4::<2>(u, u));
            }
        }
    }
}

/// Outputs `e0 .. e0 + 64` of heads `t0 .. t0 + PH`: `out[t * dv + e] = sum over j (in order,
/// from 0.0, segment after segment) of v[j][base + e] * p[t][j]`.
///
/// # Safety
/// AVX-512 F; `kv.bounded` holds for rows of `e0 + 64 <= dv` floats from `base`; `out` holds
/// `(t0 + PH) * dv` floats; `sc` holds `(t0 + PH) * kv.n_kv`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn weigh_v_heads<const PH: usize>(
    sc: &[f32],
    t0: usize,
    kv: &KvView<'_>,
    base: usize,
    e0: usize,
    out: *mut f32,
    dv: usize,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        use core::arch::x86_64::*;
        let n = kv.n_kv;
        let mut acc = [[_mm512_setzero_ps(); 4]; PH];
        let sp = sc.as_ptr().add(t0 * n);
        for s in 0..kv.segments() {
            let vb = kv.v[s].as_ptr().add(base + e0);
            let j0 = s * kv.block;
            for jj in 0..kv.rows(s) {
                let row = vb.add(jj * kv.v_stride);
                let v = [
                    _mm512_loadu_ps(row),
                    _mm512_loadu_ps(row.add(16)),
                    _mm512_loadu_ps(row.add(32)),
                    _mm512_loadu_ps(row.add(48)),
                ];
                for (h, a) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*sp.add(h * n + j0 + jj));
                    for (ac, &vc) in a.iter_mut().zip(&v) {
                        *ac = _mm512_add_ps(*ac, _mm512_mul_ps(vc, p));
                    }
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (c, &ac) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add((t0 + h) * dv + e0 + 16 * c), ac);
            }
        }
    }
}

/// [`super::attend_heads`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_heads_avx2(
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

/// `oh[e] = sum over j (in order, from 0.0, segment after segment) of v[j][base + e] * p[j]`,
/// 64 outputs at a time kept in eight registers across all positions (the portable loop
/// re-loads and stores the outputs at every position). Same operations per output, same order,
/// same bits.
///
/// # Safety
/// The CPU must have AVX2; `kv.bounded` must hold for rows of `oh.len()` floats from `base`;
/// `p` holds `kv.n_kv` probabilities.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn weigh_v_avx2(p: &[f32], kv: &KvView<'_>, base: usize, oh: &mut [f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        use core::arch::x86_64::*;
        let dv = oh.len();
        let stride = kv.v_stride;
        // every visible (segment, row) in order, with its probability
        let rows = || {
            (0..kv.segments()).flat_map(move |s| {
                let vp = kv.v[s].as_ptr().add(base);
                let j0 = s * kv.block;
                (0..kv.rows(s)).map(move |j| (vp.add(j * stride), p[j0 + j]))
            })
        };
        let mut e0 = 0;
        while e0 + 64 <= dv {
            let mut acc = [_mm256_setzero_ps(); 8];
            for s in 0..kv.segments() {
                let vp = kv.v[s].as_ptr().add(base + e0);
                let pp = &p[s * kv.block..s * kv.block + kv.rows(s)];
                for (j, &pj) in pp.iter().enumerate() {
                    let pv = _mm256_set1_ps(pj);
                    let row = vp.add(j * stride);
                    for (c, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(row.add(8 * c)), pv));
                    }
                }
            }
            for (c, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(oh.as_mut_ptr().add(e0 + 8 * c), *a);
            }
            e0 += 64;
        }
        while e0 + 8 <= dv {
            let mut acc = _mm256_setzero_ps();
            for (row, pj) in rows() {
                let r = _mm256_loadu_ps(row.add(e0));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(r, _mm256_set1_ps(pj)));
            }
            _mm256_storeu_ps(oh.as_mut_ptr().add(e0), acc);
            e0 += 8;
        }
        for (e, o) in oh.iter_mut().enumerate().skip(e0) {
            let mut acc = 0.0f32;
            for (row, pj) in rows() {
                acc += *row.add(e) * pj;
            }
            *o = acc;
        }
    }
}
