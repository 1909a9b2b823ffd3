//! Q8_0 x Q8_0 building blocks of the AVX2 tier (the AVX-512 tier has `q8_0_512`): the per-call
//! tables of block scales, the 8-way transposing integer reduction and the tile driver.
//!
//! The reference (`ggml_vec_dot_q8_0_q8_0_generic`) does `sumf += (float)sumi * (dx * dy)` per
//! 32-element block, so each (weight row, activation row) pair needs its block's integer sum as a
//! scalar. A tile computes 8 pairs at once, one per f32 lane: either 1 weight row x 8 activation
//! rows (the weight block is prepared once and reused 8 times) or 8 weight rows x 1 activation row
//! (for the activation rows left over, and batch 1; every leftover row is done in the same pass
//! over a weight tile, so the weights are read once). The 8 integer block sums are reduced into
//! one vector and the float epilogue runs lane-wise in the reference order.

use core::arch::x86_64::*;

use super::kblock::f16_to_f32;

/// Bytes of one Q8_0 block: f16 d, 32 i8.
pub(super) const Q8_0_BYTES: usize = 34;

/// `yd[b * n_p + j]`: the activation block scales as f32, rows padded to a multiple of 8 by
/// repeating the last row (the weight scales are converted inside the tiles).
///
/// # Safety
/// `x` must hold `n * nb` Q8_0 blocks (`n >= 1`); the CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn act_scales(x: *const u8, n: usize, nb: usize, yd: &mut Vec<f32>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let padded = n.div_ceil(8) * 8;
        yd.clear();
        yd.resize(nb * padded, 0.0);
        let dst = yd.as_mut_ptr();
        for j in 0..padded {
            let row = x.add(j.min(n - 1) * nb * Q8_0_BYTES);
            for b in 0..nb {
                *dst.add(b * padded + j) = f16_to_f32(rd_u16(row.add(b * Q8_0_BYTES)));
            }
        }
    }
}

/// The f16 scale at `p` (unaligned).
#[inline(always)]
pub(super) fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: callers pass the start of a Q8_0 block inside a checked buffer.
    unsafe { u16::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 2])) }
}

/// The f16 scales of block `off` of 8 weight rows as f32 lanes.
///
/// # Safety
/// Each `rows[i] + off` must start a Q8_0 block; the CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn row_scales8(rows: &[*const u8; 8], off: usize) -> __m256 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let h = _mm_setr_epi16(
            rd_u16(rows[0].add(off)) as i16,
            rd_u16(rows[1].add(off)) as i16,
            rd_u16(rows[2].add(off)) as i16,
            rd_u16(rows[3].add(off)) as i16,
            rd_u16(rows[4].add(off)) as i16,
            rd_u16(rows[5].add(off)) as i16,
            rd_u16(rows[6].add(off)) as i16,
            rd_u16(rows[7].add(off)) as i16,
        );
        _mm256_cvtph_ps(h)
    }
}

/// Transposing reduction: lane `i` of the result is the sum of the 8 lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let a01 = _mm256_hadd_epi32(v[0], v[1]);
    let a23 = _mm256_hadd_epi32(v[2], v[3]);
    let a45 = _mm256_hadd_epi32(v[4], v[5]);
    let a67 = _mm256_hadd_epi32(v[6], v[7]);
    let b0 = _mm256_hadd_epi32(a01, a23);
    let b1 = _mm256_hadd_epi32(a45, a67);
    let lo = _mm256_permute2x128_si256::<0x20>(b0, b1);
    let hi = _mm256_permute2x128_si256::<0x31>(b0, b1);
    _mm256_add_epi32(lo, hi)
}

/// Defines `gemm_q8_0` for one tier from its block helpers: `$prep(block) -> P` prepares one
/// block's quants, `$dot(&P, other_block) -> __m256i` returns 8 i32 partial sums of the block's
/// 32 products (sum them for the exact block sum). The products are symmetric, so the same pair
/// serves both tile orientations.
macro_rules! q8_0_gemm {
    ($feat:literal, $prep:ident, $dot:ident) => {
        /// `out[r * n + j] = W[r] . x[j]` for Q8_0 x Q8_0 with `nb` blocks per row; `yd` is the
        /// table from [`q8_0::act_scales`](super::q8_0::act_scales).
        ///
        /// # Safety
        /// `w` must hold `rows * nb` blocks, `x` `n * nb` blocks, `yd` the padded table and `out`
        /// `rows * n` floats; the CPU must have the tier's features.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn gemm_q8_0(
            nb: usize,
            w: *const u8,
            rows: usize,
            x: *const u8,
            n: usize,
            yd: *const f32,
            out: *mut f32,
        ) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                use super::kblock::f16_to_f32;
                use super::q8_0::{rd_u16, reduce8, row_scales8, Q8_0_BYTES};
                let row_bytes = nb * Q8_0_BYTES;
                let n_p = n.div_ceil(8) * 8;
                let n8 = n / 8 * 8;
                let mut lanes = [0f32; 8];
                // 1 weight row x 8 activation rows.
                for r in 0..rows {
                    let wrow = w.add(r * row_bytes);
                    for j0 in (0..n8).step_by(8) {
                        let mut acc = _mm256_setzero_ps();
                        for b in 0..nb {
                            let pw = $prep(wrow.add(b * Q8_0_BYTES));
                            let mut p = [_mm256_setzero_si256(); 8];
                            for (i, pi) in p.iter_mut().enumerate() {
                                *pi = $dot(&pw, x.add((j0 + i) * row_bytes + b * Q8_0_BYTES));
                            }
                            let s = _mm256_cvtepi32_ps(reduce8(&p));
                            let dx = _mm256_set1_ps(f16_to_f32(rd_u16(wrow.add(b * Q8_0_BYTES))));
                            let d = _mm256_mul_ps(dx, _mm256_loadu_ps(yd.add(b * n_p + j0)));
                            acc = _mm256_add_ps(acc, _mm256_mul_ps(s, d));
                        }
                        _mm256_storeu_ps(out.add(r * n + j0), acc);
                    }
                }
                // 8 weight rows (the last repeated to fill the tile) x the leftover activation rows
                // (fewer than 8), all of them per pass over the weights.
                let left = n - n8;
                if left > 0 {
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for r0 in (0..rows).step_by(8) {
                        let mut wrows = [w; 8];
                        for (i, wr) in wrows.iter_mut().enumerate() {
                            *wr = w.add((r0 + i).min(rows - 1) * row_bytes);
                        }
                        acc[..left].fill(_mm256_setzero_ps());
                        for b in 0..nb {
                            // The same block of the next tile's rows (34 bytes: at most 2 lines).
                            for wr in &wrows {
                                let pf = wr.add(b * Q8_0_BYTES).wrapping_add(8 * row_bytes);
                                _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
                                _mm_prefetch::<_MM_HINT_T1>(
                                    pf.wrapping_add(Q8_0_BYTES - 1) as *const i8
                                );
                            }
                            let dx = row_scales8(&wrows, b * Q8_0_BYTES);
                            for (jj, a) in acc[..left].iter_mut().enumerate() {
                                let j = n8 + jj;
                                let pa = $prep(x.add(j * row_bytes + b * Q8_0_BYTES));
                                let mut p = [_mm256_setzero_si256(); 8];
                                for (i, pi) in p.iter_mut().enumerate() {
                                    *pi = $dot(&pa, wrows[i].add(b * Q8_0_BYTES));
                                }
                                let s = _mm256_cvtepi32_ps(reduce8(&p));
                                let d = _mm256_mul_ps(dx, _mm256_set1_ps(*yd.add(b * n_p + j)));
                                *a = _mm256_add_ps(*a, _mm256_mul_ps(s, d));
                            }
                        }
                        for (jj, a) in acc[..left].iter().enumerate() {
                            _mm256_storeu_ps(lanes.as_mut_ptr(), *a);
                            for (i, v) in lanes.iter().enumerate().take((rows - r0).min(8)) {
                                *out.add((r0 + i) * n + n8 + jj) = *v;
                            }
                        }
                    }
                }
            }
        }
    };
}
pub(super) use q8_0_gemm;
