//! Q2_K x Q8_K for the AVX-512-VNNI tier, one weight row per i32 lane: 16 rows per tile, so a
//! block's integer sums need no horizontal reduction (the Q2_K counterpart of `q8_0_512`).
//!
//! The reference (`ggml_vec_dot_q2_K_q8_K_generic`) reduces each block to two exact integers,
//! `isum = sum of scale * w * q` and `summs = sum of bsums * min`, then does `sumf += dall *
//! isum - dmin * summs`. `q2k512` (8 rows, row-major) gets every row's `isum` as 16 partial
//! lanes and pays a transposing reduction per activation row and block; here the reduction is
//! paid once per weight block instead, by transposing the weights: the 16 rows' `qs` (16 dwords
//! each) go through a 16 x 16 dword transpose (in-lane `unpck` 4 x 4 blocks, then 128-bit lane
//! shuffles) into `Q[m]`, lane `r` = dword `m` of row `r`.
//! Dword `m` holds qs bytes `4m .. 4m + 4`, and shift `2j` of them are the elements `128 h + 32
//! j + 4 (m % 8) ..+ 4` (`h = m / 8`) of sub-block `8 h + 2 j + (m % 8) / 4`: one sub-block per
//! dword, so the scale is one word per lane and is folded into the weight bytes before the
//! multiply. The two-bit value is masked in place (`& 3` for even `j`, `& 12` = `4 w` for odd
//! `j`, on `qs` or `qs >> 4`) and `vpmullw` by the lane's scale word (`4 s` for even `j`, `s`
//! for odd) gives `4 w s <= 180` in every byte without carries (both bytes of a word share the
//! scale). So one `vpdpbusd` with the activation dword broadcast (read from the raw Q8_K block:
//! no packing) adds `4 * scale * w * q` of 4 elements of all 16 rows, and `isum` is the sum
//! shifted right by 2 (exact: every term is a multiple of 4, at most 4 * 256 * 45 * 128 in
//! magnitude). `summs` takes 8 `vpdpwssd` with the mins as word pairs (`min 2p, min 2p + 1`)
//! against the broadcast bsum pairs. The float step then runs once per block and activation row
//! for all 16 rows, in the reference order.
//!
//! Per tile and block the decode (transpose, masks, scale products, scales and mins) is paid
//! once for up to [`GROUP`] activation rows; each activation row adds 64 `vpdpbusd`, 8
//! `vpdpwssd` and ~8 float operations per 16 rows, against ~8 + 1 reduction and float
//! operations per row in `q2k512`. For a group of 1 or 2 activation rows (`POST`: the tail of a
//! larger batch) the scale goes in after the multiply instead: the 4 dwords of a sub-block are
//! summed by `vpdpbusd` on the masked values (at most 16 * 12 * 128 per lane: an i16), then one
//! `vpdpwssd` by the scale word per sub-block and activation row (16 per 16 rows) replaces the
//! 64 `vpmullw` of the decode.

use core::arch::x86_64::*;

use super::kblock::{block_bytes, prefetch_span, rd_f32, KArgs, Q2, Q8K_BYTES};
use crate::formats::kquants::layout::{Q2K_D, Q8K_BSUMS, Q8K_QS};

/// Bytes of one Q2_K block: scales[16], qs[64], d, dmin.
const BLOCK: usize = block_bytes(Q2);
/// Where a Q2_K block's `qs` start (after the 16 scale bytes).
const QS: usize = core::mem::offset_of!(crate::formats::kquants::BlockQ2_K, qs);
/// Weight rows per tile (one per i32 lane).
const TILE: usize = 16;
/// Activation rows run against one decoded tile block.
const GROUP: usize = 8;

/// Whether this kernel can take a call with `nb` blocks per row: the gathers address the tile's
/// rows by i32 offsets from its first row (at most 15 rows further).
pub(super) fn fits(nb: usize) -> bool {
    nb.checked_mul(BLOCK * (TILE - 1))
        .is_some_and(|b| b <= i32::MAX as usize)
}

/// `vpshufb` control giving, in every dword, the bytes `(b0, 0, b1, 0)` of that dword (word
/// pair `(byte b0, byte b1)`, zero-extended; `b1 = ZERO`: a zero high word).
const fn pick(b0: u8, b1: u8) -> [u8; 64] {
    let mut o = [0u8; 64];
    let mut d = 0;
    while d < 16 {
        let base = 4 * (d % 4) as u8;
        o[4 * d] = base + b0;
        o[4 * d + 1] = 0x80;
        o[4 * d + 2] = if b1 == ZERO { ZERO } else { base + b1 };
        o[4 * d + 3] = 0x80;
        d += 1;
    }
    o
}

/// 64-byte constants, aligned for one load.
#[repr(C, align(64))]
struct V64([u8; 64]);

impl V64 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn get(&self) -> __m512i {
        // SAFETY: 64 readable bytes.
        unsafe { _mm512_loadu_si512(self.0.as_ptr() as *const __m512i) }
    }
}

/// `PICK[b]`: byte `b` of each dword in both of its words.
static PICK: [V64; 4] = [
    V64(pick(0, 0)),
    V64(pick(1, 1)),
    V64(pick(2, 2)),
    V64(pick(3, 3)),
];
/// A `vpshufb` control byte that gives zero.
const ZERO: u8 = 0x80;
/// `PICK_LO[b]`: byte `b` of each dword as the dword's value (high word zero).
static PICK_LO: [V64; 4] = [
    V64(pick(0, ZERO)),
    V64(pick(1, ZERO)),
    V64(pick(2, ZERO)),
    V64(pick(3, ZERO)),
];
/// `PAIR[t]`: bytes `(2t, 2t + 1)` of each dword as a word pair.
static PAIR: [V64; 2] = [V64(pick(0, 1)), V64(pick(2, 3))];

/// Transposes 4 x 4 dwords within each 128-bit lane: lane `L` of output `e` = dword `e` of
/// lane `L` of inputs `0..4`, in order.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn transpose4x4(v: [__m512i; 4]) -> [__m512i; 4] {
    let a0 = _mm512_unpacklo_epi32(v[0], v[1]);
    let a1 = _mm512_unpackhi_epi32(v[0], v[1]);
    let a2 = _mm512_unpacklo_epi32(v[2], v[3]);
    let a3 = _mm512_unpackhi_epi32(v[2], v[3]);
    [
        _mm512_unpacklo_epi64(a0, a2),
        _mm512_unpackhi_epi64(a0, a2),
        _mm512_unpacklo_epi64(a1, a3),
        _mm512_unpackhi_epi64(a1, a3),
    ]
}

/// `v[r]` = row `r`'s 16 dwords -> `out[m]` = dword `m` of every row (lane `r`): per group of
/// 4 rows a 4 x 4 dword transpose within the 128-bit lanes (`b[g][e]` lane `L` = rows `4g ..
/// 4g + 4`, dword `4L + e`), then per `e` a 4 x 4 transpose of the 128-bit lanes across the
/// groups.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn transpose16(v: &[__m512i; 16]) -> [__m512i; 16] {
    let b: [[__m512i; 4]; 4] = core::array::from_fn(|g| {
        transpose4x4([v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]])
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for e in 0..4 {
        let t0 = _mm512_shuffle_i64x2::<0x44>(b[0][e], b[1][e]);
        let t1 = _mm512_shuffle_i64x2::<0xEE>(b[0][e], b[1][e]);
        let t2 = _mm512_shuffle_i64x2::<0x44>(b[2][e], b[3][e]);
        let t3 = _mm512_shuffle_i64x2::<0xEE>(b[2][e], b[3][e]);
        out[e] = _mm512_shuffle_i64x2::<0x88>(t0, t2);
        out[4 + e] = _mm512_shuffle_i64x2::<0xDD>(t0, t2);
        out[8 + e] = _mm512_shuffle_i64x2::<0x88>(t1, t3);
        out[12 + e] = _mm512_shuffle_i64x2::<0xDD>(t1, t3);
    }
    out
}

/// One block of the tile's 16 rows, decoded.
struct Dec {
    /// `Q[m]`: dword `m` of each row's `qs` (lane = row).
    q: [__m512i; 16],
    /// Per lane, the low-nibble scales of bytes `4i .. 4i + 4` (`lo[i]`) and the same times 4
    /// (`lo4[i]`).
    lo: [__m512i; 4],
    lo4: [__m512i; 4],
    /// `mins[p]`: the word pair (min `2p`, min `2p + 1`) of each row.
    mins: [__m512i; 8],
    /// `d` and `dmin` of each row.
    d: __m512,
    dmin: __m512,
}

/// Decodes block `off` of the 16 rows (`rows[r] = rows[0] + ridx[r]`).
///
/// # Safety
/// Every `rows[r] + off` must start a readable Q2_K block and `ridx` hold `rows[r] - rows[0]`;
/// the CPU must have AVX-512F/BW/VL/VNNI, AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode(rows: &[*const u8; TILE], ridx: __m512i, off: usize) -> Dec {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let base = rows[0].add(off);
        let rq: [__m512i; 16] =
            core::array::from_fn(|r| _mm512_loadu_si512(rows[r].add(off + QS) as *const __m512i));
        let q = transpose16(&rq);
        // The 16 scale bytes of rows t, 4 + t, 8 + t, 12 + t in the 128-bit lanes of `z[t]`;
        // the in-lane transpose gives `sc[i]` lane `r` = scale dword `i` of row `r`.
        let z: [__m512i; 4] = core::array::from_fn(|t| {
            let ld = |r: usize| _mm_loadu_si128(rows[r].add(off) as *const __m128i);
            let v = _mm512_castsi128_si512(ld(t));
            let v = _mm512_inserti32x4::<1>(v, ld(4 + t));
            let v = _mm512_inserti32x4::<2>(v, ld(8 + t));
            _mm512_inserti32x4::<3>(v, ld(12 + t))
        });
        let sc = transpose4x4(z);
        let dd = _mm512_i32gather_epi32::<1>(ridx, base.add(Q2K_D) as *const i32);
        let m0f = _mm512_set1_epi8(0x0f);
        let lo: [__m512i; 4] = core::array::from_fn(|i| _mm512_and_si512(sc[i], m0f));
        let lo4 = lo.map(|v| _mm512_slli_epi32::<2>(v));
        let hi: [__m512i; 4] =
            core::array::from_fn(|i| _mm512_and_si512(_mm512_srli_epi32::<4>(sc[i]), m0f));
        let mins = core::array::from_fn(|p| _mm512_shuffle_epi8(hi[p / 2], PAIR[p % 2].get()));
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
        Dec {
            q,
            lo,
            lo4,
            mins,
            d,
            dmin,
        }
    }
}

/// Activation rows `x[j]` (raw Q8_K blocks) against one decoded block: adds each row's float
/// step into `sumf[j]` (lane `r` = weight row `r`).
///
/// # Safety
/// Every `x[j]` must be valid for `Q8K_BYTES`; CPU features as [`decode`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<const N: usize, const C: usize, const POST: bool>(
    dec: &Dec,
    x: [*const u8; N],
    sumf: &mut [__m512; N],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let z = _mm512_setzero_si512();
        let mut acc = [[z; C]; N];
        let (m03, m0c) = (_mm512_set1_epi8(0x03), _mm512_set1_epi8(0x0c));
        let act = |j: usize, at: usize| {
            _mm512_set1_epi32(core::ptr::read_unaligned(
                x[j].add(Q8K_QS + at) as *const i32
            ))
        };
        // (h, part): the sub-blocks 8h + 2j + part, qs dwords 8h + 4 part .. + 4.
        for hp in 0..4 {
            let (h, part) = (hp / 2, hp % 2);
            // The scale words of sub-block 8h + 2j + part: scale byte 2j + part of dword
            // 2h + j / 2 (4 s for even j, whose weights are masked in place, s for odd j,
            // masked as 4 w).
            let s: [__m512i; 4] = core::array::from_fn(|j| {
                let (i, b) = (2 * h + j / 2, 2 * (j % 2) + part);
                let src = if j % 2 == 0 { dec.lo4[i] } else { dec.lo[i] };
                let pick = if POST { &PICK_LO[b] } else { &PICK[b] };
                _mm512_shuffle_epi8(src, pick.get())
            });
            // POST: the sub-block's raw products (16 per lane, at most 16 * 12 * 128 in
            // magnitude: i16) summed first, then one `vpdpwssd` by the scale.
            let mut sub = [[z; 4]; N];
            for i in 0..4 {
                let m = 4 * hp + i;
                let q0 = dec.q[m];
                let q4 = _mm512_srli_epi16::<4>(q0);
                for (j, sj) in s.iter().enumerate() {
                    let src = if j < 2 { q0 } else { q4 };
                    let t = _mm512_and_si512(src, if j % 2 == 0 { m03 } else { m0c });
                    let at = 128 * h + 32 * j + 4 * (m % 8);
                    if POST {
                        for (jj, u) in sub.iter_mut().enumerate() {
                            u[j] = _mm512_dpbusd_epi32(u[j], t, act(jj, at));
                        }
                    } else {
                        let w = _mm512_mullo_epi16(t, *sj);
                        for (jj, a) in acc.iter_mut().enumerate() {
                            let c = (4 * i + j) % C;
                            a[c] = _mm512_dpbusd_epi32(a[c], w, act(jj, at));
                        }
                    }
                }
            }
            if POST {
                for (a, u) in acc.iter_mut().zip(&sub) {
                    for (j, sj) in s.iter().enumerate() {
                        a[j % C] = _mm512_dpwssd_epi32(a[j % C], u[j], *sj);
                    }
                }
            }
        }
        for (jj, s) in sumf.iter_mut().enumerate() {
            let mut summs = z;
            for (p, mv) in dec.mins.iter().enumerate() {
                let bs = core::ptr::read_unaligned(x[jj].add(Q8K_BSUMS + 4 * p) as *const i32);
                summs = _mm512_dpwssd_epi32(summs, *mv, _mm512_set1_epi32(bs));
            }
            let mut isum4 = acc[jj][0];
            for a in &acc[jj][1..] {
                isum4 = _mm512_add_epi32(isum4, *a);
            }
            let isum = _mm512_srai_epi32::<2>(isum4);
            let yd = _mm512_set1_ps(rd_f32(x[jj]));
            // dall = y.d * d, dmin = y.d * dmin; sumf += dall * isum - dmin * summs.
            let dall = _mm512_mul_ps(yd, dec.d);
            let dmin = _mm512_mul_ps(yd, dec.dmin);
            let t = _mm512_sub_ps(
                _mm512_mul_ps(dall, _mm512_cvtepi32_ps(isum)),
                _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summs)),
            );
            *s = _mm512_add_ps(*s, t);
        }
    }
}

/// Activation rows `j0 .. j0 + N` against every block of the tile: `sumf[j]` lane `r` is the
/// reference's `sumf` of row `r` and activation row `j0 + j`.
///
/// # Safety
/// As [`gemm`], with `rows` the tile's rows (`ridx` their offsets from `rows[0]`) and
/// `j0 + N <= n`.
#[inline(never)]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group<const N: usize, const C: usize, const POST: bool>(
    rows: &[*const u8; TILE],
    ridx: __m512i,
    nb: usize,
    ahead: usize,
    x: *const u8,
    j0: usize,
) -> [__m512; N] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let mut sumf = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let off = b * BLOCK;
            for &r in rows {
                // The same block of the next tile's row.
                prefetch_span(r.wrapping_add(off + ahead), BLOCK);
            }
            let dec = decode(rows, ridx, off);
            let xb = core::array::from_fn(|j| x.add(((j0 + j) * nb + b) * Q8K_BYTES));
            block::<N, C, POST>(&dec, xb, &mut sumf);
        }
        sumf
    }
}

/// `out[r * n + j] = W[r] . x[j]` for Q2_K over `a` (its `xp` is not used: the activations are
/// read from the raw Q8_K blocks).
///
/// # Safety
/// `a`'s pointers must be valid for the sizes it names and [`fits`]`(a.nb)`; the CPU must have
/// AVX-512F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm(a: KArgs) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let KArgs {
            nb,
            w,
            rows,
            x,
            n,
            out,
            ..
        } = a;
        let row_bytes = nb * BLOCK;
        let ahead = TILE * row_bytes;
        let mut lanes = [0f32; TILE];
        for r0 in (0..rows).step_by(TILE) {
            // Rows past the end repeat the last row; their lanes are computed and dropped.
            let rp: [*const u8; TILE] =
                core::array::from_fn(|i| w.add((r0 + i).min(rows - 1) * row_bytes));
            // At most 15 * row_bytes (`fits`).
            let off: [i32; TILE] = core::array::from_fn(|i| rp[i].offset_from(rp[0]) as i32);
            let ridx = _mm512_loadu_si512(off.as_ptr() as *const __m512i);
            let valid = (rows - r0).min(TILE);
            let mut j0 = 0;
            while j0 < n {
                let nj = (n - j0).min(GROUP);
                let mut put = |s: &[__m512]| {
                    for (jj, v) in s.iter().enumerate() {
                        _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
                        for (i, l) in lanes.iter().enumerate().take(valid) {
                            *out.add((r0 + i) * n + j0 + jj) = *l;
                        }
                    }
                };
                match nj {
                    1 => put(&group::<1, 4, true>(&rp, ridx, nb, ahead, x, j0)),
                    2 => put(&group::<2, 4, true>(&rp, ridx, nb, ahead, x, j0)),
                    3 => put(&group::<3, 2, false>(&rp, ridx, nb, ahead, x, j0)),
                    4 => put(&group::<4, 2, false>(&rp, ridx, nb, ahead, x, j0)),
                    5 => put(&group::<5, 1, false>(&rp, ridx, nb, ahead, x, j0)),
                    6 => put(&group::<6, 1, false>(&rp, ridx, nb, ahead, x, j0)),
                    7 => put(&group::<7, 1, false>(&rp, ridx, nb, ahead, x, j0)),
                    _ => put(&group::<GROUP, 1, false>(&rp, ridx, nb, ahead, x, j0)),
                }
                j0 += nj;
            }
        }
    }
}
