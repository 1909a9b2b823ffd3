//! K-quant building blocks shared by the AVX2 and AVX-512-VNNI tiers: the byte permutation, the
//! activation packer, the exact per-block float epilogue and the tile driver (the per-type
//! weight unpackers live in `unpack`, what both build on in `kblock`).
//!
//! The reference (ggml's generic `vec_dot_q{3,4,5,6}_K_q8_K`) keeps 8 float partial sums, lane
//! `l` holding the products of the elements `e` with `e % 8 == l`. To get that split from
//! `maddubs` (which adds adjacent byte products) both operands are permuted within every 32-byte
//! chunk so that byte `4m + r` holds element `m + 8r`: then `maddubs` pairs two elements of the
//! same lane (and the same 16-element sub-block), and `madd` with the scale vector sums the two
//! halves into i32 lane `m` = `aux32[m]` of the reference. Integer work is exact in any order;
//! only the float epilogue must follow the reference step by step, which [`epilogue`] does.
//!
//! Weights whose values are unsigned (Q2_K, Q4_K, Q5_K) multiply the signed activations directly
//! (`maddubs(w_u8, q_s8)`). Signed weights (Q3_K, Q6_K) instead multiply activations offset to
//! `q + 128` (`maddubs(u_u8, w_s8)`, no saturation for |w| <= 32) and subtract the weight-side
//! correction `128 * sum(scale * w)` per lane, computed once per weight block.

use core::arch::x86_64::*;

use super::kblock::{perm32, rd_f32, Q2, Q3, Q4, Q5, Q6, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::unpack::{BlockMeta, Unpacked};

/// Packs `blocks` Q8_K blocks (the quants only) into 256 permuted bytes each, offset by 128
/// (`q ^ 0x80`) when `offset` is set.
///
/// # Safety
/// `x` must be valid for `blocks * Q8K_BYTES` bytes and `out` for `blocks * 256` bytes; the CPU
/// must have AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack_q8k(x: *const u8, blocks: usize, offset: bool, out: *mut u8) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let flip = _mm256_set1_epi8(if offset { -128 } else { 0 });
        for i in 0..blocks {
            let src = x.add(i * Q8K_BYTES + Q8K_QS);
            let dst = out.add(i * 256);
            for c in 0..8 {
                let v = _mm256_loadu_si256(src.add(32 * c) as *const __m256i);
                let v = _mm256_xor_si256(v, flip);
                _mm256_storeu_si256(dst.add(32 * c) as *mut __m256i, perm32(v));
            }
        }
    }
}

/// Transposing reduction of 4 vectors: lane `i` of the result is the sum of `v[i]`'s lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn reduce4(v: [__m256i; 4]) -> __m128i {
    let t = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
}

/// Per-row scalars of a tile as vectors, one lane per weight row (lanes past the tile are 0
/// and ignored).
#[derive(Clone, Copy)]
pub(super) struct RowScales {
    pub d: __m128,
    pub dmin: __m128,
}

/// Gathers `d`/`dmin` of up to 4 rows' blocks into lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn row_scales<const R: usize>(u: &[BlockMeta; R]) -> RowScales {
    let mut d = [0f32; 4];
    let mut dmin = [0f32; 4];
    for r in 0..R.min(4) {
        d[r] = u[r].d;
        dmin[r] = u[r].dmin;
    }
    // SAFETY: both arrays are 16 readable bytes.
    unsafe {
        RowScales {
            d: _mm_loadu_ps(d.as_ptr()),
            dmin: _mm_loadu_ps(dmin.as_ptr()),
        }
    }
}

/// Float work of one activation block against the `R` (<= 4) weight blocks of a tile, in the
/// reference order. `aux[r]` holds the 8 lane sums of `scale * w * q` (offset form for signed
/// kinds); `xb` is the Q8_K block. `sums[r]` is the reference's `sums[8]` for row `r`, `sumf`
/// its `sumf` with one lane per row. Lanes of different rows never mix, so each lane sees
/// exactly the reference's sequence of float operations.
///
/// # Safety
/// `xb` must be valid for `Q8K_BYTES` bytes; the CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn epilogue<const K: u8, const R: usize>(
    u: &[BlockMeta; R],
    rs: RowScales,
    xb: *const u8,
    aux: &[__m256i; R],
    sums: &mut [__m256; R],
    sumf: &mut __m128,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
    // features it is compiled for, pointers valid for the sizes it names), which is what every
    // operation below relies on.
    unsafe {
        let yd = rd_f32(xb);
        let ydv = _mm_set1_ps(yd);
        let zero = _mm256_setzero_si256();
        let bs = _mm256_loadu_si256(xb.add(Q8K_BSUMS) as *const __m256i);
        let mut ms = [zero; 4];
        if K == Q2 || K == Q4 || K == Q5 {
            for r in 0..R.min(4) {
                ms[r] = _mm256_madd_epi16(bs, u[r].mins);
            }
        }
        match K {
            Q2 => {
                // sumf += dall * isum - dmin * summs, with dall = y.d * d, dmin = y.d * dmin.
                let mut a = [zero; 4];
                a[..R.min(4)].copy_from_slice(&aux[..R.min(4)]);
                let isum = _mm_cvtepi32_ps(reduce4(a));
                let summs = _mm_cvtepi32_ps(reduce4(ms));
                let dall = _mm_mul_ps(ydv, rs.d);
                let dmin = _mm_mul_ps(ydv, rs.dmin);
                let t = _mm_sub_ps(_mm_mul_ps(dall, isum), _mm_mul_ps(dmin, summs));
                *sumf = _mm_add_ps(*sumf, t);
            }
            Q3 | Q6 => {
                // sums[l] += d * aux32[l], d = x.d * y.d
                for r in 0..R {
                    let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(aux[r], u[r].corr));
                    let d = _mm256_set1_ps(u[r].d * yd);
                    sums[r] = _mm256_add_ps(sums[r], _mm256_mul_ps(d, v));
                }
            }
            _ => {
                // sums[l] += d * aux32[l]; sumf -= dmin * sumi, with dmin = x.dmin * y.d
                for r in 0..R {
                    let v = _mm256_cvtepi32_ps(aux[r]);
                    let d = _mm256_set1_ps(u[r].d * yd);
                    sums[r] = _mm256_add_ps(sums[r], _mm256_mul_ps(d, v));
                }
                let sumi = _mm_cvtepi32_ps(reduce4(ms));
                let dmin = _mm_mul_ps(rs.dmin, ydv);
                *sumf = _mm_sub_ps(*sumf, _mm_mul_ps(dmin, sumi));
            }
        }
    }
}

/// The reference's last step for row lane `r`: Q2_K returns `sumf`; the others add
/// `sums[l]` for l in 0..8 to it in order.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn finish<const K: u8>(sums: __m256, sumf: __m128, r: usize) -> f32 {
    let mut lanes = [0f32; 8];
    let mut rows = [0f32; 4];
    // SAFETY: `lanes` is 32 and `rows` 16 writable bytes.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
        _mm_storeu_ps(rows.as_mut_ptr(), sumf);
    }
    let mut s = rows[r];
    if K != Q2 {
        for l in lanes {
            s += l;
        }
    }
    s
}

/// Weight rows per tile: each activation block is loaded once per tile and used for all rows.
pub(super) const ROWS: usize = 4;
/// Activation rows whose float state a tile keeps at once.
pub(super) const CHUNK: usize = 64;

/// Reusable per-call state of the batched path: the unpacked blocks of a tile and the
/// reference's float accumulators (`sums[8]` per row, `sumf` per row as a lane) per activation.
pub(super) struct TileState<const R: usize> {
    pub u: [Unpacked; R],
    pub sums: [[__m256; R]; CHUNK],
    pub sumf: [__m128; CHUNK],
}

impl<const R: usize> TileState<R> {
    pub(super) fn new() -> Box<TileState<R>> {
        Box::new(TileState {
            u: core::array::from_fn(|_| Unpacked::new()),
            // SAFETY: all-zero bytes are valid SIMD float vectors (+0.0).
            sums: unsafe { core::mem::zeroed() },
            // SAFETY: as above.
            sumf: unsafe { core::mem::zeroed() },
        })
    }
}

/// Defines `gemm_k::<K>` for one tier: tiles of [`ROWS`] weight rows (then single rows) over
/// chunks of activation rows and the blocks, around that tier's integer block dot
/// `$dot::<R>(&[Unpacked; R], packed_act, signed) -> [__m256i; R]`, and for a single
/// activation row its fused decode-and-multiply `$fused::<K>(block, packed_act) -> (BlockMeta,
/// __m256i)`.
macro_rules! kquant_gemm {
    ($feat:literal, $dot:ident, $fused:ident) => {
        /// `out[r * n + j] = W[r] . x[j]` for K-quant kind `K` over `a`, whose `xp` holds the
        /// quants packed by [`kquant::pack_q8k`](super::kquant::pack_q8k) (offset for signed
        /// kinds).
        ///
        /// # Safety
        /// `a`'s pointers must be valid for the sizes it names; the CPU must have the tier's
        /// features.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn gemm_k<const K: u8>(a: super::kblock::KArgs) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                use super::kquant::{TileState, ROWS};
                let (rows, n) = (a.rows, a.n);
                let full = rows / ROWS * ROWS;
                if n == 1 {
                    for r0 in (0..full).step_by(ROWS) {
                        row1_k::<K, ROWS>(a, r0);
                    }
                    for r0 in full..rows {
                        row1_k::<K, 1>(a, r0);
                    }
                    return;
                }
                if full > 0 {
                    let mut st = TileState::<ROWS>::new();
                    for r0 in (0..full).step_by(ROWS) {
                        tile_k::<K, ROWS>(a, r0, &mut st);
                    }
                }
                if rows > full {
                    let mut st = TileState::<1>::new();
                    for r0 in full..rows {
                        tile_k::<K, 1>(a, r0, &mut st);
                    }
                }
            }
        }

        /// One activation row against rows `r0 .. r0 + R`: decode and multiply in registers,
        /// no stored block.
        ///
        /// # Safety
        /// As [`gemm_k`] with `a.n == 1`, and `r0 + R <= a.rows`.
        #[target_feature(enable = $feat)]
        unsafe fn row1_k<const K: u8, const R: usize>(a: super::kblock::KArgs, r0: usize) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                use super::kblock::{block_bytes, Q8K_BYTES};
                let super::kblock::KArgs {
                    nb, w, x, xp, out, ..
                } = a;
                use super::kquant::{epilogue, finish, row_scales};
                let wbytes = block_bytes(K);
                let mut sums = [_mm256_setzero_ps(); R];
                let mut sumf = _mm_setzero_ps();
                for b in 0..nb {
                    let ap = xp.add(b * 256);
                    let mut meta = [core::mem::MaybeUninit::uninit(); R];
                    let mut aux = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let blk = w.add(((r0 + r) * nb + b) * wbytes);
                        super::kblock::prefetch_block::<K>(blk.wrapping_add(R * nb * wbytes));
                        let (m, a) = $fused::<K>(blk, ap);
                        meta[r] = core::mem::MaybeUninit::new(m);
                        aux[r] = a;
                    }
                    // SAFETY: every element was written just above.
                    let meta = meta.map(|m| m.assume_init());
                    let rs = row_scales(&meta);
                    epilogue::<K, R>(&meta, rs, x.add(b * Q8K_BYTES), &aux, &mut sums, &mut sumf);
                }
                for r in 0..R {
                    *out.add(r0 + r) = finish::<K>(sums[r], sumf, r);
                }
            }
        }

        /// Rows `r0 .. r0 + R` of [`gemm_k`].
        ///
        /// # Safety
        /// As [`gemm_k`], with `r0 + R <= a.rows`.
        #[target_feature(enable = $feat)]
        unsafe fn tile_k<const K: u8, const R: usize>(
            a: super::kblock::KArgs,
            r0: usize,
            st: &mut super::kquant::TileState<R>,
        ) {
            // SAFETY: the caller upholds this function's contract (its `# Safety` section: the CPU
            // features it is compiled for, pointers valid for the sizes it names), which is what every
            // operation below relies on.
            unsafe {
                let super::kblock::KArgs {
                    nb,
                    w,
                    x,
                    xp,
                    n,
                    out,
                    ..
                } = a;
                use super::kblock::{block_bytes, signed, Q8K_BYTES};
                use super::kquant::{epilogue, finish, row_scales, CHUNK};
                use super::unpack::unpack;
                let wbytes = block_bytes(K);
                let mut j0 = 0;
                while j0 < n {
                    let nj = (n - j0).min(CHUNK);
                    st.sums[..nj].fill([_mm256_setzero_ps(); R]);
                    st.sumf[..nj].fill(_mm_setzero_ps());
                    for b in 0..nb {
                        let mut meta = [core::mem::MaybeUninit::uninit(); R];
                        for (r, ur) in st.u.iter_mut().enumerate() {
                            let blk = w.add(((r0 + r) * nb + b) * wbytes);
                            super::kblock::prefetch_block::<K>(blk.wrapping_add(R * nb * wbytes));
                            meta[r] = core::mem::MaybeUninit::new(unpack::<K>(blk, ur));
                        }
                        // SAFETY: every element was written just above.
                        let meta = meta.map(|m| m.assume_init());
                        let rs = row_scales(&meta);
                        for jj in 0..nj {
                            let blk = (j0 + jj) * nb + b;
                            let aux = $dot::<R>(&st.u, xp.add(blk * 256), signed(K));
                            let xb = x.add(blk * Q8K_BYTES);
                            epilogue::<K, R>(
                                &meta,
                                rs,
                                xb,
                                &aux,
                                &mut st.sums[jj],
                                &mut st.sumf[jj],
                            );
                        }
                    }
                    for r in 0..R {
                        for jj in 0..nj {
                            *out.add((r0 + r) * n + j0 + jj) =
                                finish::<K>(st.sums[jj][r], st.sumf[jj], r);
                        }
                    }
                    j0 += nj;
                }
            }
        }
    };
}
pub(super) use kquant_gemm;
