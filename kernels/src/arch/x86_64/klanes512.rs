//! Q3_K, Q4_K, Q5_K and Q6_K x Q8_K for the AVX-512-VNNI tier: 8 weight rows per tile, taken in
//! pairs, 64-byte vectors throughout, float lanes of two rows per register.
//!
//! The reference keeps 8 float partial sums per row (lane `l` = elements `e % 8 == l`); the
//! integer work below gives each of them exactly (any order is exact), and only the float steps
//! follow the reference one by one. Each block's weights are decoded once per tile and reused
//! for every activation row (batches up to 4 use them straight from registers, larger ones store
//! the decoded tile and reload it per activation row).
//!
//! Q4_K/Q5_K (one scale per 32-element chunk): a dword holds the 4 elements `q + 8r` of one
//! chunk, so `vpdpbusd` (unsigned values 0..=15 / 0..=31 times the signed activations) gives the
//! chunk's exact part of lane `q` in one i32 (|x| <= 4 * 31 * 128, within i16). A 64-byte
//! vector holds two chunks `(ca, ca + 2)` with their dwords interleaved (dword `2q` chunk `ca`,
//! `2q + 1` chunk `cb`, both lane `q`): that is what one 64-byte `qs` load gives in its low
//! (`ca = 4L`) and high (`4L + 1`) nibbles after one `vpermb`. `packssdw` of the two rows'
//! results puts the word pairs (lane `q` of chunks `ca`, `cb`) of row A in i32 lanes `4j, 4j +
//! 1` and those of row B in `4j + 2, 4j + 3` (`q = 2j + (lane & 1)`), and one `vpdpwssd` with the
//! pair's scale words adds `s_ca * x_ca + s_cb * x_cb` into them: 2 rows' lanes in one register,
//! no fold. Q5_K's `qh` bit is added with a byte mask (`vptestmb`). The min term `sumi` (per row
//! `sum_i min_(i / 2) * bsum_i`) runs with the 8 rows' mins transposed into four vectors: four
//! `vpdpwssd` per activation block and tile (the bsums are taken as any i16, never pre-added).
//!
//! Q3_K/Q6_K (one scale per 16 elements, so a dword would straddle two scales) permute every
//! 32-byte chunk so that byte `4m + r` = element `m + 8r` (as in `kquant`): `maddubs` pairs two
//! elements of lane `m` and one sub-block, and `vpdpwssd` by the scale pairs gives i32 lane `m`
//! (and `m + 8` for the second chunk of a vector). They are signed: the raw unsigned values
//! (Q3_K `q | 4 * hbit` in 0..=7, Q6_K 0..=63) multiply the activations and `maddubs(offset, q)`
//! (offset 4 or 32; once per activation block, shared by the tile) is subtracted from every pair
//! sum. Q3_K's one 64-byte `qs` load holds chunks (s, s + 4) in bits `2s..2s+2`, and its
//! activations are packed in that order. Two rows' lanes are folded into one vector (decoders
//! in `signed`). From 2 activation rows on, with GFNI, they take the
//! signed scheme instead ([`signed_scheme`]): weights `raw - offset` (signed, made by the affine
//! transform's constant), activations `q + 128`, and a per-row seed `-128 * sum(scale * w)`;
//! that costs 8 ops per row and saves the subtraction (4 ops) per row and activation, so batch
//! 1 keeps the offset scheme.
//!
//! Per tile and block, the 8 rows' `d` (and `dmin`) halves are converted by one `vcvtph2ps`
//! (Q6_K: per pair of rows); for Q4_K/Q5_K they and the 12 scale bytes are fetched with
//! `vpgatherq*`, and the 6-bit scales and mins of all rows come out of a few vector ops. `sums[l] += d * aux32[l]` runs lane-wise in the reference
//! order; the Q4_K/Q5_K `sumf -= dmin * sumi` runs with one lane per row. Bit-field extraction
//! uses GFNI's affine byte transform where the CPU has it (one op instead of shift + mask).
//! Instructions that LLVM would rewrite into more uops are written as asm (`ops`).

use core::arch::x86_64::*;

use super::kblock::{perm32, rd_f32, KArgs, Q3, Q4, Q5, Q6, Q8K_BYTES};

mod ops;
mod signed;
mod tables;
use super::kblock::prefetch_block;
use ops::{add_masked, fold2, pair_idx};
pub(super) use ops::{dpwssd, gf_affine};
use signed::decode_signed;
use tables::{
    chunks45, d_idx, has_mins, out_lane, slots, GF_NIB_HI, MIN_IDX, PAIR_PERM, Q5_SEL, SCALE_IDX,
};
pub(super) use tables::{gf_halves, NONE as GF_NONE, V64};

/// Weight rows per tile.
const TILE: usize = 8;
/// Activation rows whose float state a tile keeps at once.
const JCHUNK: usize = 64;
/// Batches up to this size take the fused path (decode and multiply at once, nothing stored).
/// Out of cache (7168 x 8192, `x86_gemm` on the thread's CPU clock, stored decode against
/// fused), 5 and 6 rows fused cost Q6_K 5.42-5.49 / 4.96-4.97 against 4.19-4.20 / 4.63-4.74 ns
/// per row and block, Q5_K 4.80-4.91 / 4.41-4.57 against 4.08-4.12 / 4.01-4.04, Q3_K
/// 5.36-5.45 against 4.66-4.76 at 5 rows (the same at 6); Q4_K the same at 5 rows and 5-8%
/// slower at 6 (3.59-3.69 against 3.31-3.45), so it keeps 4 ([`fused_max`]). From 7 rows the
/// stored decode wins (Q4_K 3.0-3.3 against 4.0-4.4 ns at 7-8 rows).
const FUSED_MAX: usize = 6;

/// The largest batch kind `K` takes the fused path for ([`FUSED_MAX`]).
const fn fused_max(k: u8) -> usize {
    if k == Q4 {
        4
    } else {
        FUSED_MAX
    }
}

/// What the decoded raw (unsigned) values carry above the true ones: Q3_K 4, Q6_K 32, else 0.
const fn offset(k: u8) -> i8 {
    match k {
        Q3 => 4,
        Q6 => 32,
        _ => 0,
    }
}

/// Packs `blocks` Q8_K blocks' quants for kind `K`: Q4_K/Q5_K vector `v` = chunks
/// [`chunks45`]`(v)` through [`PAIR_PERM`]; Q3_K/Q6_K each 32-byte chunk permuted as in
/// `kquant`, chunks placed by [`slots`].
///
/// # Safety
/// `x` must be valid for `blocks * Q8K_BYTES` bytes and `out` for `blocks * 256` bytes; the CPU
/// must have AVX-512F/BW/VL/VNNI/VBMI, AVX2 and F16C.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn pack<const K: u8>(x: *const u8, blocks: usize, out: *mut u8) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let slot_of = slots(K);
        let perm = PAIR_PERM.get();
        for i in 0..blocks {
            let src = x.add(i * Q8K_BYTES + 4);
            let dst = out.add(i * 256);
            if has_mins(K) {
                for v in 0..4 {
                    let (ca, cb) = chunks45(v);
                    let lo = _mm256_loadu_si256(src.add(32 * ca) as *const __m256i);
                    let hi = _mm256_loadu_si256(src.add(32 * cb) as *const __m256i);
                    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    _mm512_storeu_si512(
                        dst.add(64 * v) as *mut __m512i,
                        _mm512_permutexvar_epi8(perm, both),
                    );
                }
            } else {
                for (c, &slot) in slot_of.iter().enumerate() {
                    let v = _mm256_loadu_si256(src.add(32 * c) as *const __m256i);
                    _mm256_storeu_si256(dst.add(32 * slot) as *mut __m256i, perm32(v));
                }
            }
        }
    }
}

/// One weight block of a pair of rows, decoded.
#[derive(Clone, Copy)]
struct PairDec {
    /// Per row, 4 vectors of 2 chunks (Q4_K/Q5_K values 0..=15 / 0..=31 interleaved by dword;
    /// Q3_K/Q6_K the raw 0..=7 / 0..=63, permuted per chunk).
    w: [[__m512i; 4]; 2],
    /// Q4_K/Q5_K: `s[0][v]` the scale words of vector `v` for both rows (`s[1]` unused);
    /// Q3_K/Q6_K: per row, the scale i16 pair of each lane's chunk.
    s: [[__m512i; 4]; 2],
    /// Q3_K/Q6_K in the signed scheme ([`signed_scheme`]): per row, `-128 * sum(scale * w)` per lane
    /// (the accumulator seed that cancels the `+ 128` of the activations).
    corr: [__m512i; 2],
}

/// Q3_K/Q6_K with GFNI at 2 or more activation rows (and the stored-tile path) take the signed
/// scheme: weights decoded as `raw - 4` / `raw - 32` (free: the affine transform's constant
/// does it), activations as `q + 128` (`maddubs(q ^ 0x80, w)`, pair sums within 2 * 255 * 32),
/// and a per-row seed `-128 * sum(scale * w)` (4 `maddubs` + 4 `vpdpwssd` per row) instead of
/// the per-(row, activation) `sub` of `maddubs(offset, q)` (4 ops). Measured: it pays from 2
/// rows on for Q6_K (+9% at 2) and for Q3_K (7168 columns, on the thread's CPU clock: 2 rows
/// 6.93-7.04 -> 5.94-6.01 ns per row and block in cache, 7.25-8.74 -> 6.59-6.75 from DRAM;
/// an earlier "-7% at 2" came from the tick-quantized clock). At 1 row it loses (Q3_K
/// 7.8 -> 9.1-9.6, Q6_K 6.5 -> 8.4-8.5 in cache).
const fn signed_scheme(k: u8, gfni: bool, n: usize) -> bool {
    gfni && (k == Q6 || k == Q3) && n >= 2
}

/// Q4_K/Q5_K values of one row's block at `b` (vector `v` = chunks [`chunks45`]`(v)`).
///
/// # Safety
/// `b` must start a readable block of kind `K`; the CPU must have AVX-512F/BW/VL/VNNI/VBMI,
/// AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn values45<const K: u8, const G: bool>(b: *const u8) -> [__m512i; 4] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let m0f = _mm512_set1_epi8(0x0f);
        let perm = PAIR_PERM.get();
        let qs = if K == Q5 { b.add(48) } else { b.add(16) };
        let q0 = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(qs as *const __m512i));
        let q1 = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(qs.add(64) as *const __m512i));
        // The high nibbles: one affine byte transform with GFNI, else a shift and a mask.
        let hi = |q: __m512i| {
            if G {
                gf_affine::<0>(q, GF_NIB_HI.get())
            } else {
                _mm512_and_si512(_mm512_srli_epi16::<4>(q), m0f)
            }
        };
        let mut w = [
            _mm512_and_si512(q0, m0f),
            hi(q0),
            _mm512_and_si512(q1, m0f),
            hi(q1),
        ];
        if K == Q5 {
            // qh[32] @16: bit c of byte e is bit 4 of chunk c's element e; both halves of the
            // broadcast go through the same permutation as the values.
            let qh = _mm512_permutexvar_epi8(
                perm,
                _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i)),
            );
            let k16 = _mm512_set1_epi8(16);
            for (v, wv) in w.iter_mut().enumerate() {
                let k = _mm512_test_epi8_mask(qh, Q5_SEL[v].get());
                *wv = add_masked(*wv, k, k16);
            }
        }
        w
    }
}

/// Decodes the blocks of kind `K` at `a` and `b` (rows `2p` and `2p + 1` of the tile whose
/// scale bytes, for Q4_K/Q5_K, are in `scales` as [`Meta::scales`]).
///
/// # Safety
/// As [`values45`], for both pointers.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn decode_pair<const K: u8, const G: bool>(
    a: *const u8,
    b: *const u8,
    scales: __m512i,
    p: usize,
    sgn: bool,
) -> PairDec {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let z = _mm512_setzero_si512();
        if has_mins(K) {
            let s = core::array::from_fn(|v| {
                _mm512_permutex2var_epi8(scales, SCALE_IDX[p][v].get(), z)
            });
            PairDec {
                w: [values45::<K, G>(a), values45::<K, G>(b)],
                s: [s, [z; 4]],
                corr: [z; 2],
            }
        } else {
            let (wa, sa) = decode_signed::<K, G>(a, sgn);
            let (wb, sb) = decode_signed::<K, G>(b, sgn);
            let mut corr = [z; 2];
            if sgn {
                let k128 = _mm512_set1_epi8(-128);
                for (c, (w, s)) in corr.iter_mut().zip([(&wa, &sa), (&wb, &sb)]) {
                    let mut t = z;
                    for i in 0..4 {
                        t = dpwssd(t, _mm512_maddubs_epi16(k128, w[i]), s[i]);
                    }
                    *c = _mm512_sub_epi32(z, t);
                }
            }
            PairDec {
                w: [wa, wb],
                s: [sa, sb],
                corr,
            }
        }
    }
}

/// One activation block as the tile's kernels use it.
#[derive(Clone, Copy)]
struct Act {
    /// The 4 packed vectors.
    v: [__m512i; 4],
    /// Q3_K/Q6_K: `maddubs(offset, q)` of each (the pair sums that turn the raw values into
    /// `raw - offset`); unused in the signed scheme, where `v` holds `q + 128`.
    pq: [__m512i; 4],
    /// Q4_K/Q5_K: the bsum pairs of chunks `2h` (lanes 0..8) and `2h + 1` (lanes 8..16), for
    /// the transposed mins ([`min_idx`]).
    b: [__m512i; 4],
    /// `y.d` in every lane.
    yd: __m512,
}

/// Loads activation block `a` (packed) / `xb` (raw Q8_K) for kind `K`.
///
/// # Safety
/// `a` must be valid for 256 bytes and `xb` for `Q8K_BYTES`; CPU features as [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn load_act<const K: u8>(a: *const u8, xb: *const u8, sgn: bool) -> Act {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let mut v = [
            _mm512_loadu_si512(a as *const __m512i),
            _mm512_loadu_si512(a.add(64) as *const __m512i),
            _mm512_loadu_si512(a.add(128) as *const __m512i),
            _mm512_loadu_si512(a.add(192) as *const __m512i),
        ];
        let mut pq = [_mm512_setzero_si512(); 4];
        if sgn {
            // q + 128 as unsigned bytes.
            let k80 = _mm512_set1_epi8(-128);
            for vi in v.iter_mut() {
                *vi = _mm512_xor_si512(*vi, k80);
            }
        } else if offset(K) != 0 {
            let off = _mm512_set1_epi8(offset(K));
            for i in 0..4 {
                pq[i] = _mm512_maddubs_epi16(off, v[i]);
            }
        }
        let mut b = [_mm512_setzero_si512(); 4];
        if has_mins(K) {
            // Dword c = the bsums (2c, 2c + 1) of chunk c (any i16 values: nothing is pre-added).
            let bs = _mm512_castsi256_si512(_mm256_loadu_si256(xb.add(260) as *const __m256i));
            b = core::array::from_fn(|h| {
                let (c1, c2) = (2 * h as i32, 2 * h as i32 + 1);
                _mm512_permutexvar_epi32(pair_idx(c1, c2), bs)
            });
        }
        Act {
            v,
            pq,
            b,
            yd: _mm512_set1_ps(rd_f32(xb)),
        }
    }
}

/// The 16 i32 lane sums of `scale * w * q` of one Q3_K/Q6_K row's block (lanes `m` and `m + 8`
/// are the reference's lane `m`). Pair sums stay within i16 (at most `2 * 63 * 128`, Q6_K).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn row_lanes(w: &[__m512i; 4], s: &[__m512i; 4], av: &[__m512i; 4], pq: &[__m512i; 4]) -> __m512i {
    let mut acc = _mm512_setzero_si512();
    for i in 0..4 {
        let p = _mm512_sub_epi16(_mm512_maddubs_epi16(w[i], av[i]), pq[i]);
        acc = dpwssd(acc, p, s[i]);
    }
    acc
}

/// The exact `aux32` lanes of both rows of a pair against one activation block, in the float
/// layout of [`out_lane`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn pair_lanes<const K: u8>(d: &PairDec, act: &Act, sgn: bool) -> __m512i {
    if has_mins(K) {
        let z = _mm512_setzero_si512();
        let mut acc = z;
        for v in 0..4 {
            let xa = _mm512_dpbusd_epi32(z, d.w[0][v], act.v[v]);
            let xb = _mm512_dpbusd_epi32(z, d.w[1][v], act.v[v]);
            acc = dpwssd(acc, _mm512_packs_epi32(xa, xb), d.s[0][v]);
        }
        acc
    } else if sgn {
        let rl = |h: usize| {
            let mut acc = d.corr[h];
            for i in 0..4 {
                acc = dpwssd(acc, _mm512_maddubs_epi16(act.v[i], d.w[h][i]), d.s[h][i]);
            }
            acc
        };
        fold2(rl(0), rl(1))
    } else {
        fold2(
            row_lanes(&d.w[0], &d.s[0], &act.v, &act.pq),
            row_lanes(&d.w[1], &d.s[1], &act.v, &act.pq),
        )
    }
}

/// Per-tile, per-block float factors and transposed mins.
#[derive(Clone, Copy)]
struct Meta {
    /// Per pair, each row's `d` in its float lanes.
    dp: [__m512; 4],
    /// Q4_K/Q5_K: `dmin` of row `r` in lane `r`.
    dmin: __m256,
    /// Q4_K/Q5_K: the 8 scale bytes of row `r` in qword `r`.
    scales: __m512i,
    /// Q4_K/Q5_K: the 8 rows' mins, transposed ([`min_idx`]).
    mins: [__m512i; 4],
}

/// Reads the per-row fields of the tile's blocks at `rows[r] + off` = `base + ridx[r]` (`base`
/// = row 0's block): the `d` (and `dmin`) halves (Q4_K/Q5_K gathered, Q3_K by scalar loads,
/// which measured 1-3% faster for it; Q6_K reads them per pair, [`pair_d`], and leaves `dp`
/// zero here), and for Q4_K/Q5_K the 6-bit scales and mins of
/// all 8 rows at once from the 12 scale bytes `a0 | a1 | a2` gathered (the bit layout of
/// `unpack::k4_scales`, one row per qword).
///
/// # Safety
/// Every `rows[r] + off` (= `base + ridx[r]`) must start a readable block of kind `K`; CPU
/// features as
/// [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn meta<const K: u8>(
    rows: &[*const u8; TILE],
    off: usize,
    base: *const u8,
    ridx: __m512i,
) -> Meta {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        // The dword ending with `d` for Q3_K/Q6_K (d is a block's last 2 bytes: nothing past it is
        // read), `d | dmin` for Q4_K/Q5_K: halves 2r, 2r + 1 of row r.
        let f = if has_mins(K) {
            _mm512_cvtph_ps(_mm512_i64gather_epi32::<1>(ridx, base as *const i32))
        } else if K == Q3 {
            // Q3_K: the 8 `d` halves by scalar loads, 4 to a qword.
            let d16 = |r: usize| -> u64 {
                let b = rows[r].add(off + 108);
                u16::from_le_bytes([*b, *b.add(1)]) as u64
            };
            let q = |r: usize| d16(r) | d16(r + 1) << 16 | d16(r + 2) << 32 | d16(r + 3) << 48;
            let h = _mm_unpacklo_epi64(
                _mm_cvtsi64_si128(q(0) as i64),
                _mm_cvtsi64_si128(q(4) as i64),
            );
            _mm512_castps256_ps512(_mm256_cvtph_ps(h))
        } else {
            // Q6_K: per pair, from the pair's own blocks ([`pair_d`]).
            _mm512_setzero_ps()
        };
        let dp = core::array::from_fn(|p| {
            let idx = d_idx(K, p);
            _mm512_permutexvar_ps(_mm512_loadu_si512(idx.as_ptr() as *const __m512i), f)
        });
        let mut m = Meta {
            dp,
            dmin: _mm256_setzero_ps(),
            scales: _mm512_setzero_si512(),
            mins: [_mm512_setzero_si512(); 4],
        };
        if has_mins(K) {
            let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
            m.dmin = _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, f));
            // g4 = a0 | a1 << 32, g8 = a1 | a2 << 32 per row.
            let g4 = _mm512_i64gather_epi64::<1>(ridx, base.add(4) as *const i64);
            let g8 = _mm512_i64gather_epi64::<1>(ridx, base.add(8) as *const i64);
            let low6 = _mm512_set1_epi64(0x3f3f_3f3f);
            let high4 = _mm512_set1_epi64(0x0f0f_0f0f << 32);
            let high2 = _mm512_set1_epi64(0x3030_3030 << 32);
            // scales: a0 & 0x3f (low dword) | (a2 & 0xf) | ((a0 >> 6) << 4) (high dword); `x << 30`
            // puts `x_low >> 2` in the high dword.
            m.scales = _mm512_or_si512(
                _mm512_ternarylogic_epi64::<0xEA>(g4, low6, _mm512_and_si512(g8, high4)),
                _mm512_and_si512(_mm512_slli_epi64::<30>(g4), high2),
            );
            // mins: a1 & 0x3f | ((a2 >> 4) & 0xf) | ((a1 >> 6) << 4).
            let mins = _mm512_or_si512(
                _mm512_ternarylogic_epi64::<0xEA>(
                    g8,
                    low6,
                    _mm512_and_si512(_mm512_srli_epi64::<4>(g8), high4),
                ),
                _mm512_and_si512(_mm512_slli_epi64::<30>(g8), high2),
            );
            let z = _mm512_setzero_si512();
            m.mins = core::array::from_fn(|h| _mm512_permutex2var_epi8(mins, MIN_IDX[h].get(), z));
        }
        m
    }
}

/// Q6_K: the `d` of the pair's rows at `a` and `b` in their float lanes, read with the pair (so
/// that a pair's float step waits for its own blocks only; measured 7% faster at batch 1 than
/// the tile-level read, which Q3_K keeps: 5% slower there).
///
/// # Safety
/// `a` and `b` must start readable blocks of kind `K`; CPU features as [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn pair_d<const K: u8>(a: *const u8, b: *const u8) -> __m512 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let dpos = if K == Q3 { 108 } else { 208 };
        let h = |p: *const u8| u16::from_le_bytes([*p.add(dpos), *p.add(dpos + 1)]) as i32;
        let f = _mm_cvtph_ps(_mm_cvtsi32_si128(h(a) | h(b) << 16));
        // Lanes 0..8 row a, 8..16 row b (the Q3_K/Q6_K layout of `out_lane`).
        let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f))
    }
}

/// `rows[r] - rows[0]` as i64 lanes (the gather offsets of [`meta`]).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn row_offsets(rows: &[*const u8; TILE]) -> __m512i {
    let o: [i64; TILE] = core::array::from_fn(|r| (rows[r] as i64).wrapping_sub(rows[0] as i64));
    // SAFETY: 64 readable bytes.
    unsafe { _mm512_loadu_si512(o.as_ptr() as *const __m512i) }
}

/// The reference's float state of one activation row against a tile's 8 rows.
#[derive(Clone, Copy)]
struct Acc {
    /// `sums[l]` of rows `2p` and `2p + 1` (lanes as [`out_lane`]).
    sums: [__m512; 4],
    /// `sumf` of each row (the Q4_K/Q5_K min terms), one lane per row.
    sumf: __m256,
}

/// `d = x.d * y.d; sums[l] += d * aux32[l]` for pair `p`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn sums_update(dp: __m512, p: usize, lanes: __m512i, act: &Act, acc: &mut Acc) {
    let d = _mm512_mul_ps(dp, act.yd);
    acc.sums[p] = _mm512_add_ps(acc.sums[p], _mm512_mul_ps(d, _mm512_cvtepi32_ps(lanes)));
}

/// The Q4_K/Q5_K `sumf -= dmin * sumi` for 8 rows (lane per row), `dmin = x.dmin * y.d`,
/// `sumi = sum_i min_(i / 2) * bsum_i` from the transposed mins (lanes `r` and `r + 8`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn min_update(mt: &Meta, act: &Act, acc: &mut Acc) {
    let mut s = _mm512_setzero_si512();
    for h in 0..4 {
        s = dpwssd(s, mt.mins[h], act.b[h]);
    }
    let sumi = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
    let dm = _mm256_mul_ps(mt.dmin, _mm512_castps512_ps256(act.yd));
    acc.sumf = _mm256_sub_ps(acc.sumf, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(sumi)));
}

/// One block of each of a tile's rows, decoded for reuse against every activation row.
struct Tile {
    pairs: [PairDec; 4],
    meta: Meta,
}

/// Batched path: one activation block against the decoded tile.
///
/// # Safety
/// `a` must be valid for 256 bytes, `xb` for `Q8K_BYTES`; CPU features as [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn dot<const K: u8>(t: &Tile, a: *const u8, xb: *const u8, acc: &mut Acc, sgn: bool) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let act = load_act::<K>(a, xb, sgn);
        for p in 0..4 {
            let lanes = pair_lanes::<K>(&t.pairs[p], &act, sgn);
            sums_update(t.meta.dp[p], p, lanes, &act, acc);
        }
        if has_mins(K) {
            min_update(&t.meta, &act, acc);
        }
    }
}

/// Small batches (`N` activation rows, 1..=[`FUSED_MAX`]): decode each pair's block and
/// multiply it at once against the `N` activation blocks, nothing stored, folding it into the
/// float state right away. Also prefetches the same block of the rows `ahead` bytes further
/// (the next tile).
///
/// # Safety
/// Every `rows[i] + off` must start a readable block of kind `K`; `a[j]` must be valid for 256
/// bytes and `xb[j]` for `Q8K_BYTES`; CPU features as [`values45`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn fused<const K: u8, const G: bool, const N: usize>(
    rows: &[*const u8; TILE],
    ridx: __m512i,
    off: usize,
    ahead: usize,
    a: [*const u8; N],
    xb: [*const u8; N],
    acc: &mut [Acc],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let sgn = signed_scheme(K, G, N);
        let acts: [Act; N] = core::array::from_fn(|j| load_act::<K>(a[j], xb[j], sgn));
        let mt = meta::<K>(rows, off, rows[0].add(off), ridx);
        for p in 0..4 {
            let (ra, rb) = (rows[2 * p].add(off), rows[2 * p + 1].add(off));
            prefetch_block::<K>(ra.wrapping_add(ahead));
            prefetch_block::<K>(rb.wrapping_add(ahead));
            let dec = decode_pair::<K, G>(ra, rb, mt.scales, p, sgn);
            let dp = if K == Q6 {
                pair_d::<K>(ra, rb)
            } else {
                mt.dp[p]
            };
            for (act, acc) in acts.iter().zip(acc.iter_mut()) {
                sums_update(dp, p, pair_lanes::<K>(&dec, act, sgn), act, acc);
            }
        }
        if has_mins(K) {
            for (act, acc) in acts.iter().zip(acc.iter_mut()) {
                min_update(&mt, act, acc);
            }
        }
    }
}

/// Runs [`fused`] with `N` activation rows `j0..j0 + N` over every block of a tile. Not inlined:
/// each batch size gets its own register allocation (inlined into one function, the constants
/// hoisted for the other sizes cost Q3_K 4% at batch 1).
///
/// # Safety
/// As [`gemm`], with `j0 + N <= n` and `acc` holding `N` states.
#[inline(never)]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn fused_tile<const K: u8, const G: bool, const N: usize>(
    rp: &[*const u8; TILE],
    nb: usize,
    ahead: usize,
    x: *const u8,
    xp: *const u8,
    j0: usize,
    acc: &mut [Acc],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let bbytes = super::kblock::block_bytes(K);
        let ridx = row_offsets(rp);
        for b in 0..nb {
            let blk: [usize; N] = core::array::from_fn(|j| (j0 + j) * nb + b);
            let a = blk.map(|i| xp.add(i * 256));
            let xb = blk.map(|i| x.add(i * Q8K_BYTES));
            fused::<K, G, N>(rp, ridx, b * bbytes, ahead, a, xb, acc);
        }
    }
}

/// `out[r * n + j] = W[r] . x[j]` for kind `K` (Q3_K..Q6_K) over `a`, whose `xp` holds the
/// quants packed by [`pack`] for `K`.
///
/// # Safety
/// `a`'s pointers must be valid for the sizes it names; the CPU must have
/// AVX-512F/BW/VL/VNNI/VBMI, AVX2 and F16C.
pub(super) unsafe fn gemm<const K: u8>(a: KArgs) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        if gfni() {
            gemm_impl::<K, true>(a)
        } else {
            gemm_impl::<K, false>(a)
        }
    }
}

/// Whether this CPU has GFNI (`vgf2p8affineqb`), unless `NIGHTSHIFT_X86_GFNI=off` withholds it
/// (see [`crate::dispatch::X86Features`]).
pub(super) fn gfni() -> bool {
    crate::dispatch::x86_features().gfni
}

/// [`gemm`] with (`G`) or without GFNI's affine byte transforms in the decoders.
///
/// # Safety
/// As [`gemm`], and the CPU must have GFNI when `G`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gemm_impl<const K: u8, const G: bool>(a: KArgs) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let KArgs {
            nb,
            w,
            rows,
            x,
            xp,
            n,
            out,
        } = a;
        let bbytes = super::kblock::block_bytes(K);
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
            let ahead = TILE * row_bytes;
            let mut j0 = 0;
            while j0 < n {
                let nj = (n - j0).min(JCHUNK);
                accs[..nj].fill(zero);
                if n <= fused_max(K) {
                    match n {
                        1 => fused_tile::<K, G, 1>(&rp, nb, ahead, x, xp, 0, &mut accs[..1]),
                        2 => fused_tile::<K, G, 2>(&rp, nb, ahead, x, xp, 0, &mut accs[..2]),
                        3 => fused_tile::<K, G, 3>(&rp, nb, ahead, x, xp, 0, &mut accs[..3]),
                        4 => fused_tile::<K, G, 4>(&rp, nb, ahead, x, xp, 0, &mut accs[..4]),
                        5 => fused_tile::<K, G, 5>(&rp, nb, ahead, x, xp, 0, &mut accs[..5]),
                        _ => fused_tile::<K, G, 6>(&rp, nb, ahead, x, xp, 0, &mut accs[..6]),
                    }
                } else {
                    let ridx = row_offsets(&rp);
                    let sgn = signed_scheme(K, G, n);
                    for b in 0..nb {
                        let off = b * bbytes;
                        t.meta = meta::<K>(&rp, off, rp[0].add(off), ridx);
                        for p in 0..4 {
                            let (ra, rb) = (rp[2 * p].add(off), rp[2 * p + 1].add(off));
                            prefetch_block::<K>(ra.wrapping_add(ahead));
                            prefetch_block::<K>(rb.wrapping_add(ahead));
                            t.pairs[p] = decode_pair::<K, G>(ra, rb, t.meta.scales, p, sgn);
                            if K == Q6 {
                                t.meta.dp[p] = pair_d::<K>(ra, rb);
                            }
                        }
                        for (jj, acc) in accs[..nj].iter_mut().enumerate() {
                            let blk = (j0 + jj) * nb + b;
                            dot::<K>(&t, xp.add(blk * 256), x.add(blk * Q8K_BYTES), acc, sgn);
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
                            s += sums[out_lane(K, i % 2, l)];
                        }
                        *out.add((r0 + i) * n + j0 + jj) = s;
                    }
                }
                j0 += nj;
            }
        }
    }
}

#[cfg(test)]
mod tests;
