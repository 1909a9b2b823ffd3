//! Q3_K, Q4_K, Q5_K and Q6_K x Q8_K for the AVX-512-VNNI tier: 8 weight rows per tile, 64-byte
//! vectors throughout, per-row float lanes kept two rows per register.
//!
//! The reference keeps 8 float partial sums per row (lane `l` = elements `e % 8 == l`), so the
//! values are permuted within every 32-element chunk as in `kquant` (byte `4m + r` = element
//! `m + 8r`) and `maddubs` + `vpdpwssd` by the scale pairs gives i32 lane `m` (and `m + 8` for
//! the second chunk of a 64-byte vector) = the reference's `aux32[m]`. The raw bytes are
//! permuted once per 64-byte load, before the bit fields are split. Each (row, activation block)
//! pair costs 4 `maddubs` + 4 `vpdpwssd`; a block's weights are decoded once per tile and reused
//! for every activation row (batches up to 4 use them straight from registers, larger ones store
//! the decoded tile and reload it per activation row).
//!
//! Q4_K/Q5_K: values 0..=15 (0..=31) multiply the signed activations directly; one 64-byte load
//! of `qs` gives chunks (0, 2) in its low nibbles and (1, 3) in its high ones, so the activations
//! are packed in that chunk order; Q5_K's `qh` bit is added with a byte mask (`vptestmb`).
//! Q3_K/Q6_K are signed: the raw unsigned values (Q3_K `q | 4 * hbit` in 0..=7, Q6_K 0..=63)
//! multiply the activations and `maddubs(offset, q)` (offset 4 or 32; once per activation block,
//! shared by the tile) is subtracted from every pair sum, which gives the exact pair sums of
//! `(raw - offset) * q`. Q3_K's one 64-byte `qs` load holds chunks (s, s + 4) in bits `2s..2s+2`,
//! and its activations are packed in that order. Two rows' lanes are folded into one vector, and
//! `sums[l] += d * aux32[l]` runs on it lane-wise in the reference order; the Q4_K/Q5_K
//! `sumf -= dmin * sumi` runs with one lane per row.

use core::arch::x86_64::*;

use super::kquant::{f16_to_f32, perm32, rd_f32, Q3, Q4, Q5, Q6, Q8K_BYTES};
use super::q8_0::reduce8;
use super::unpack::k4_scales;

/// Weight rows per tile.
const TILE: usize = 8;
/// Activation rows whose float state a tile keeps at once.
const JCHUNK: usize = 64;
/// Batches up to this size take the fused path (decode and multiply at once, nothing stored).
const FUSED_MAX: usize = 4;
/// True for the kinds with mins (`sumf -= dmin * sumi`): Q4_K and Q5_K.
const fn has_mins(k: u8) -> bool {
    k == Q4 || k == Q5
}

/// What the decoded raw (unsigned) values carry above the true ones: Q3_K 4, Q6_K 32, else 0.
const fn offset(k: u8) -> i8 {
    match k {
        Q3 => 4,
        Q6 => 32,
        _ => 0,
    }
}

/// Where chunk `c` of an activation block goes (32-byte slots) for kind `k`, so that 64-byte
/// vector `i` holds the two chunks of the weight vector `w[i]`: Q4_K/Q5_K (0, 2), (1, 3),
/// (4, 6), (5, 7); Q3_K (0, 4), (1, 5), (2, 6), (3, 7); Q6_K in order.
const fn slots(k: u8) -> [usize; 8] {
    match k {
        Q4 | Q5 => [0, 2, 1, 3, 4, 6, 5, 7],
        Q3 => [0, 2, 4, 6, 1, 3, 5, 7],
        _ => [0, 1, 2, 3, 4, 5, 6, 7],
    }
}

/// Packs `blocks` Q8_K blocks' quants for kind `K`: each 32-byte chunk permuted as in
/// `kquant`, chunks placed by [`slots`].
///
/// # Safety
/// `x` must be valid for `blocks * Q8K_BYTES` bytes and `out` for `blocks * 256` bytes; the CPU
/// must have AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack<const K: u8>(x: *const u8, blocks: usize, out: *mut u8) {
    let slot_of = slots(K);
    for i in 0..blocks {
        let src = x.add(i * Q8K_BYTES + 4);
        let dst = out.add(i * 256);
        for (c, &slot) in slot_of.iter().enumerate() {
            let v = _mm256_loadu_si256(src.add(32 * c) as *const __m256i);
            _mm256_storeu_si256(dst.add(32 * slot) as *mut __m256i, perm32(v));
        }
    }
}

/// `kquant::perm32` on both 32-byte halves: one `vpermb` (AVX512-VBMI).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn perm64(v: __m512i) -> __m512i {
    // Byte 4m + r of each half <- byte m + 8r of that half.
    let idx = _mm512_set_epi32(
        0x3F37_2F27,
        0x3E36_2E26,
        0x3D35_2D25,
        0x3C34_2C24,
        0x3B33_2B23,
        0x3A32_2A22,
        0x3931_2921,
        0x3830_2820,
        0x1F17_0F07,
        0x1E16_0E06,
        0x1D15_0D05,
        0x1C14_0C04,
        0x1B13_0B03,
        0x1A12_0A02,
        0x1911_0901,
        0x1810_0800,
    );
    _mm512_permutexvar_epi8(idx, v)
}

/// Lane pairs of chunk `c1` (lanes 0..8) and `c2` (lanes 8..16) from the i16 scale pairs.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn pair_idx(c1: i32, c2: i32) -> __m512i {
    _mm512_setr_epi32(
        c1, c1, c1, c1, c1, c1, c1, c1, c2, c2, c2, c2, c2, c2, c2, c2,
    )
}

/// Lanes `0..8` of `a` + lanes `8..16` of `a` in lanes 0..8, the same for `b` in lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn fold2(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0x44>(a, b),
        _mm512_shuffle_i64x2::<0xEE>(a, b),
    )
}

/// One weight block of one row, decoded.
#[derive(Clone, Copy)]
struct RowDec {
    /// 4 vectors of 2 permuted chunks (values 0..=15 / 0..=31 for Q4_K / Q5_K, the raw 0..=7 /
    /// 0..=63 for Q3_K / Q6_K).
    w: [__m512i; 4],
    /// Per vector: the scale i16 pair of each lane's chunk.
    s: [__m512i; 4],
    /// Q4_K/Q5_K: the 8 mins, each twice, as i16 (multiplies the 16 bsums).
    mins: __m256i,
    /// `d` and `dmin` as f32.
    d: f32,
    dmin: f32,
}

/// Decodes the block of kind `K` at `b`.
///
/// # Safety
/// `b` must start a readable block of kind `K`; the CPU must have AVX-512F/BW/VL/VNNI/VBMI,
/// AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn decode_row<const K: u8>(b: *const u8) -> RowDec {
    let m0f = _mm512_set1_epi8(0x0f);
    if K == Q3 {
        return decode_q3(b);
    }
    if has_mins(K) {
        let (s8, m8) = k4_scales(b.add(4));
        let s = _mm_loadl_epi64(s8.as_ptr() as *const __m128i);
        let m = _mm_loadl_epi64(m8.as_ptr() as *const __m128i);
        // Dword c = (scale c, scale c): one scale per 32 elements.
        let sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s)));
        let qs = if K == Q5 { b.add(48) } else { b.add(16) };
        let q0 = perm64(_mm512_loadu_si512(qs as *const __m512i));
        let q1 = perm64(_mm512_loadu_si512(qs.add(64) as *const __m512i));
        let mut w = [
            _mm512_and_si512(q0, m0f),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m0f),
            _mm512_and_si512(q1, m0f),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m0f),
        ];
        if K == Q5 {
            // qh[32] @16: bit c of byte e is bit 4 of chunk c's element e; w[i] holds chunks
            // (0, 2), (1, 3), (4, 6), (5, 7).
            let qh = perm64(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                b.add(16) as *const __m256i
            )));
            for (wi, (c1, c2)) in w.iter_mut().zip([(0, 2), (1, 3), (4, 6), (5, 7)]) {
                *wi = add_high_bit(*wi, qh, c1, c2, 16);
            }
        }
        RowDec {
            w,
            s: [
                _mm512_permutexvar_epi32(pair_idx(0, 2), sc),
                _mm512_permutexvar_epi32(pair_idx(1, 3), sc),
                _mm512_permutexvar_epi32(pair_idx(4, 6), sc),
                _mm512_permutexvar_epi32(pair_idx(5, 7), sc),
            ],
            mins: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)),
            d: f16_to_f32(u16::from_le_bytes([*b, *b.add(1)])),
            dmin: f16_to_f32(u16::from_le_bytes([*b.add(2), *b.add(3)])),
        }
    } else {
        // Q6_K: ql[128] @0, qh[64] @128, scales[16] @192, d @208.
        let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
            b.add(192) as *const __m128i
        )));
        let m30 = _mm512_set1_epi8(0x30);
        // Low nibbles: qh bits 0-1 (shift left 4) / 2-3 (left 2) to bits 4-5 in the two
        // halves; high nibbles: bits 4-5 (no shift) / 6-7 (right 2).
        let shl = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
        let shr =
            _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_setzero_si512(), _mm512_set1_epi16(2));
        let mut w = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let l = perm64(_mm512_loadu_si512(b.add(64 * h) as *const __m512i));
            let qh = perm64(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                b.add(128 + 32 * h) as *const __m256i,
            )));
            let hlo = _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30);
            let hhi = _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30);
            // (a & 0x0f) | b
            w[2 * h] = _mm512_ternarylogic_epi32::<0xEC>(l, hlo, m0f);
            w[2 * h + 1] = _mm512_ternarylogic_epi32::<0xEC>(_mm512_srli_epi16::<4>(l), hhi, m0f);
        }
        RowDec {
            w,
            s: [
                _mm512_permutexvar_epi32(pair_idx(0, 1), sc),
                _mm512_permutexvar_epi32(pair_idx(2, 3), sc),
                _mm512_permutexvar_epi32(pair_idx(4, 5), sc),
                _mm512_permutexvar_epi32(pair_idx(6, 7), sc),
            ],
            mins: _mm256_setzero_si256(),
            d: f16_to_f32(u16::from_le_bytes([*b.add(208), *b.add(209)])),
            dmin: 0.0,
        }
    }
}

/// `w + add` in the bytes whose bit `c1` (low 32 bytes) or `c2` (high 32 bytes) of `h` is set.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn add_high_bit(w: __m512i, h: __m512i, c1: u32, c2: u32, add: i8) -> __m512i {
    let sel = _mm512_mask_blend_epi8(
        0xFFFF_FFFF_0000_0000,
        _mm512_set1_epi8((1u32 << c1) as u8 as i8),
        _mm512_set1_epi8((1u32 << c2) as u8 as i8),
    );
    let k = _mm512_test_epi8_mask(h, sel);
    _mm512_mask_add_epi8(w, k, w, _mm512_set1_epi8(add))
}

/// Q3_K's 12 scale bytes at `p` -> the 16 six-bit scales minus 32 as i8 (as
/// `unpack::q3_scales`): scale `4i + k` = bits 0..4 of byte k (i = 0), of byte 4 + k (i = 1),
/// bits 4..8 of those (i = 2, 3), with bits `2i..2i+2` of byte `8 + k` on top.
///
/// # Safety
/// `p` must be valid for 12 bytes (the load is masked to them); CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn q3_scales_simd(p: *const u8) -> __m128i {
    let v = _mm_maskz_loadu_epi8(0x0FFF, p as *const i8);
    let lo = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
    );
    let lo = _mm_and_si128(
        _mm_srlv_epi16(lo, _mm_setr_epi16(0, 0, 0, 0, 4, 4, 4, 4)),
        _mm_set1_epi8(0x0f),
    );
    let hi = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11),
    );
    let hi = _mm_and_si128(
        _mm_srlv_epi16(hi, _mm_setr_epi16(0, 0, 2, 2, 4, 4, 6, 6)),
        _mm_set1_epi8(3),
    );
    _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16::<4>(hi)), _mm_set1_epi8(32))
}

/// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108. The raw values `q | 4 * hbit` are
/// in 0..=7 (the true ones are 4 less); w[s] holds chunks (s, s + 4), which are bits `2s..2s+2`
/// of the two 32-byte halves of `qs`.
///
/// # Safety
/// As [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn decode_q3(b: *const u8) -> RowDec {
    let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(q3_scales_simd(b.add(96))));
    let hm = perm64(_mm512_broadcast_i64x4(_mm256_loadu_si256(
        b as *const __m256i,
    )));
    let qs = perm64(_mm512_loadu_si512(b.add(32) as *const __m512i));
    let m3 = _mm512_set1_epi8(3);
    let w = [
        add_high_bit(_mm512_and_si512(qs, m3), hm, 0, 4, 4),
        add_high_bit(
            _mm512_and_si512(_mm512_srli_epi16::<2>(qs), m3),
            hm,
            1,
            5,
            4,
        ),
        add_high_bit(
            _mm512_and_si512(_mm512_srli_epi16::<4>(qs), m3),
            hm,
            2,
            6,
            4,
        ),
        add_high_bit(
            _mm512_and_si512(_mm512_srli_epi16::<6>(qs), m3),
            hm,
            3,
            7,
            4,
        ),
    ];
    RowDec {
        w,
        s: [
            _mm512_permutexvar_epi32(pair_idx(0, 4), sc),
            _mm512_permutexvar_epi32(pair_idx(1, 5), sc),
            _mm512_permutexvar_epi32(pair_idx(2, 6), sc),
            _mm512_permutexvar_epi32(pair_idx(3, 7), sc),
        ],
        mins: _mm256_setzero_si256(),
        d: f16_to_f32(u16::from_le_bytes([*b.add(108), *b.add(109)])),
        dmin: 0.0,
    }
}

/// One activation block's 4 vectors and, for Q3_K/Q6_K, `maddubs(offset, q)` of each (the pair
/// sums that turn the raw values into `raw - offset`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn load_act<const K: u8>(a: *const u8) -> ([__m512i; 4], [__m512i; 4]) {
    let av = [
        _mm512_loadu_si512(a as *const __m512i),
        _mm512_loadu_si512(a.add(64) as *const __m512i),
        _mm512_loadu_si512(a.add(128) as *const __m512i),
        _mm512_loadu_si512(a.add(192) as *const __m512i),
    ];
    let mut pq = [_mm512_setzero_si512(); 4];
    if offset(K) != 0 {
        let off = _mm512_set1_epi8(offset(K));
        for i in 0..4 {
            pq[i] = _mm512_maddubs_epi16(off, av[i]);
        }
    }
    (av, pq)
}

/// The 16 i32 lane sums of `scale * w * q` of one row's block (lanes `m` and `m + 8` are the
/// reference's lane `m`). Pair sums stay within i16 (at most `2 * 63 * 128`, Q6_K).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn row_lanes<const K: u8>(
    w: &[__m512i; 4],
    s: &[__m512i; 4],
    av: &[__m512i; 4],
    pq: &[__m512i; 4],
) -> __m512i {
    let mut acc = _mm512_setzero_si512();
    for i in 0..4 {
        let mut p = _mm512_maddubs_epi16(w[i], av[i]);
        if offset(K) != 0 {
            p = _mm512_sub_epi16(p, pq[i]);
        }
        acc = _mm512_dpwssd_epi32(acc, p, s[i]);
    }
    acc
}

/// The reference's float state of one activation row against a tile's 8 rows.
#[derive(Clone, Copy)]
struct Acc {
    /// `sums[l]` of rows `2p` (lanes 0..8) and `2p + 1` (lanes 8..16).
    sums: [__m512; 4],
    /// `sumf` of each row (the Q4_K/Q5_K min terms), one lane per row.
    sumf: __m256,
}

/// Per-row `d` as pairs (`d` of row `2p` in lanes 0..8, of row `2p + 1` in lanes 8..16).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn d_pairs(d: &[f32; TILE]) -> [__m512; 4] {
    core::array::from_fn(|p| {
        _mm512_mask_blend_ps(
            0xFF00,
            _mm512_set1_ps(d[2 * p]),
            _mm512_set1_ps(d[2 * p + 1]),
        )
    })
}

/// The float work of one activation block (raw Q8_K block `xb`) against 8 rows, given their
/// lane sums, `bsums * mins` products (Q4_K/Q5_K), `d` pairs and `dmin`s, in the reference order.
///
/// # Safety
/// `xb` must be valid for `Q8K_BYTES`; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn epilogue<const K: u8>(
    lanes: &[__m512i; TILE],
    ms: &[__m256i; TILE],
    dp: &[__m512; 4],
    dmin: __m256,
    xb: *const u8,
    acc: &mut Acc,
) {
    let yd = rd_f32(xb);
    let ydv = _mm512_set1_ps(yd);
    for p in 0..4 {
        let aux = fold2(lanes[2 * p], lanes[2 * p + 1]);
        // d = x.d * y.d; sums[l] += d * aux32[l]
        let d = _mm512_mul_ps(dp[p], ydv);
        acc.sums[p] = _mm512_add_ps(acc.sums[p], _mm512_mul_ps(d, _mm512_cvtepi32_ps(aux)));
    }
    if has_mins(K) {
        min_update(ms, dmin, yd, acc);
    }
}

/// The Q4_K/Q5_K `sumf -= dmin * sumi` for 8 rows (lane per row), `dmin = x.dmin * y.d`,
/// `sumi` the sum of each row's `bsums * mins` products `ms[r]`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn min_update(ms: &[__m256i; TILE], dmin: __m256, yd: f32, acc: &mut Acc) {
    let sumi = _mm256_cvtepi32_ps(reduce8(ms));
    let dm = _mm256_mul_ps(dmin, _mm256_set1_ps(yd));
    acc.sumf = _mm256_sub_ps(acc.sumf, _mm256_mul_ps(dm, sumi));
}

/// One block of each of a tile's rows, decoded for reuse against every activation row.
struct Tile {
    rows: [RowDec; TILE],
    dp: [__m512; 4],
    dmin: __m256,
}

/// Batched path: one activation block against the decoded tile.
///
/// # Safety
/// `a` must be valid for 256 bytes, `xb` for `Q8K_BYTES`; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn dot<const K: u8>(t: &Tile, a: *const u8, xb: *const u8, acc: &mut Acc) {
    let (av, pq) = load_act::<K>(a);
    let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
    let mut lanes = [_mm512_setzero_si512(); TILE];
    let mut ms = [_mm256_setzero_si256(); TILE];
    for r in 0..TILE {
        lanes[r] = row_lanes::<K>(&t.rows[r].w, &t.rows[r].s, &av, &pq);
        if has_mins(K) {
            ms[r] = _mm256_madd_epi16(bs, t.rows[r].mins);
        }
    }
    epilogue::<K>(&lanes, &ms, &t.dp, t.dmin, xb, acc);
}

/// Small batches (`N` activation rows, 1..=[`FUSED_MAX`]): decode each row's block and multiply
/// it at once against the `N` activation blocks, nothing stored; rows are taken in pairs and
/// folded into the float state right away (fewer live registers). Also prefetches the same
/// block of the rows `ahead` bytes further (the next tile).
///
/// # Safety
/// Every `rows[i] + off` must start a readable block of kind `K`; `a[j]` must be valid for 256
/// bytes and `xb[j]` for `Q8K_BYTES`; CPU features as [`decode_row`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn fused<const K: u8, const N: usize>(
    rows: &[*const u8; TILE],
    off: usize,
    ahead: usize,
    a: [*const u8; N],
    xb: [*const u8; N],
    acc: &mut [Acc],
) {
    let mut av = [[_mm512_setzero_si512(); 4]; N];
    let mut pq = [[_mm512_setzero_si512(); 4]; N];
    let mut bs = [_mm256_setzero_si256(); N];
    let mut ydv = [_mm512_setzero_ps(); N];
    for j in 0..N {
        (av[j], pq[j]) = load_act::<K>(a[j]);
        bs[j] = _mm256_loadu_si256(xb[j].add(260) as *const __m256i);
        ydv[j] = _mm512_set1_ps(rd_f32(xb[j]));
    }
    let mut ms = [[_mm256_setzero_si256(); TILE]; N];
    let mut dmin = [0f32; TILE];
    for p in 0..4 {
        let mut dec = [decode_row_zero(); 2];
        for (h, dh) in dec.iter_mut().enumerate() {
            let r = 2 * p + h;
            let b = rows[r].add(off);
            let pf = b.wrapping_add(ahead);
            for line in 0..super::kquant::block_bytes(K).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(64 * line) as *const i8);
            }
            *dh = decode_row::<K>(b);
            dmin[r] = dh.dmin;
        }
        let dp = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(dec[0].d), _mm512_set1_ps(dec[1].d));
        for j in 0..N {
            let l0 = row_lanes::<K>(&dec[0].w, &dec[0].s, &av[j], &pq[j]);
            let l1 = row_lanes::<K>(&dec[1].w, &dec[1].s, &av[j], &pq[j]);
            if has_mins(K) {
                ms[j][2 * p] = _mm256_madd_epi16(bs[j], dec[0].mins);
                ms[j][2 * p + 1] = _mm256_madd_epi16(bs[j], dec[1].mins);
            }
            let aux = fold2(l0, l1);
            // d = x.d * y.d; sums[l] += d * aux32[l]
            let dv = _mm512_mul_ps(dp, ydv[j]);
            acc[j].sums[p] =
                _mm512_add_ps(acc[j].sums[p], _mm512_mul_ps(dv, _mm512_cvtepi32_ps(aux)));
        }
    }
    if has_mins(K) {
        let dminv = _mm256_loadu_ps(dmin.as_ptr());
        for j in 0..N {
            min_update(&ms[j], dminv, rd_f32(xb[j]), &mut acc[j]);
        }
    }
}

/// An all-zero [`RowDec`] (placeholder before decoding).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn decode_row_zero() -> RowDec {
    RowDec {
        w: [_mm512_setzero_si512(); 4],
        s: [_mm512_setzero_si512(); 4],
        mins: _mm256_setzero_si256(),
        d: 0.0,
        dmin: 0.0,
    }
}

/// Runs [`fused`] with `N` activation rows `j0..j0 + N` over every block of a tile.
///
/// # Safety
/// As [`gemm`], with `j0 + N <= n` and `acc` holding `N` states.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn fused_tile<const K: u8, const N: usize>(
    rp: &[*const u8; TILE],
    nb: usize,
    ahead: usize,
    x: *const u8,
    xp: *const u8,
    j0: usize,
    acc: &mut [Acc],
) {
    let bbytes = super::kquant::block_bytes(K);
    for b in 0..nb {
        let blk: [usize; N] = core::array::from_fn(|j| (j0 + j) * nb + b);
        let a = blk.map(|i| xp.add(i * 256));
        let xb = blk.map(|i| x.add(i * Q8K_BYTES));
        fused::<K, N>(rp, b * bbytes, ahead, a, xb, acc);
    }
}

/// `out[r * n + j] = W[r] . x[j]` for kind `K` (Q3_K..Q6_K): `w` holds `rows` rows of `nb`
/// blocks, `x` the raw Q8_K rows and `xp` their quants packed by [`pack`] for `K`.
///
/// # Safety
/// All pointers must be valid for those sizes (`rows, n >= 1`); the CPU must have
/// AVX-512F/BW/VL/VNNI/VBMI, AVX2 and F16C.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn gemm<const K: u8>(
    nb: usize,
    w: *const u8,
    rows: usize,
    x: *const u8,
    xp: *const u8,
    n: usize,
    out: *mut f32,
) {
    let bbytes = super::kquant::block_bytes(K);
    let row_bytes = nb * bbytes;
    // SAFETY: all-zero bytes are valid for SIMD vectors and f32.
    let mut t: Tile = core::mem::zeroed();
    let zero = Acc {
        sums: [_mm512_setzero_ps(); 4],
        sumf: _mm256_setzero_ps(),
    };
    let mut accs = [zero; JCHUNK];
    let mut sums = [0f32; 16];
    let mut sumf = [0f32; 8];
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
            accs[..nj].fill(zero);
            if n <= FUSED_MAX {
                let ahead = TILE * row_bytes;
                match n {
                    1 => fused_tile::<K, 1>(&rp, nb, ahead, x, xp, 0, &mut accs[..1]),
                    2 => fused_tile::<K, 2>(&rp, nb, ahead, x, xp, 0, &mut accs[..2]),
                    3 => fused_tile::<K, 3>(&rp, nb, ahead, x, xp, 0, &mut accs[..3]),
                    _ => fused_tile::<K, 4>(&rp, nb, ahead, x, xp, 0, &mut accs[..4]),
                }
            } else {
                for b in 0..nb {
                    let mut d = [0f32; TILE];
                    let mut dmin = [0f32; TILE];
                    for r in 0..TILE {
                        let blk = rp[r].add(b * bbytes);
                        // The same block of the next tile's row, as in `fused`.
                        let pf = blk.wrapping_add(TILE * row_bytes);
                        for line in 0..bbytes.div_ceil(64) {
                            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(64 * line) as *const i8);
                        }
                        t.rows[r] = decode_row::<K>(blk);
                        d[r] = t.rows[r].d;
                        dmin[r] = t.rows[r].dmin;
                    }
                    t.dp = d_pairs(&d);
                    t.dmin = _mm256_loadu_ps(dmin.as_ptr());
                    for (jj, acc) in accs[..nj].iter_mut().enumerate() {
                        let blk = (j0 + jj) * nb + b;
                        dot::<K>(&t, xp.add(blk * 256), x.add(blk * Q8K_BYTES), acc);
                    }
                }
            }
            for (jj, acc) in accs[..nj].iter().enumerate() {
                _mm256_storeu_ps(sumf.as_mut_ptr(), acc.sumf);
                for i in 0..valid {
                    _mm512_storeu_ps(sums.as_mut_ptr(), acc.sums[i / 2]);
                    // sumf += sums[l] for l in 0..8, in order.
                    let mut s = sumf[i];
                    for l in 0..8 {
                        s += sums[8 * (i % 2) + l];
                    }
                    *out.add((r0 + i) * n + j0 + jj) = s;
                }
            }
            j0 += nj;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Batch sizes 1..=6 and a row count with a partial tile for every kind on this path: the
    //! fused small-batch path (1..=4) and the tiled one (5, 6) against the scalar tier's bits.

    use crate::dispatch::{available_tiers, gemm_with, Tier};
    use crate::{quantize_row, GgmlType};

    fn rows_of(ty: GgmlType, k: usize, count: usize, seed: u32) -> Vec<u8> {
        let rb = ty.row_bytes(k).expect("k is a multiple of 256");
        let mut out = vec![0u8; count * rb];
        let mut s = seed;
        for row in out.chunks_exact_mut(rb) {
            let f: Vec<f32> = (0..k)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
                })
                .collect();
            quantize_row(ty, &f, row).expect("quantize");
        }
        out
    }

    #[test]
    fn small_and_tiled_batches_match_the_scalar_tier() {
        if !available_tiers().contains(&Tier::Avx512Vnni) {
            return;
        }
        let (k, m) = (512, 11);
        for ty in [
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let w = rows_of(ty, k, m, 7);
            for n in 1..=6 {
                let x = rows_of(GgmlType::Q8_K, k, n, 100 + n as u32);
                let mut want = vec![0f32; m * n];
                let mut got = vec![0f32; m * n];
                gemm_with(Tier::Scalar, ty, k, &w, m, &x, n, &mut want, None).expect("scalar");
                gemm_with(Tier::Avx512Vnni, ty, k, &w, m, &x, n, &mut got, None).expect("avx512");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{} n={n}", ty.name());
            }
        }
    }
}
