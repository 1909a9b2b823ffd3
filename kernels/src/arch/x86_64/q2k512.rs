//! Q2_K x Q8_K for the AVX-512-VNNI tier, 8 weight rows per tile, 512-bit throughout.
//!
//! The reference (`ggml_vec_dot_q2_K_q8_K_generic`) reduces each block to two exact integers
//! (`isum = sum of scale * w * q`, `summs = sum of bsums * min`) before any float work, so no
//! lane split is needed and the values stay in their stored order. One 64-byte load holds the
//! whole `qs`; shift `2j` of it gives 64 values whose four 16-byte lanes are the sub-blocks
//! `2j, 2j+1, 8+2j, 9+2j`. The scale is folded into the weight bytes before the multiply: a
//! per-block table holds `w * scale` (at most 45, still u8) for every sub-block and each 2-bit
//! value is looked up in its sub-block's row of that table, so one `vpdpbusd` per 64 values
//! yields `scale * w * q` sums. With AVX512-VBMI the table is built with byte operations and
//! the lookup is one `vpermb` over all 64 table bytes (index `4 * sub-block + w`); without it,
//! a `vpmulld` builds the table and `vpermd` + `vpshufb` look it up (module `base`; `vbmi` is
//! the same code compiled with VBMI). The activations are packed once per call into the
//! matching order (`q[32j..32j+32] ++ q[128+32j..128+32j+32]`).
//!
//! Rows go in pairs: the two rows' 16-lane `isum` partials are folded into one vector (row `2p`
//! in lanes 0..8, `2p + 1` in 8..16) and their mins share one `vpmaddwd` against the bsums, so
//! per (tile, activation block) a transposing reduction of 4 + 4 vectors gives every row's
//! `isum` and `summs` as lanes, and the float step `sumf += dall * isum - dmin * summs` runs
//! with one lane per row, in the reference order. Batches up to 4 decode each block once into
//! registers and run it against all their activation rows (nothing stored); larger ones store
//! the decoded tile and reload it per activation row.

use super::kblock::{block_bytes, Q2, Q8K_BYTES};

/// Bytes of one Q2_K block: scales[16], qs[64], d, dmin.
const BLOCK: usize = block_bytes(Q2);
/// Weight rows per tile.
const TILE: usize = 8;
/// Activation rows whose float state a tile keeps at once.
const JCHUNK: usize = 64;
/// Batches up to this size take the fused path (decode and multiply at once, nothing stored).
const FUSED_MAX: usize = 4;
/// Where row `r`'s `d | dmin << 16` word goes so that the reduction's lanes line up (see
/// `reduce`): lanes `4g + 2k` (isum) and `4g + 2k + 1` (summs) belong to row `SLOT[2g + k]`
/// (the permutation is its own inverse).
const SLOT: [usize; TILE] = [0, 2, 1, 3, 4, 6, 5, 7];
/// The `sumf` lane holding row `r`'s result.
const LANE: [usize; TILE] = [0, 4, 2, 6, 8, 12, 10, 14];

/// Packs `blocks` Q8_K blocks' quants into the Q2_K order above (256 bytes each).
///
/// # Safety
/// `x` must be valid for `blocks * Q8K_BYTES` bytes and `out` for `blocks * 256` bytes; the CPU
/// must have AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack(x: *const u8, blocks: usize, out: *mut u8) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        use core::arch::x86_64::*;
        for i in 0..blocks {
            let src = x.add(i * Q8K_BYTES + 4);
            let dst = out.add(i * 256);
            for j in 0..4 {
                let lo = _mm256_loadu_si256(src.add(32 * j) as *const __m256i);
                let hi = _mm256_loadu_si256(src.add(128 + 32 * j) as *const __m256i);
                _mm256_storeu_si256(dst.add(64 * j) as *mut __m256i, lo);
                _mm256_storeu_si256(dst.add(64 * j + 32) as *mut __m256i, hi);
            }
        }
    }
}

/// The kernel, compiled once per feature set (`$vbmi` picks the table lookup).
macro_rules! q2k_kernel {
    ($feat:literal, $vbmi:literal) => {
        use core::arch::x86_64::*;

        use super::super::kblock::{rd_f32, Q8K_BYTES};
        use super::{BLOCK, FUSED_MAX, JCHUNK, LANE, SLOT, TILE};

        /// `f(sub-block)` in every dword of each 16-byte lane of shift `j`'s values: lane `L`
        /// holds sub-block `8 * (L / 2) + 2j + L % 2`.
        #[inline]
        #[target_feature(enable = $feat)]
        fn sub_blocks(j: usize, f: impl Fn(i32) -> i32) -> __m512i {
            let s = 2 * j as i32;
            let (a, b, c, d) = (f(s), f(s + 1), f(8 + s), f(9 + s));
            _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
        }

        /// One row's block at `b`: the 4 scaled value vectors, the raw 16 scale bytes and the
        /// `d | dmin << 16` word.
        ///
        /// # Safety
        /// `b` must start a readable Q2_K block; the CPU must have the module's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_row(b: *const u8) -> ([__m512i; 4], __m128i, i32) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let m3 = _mm512_set1_epi8(3);
                let sc = _mm_loadu_si128(b as *const __m128i);
                let qs = _mm512_loadu_si512(b.add(16) as *const __m512i);
                let vals = [
                    qs,
                    _mm512_srli_epi16::<2>(qs),
                    _mm512_srli_epi16::<4>(qs),
                    _mm512_srli_epi16::<6>(qs),
                ];
                let sw = if $vbmi {
                    // Table byte 4s + w = w * (scale s & 15): the scale byte copied into its
                    // dword, masked to the bytes w = 1, 3 and w = 2, 3, the second part doubled.
                    let spread = _mm512_set_epi32(
                        0x0F0F_0F0F,
                        0x0E0E_0E0E,
                        0x0D0D_0D0D,
                        0x0C0C_0C0C,
                        0x0B0B_0B0B,
                        0x0A0A_0A0A,
                        0x0909_0909,
                        0x0808_0808,
                        0x0707_0707,
                        0x0606_0606,
                        0x0505_0505,
                        0x0404_0404,
                        0x0303_0303,
                        0x0202_0202,
                        0x0101_0101,
                        0x0000_0000,
                    );
                    let sb = _mm512_permutexvar_epi8(spread, _mm512_castsi128_si512(sc));
                    let odd = _mm512_and_si512(sb, _mm512_set1_epi32(0x0F00_0F00));
                    let high = _mm512_and_si512(sb, _mm512_set1_epi32(0x0F0F_0000));
                    let table = _mm512_add_epi8(odd, _mm512_add_epi8(high, high));
                    // Index 4 * sub-block + w: the 4 * sub-block part or-ed in with the 2-bit
                    // mask, `(vals & 3) | base`.
                    let look = |j: usize| {
                        let base = sub_blocks(j, |sub| 0x0101_0101 * (4 * sub));
                        let idx = _mm512_ternarylogic_epi32::<0xEA>(vals[j], m3, base);
                        _mm512_permutexvar_epi8(idx, table)
                    };
                    [look(0), look(1), look(2), look(3)]
                } else {
                    let m4 = _mm_set1_epi8(0x0f);
                    // Byte 4s + w of the table = w * scale[s] (no carries: 3 * 15 < 256).
                    let mult = _mm512_set1_epi32(0x0302_0100);
                    let table =
                        _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(sc, m4)), mult);
                    // Table dword s is sub-block s's row.
                    let look = |j: usize| {
                        let row = _mm512_permutexvar_epi32(sub_blocks(j, |sub| sub), table);
                        _mm512_shuffle_epi8(row, _mm512_and_si512(vals[j], m3))
                    };
                    [look(0), look(1), look(2), look(3)]
                };
                (
                    sw,
                    sc,
                    core::ptr::read_unaligned(
                        b.add(crate::formats::kquants::layout::Q2K_D) as *const i32
                    ),
                )
            }
        }

        /// The mins (`scale >> 4`) of two rows' blocks as i16: the first row's in words 0..16,
        /// the second's in 16..32.
        #[inline]
        #[target_feature(enable = $feat)]
        fn mins_pair(sc0: __m128i, sc1: __m128i) -> __m512i {
            let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(sc0), sc1);
            let m = _mm256_and_si256(_mm256_srli_epi16::<4>(both), _mm256_set1_epi8(0x0f));
            _mm512_cvtepu8_epi16(m)
        }

        /// The 16 `isum` lane partials of one row's scaled values against the activation
        /// block at `a`.
        ///
        /// # Safety
        /// `a` must be valid for 256 bytes; the CPU must have the module's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn isum16(sw: &[__m512i; 4], a: *const u8) -> __m512i {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let mut acc = _mm512_setzero_si512();
                for (j, &w) in sw.iter().enumerate() {
                    let av = _mm512_loadu_si512(a.add(64 * j) as *const __m512i);
                    acc = _mm512_dpbusd_epi32(acc, w, av);
                }
                acc
            }
        }

        /// One pair of rows against one activation block (`a` its packed quants, `bs2` its 16
        /// bsums in both 256-bit halves, see [`bsums2`]): the first level of the transposing reduction, i.e.
        /// per 128-bit lane `[isum 2p, summs 2p, isum 2p+1, summs 2p+1]` partials folded over
        /// the lane's dwords 0, 2 and 1, 3.
        ///
        /// # Safety
        /// As [`isum16`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn pair(
            sw0: &[__m512i; 4],
            sw1: &[__m512i; 4],
            mins: __m512i,
            a: *const u8,
            bs2: __m512i,
        ) -> __m512i {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let (z0, z1) = (isum16(sw0, a), isum16(sw1, a));
                // Lanes 0..8: row 2p's 16 partials folded to 8; lanes 8..16: row 2p + 1's.
                let i = _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0x44>(z0, z1),
                    _mm512_shuffle_i64x2::<0xEE>(z0, z1),
                );
                let s = _mm512_madd_epi16(bs2, mins);
                _mm512_add_epi32(_mm512_unpacklo_epi32(i, s), _mm512_unpackhi_epi32(i, s))
            }
        }

        /// The 16 bsums of the raw Q8_K block at `xb`, in both 256-bit halves.
        ///
        /// # Safety
        /// `xb` must be valid for `Q8K_BYTES`; the CPU must have the module's features.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn bsums2(xb: *const u8) -> __m512i {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(xb.add(260) as *const __m256i)) }
        }

        /// The second level of the transposing reduction: two pairs' [`pair`] vectors.
        #[inline]
        #[target_feature(enable = $feat)]
        fn combine(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
        }

        /// The last level of the reduction of the 4 pairs' vectors (combined two by two): lane
        /// `4g + 2k` holds the `isum` of row `SLOT[2g + k]`, the lane after it that row's
        /// `summs`.
        #[inline]
        #[target_feature(enable = $feat)]
        fn reduce(s2: &[__m512i; 2]) -> __m512i {
            let c = _mm512_shuffle_i64x2::<0x88>(s2[0], s2[1]);
            let d = _mm512_shuffle_i64x2::<0xDD>(s2[0], s2[1]);
            _mm512_add_epi32(c, d)
        }

        /// `[d, dmin]` of each row in the lanes [`reduce`] puts its `isum`, `summs` (the raw
        /// words were stored in `SLOT` order).
        #[inline]
        #[target_feature(enable = $feat)]
        fn scales(dd: &[i32; TILE]) -> __m512 {
            // SAFETY: `dd` is 32 readable bytes.
            let h = unsafe { _mm256_loadu_si256(dd.as_ptr() as *const __m256i) };
            _mm512_cvtph_ps(h)
        }

        /// The float step of one activation block (`yd` its scale) for 8 rows:
        /// `sumf += dall * isum - dmin * summs` in each row's `LANE`.
        #[inline]
        #[target_feature(enable = $feat)]
        fn block_update(s2: &[__m512i; 2], dv: __m512, yd: f32, sumf: &mut __m512) {
            let v = _mm512_cvtepi32_ps(reduce(s2));
            // dall = y.d * d, dmin = y.d * dmin per row; then dall * isum and dmin * summs.
            let p = _mm512_mul_ps(_mm512_set1_ps(yd), dv);
            let prod = _mm512_mul_ps(p, v);
            let swapped = _mm512_permute_ps::<0xB1>(prod);
            *sumf = _mm512_add_ps(*sumf, _mm512_sub_ps(prod, swapped));
        }

        /// Prefetches the block at `b + ahead` (the same block of the next tile's row).
        #[inline(always)]
        fn prefetch(b: *const u8, ahead: usize) {
            super::super::kblock::prefetch_span(b.wrapping_add(ahead), BLOCK);
        }

        /// Batches of `N` (1..=[`FUSED_MAX`]): decodes block `off` (bytes) of every row once
        /// and runs each pair of rows against the `N` activation blocks (`a[j]` packed quants,
        /// `xb[j]` the raw Q8_K block) straight from registers.
        ///
        /// # Safety
        /// Every `rows[i] + off` must start a readable Q2_K block, `a[j]` be valid for 256
        /// bytes and `xb[j]` for `Q8K_BYTES`; CPU features as [`decode_row`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn fused<const N: usize>(
            rows: &[*const u8; TILE],
            off: usize,
            ahead: usize,
            a: [*const u8; N],
            xb: [*const u8; N],
            sumf: &mut [__m512],
        ) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let mut bs2 = [_mm512_setzero_si512(); N];
                for j in 0..N {
                    bs2[j] = bsums2(xb[j]);
                }
                let mut s1 = [[_mm512_setzero_si512(); 4]; N];
                let mut s2 = [[_mm512_setzero_si512(); 2]; N];
                let mut dd = [0i32; TILE];
                for p in 0..4 {
                    let (b0, b1) = (rows[2 * p].add(off), rows[2 * p + 1].add(off));
                    prefetch(b0, ahead);
                    prefetch(b1, ahead);
                    let (sw0, sc0, d0) = decode_row(b0);
                    let (sw1, sc1, d1) = decode_row(b1);
                    dd[SLOT[2 * p]] = d0;
                    dd[SLOT[2 * p + 1]] = d1;
                    let mins = mins_pair(sc0, sc1);
                    for j in 0..N {
                        let v = pair(&sw0, &sw1, mins, a[j], bs2[j]);
                        s1[j][p] = v;
                        // Above 2 activation rows, fold pairs 0 and 1 early (fewer live registers).
                        if N > 2 && p == 1 {
                            s2[j][0] = combine(s1[j][0], s1[j][1]);
                        }
                    }
                }
                let dv = scales(&dd);
                for j in 0..N {
                    if N <= 2 {
                        s2[j][0] = combine(s1[j][0], s1[j][1]);
                    }
                    s2[j][1] = combine(s1[j][2], s1[j][3]);
                    block_update(&s2[j], dv, rd_f32(xb[j]), &mut sumf[j]);
                }
            }
        }

        /// One block of each of the tile's rows, decoded for reuse against every activation
        /// row (batches above [`FUSED_MAX`]).
        struct Tile {
            sw: [[__m512i; 4]; TILE],
            mins: [__m512i; 4],
            dv: __m512,
        }

        /// Decodes block `off` of every row in `rows` into `t`, prefetching as [`fused`].
        ///
        /// # Safety
        /// As [`fused`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode(rows: &[*const u8; TILE], off: usize, ahead: usize, t: &mut Tile) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let mut dd = [0i32; TILE];
                let mut sc = [_mm_setzero_si128(); TILE];
                for (r, &row) in rows.iter().enumerate() {
                    let b = row.add(off);
                    prefetch(b, ahead);
                    (t.sw[r], sc[r], dd[SLOT[r]]) = decode_row(b);
                }
                for p in 0..4 {
                    t.mins[p] = mins_pair(sc[2 * p], sc[2 * p + 1]);
                }
                t.dv = scales(&dd);
            }
        }

        /// `out[r * n + j] = W[r] . x[j]` for Q2_K over `a`, whose `xp` holds the quants
        /// packed by `pack`.
        ///
        /// # Safety
        /// `a`'s pointers must be valid for the sizes it names; the CPU must have the module's
        /// features.
        #[target_feature(enable = $feat)]
        pub(in super::super) unsafe fn gemm(a: super::super::kblock::KArgs) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let super::super::kblock::KArgs {
                    nb,
                    w,
                    rows,
                    x,
                    xp,
                    n,
                    out,
                } = a;
                let row_bytes = nb * BLOCK;
                let ahead = TILE * row_bytes;
                // SAFETY: all-zero bytes are valid for SIMD vectors.
                let mut t: Tile = core::mem::zeroed();
                let mut sumf = [_mm512_setzero_ps(); JCHUNK];
                let mut lanes = [0f32; 16];
                for r0 in (0..rows).step_by(TILE) {
                    // Rows past the end repeat the last row; their lanes are computed and dropped.
                    let mut rp = [w; TILE];
                    for (i, p) in rp.iter_mut().enumerate() {
                        *p = w.add((r0 + i).min(rows - 1) * row_bytes);
                    }
                    let valid = (rows - r0).min(TILE);
                    let mut j0 = 0;
                    while j0 < n {
                        let nj = (n - j0).min(JCHUNK);
                        sumf[..nj].fill(_mm512_setzero_ps());
                        if n <= FUSED_MAX {
                            for b in 0..nb {
                                macro_rules! run {
                                    ($n:literal) => {{
                                        let blk: [usize; $n] = core::array::from_fn(|j| j * nb + b);
                                        fused::<$n>(
                                            &rp,
                                            b * BLOCK,
                                            ahead,
                                            blk.map(|i| xp.add(i * 256)),
                                            blk.map(|i| x.add(i * Q8K_BYTES)),
                                            &mut sumf[..$n],
                                        )
                                    }};
                                }
                                match n {
                                    1 => run!(1),
                                    2 => run!(2),
                                    3 => run!(3),
                                    _ => run!(4),
                                }
                            }
                        } else {
                            for b in 0..nb {
                                decode(&rp, b * BLOCK, ahead, &mut t);
                                for (jj, s) in sumf[..nj].iter_mut().enumerate() {
                                    let blk = (j0 + jj) * nb + b;
                                    let (a, xb) = (xp.add(blk * 256), x.add(blk * Q8K_BYTES));
                                    let bs2 = bsums2(xb);
                                    // Plain calls, not `array::from_fn`: a closure called from a
                                    // generic function is not inlined with this module's features.
                                    let v = [
                                        pair(&t.sw[0], &t.sw[1], t.mins[0], a, bs2),
                                        pair(&t.sw[2], &t.sw[3], t.mins[1], a, bs2),
                                        pair(&t.sw[4], &t.sw[5], t.mins[2], a, bs2),
                                        pair(&t.sw[6], &t.sw[7], t.mins[3], a, bs2),
                                    ];
                                    let s2 = [combine(v[0], v[1]), combine(v[2], v[3])];
                                    block_update(&s2, t.dv, rd_f32(xb), s);
                                }
                            }
                        }
                        for (jj, s) in sumf[..nj].iter().enumerate() {
                            _mm512_storeu_ps(lanes.as_mut_ptr(), *s);
                            for i in 0..valid {
                                *out.add((r0 + i) * n + j0 + jj) = lanes[LANE[i]];
                            }
                        }
                        j0 += nj;
                    }
                }
            }
        }
    };
}

/// Without AVX512-VBMI: the table by `vpmulld`, looked up with `vpermd` + `vpshufb`.
pub(super) mod base {
    q2k_kernel!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", false);
}

/// With AVX512-VBMI: the table by byte operations, looked up with one `vpermb`.
pub(super) mod vbmi {
    q2k_kernel!(
        "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi",
        true
    );
}
