//! Q2_K x Q8_K for the AVX-512-VNNI tier, 8 weight rows per tile, 512-bit throughout.
//!
//! The reference (`ggml_vec_dot_q2_K_q8_K_generic`) reduces each block to two exact integers
//! (`isum = sum of scale * w * q`, `summs = sum of bsums * min`) before any float work, so no
//! lane split is needed and the values stay in their stored order. One 64-byte load holds the
//! whole `qs`; shift `2j` of it gives 64 values whose four 16-byte lanes are the sub-blocks
//! `2j, 2j+1, 8+2j, 9+2j`. The scale is folded into the weight bytes before the multiply: a
//! per-block table holds `w * scale` (at most 45, still u8) for every sub-block and `vpshufb`
//! looks each 2-bit value up in its lane's row of that table, so one `vpdpbusd` per 64 values
//! yields `scale * w * q` sums. The activations are packed once per call into the matching
//! order (`q[32j..32j+32] ++ q[128+32j..128+32j+32]`).
//!
//! Per (tile, activation block) the 8 rows' integer vectors are reduced together (one
//! transposing reduction gives every row's `isum` and `summs` as lanes) and the float step
//! `sumf += dall * isum - dmin * summs` runs with one lane per row, in the reference order.

use core::arch::x86_64::*;

use super::kquant::{rd_f32, Q8K_BYTES};

/// Bytes of one Q2_K block: scales[16], qs[64], d, dmin.
const BLOCK: usize = 84;
/// Weight rows per tile.
const TILE: usize = 8;
/// Activation rows whose float state a tile keeps at once.
const JCHUNK: usize = 64;

/// Packs `blocks` Q8_K blocks' quants into the Q2_K order above (256 bytes each).
///
/// # Safety
/// `x` must be valid for `blocks * Q8K_BYTES` bytes and `out` for `blocks * 256` bytes; the CPU
/// must have AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack(x: *const u8, blocks: usize, out: *mut u8) {
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

/// One block of each of the tile's rows, decoded for reuse against every activation row.
struct Tile {
    /// Per row and shift `j`: the 64 values times their sub-block's scale.
    sw: [[__m512i; 4]; TILE],
    /// Per row: the 16 mins (`scale >> 4`) as i16.
    mins: [__m256i; TILE],
    /// Lanes `[d 0..4, dmin 0..4, d 4..8, dmin 4..8]` of the rows' blocks.
    dv: __m512,
}

/// One row's block at `b`: the 4 scaled value vectors, the 16 mins as i16 and the raw
/// `d | dmin << 16` word.
///
/// # Safety
/// `b` must start a readable Q2_K block; the CPU must have AVX-512F/BW/VNNI and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_row(b: *const u8) -> ([__m512i; 4], __m256i, i32) {
    let m3 = _mm512_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0f);
    // Byte 4s + w of the table = w * scale[s] (no carries: 3 * 15 < 256).
    let mult = _mm512_set1_epi32(0x0302_0100);
    // Lane L of shift j reads sub-block 8 * (L / 2) + 2j + L % 2, i.e. table dword 4L.
    let idx = [
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 8, 8, 8, 8, 9, 9, 9, 9),
        _mm512_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3, 10, 10, 10, 10, 11, 11, 11, 11),
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 12, 12, 12, 12, 13, 13, 13, 13),
        _mm512_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7, 14, 14, 14, 14, 15, 15, 15, 15),
    ];
    let sc = _mm_loadu_si128(b as *const __m128i);
    let table = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(sc, m4)), mult);
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
    let qs = _mm512_loadu_si512(b.add(16) as *const __m512i);
    let vals = [
        _mm512_and_si512(qs, m3),
        _mm512_and_si512(_mm512_srli_epi16::<2>(qs), m3),
        _mm512_and_si512(_mm512_srli_epi16::<4>(qs), m3),
        _mm512_and_si512(_mm512_srli_epi16::<6>(qs), m3),
    ];
    let sw = core::array::from_fn(|j| {
        _mm512_shuffle_epi8(_mm512_permutexvar_epi32(idx[j], table), vals[j])
    });
    (sw, mins, core::ptr::read_unaligned(b.add(80) as *const i32))
}

/// `[d 0..4, dmin 0..4, d 4..8, dmin 4..8]` from the rows' raw `d | dmin << 16` words.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scales(dd: &[i32; TILE]) -> __m512 {
    // SAFETY: `dd` is 32 readable bytes.
    let h = unsafe { _mm256_loadu_si256(dd.as_ptr() as *const __m256i) };
    let order = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    _mm512_permutexvar_ps(order, _mm512_cvtph_ps(h))
}

/// Decodes block `off` (bytes) of every row in `rows` into `t`; prefetches the same block of
/// the rows `ahead` bytes further (the next tile), as [`fused`] does.
///
/// # Safety
/// Every `rows[i] + off` must start a readable Q2_K block; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode(rows: &[*const u8; TILE], off: usize, ahead: usize, t: &mut Tile) {
    let mut dd = [0i32; TILE];
    for (r, &row) in rows.iter().enumerate() {
        let b = row.add(off);
        let pf = b.wrapping_add(ahead);
        _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(BLOCK - 1) as *const i8);
        (t.sw[r], t.mins[r], dd[r]) = decode_row(b);
    }
    t.dv = scales(&dd);
}

/// The 4 packed activation vectors at `a`.
///
/// # Safety
/// `a` must be valid for 256 bytes; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn load_act(a: *const u8) -> [__m512i; 4] {
    core::array::from_fn(|j| _mm512_loadu_si512(a.add(64 * j) as *const __m512i))
}

/// One row's block against one activation block: `isum` partials in lanes 0..8, `summs`
/// partials in lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn row_z(sw: &[__m512i; 4], mins: __m256i, av: &[__m512i; 4], bs: __m256i) -> __m512i {
    let mut acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), sw[0], av[0]);
    acc = _mm512_dpbusd_epi32(acc, sw[1], av[1]);
    acc = _mm512_dpbusd_epi32(acc, sw[2], av[2]);
    acc = _mm512_dpbusd_epi32(acc, sw[3], av[3]);
    let folded = _mm256_add_epi32(
        _mm512_castsi512_si256(acc),
        _mm512_extracti64x4_epi64::<1>(acc),
    );
    let summs = _mm256_madd_epi16(bs, mins);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(folded), summs)
}

/// The float step of one activation block (`yd` its scale) for 8 rows: `sumf` lanes 0..4 and
/// 8..12 (rows 0..4 and 4..8) get `dall * isum - dmin * summs`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn block_update(z: &[__m512i; TILE], dv: __m512, yd: f32, sumf: &mut __m512) {
    let v = _mm512_cvtepi32_ps(reduce8(z));
    // dall = y.d * d, dmin = y.d * dmin per row; then dall * isum and dmin * summs.
    let p = _mm512_mul_ps(_mm512_set1_ps(yd), dv);
    let prod = _mm512_mul_ps(p, v);
    let swapped = _mm512_shuffle_f32x4::<0xB1>(prod, prod);
    *sumf = _mm512_add_ps(*sumf, _mm512_sub_ps(prod, swapped));
}

/// One activation block (packed quants `a`, raw Q8_K block `xb`) against the decoded tile.
///
/// # Safety
/// `a` must be valid for 256 bytes, `xb` for `Q8K_BYTES`; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot(t: &Tile, a: *const u8, xb: *const u8, sumf: &mut __m512) {
    let av = load_act(a);
    let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
    let z = core::array::from_fn(|r| row_z(&t.sw[r], t.mins[r], &av, bs));
    block_update(&z, t.dv, rd_f32(xb), sumf);
}

/// Batch 1: decode each row's block and multiply it at once, nothing stored; also prefetches
/// the same block of the rows `ahead` bytes further (the next tile).
///
/// # Safety
/// Every `rows[i] + off` must start a readable Q2_K block, `a` be valid for 256 bytes and `xb`
/// for `Q8K_BYTES`; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fused(
    rows: &[*const u8; TILE],
    off: usize,
    ahead: usize,
    a: *const u8,
    xb: *const u8,
    sumf: &mut __m512,
) {
    let av = load_act(a);
    let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
    let mut z = [_mm512_setzero_si512(); TILE];
    let mut dd = [0i32; TILE];
    for r in 0..TILE {
        let b = rows[r].add(off);
        let pf = b.wrapping_add(ahead);
        _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(BLOCK - 1) as *const i8);
        let (sw, mins, d) = decode_row(b);
        z[r] = row_z(&sw, mins, &av, bs);
        dd[r] = d;
    }
    block_update(&z, scales(&dd), rd_f32(xb), sumf);
}

/// Transposing reduction of 8 vectors whose low 8 lanes sum to one integer (`isum`) and high 8
/// lanes to another (`summs`): the result is `[isum 0..4, summs 0..4, isum 4..8, summs 4..8]`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn reduce8(z: &[__m512i; TILE]) -> __m512i {
    let mut s1 = [_mm512_setzero_si512(); 4];
    for p in 0..4 {
        let (a, b) = (z[2 * p], z[2 * p + 1]);
        s1[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    }
    let mut s2 = [_mm512_setzero_si512(); 2];
    for q in 0..2 {
        let (a, b) = (s1[2 * q], s1[2 * q + 1]);
        s2[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    }
    // Each 128-bit lane now holds 4 rows' partials of that lane; lanes 0, 1 are isum, 2, 3 summs.
    let c = _mm512_shuffle_i64x2::<0x88>(s2[0], s2[1]);
    let d = _mm512_shuffle_i64x2::<0xDD>(s2[0], s2[1]);
    _mm512_add_epi32(c, d)
}

/// `out[r * n + j] = W[r] . x[j]` for Q2_K: `w` holds `rows` rows of `nb` blocks, `x` the raw
/// Q8_K rows and `xp` their quants packed by [`pack`].
///
/// # Safety
/// All pointers must be valid for those sizes (`rows, n >= 1`); the CPU must have
/// AVX-512F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm(
    nb: usize,
    w: *const u8,
    rows: usize,
    x: *const u8,
    xp: *const u8,
    n: usize,
    out: *mut f32,
) {
    let row_bytes = nb * BLOCK;
    let mut t = Tile {
        sw: [[_mm512_setzero_si512(); 4]; TILE],
        mins: [_mm256_setzero_si256(); TILE],
        dv: _mm512_setzero_ps(),
    };
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
            if n == 1 {
                for b in 0..nb {
                    let (a, xb) = (xp.add(b * 256), x.add(b * Q8K_BYTES));
                    fused(&rp, b * BLOCK, TILE * row_bytes, a, xb, &mut sumf[0]);
                }
            }
            for b in (0..nb).filter(|_| n > 1) {
                decode(&rp, b * BLOCK, TILE * row_bytes, &mut t);
                for (jj, s) in sumf[..nj].iter_mut().enumerate() {
                    let blk = (j0 + jj) * nb + b;
                    dot(&t, xp.add(blk * 256), x.add(blk * Q8K_BYTES), s);
                }
            }
            for (jj, s) in sumf[..nj].iter().enumerate() {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *s);
                for i in 0..valid {
                    let lane = if i < 4 { i } else { i + 4 };
                    *out.add((r0 + i) * n + j0 + jj) = lanes[lane];
                }
            }
            j0 += nj;
        }
    }
}
