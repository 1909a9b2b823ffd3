//! K-quant building blocks shared by the AVX2 and AVX-512-VNNI tiers: the byte permutation, the
//! activation packer, the per-type weight unpackers and the exact per-block float epilogue.
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

/// Bytes of one Q8_K block: f32 d, 256 i8, 16 i16 bsums.
pub(super) const Q8K_BYTES: usize = 292;
/// Offset of the bsums in a Q8_K block.
const Q8K_BSUMS: usize = 260;

/// Which K-quant a monomorphised kernel handles.
pub(super) const Q2: u8 = 2;
pub(super) const Q3: u8 = 3;
pub(super) const Q4: u8 = 4;
pub(super) const Q5: u8 = 5;
pub(super) const Q6: u8 = 6;

/// Bytes per weight block of kind `K`.
pub(super) const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q2 => 84,
        Q3 => 110,
        Q4 => 144,
        Q5 => 176,
        _ => 210,
    }
}

/// True when kind `K` stores signed values (offset activations + weight-side correction).
pub(super) const fn signed(kind: u8) -> bool {
    matches!(kind, Q3 | Q6)
}

/// One weight super-block, unpacked once and reused against every activation row.
#[repr(C, align(64))]
pub(super) struct Unpacked {
    /// 256 weight values, permuted per 32-element chunk (u8 or i8 depending on the kind).
    pub w: [u8; 256],
    /// Per chunk, 16 i16: position `2m` the scale of the chunk's first 16 elements, `2m + 1` of
    /// the second 16.
    pub s: [i16; 128],
    /// Signed kinds: `128 * sum(scale * w)` per lane (subtracted from the offset products).
    pub corr: [i32; 8],
    /// Per 16-element sub-block, the multiplier of the activation bsums (Q2_K: `sc >> 4`,
    /// Q4_K/Q5_K: the 6-bit min).
    pub mins: [i16; 16],
    pub d: f32,
    pub dmin: f32,
}

impl Unpacked {
    pub(super) fn new() -> Unpacked {
        Unpacked {
            w: [0; 256],
            s: [0; 128],
            corr: [0; 8],
            mins: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

#[inline(always)]
fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: every caller passes a pointer inside a block it has already bounds-checked; the
    // read is unaligned-safe.
    unsafe { u16::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 2])) }
}

/// f16 bits -> f32 with F16C (exact, like the reference's conversion).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
pub(super) fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: as `rd_u16`, for the 4-byte d of a Q8_K block.
    unsafe { f32::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 4])) }
}

#[inline(always)]
fn rd_u32(p: *const u8) -> u32 {
    // SAFETY: as `rd_u16`, for 4 bytes inside a block's scale array.
    unsafe { u32::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 4])) }
}

/// Within each 32-byte chunk, byte `4m + r` <- byte `m + 8r` (see the module docs).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn perm32(v: __m256i) -> __m256i {
    let idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let v = _mm256_permutevar8x32_epi32(v, idx);
    let ctrl = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
        14, 3, 7, 11, 15,
    );
    _mm256_shuffle_epi8(v, ctrl)
}

/// Packs `blocks` Q8_K blocks (the quants only) into 256 permuted bytes each, offset by 128
/// (`q ^ 0x80`) when `offset` is set.
///
/// # Safety
/// `x` must be valid for `blocks * Q8K_BYTES` bytes and `out` for `blocks * 256` bytes; the CPU
/// must have AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack_q8k(x: *const u8, blocks: usize, offset: bool, out: *mut u8) {
    let flip = _mm256_set1_epi8(if offset { -128 } else { 0 });
    for i in 0..blocks {
        let src = x.add(i * Q8K_BYTES + 4);
        let dst = out.add(i * 256);
        for c in 0..8 {
            let v = _mm256_loadu_si256(src.add(32 * c) as *const __m256i);
            let v = _mm256_xor_si256(v, flip);
            _mm256_storeu_si256(dst.add(32 * c) as *mut __m256i, perm32(v));
        }
    }
}

/// Broadcasts the i16 pair (2c, 2c+1) of `sc16` to every i32 lane for chunk `c` and stores the
/// 8 scale vectors into `u.s`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn store_scales(sc16: __m256i, u: &mut Unpacked) {
    for c in 0..8 {
        let v = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(c as i32));
        _mm256_storeu_si256(u.s.as_mut_ptr().add(16 * c) as *mut __m256i, v);
    }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn store_w(u: &mut Unpacked, c: usize, v: __m256i) {
    _mm256_storeu_si256(u.w.as_mut_ptr().add(32 * c) as *mut __m256i, v);
}

/// Signed kinds: `corr[m] = 128 * sum over the chunk lanes of scale * w`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn store_corr(u: &mut Unpacked) {
    let k128 = _mm256_set1_epi8(-128);
    let mut acc = _mm256_setzero_si256();
    for c in 0..8 {
        let w = _mm256_loadu_si256(u.w.as_ptr().add(32 * c) as *const __m256i);
        let s = _mm256_loadu_si256(u.s.as_ptr().add(16 * c) as *const __m256i);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(k128, w), s));
    }
    _mm256_storeu_si256(u.corr.as_mut_ptr() as *mut __m256i, acc);
}

/// `v >> s` per byte for a compile-time `s` (16-bit shifts; callers mask the result).
macro_rules! shr {
    ($v:expr, $s:literal) => {
        _mm256_srli_epi16::<$s>($v)
    };
}

/// Unpacks one weight block of kind `K` at `b` into `u`.
///
/// # Safety
/// `b` must be valid for `block_bytes(K)` bytes; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn unpack<const K: u8>(b: *const u8, u: &mut Unpacked) {
    match K {
        Q2 => unpack_q2(b, u),
        Q3 => unpack_q3(b, u),
        Q4 => unpack_q45::<false>(b, u),
        Q5 => unpack_q45::<true>(b, u),
        _ => unpack_q6(b, u),
    }
}

/// Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_q2(b: *const u8, u: &mut Unpacked) {
    let m4 = _mm_set1_epi8(0x0f);
    let sc = _mm_loadu_si128(b as *const __m128i);
    let lo = _mm256_cvtepu8_epi16(_mm_and_si128(sc, m4));
    let hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
    _mm256_storeu_si256(u.mins.as_mut_ptr() as *mut __m256i, hi);
    store_scales(lo, u);
    let m3 = _mm256_set1_epi8(3);
    for h in 0..2 {
        let v = perm32(_mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i));
        store_w(u, 4 * h, _mm256_and_si256(v, m3));
        store_w(u, 4 * h + 1, _mm256_and_si256(shr!(v, 2), m3));
        store_w(u, 4 * h + 2, _mm256_and_si256(shr!(v, 4), m3));
        store_w(u, 4 * h + 3, _mm256_and_si256(shr!(v, 6), m3));
    }
    u.d = f16_to_f32(rd_u16(b.add(80)));
    u.dmin = f16_to_f32(rd_u16(b.add(82)));
}

/// Q3_K's 12 scale bytes -> 16 six-bit scales (as ggml packs them), minus 32.
#[inline(always)]
fn q3_scales(p: *const u8) -> [i8; 16] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let a0 = rd_u32(p);
    let a1 = rd_u32(p.wrapping_add(4));
    let hi = rd_u32(p.wrapping_add(8));
    let words = [
        (a0 & LOW4) | ((hi & LOW2) << 4),
        (a1 & LOW4) | (((hi >> 2) & LOW2) << 4),
        ((a0 >> 4) & LOW4) | (((hi >> 4) & LOW2) << 4),
        ((a1 >> 4) & LOW4) | (((hi >> 6) & LOW2) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, w) in words.iter().enumerate() {
        for (k, byte) in w.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = (*byte as i8).wrapping_sub(32);
        }
    }
    out
}

/// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108. Values `raw - 4` in [-4, 3].
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_q3(b: *const u8, u: &mut Unpacked) {
    let sc = q3_scales(b.add(96));
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
    store_scales(sc16, u);
    let hm = perm32(_mm256_loadu_si256(b as *const __m256i));
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm256_set1_epi8(4);
    // Bit c of every hmask byte moved to bit 2 (16-bit shifts; the mask drops what crossed bytes).
    let hbit = [
        _mm256_and_si256(_mm256_slli_epi16::<2>(hm), m4),
        _mm256_and_si256(_mm256_slli_epi16::<1>(hm), m4),
        _mm256_and_si256(hm, m4),
        _mm256_and_si256(shr!(hm, 1), m4),
        _mm256_and_si256(shr!(hm, 2), m4),
        _mm256_and_si256(shr!(hm, 3), m4),
        _mm256_and_si256(shr!(hm, 4), m4),
        _mm256_and_si256(shr!(hm, 5), m4),
    ];
    for h in 0..2 {
        let v = perm32(_mm256_loadu_si256(b.add(32 + 32 * h) as *const __m256i));
        let q = [
            _mm256_and_si256(v, m3),
            _mm256_and_si256(shr!(v, 2), m3),
            _mm256_and_si256(shr!(v, 4), m3),
            _mm256_and_si256(shr!(v, 6), m3),
        ];
        for (s, qv) in q.into_iter().enumerate() {
            let c = 4 * h + s;
            store_w(u, c, _mm256_sub_epi8(_mm256_or_si256(qv, hbit[c]), m4));
        }
    }
    store_corr(u);
    u.d = f16_to_f32(rd_u16(b.add(108)));
    u.dmin = 0.0;
}

/// Q4_K / Q5_K's 12 scale bytes -> (8 scales, 8 mins), six bits each.
#[inline(always)]
fn k4_scales(p: *const u8) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let a0 = rd_u32(p);
    let a1 = rd_u32(p.wrapping_add(4));
    let a2 = rd_u32(p.wrapping_add(8));
    let sc0 = a0 & LOW6;
    let sc1 = (a2 & LOW4) | (((a0 >> 6) & LOW2) << 4);
    let mn0 = a1 & LOW6;
    let mn1 = ((a2 >> 4) & LOW4) | (((a1 >> 6) & LOW2) << 4);
    let mut s = [0u8; 8];
    let mut m = [0u8; 8];
    s[..4].copy_from_slice(&sc0.to_le_bytes());
    s[4..].copy_from_slice(&sc1.to_le_bytes());
    m[..4].copy_from_slice(&mn0.to_le_bytes());
    m[4..].copy_from_slice(&mn1.to_le_bytes());
    (s, m)
}

/// Q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16. Q5_K adds qh[32] @16 and moves qs to @48.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_q45<const HIGH: bool>(b: *const u8, u: &mut Unpacked) {
    let (s8, m8) = k4_scales(b.add(4));
    let s = _mm_loadl_epi64(s8.as_ptr() as *const __m128i);
    let m = _mm_loadl_epi64(m8.as_ptr() as *const __m128i);
    // Duplicate every byte (scale per 32 elements = two 16-element sub-blocks), widen to i16.
    store_scales(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s)), u);
    let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    _mm256_storeu_si256(u.mins.as_mut_ptr() as *mut __m256i, mins);
    let m4 = _mm256_set1_epi8(0x0f);
    let qs = if HIGH { b.add(48) } else { b.add(16) };
    for j in 0..4 {
        let v = perm32(_mm256_loadu_si256(qs.add(32 * j) as *const __m256i));
        store_w(u, 2 * j, _mm256_and_si256(v, m4));
        store_w(u, 2 * j + 1, _mm256_and_si256(shr!(v, 4), m4));
    }
    if HIGH {
        let qh = perm32(_mm256_loadu_si256(b.add(16) as *const __m256i));
        let m16 = _mm256_set1_epi8(0x10);
        // Bit c of every qh byte moved to bit 4.
        let hbit = [
            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m16),
            _mm256_and_si256(_mm256_slli_epi16::<3>(qh), m16),
            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m16),
            _mm256_and_si256(_mm256_slli_epi16::<1>(qh), m16),
            _mm256_and_si256(qh, m16),
            _mm256_and_si256(shr!(qh, 1), m16),
            _mm256_and_si256(shr!(qh, 2), m16),
            _mm256_and_si256(shr!(qh, 3), m16),
        ];
        for (c, h) in hbit.into_iter().enumerate() {
            let p = u.w.as_mut_ptr().add(32 * c) as *mut __m256i;
            _mm256_storeu_si256(p, _mm256_or_si256(_mm256_loadu_si256(p), h));
        }
    }
    u.d = f16_to_f32(rd_u16(b));
    u.dmin = f16_to_f32(rd_u16(b.add(2)));
}

/// Q6_K: ql[128] @0, qh[64] @128, scales[16] (i8) @192, d @208. Values `raw - 32`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_q6(b: *const u8, u: &mut Unpacked) {
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
    store_scales(sc16, u);
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let k32 = _mm256_set1_epi8(32);
    for h in 0..2 {
        let l0 = perm32(_mm256_loadu_si256(b.add(64 * h) as *const __m256i));
        let l1 = perm32(_mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i));
        let hb = perm32(_mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i));
        // Bits (2t, 2t+1) of qh moved to bits 4..5.
        let h0 = _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m30);
        let h1 = _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m30);
        let h2 = _mm256_and_si256(hb, m30);
        let h3 = _mm256_and_si256(shr!(hb, 2), m30);
        let vals = [
            _mm256_or_si256(_mm256_and_si256(l0, m4), h0),
            _mm256_or_si256(_mm256_and_si256(l1, m4), h1),
            _mm256_or_si256(_mm256_and_si256(shr!(l0, 4), m4), h2),
            _mm256_or_si256(_mm256_and_si256(shr!(l1, 4), m4), h3),
        ];
        for (t, v) in vals.into_iter().enumerate() {
            store_w(u, 4 * h + t, _mm256_sub_epi8(v, k32));
        }
    }
    store_corr(u);
    u.d = f16_to_f32(rd_u16(b.add(208)));
    u.dmin = 0.0;
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

/// Gathers `d`/`dmin` of up to 4 unpacked rows into lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn row_scales<const R: usize>(u: &[Unpacked; R]) -> RowScales {
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
    u: &[Unpacked; R],
    rs: RowScales,
    xb: *const u8,
    aux: &[__m256i; R],
    sums: &mut [__m256; R],
    sumf: &mut __m128,
) {
    let yd = rd_f32(xb);
    let ydv = _mm_set1_ps(yd);
    let zero = _mm256_setzero_si256();
    let bs = _mm256_loadu_si256(xb.add(Q8K_BSUMS) as *const __m256i);
    let mut ms = [zero; 4];
    if K == Q2 || K == Q4 || K == Q5 {
        for r in 0..R.min(4) {
            let mins = _mm256_loadu_si256(u[r].mins.as_ptr() as *const __m256i);
            ms[r] = _mm256_madd_epi16(bs, mins);
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
                let corr = _mm256_loadu_si256(u[r].corr.as_ptr() as *const __m256i);
                let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(aux[r], corr));
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

/// Defines `gemm_k::<K>` for one tier: tiles of [`ROWS`] weight rows (then single rows) over
/// chunks of activation rows and the blocks, around that tier's integer block dot
/// `$dot::<R>(&[Unpacked; R], packed_act, signed) -> [__m256i; R]`.
macro_rules! kquant_gemm {
    ($feat:literal, $dot:ident) => {
        /// `out[r * n + j] = W[r] . x[j]` for K-quant kind `K`: `w` holds `rows` rows of `nb`
        /// blocks, `x` the raw Q8_K rows and `xp` the packed quants from
        /// [`kquant::pack_q8k`](super::kquant::pack_q8k) (offset for signed kinds).
        ///
        /// # Safety
        /// All pointers must be valid for the sizes above; the CPU must have the tier's features.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn gemm_k<const K: u8>(
            nb: usize,
            w: *const u8,
            rows: usize,
            x: *const u8,
            xp: *const u8,
            n: usize,
            out: *mut f32,
        ) {
            use super::kquant::ROWS;
            let full = rows / ROWS * ROWS;
            for r0 in (0..full).step_by(ROWS) {
                tile_k::<K, ROWS>(nb, w, r0, x, xp, n, out);
            }
            for r0 in full..rows {
                tile_k::<K, 1>(nb, w, r0, x, xp, n, out);
            }
        }

        /// Rows `r0 .. r0 + R` of [`gemm_k`].
        ///
        /// # Safety
        /// As [`gemm_k`], with `r0 + R <= rows`.
        #[target_feature(enable = $feat)]
        unsafe fn tile_k<const K: u8, const R: usize>(
            nb: usize,
            w: *const u8,
            r0: usize,
            x: *const u8,
            xp: *const u8,
            n: usize,
            out: *mut f32,
        ) {
            use super::kquant::{
                block_bytes, epilogue, finish, row_scales, signed, unpack, Unpacked, Q8K_BYTES,
            };
            const CHUNK: usize = 64;
            let wbytes = block_bytes(K);
            let mut u: [Unpacked; R] = core::array::from_fn(|_| Unpacked::new());
            let mut sums = [[_mm256_setzero_ps(); R]; CHUNK];
            let mut sumf = [_mm_setzero_ps(); CHUNK];
            let mut j0 = 0;
            while j0 < n {
                let nj = (n - j0).min(CHUNK);
                sums[..nj].fill([_mm256_setzero_ps(); R]);
                sumf[..nj].fill(_mm_setzero_ps());
                for b in 0..nb {
                    for (r, ur) in u.iter_mut().enumerate() {
                        unpack::<K>(w.add(((r0 + r) * nb + b) * wbytes), ur);
                    }
                    let rs = row_scales(&u);
                    for jj in 0..nj {
                        let blk = (j0 + jj) * nb + b;
                        let aux = $dot::<R>(&u, xp.add(blk * 256), signed(K));
                        let xb = x.add(blk * Q8K_BYTES);
                        epilogue::<K, R>(&u, rs, xb, &aux, &mut sums[jj], &mut sumf[jj]);
                    }
                }
                for r in 0..R {
                    for jj in 0..nj {
                        *out.add((r0 + r) * n + j0 + jj) = finish::<K>(sums[jj][r], sumf[jj], r);
                    }
                }
                j0 += nj;
            }
        }
    };
}
pub(super) use kquant_gemm;
