//! Q8_0 x Q8_0 for the AVX-512-VNNI tier: 16 weight rows per tile, one row per i32 lane, so a
//! block's integer sum needs no horizontal reduction.
//!
//! The reference (`ggml_vec_dot_q8_0_q8_0_generic`) does `sumf += (float)sumi * (dx * dy)` per
//! 32-element block. Here each weight block of the tile's 16 rows is transposed once (24
//! `vpermt2d`) into 8 vectors `W[e]` whose lane `r` holds quants `4e .. 4e + 4` of row `r`,
//! offset to unsigned (`q ^ 0x80` = `q + 128`). Against one activation block, 8 `vpdpbusd`
//! with that block's dword `e` broadcast give all 16 rows' `sumi` at once, the accumulator
//! seeded with `-128 * sum(y)` (which cancels the offset exactly; at most 32 * 255 * 128 in
//! magnitude). The float step then runs once per (block, activation row) for 16 rows, lane by
//! lane in the reference order. The transposed weights are reused for up to [`GROUP`]
//! activation rows, so from batch 1 to batch 8 the per-weight-byte work grows by 8 `vpdpbusd`
//! and 4 float operations per block and activation row only.

use core::arch::x86_64::*;

use super::q8_0::{rd_u16, Q8_0_BYTES};

/// Weight rows per tile (one per i32 lane).
const TILE: usize = 16;
/// Activation rows run against one transposed tile block.
const GROUP: usize = 8;

/// Per activation block: `(y.d as f32, -128 * sum of its 32 quants)`, row-major (`j * nb + b`).
///
/// # Safety
/// `x` must hold `n * nb` Q8_0 blocks.
pub(super) unsafe fn act_table(x: *const u8, n: usize, nb: usize, tab: &mut Vec<(f32, i32)>) {
    tab.clear();
    for i in 0..n * nb {
        // SAFETY: block `i` is inside `x` (the caller's contract).
        let blk = unsafe { core::slice::from_raw_parts(x.add(i * Q8_0_BYTES), Q8_0_BYTES) };
        let sum: i32 = blk[2..].iter().map(|&q| q as i8 as i32).sum();
        let d = crate::formats::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        tab.push((d, -128 * sum));
    }
}

/// `vpermt2d` index tables of the three transpose stages (see [`transpose`]), per output half.
const fn stage_idx(stage: usize, bit: usize) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut l = 0;
    while l < 16 {
        let (b3, b2, b1, b0) = ((l >> 3) & 1, (l >> 2) & 1, (l >> 1) & 1, l & 1);
        idx[l] = match stage {
            // lane (r3, r0, e1, e0) <- source (r3 ? b : a) lane 8 r0 + 4 e2 + (e1, e0)
            0 => 16 * b3 + 8 * b2 + 4 * bit + 2 * b1 + b0,
            // lane (r3, r2, r0, e0) <- source (r2 ? b : a) lane (r3, r0, e1, e0)
            1 => 16 * b2 + 8 * b3 + 4 * b1 + 2 * bit + b0,
            // lane (r3, r2, r1, r0) <- source (r1 ? b : a) lane (r3, r2, r0, e0)
            _ => 16 * b1 + 8 * b3 + 4 * b2 + 2 * b0 + bit,
        } as i32;
        l += 1;
    }
    idx
}

const IDX: [[[i32; 16]; 2]; 3] = [
    [stage_idx(0, 0), stage_idx(0, 1)],
    [stage_idx(1, 0), stage_idx(1, 1)],
    [stage_idx(2, 0), stage_idx(2, 1)],
];

/// Block `off` of the 16 rows as `W[e]` (lane `r` = quants `4e..4e + 4` of row `r`, each
/// `^ 0x80`). `v[i]` starts as rows `2i` (low half) and `2i + 1` (high half); three stages of
/// `vpermt2d` exchange one row bit with one quant-dword bit each (r3 with e2, r2 with e1, r1
/// with e0), the lane order chosen so that the last stage leaves lane `r` = row `r`.
///
/// # Safety
/// Every `rows[r] + off` must start a readable Q8_0 block; the CPU must have AVX-512F/BW/VL/VNNI.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn transpose(rows: &[*const u8; TILE], off: usize) -> [__m512i; 8] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        let ld = |r: usize| _mm256_loadu_si256(rows[r].add(off + 2) as *const __m256i);
        let v: [__m512i; 8] = core::array::from_fn(|i| {
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld(2 * i)), ld(2 * i + 1));
            _mm512_xor_si512(both, flip)
        });
        let idx = |s: usize, h: usize| _mm512_loadu_si512(IDX[s][h].as_ptr() as *const __m512i);
        // Stage 0: pairs (i, i + 4) differ in r3; output u = 4 e2 + (i & 3).
        let (i00, i01) = (idx(0, 0), idx(0, 1));
        let u: [__m512i; 8] = core::array::from_fn(|o| {
            let i = o & 3;
            let ix = if o >= 4 { i01 } else { i00 };
            _mm512_permutex2var_epi32(v[i], ix, v[i + 4])
        });
        // Stage 1: pairs (4 e2 + r1, 4 e2 + 2 + r1) differ in r2; output t = 4 e2 + 2 e1 + r1.
        let (i10, i11) = (idx(1, 0), idx(1, 1));
        let t: [__m512i; 8] = core::array::from_fn(|o| {
            let a = (o & 4) + (o & 1);
            let ix = if o & 2 != 0 { i11 } else { i10 };
            _mm512_permutex2var_epi32(u[a], ix, u[a + 2])
        });
        // Stage 2: pairs (2 (e >> 1), 2 (e >> 1) + 1) differ in r1; output e.
        let (i20, i21) = (idx(2, 0), idx(2, 1));
        core::array::from_fn(|e| {
            let a = e & 6;
            let ix = if e & 1 != 0 { i21 } else { i20 };
            _mm512_permutex2var_epi32(t[a], ix, t[a + 1])
        })
    }
}

/// The 16 rows' `d` of block `off` as f32 lanes.
///
/// # Safety
/// As [`transpose`], and the CPU must have F16C.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_scales(rows: &[*const u8; TILE], off: usize) -> __m512 {
    let h: [u16; TILE] = core::array::from_fn(|r| rd_u16(rows[r].wrapping_add(off)));
    // SAFETY: `h` is 32 readable bytes.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i)) }
}

/// Activation rows `j0 .. j0 + N` against every block of the tile's rows: `sums[j]` lane `r`
/// is the reference's `sumf` of row `r` and activation row `j0 + j`.
///
/// # Safety
/// Every `rows[r]` must start a row of `nb` readable Q8_0 blocks; `x` must hold activation rows
/// `j0 .. j0 + N` of `nb` blocks and `tab` their [`act_table`] entries; the CPU must have
/// AVX-512F/BW/VL/VNNI and F16C.
#[inline(never)]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group<const N: usize>(
    rows: &[*const u8; TILE],
    nb: usize,
    ahead: usize,
    x: *const u8,
    tab: &[(f32, i32)],
    j0: usize,
) -> [__m512; N] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let mut sums = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let off = b * Q8_0_BYTES;
            for &r in rows {
                // The same block of the next tile's row. One hint per row and block covers
                // every line (a block is shorter than a line, so every line holds a block start).
                let p = r.wrapping_add(off + ahead) as *const i8;
                _mm_prefetch::<_MM_HINT_T1>(p);
            }
            let w = transpose(rows, off);
            let dx = row_scales(rows, off);
            for (j, s) in sums.iter_mut().enumerate() {
                let blk = (j0 + j) * nb + b;
                let (yd, corr) = tab[blk];
                let q = x.add(blk * Q8_0_BYTES + 2) as *const i32;
                let mut acc = _mm512_set1_epi32(corr);
                for (e, we) in w.iter().enumerate() {
                    let y = _mm512_set1_epi32(core::ptr::read_unaligned(q.add(e)));
                    acc = _mm512_dpbusd_epi32(acc, *we, y);
                }
                // sumf += (float)sumi * (dx * dy)
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(yd));
                *s = _mm512_add_ps(*s, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), d));
            }
        }
        sums
    }
}

/// `out[r * n + j] = W[r] . x[j]` for Q8_0 x Q8_0: `w` holds `rows` rows of `nb` blocks, `x`
/// `n` rows, `tab` their [`act_table`].
///
/// # Safety
/// `w` must hold `rows * nb` blocks, `x` `n * nb` blocks, `tab` `n * nb` entries and `out`
/// `rows * n` floats (`rows, n, nb >= 1`); the CPU must have AVX-512F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm(
    nb: usize,
    w: *const u8,
    rows: usize,
    x: *const u8,
    n: usize,
    tab: &[(f32, i32)],
    out: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let row_bytes = nb * Q8_0_BYTES;
        let ahead = TILE * row_bytes;
        let mut lanes = [0f32; TILE];
        for r0 in (0..rows).step_by(TILE) {
            // Rows past the end repeat the last row; their lanes are computed and dropped.
            let rp: [*const u8; TILE] =
                core::array::from_fn(|i| w.add((r0 + i).min(rows - 1) * row_bytes));
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
                    1 => put(&group::<1>(&rp, nb, ahead, x, tab, j0)),
                    2 => put(&group::<2>(&rp, nb, ahead, x, tab, j0)),
                    3 => put(&group::<3>(&rp, nb, ahead, x, tab, j0)),
                    4 => put(&group::<4>(&rp, nb, ahead, x, tab, j0)),
                    5 => put(&group::<5>(&rp, nb, ahead, x, tab, j0)),
                    6 => put(&group::<6>(&rp, nb, ahead, x, tab, j0)),
                    7 => put(&group::<7>(&rp, nb, ahead, x, tab, j0)),
                    _ => put(&group::<GROUP>(&rp, nb, ahead, x, tab, j0)),
                }
                j0 += nj;
            }
        }
    }
}
