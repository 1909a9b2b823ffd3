//! The x86-64 builds of the attention body: AVX2 (the portable body compiled for 8-lane vectors,
//! with its dot products and V sums in intrinsics) and AVX-512 F/DQ (query heads in pairs per
//! register, every K and V load serving several heads; a prefill tile's query rows flattened into
//! those register blocks, the cache walked once per tile; a decode row is a tile of one row).
//! Each keeps the portable body's operations in its order, so all builds give the same bits;
//! `super` picks one by [`crate::dispatch::float_level`].

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

/// [`super::attend_heads`] with AVX-512, same bits as [`attend_heads_body`]: the one-row case
/// of [`attend_tile_avx512`] when `dv` is a multiple of 64 (every model we serve), else the K.q
/// part of the tile body per segment and V weighed by [`weigh_v_avx2`].
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
        if n == 0 || q.len() < g * dk || out.len() < g * dv || !kv.bounded(hk, dk, dv) {
            // nothing to read, or a view the fast path cannot bound: the checked portable code
            attend_heads_body::<false>(q, h0, g, kv, hd, round_p, scores, out);
            return;
        }
        if dv.is_multiple_of(64) {
            attend_tile_avx512(q, &[n], h0, g, kv, hd, round_p, scores, out);
            return;
        }
        let nc = dk / 8;
        let (sc, qi, stride) = score_rows(scores, q, g, n, dk);
        for s in 0..kv.segments() {
            let kb = kv.k[s].as_ptr().add(hk * dk);
            let seg = Seg {
                rows: kv.rows(s),
                j0: s * kv.block,
                stride,
            };
            qk_pairs(qi, 0, g / 2, nc, kb, kv.k_stride, seg, sc);
        }
        for (t, oh) in out[..g * dv].chunks_exact_mut(dv).enumerate() {
            let p = &mut sc[t * stride..t * stride + n];
            probabilities(p, n, hd.scale, round_p);
            weigh_v_avx2(p, kv, hk * dv, oh);
        }
    }
}

/// Row stride of a score block over `n` positions: whole 64-byte lines, an odd number of them,
/// so the rows of a tile never share a cache set (at 16,384 positions unpadded rows are 64 KiB
/// apart, the L2's way size: a tile's 32 rows fought over one 16-way set).
fn score_stride(n: usize) -> usize {
    16 * (n.div_ceil(16) | 1)
}

/// Splits `scores` into the score rows of `rows` query heads over `n` positions (row `r` at
/// `r * stride`, 64-byte aligned; returned with the stride) and the queries interleaved by head
/// pairs: `qi[(pair * nc + c) * 16 ..]` holds chunk `c` of head `2 * pair`, then of head
/// `2 * pair + 1` (the layout `qk_pairs` reads). The scores are not cleared: every one read
/// later is written first.
fn score_rows<'s>(
    scores: &'s mut Vec<f32>,
    q: &[f32],
    rows: usize,
    n: usize,
    dk: usize,
) -> (&'s mut [f32], &'s [f32], usize) {
    let stride = score_stride(n);
    let need = rows * stride + rows * dk;
    if scores.len() < need + 16 {
        scores.resize(need + 16, 0.0);
    }
    let off = scores.as_ptr().align_offset(64).min(16);
    let (sc, qi) = scores[off..off + need].split_at_mut(rows * stride);
    for (pair, dst) in qi.chunks_exact_mut(2 * dk).enumerate() {
        for (c, d) in dst.chunks_exact_mut(16).enumerate() {
            let a = 2 * pair * dk + 8 * c;
            d[..8].copy_from_slice(&q[a..a + 8]);
            d[8..].copy_from_slice(&q[a + dk..a + dk + 8]);
        }
    }
    (sc, qi, stride)
}

/// Positions a tile's V chunk holds at most: the chunk's V rows of one kv head (32 KiB for
/// Qwen3's 128-wide heads) stay in L1 while every row block of the tile weighs them, and the
/// accumulators go through `out` once per chunk.
const V_CHUNK: usize = 64;

/// A run of consecutive positions inside one segment: `rows` rows from row `r0` of segment
/// `s`, the first at position `j0`.
#[derive(Clone, Copy)]
struct Piece {
    s: usize,
    r0: usize,
    rows: usize,
    j0: usize,
}

/// The view's positions as pieces of at most `most` positions (never across a segment), in
/// order, and the ends of the chunks grouping them: whole pieces of at most `most` positions
/// each (`ends[c]` is one past the last piece of chunk `c`).
fn pieces(kv: &KvView<'_>, most: usize) -> (Vec<Piece>, Vec<usize>) {
    let (mut ps, mut ends) = (Vec::new(), Vec::new());
    let mut in_chunk = 0;
    for s in 0..kv.segments() {
        let r = kv.rows(s);
        for r0 in (0..r).step_by(most) {
            let rows = most.min(r - r0);
            if in_chunk + rows > most {
                ends.push(ps.len());
                in_chunk = 0;
            }
            ps.push(Piece {
                s,
                r0,
                rows,
                j0: s * kv.block + r0,
            });
            in_chunk += rows;
        }
    }
    if !ps.is_empty() {
        ends.push(ps.len());
    }
    (ps, ends)
}

/// [`super::attend_tile`] with AVX-512: the tile's query rows flattened to `n_kv.len() * g` rows
/// of one head each (row `t * g + h`), scored by [`qk_pairs`]'s register blocks piece by piece
/// of the cache (a piece every row sees for all rows, a piece on the causal diagonal row by row
/// over the positions that row sees), each row's softmax, then V weighed chunk by chunk of
/// [`V_CHUNK`] positions, the accumulators kept in `out` between chunks (an exact f32 store and
/// load), so each output is the same sum in the same order as the portable loop adds it: same
/// bits as each row alone. Each K and V row is read once per tile.
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
        let (sc, qi, stride) = score_rows(scores, q, rows, n, dk);
        let (ps, ends) = pieces(kv, V_CHUNK);
        let krows = |p: &Piece| kv.k[p.s].as_ptr().add(p.r0 * kv.k_stride + hk * dk);
        for (i, p) in ps.iter().enumerate() {
            let kb = krows(p);
            if let Some(next) = ps.get(i + 1) {
                prefetch_rows::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    krows(next),
                    next.rows,
                    kv.k_stride,
                    dk,
                );
            }
            let (j0, len) = (p.j0, p.rows);
            if j0 + len <= min_n {
                qk_pairs(
                    qi,
                    0,
                    np,
                    nc,
                    kb,
                    kv.k_stride,
                    Seg {
                        rows: len,
                        j0,
                        stride,
                    },
                    sc,
                );
                continue;
            }
            for (t, &nt) in n_kv.iter().enumerate() {
                let seen = nt.min(j0 + len).saturating_sub(j0);
                if seen > 0 {
                    let seg = Seg {
                        rows: seen,
                        j0,
                        stride,
                    };
                    qk_pairs(qi, t * pg, (t + 1) * pg, nc, kb, kv.k_stride, seg, sc);
                }
            }
        }
        for (t, &nt) in n_kv.iter().enumerate() {
            for h in 0..g {
                let r = (t * g + h) * stride;
                probabilities(&mut sc[r..r + nt], nt, hd.scale, round_p);
            }
        }
        let op = out.as_mut_ptr();
        let sp = sc.as_ptr();
        // the V rows of each piece, and a chunk's pieces cut at what one row sees
        let vrows: Vec<VRows> = ps
            .iter()
            .map(|p| VRows {
                v: kv.v[p.s].as_ptr().add(p.r0 * kv.v_stride + hk * dv),
                rows: p.rows,
                j0: p.j0,
            })
            .collect();
        let mut cut: Vec<VRows> = Vec::new();
        let mut first = 0;
        for (ci, &end) in ends.iter().enumerate() {
            let chunk = &vrows[first..end];
            first = end;
            let after = ends.get(ci + 1).copied().unwrap_or(end);
            for c in &vrows[end..after] {
                prefetch_rows::<{ core::arch::x86_64::_MM_HINT_T1 }>(c.v, c.rows, kv.v_stride, dv);
            }
            let last = chunk.last().map_or(0, |c| c.j0 + c.rows);
            for e0 in (0..dv).step_by(64) {
                let ctx = VCtx {
                    sc: sp,
                    stride,
                    vstride: kv.v_stride,
                    out: op,
                    dv,
                    e0,
                };
                if last <= min_n {
                    weigh_rows(ctx, 0, rows, chunk);
                    continue;
                }
                for (t, &nt) in n_kv.iter().enumerate() {
                    cut.clear();
                    cut.extend(chunk.iter().filter(|c| c.j0 < nt).map(|c| VRows {
                        rows: c.rows.min(nt - c.j0),
                        ..*c
                    }));
                    if !cut.is_empty() {
                        weigh_rows(ctx, t * g, (t + 1) * g, &cut);
                    }
                }
            }
        }
    }
}

/// Asks for `rows` rows of `floats` floats from `p` (`stride` apart) to be brought into the
/// cache level `HINT` names while the current piece is computed: a paged cache's next block is
/// another allocation, which the hardware prefetchers do not foresee. The addresses are only
/// computed (`wrapping_add`), never dereferenced.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn prefetch_rows<const HINT: i32>(p: *const f32, rows: usize, stride: usize, floats: usize) {
    use core::arch::x86_64::_mm_prefetch;
    for r in 0..rows {
        let row = p.wrapping_add(r * stride);
        for e in (0..floats).step_by(16) {
            _mm_prefetch::<HINT>(row.wrapping_add(e) as *const i8);
        }
    }
}

/// V rows of one piece: `rows` rows from `v` (one kv head's first output), from position `j0`.
#[derive(Clone, Copy)]
struct VRows {
    v: *const f32,
    rows: usize,
    j0: usize,
}

/// What [`weigh_v_rows`] reads and writes besides its rows: the score rows (`stride` apart),
/// the V row stride, the outputs (`dv` per row) and the first of the 64 outputs it computes.
#[derive(Clone, Copy)]
struct VCtx {
    sc: *const f32,
    stride: usize,
    vstride: usize,
    out: *mut f32,
    dv: usize,
    e0: usize,
}

/// [`weigh_v_rows`] over rows `f0..f1` in blocks of 4, then pairs.
///
/// # Safety
/// As [`weigh_v_rows`] for every block.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn weigh_rows(ctx: VCtx, f0: usize, f1: usize, chunk: &[VRows]) {
    // SAFETY: the caller upholds this function's contract, which is what the calls rely on.
    unsafe {
        let mut f = f0;
        while f + 4 <= f1 {
            weigh_v_rows::<4>(ctx, f, chunk);
            f += 4;
        }
        while f + 2 <= f1 {
            weigh_v_rows::<2>(ctx, f, chunk);
            f += 2;
        }
    }
}

/// Rows `f0 .. f0 + PH` of a tile, outputs `e0 .. e0 + 64`, over the positions of one chunk's
/// pieces in order: the accumulators start at 0.0 on the view's first position and at what
/// `out` holds after the previous chunk otherwise, then add `v[j][e] * p[f][j]` in position
/// order, as the portable loop does.
///
/// # Safety
/// AVX-512 F; every piece's rows hold `e0 + 64` floats from `v`, `vstride` apart; `out` holds
/// `(f0 + PH) * dv` floats and `sc` `(f0 + PH) * stride`, with every piece's positions inside
/// its row; the pieces are consecutive positions.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn weigh_v_rows<const PH: usize>(ctx: VCtx, f0: usize, chunk: &[VRows]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        use core::arch::x86_64::*;
        let VCtx {
            sc,
            stride,
            vstride,
            out,
            dv,
            e0,
        } = ctx;
        let mut acc = [[_mm512_setzero_ps(); 4]; PH];
        if chunk.first().is_some_and(|c| c.j0 > 0) {
            for (h, a) in acc.iter_mut().enumerate() {
                for (c, ac) in a.iter_mut().enumerate() {
                    *ac = _mm512_loadu_ps(out.add((f0 + h) * dv + e0 + 16 * c));
                }
            }
        }
        for piece in chunk {
            let sp = sc.add(f0 * stride + piece.j0);
            let vb = piece.v.add(e0);
            for jj in 0..piece.rows {
                let row = vb.add(jj * vstride);
                let v = [
                    _mm512_loadu_ps(row),
                    _mm512_loadu_ps(row.add(16)),
                    _mm512_loadu_ps(row.add(32)),
                    _mm512_loadu_ps(row.add(48)),
                ];
                for (h, a) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*sp.add(h * stride + jj));
                    for (ac, &vc) in a.iter_mut().zip(&v) {
                        *ac = _mm512_add_ps(*ac, _mm512_mul_ps(vc, p));
                    }
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

/// The positions of one piece: `rows` of them from position `j0`; the scores of head `h` at
/// position `j` are `sc[h * stride + j]`.
#[derive(Clone, Copy)]
struct Seg {
    rows: usize,
    j0: usize,
    stride: usize,
}

/// Scores of head pairs `p0 .. p1` (heads `2 * p0 ..`) at the positions of one piece into
/// `sc`: blocks of 4 pairs, then single pairs.
///
/// # Safety
/// AVX-512 F/DQ; `qi` holds the interleaved pairs up to `p1`, `nc` chunks each; rows
/// `0..seg.rows` of `kb` (`stride` apart) hold `8 * nc` floats each; `sc` holds
/// `2 * p1 * seg.stride` floats and `seg.j0 + seg.rows <= seg.stride`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn qk_pairs(
    qi: &[f32],
    p0: usize,
    p1: usize,
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
        let qp = |p: usize| qi.as_ptr().add(p * nc * 16);
        let mut p = p0;
        while p + 4 <= p1 {
            qk_rows::<4>(qp(p), p, nc, kb, stride, seg, sc);
            p += 4;
        }
        while p < p1 {
            qk_rows::<1>(qp(p), p, nc, kb, stride, seg, sc);
            p += 1;
        }
    }
}

/// Scores of head pairs `p0 .. p0 + PC` at the positions of one piece, 4 positions at a time.
///
/// # Safety
/// As [`qk_pairs`] with `p1 = p0 + PC`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn qk_rows<const PC: usize>(
    qi: *const f32,
    p0: usize,
    nc: usize,
    kb: *const f32,
    stride: usize,
    seg: Seg,
    sc: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract, which is what the calls rely on.
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

/// [`qk_rows`] for rows `j .. j + PN` of the piece. K.q: each dot keeps `dot`'s eight partial
/// sums, as one 256-bit half of a zmm register: the low half for query head `2i`, the high half
/// for head `2i + 1`, against the K chunk broadcast to both halves, so every K load serves two
/// heads and up to 4 positions x 4 head pairs run as 16 independent chains. The halves are then
/// folded in `finish_dot`'s order: for a full block by [`fold4`], four registers at a time,
/// otherwise one register at a time.
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
        let ss = seg.stride;
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
        if PN == 4 && PC.is_multiple_of(2) {
            debug_assert!(2 * (p0 + PC) * ss <= sc.len() && jg + 4 <= ss);
            let d = sc.as_mut_ptr();
            for pc in (0..PC).step_by(2) {
                let f = fold4(&acc[pc], &acc[pc + 1]);
                let at = |k: usize| d.add((2 * (p0 + pc) + k) * ss + jg);
                _mm_storeu_ps(at(0), _mm512_extractf32x4_ps::<0>(f));
                _mm_storeu_ps(at(1), _mm512_extractf32x4_ps::<1>(f));
                _mm_storeu_ps(at(2), _mm512_extractf32x4_ps::<2>(f));
                _mm_storeu_ps(at(3), _mm512_extractf32x4_ps::<3>(f));
            }
            return;
        }
        for (pc, row) in acc.iter().enumerate() {
            let h = 2 * (p0 + pc);
            for (p, &a) in row.iter().enumerate() {
                // finish_dot on both halves: lanes i + (i + 4), then adjacent, then the two pairs
                let s = _mm512_add_ps(a, _mm512_shuffle_f32x4::<0b10_11_00_01>(a, a));
                let t = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
                let u = _mm512_add_ps(t, _mm512_permute_ps::<0b01_00_11_10>(t));
                sc[h * ss + jg + p] = _mm512_cvtss_f32(u);
                sc[(h + 1) * ss + jg + p] = _mm512_cvtss_f32(_mm512_shuffle_f32x4::<2>(u, u));
            }
        }
    }
}

/// `finish_dot`'s fold of 16 dots at once: `x[p]` and `y[p]` hold the eight partial sums of
/// two heads each (one per 256-bit half) at position `p` of 4; the result holds, per 128-bit
/// block, one head's 4 dots in position order (blocks: the heads of `x`, then those of `y`).
/// The same additions as `finish_dot`, each with the same operands in the same order, done
/// for 4 registers per instruction by transposing as it folds: `a[i] + a[i + 4]`, then
/// `(a0 + a4) + (a1 + a5)` and `(a2 + a6) + (a3 + a7)`, then their sum.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn fold4(
    x: &[core::arch::x86_64::__m512],
    y: &[core::arch::x86_64::__m512],
) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    // per position: [x head 0 a0..a3, x head 1 a0..a3, y head 0 a0..a3, y head 1 a0..a3] plus
    // the same blocks' a4..a7
    let s: [__m512; 4] = core::array::from_fn(|p| {
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(x[p], y[p]);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(x[p], y[p]);
        _mm512_add_ps(lo, hi)
    });
    // per block: [s0 + s1, s2 + s3] of position p, then of position p + 1
    let w: [__m512; 2] = core::array::from_fn(|i| {
        let (a, b) = (s[2 * i], s[2 * i + 1]);
        let even = _mm512_shuffle_ps::<0b10_00_10_00>(a, b);
        let odd = _mm512_shuffle_ps::<0b11_01_11_01>(a, b);
        _mm512_add_ps(even, odd)
    });
    let even = _mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]);
    let odd = _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]);
    _mm512_add_ps(even, odd)
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
