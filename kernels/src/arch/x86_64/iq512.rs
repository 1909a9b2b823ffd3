//! The i-quants on the AVX-512-VNNI tier when the CPU also has AVX512-VBMI: each 256-element
//! weight unit is decoded straight into four 64-byte registers (`decode`), together with the
//! per-pair scale words, and then used against every activation row of the call (decode once,
//! dot N rows). Grid points are gathered from the expanded grids (`iq_grids`; IQ1's expanded
//! and biased in `tables`): one `vpgatherdq` per 8 points of the 8-element grids (IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ1_S, IQ1_M), one `vpgatherdd` per 16 points of the 4-element ones (IQ3_S,
//! and half of IQ3_XXS's). On the 2026-12-02 Xeon that beats looking ggml's u16 codes up in
//! registers (`vpermi2w` per 64 grid points and a blend tree, then the fields expanded by
//! `vpermw` + `vpmultishiftqb` + `vpermb`): a two-register word permute costs two cycles of its
//! one shuffle port, while the gathers run on the load ports. IQ3_XXS (256 points, 64 per
//! block) takes its first 32 points from the codes in registers and gathers the rest, so that
//! both kinds of port work. Sign bytes are
//! `vpmultishiftqb` + one `vpermi2b` of `KSIGNS_IQ2XS` (or the block's own sign bytes). The
//! constant layouts live in `tables`; IQ4_XS and IQ4_NL take their own path (`nl4`: biased
//! weights, one row per lane for the float sums).
//!
//! Exactness: per unit the weights get their signs and then a bias (`w + BIAS`, `BIAS` at
//! least the kind's largest magnitude), so that they are unsigned bytes and `vpmaddubsw(w +
//! BIAS, x)` takes the activation bytes as they are (no per-row sign work, no packed copy of
//! the activations): each pair sum is at most 2 * 2 BIAS * 128 in magnitude (BIAS <= 63: below 2^15; IQ3_XXS's
//! 62 is the largest), and
//! `vpdpwssd` with the scale words adds them, scaled, into i32 lanes. The bias adds `BIAS` times
//! each 16 elements' scale times their activation sum, which one `vpmaddwd` of those sums
//! (computed once per call) with `-BIAS * scale` words takes out again, exactly. Integer sums are
//! exact in any order, so one horizontal sum gives the reference's integer `bsum`; the float
//! epilogue then repeats the scalar reference's operations in its
//! order. The IQ1 grids are decoded times 8 (IQ1_M adds its ±1 shift signs, IQ1_S adds the
//! activation `bsums` weighed by its signed scales to the same sum), so one integer is `8 sumi +
//! sumi1`, below 2^24, and the reference's `sumi + sumi1 / 8` is that integer over 8, exactly. The
//! ternary types TQ1_0/TQ2_0 are decoders of the same shape (`ternary`).
//!
//! Tiles: up to [`LANE_N`] activation rows, 16 weight rows share a register's lanes
//! ([`lane_tile`]; rows past the last whole 16 in tiles of [`ROWS`]); the ternary kinds run lane
//! tiles over chunks of [`LANE_N`] up to their [`Wide::SPLIT_MAX`]. Above it (prefill),
//! 16 activation rows do ([`act_tile`]): the activations are copied once per call into
//! cache-line-aligned blocks, unit-major, with their 16-element sums ([`ActBlock`]), and each
//! weight unit is decoded once per pass and dotted with every activation row of the pass at
//! fixed offsets, one [`reduce16`] per 16 dots. There `vpdpwssd` is written as asm
//! (`klanes512`'s `dpwssd`): LLVM otherwise splits it into `vpmaddwd` + `vpaddd`, one more uop
//! on the multiply ports those dots are bound by (the batch-1 lane tile is faster with LLVM's
//! split: IQ3_S 14.4-15.2 vs 17.2-18.1 ns per 256 weights with the asm).

use core::arch::x86_64::*;

use crate::arch::iq_tile::{
    unit_blocks, Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, IqKind, Tq1_0, Tq2_0,
};
use crate::formats::kquants::layout::{Q8K_BSUMS, Q8K_QS};
use crate::formats::{BlockQ8_K, QK_K};
use crate::{GgmlType, Tile};
use core::mem::size_of;

mod decode;
mod nl4;
mod tables;
mod ternary;

use super::kblock::prefetch_span;
use super::klanes512::{dpwssd, gfni};
use decode::negate;

thread_local! {
    /// The activations' 16-element sums for the current call (see [`bias`]).
    static XSUMS: core::cell::RefCell<Vec<[i16; 16]>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Weight rows whose units are interleaved (see [`gemm_wide`]).
const ROWS: usize = 4;

/// One decoded weight unit: signed weights, the scale word of every `vpmaddubsw` pair, and the
/// floats its epilogue needs (converted once per unit, not once per activation row).
#[derive(Clone, Copy)]
struct Dec {
    w: [__m512i; 4],
    sc: [__m512i; 4],
    /// The weights' sign bits still to apply (bit `i` of `neg[c]`: byte `i` of `w[c]`).
    neg: [u64; 4],
    /// IQ1_S: the 16 words `ls * delta` by which `sumi1` weighs the activation `bsums`.
    bw: __m256i,
    /// Minus `BIAS` times each 16 elements' scale word (see [`bias`]), by which the sums of the
    /// activations' 16-element groups are weighed into the sum.
    bb: __m256i,
    /// The scale word of each 16 elements (what [`bias`] takes `bb` from; the kinds that set
    /// `bb` themselves leave it zero).
    gs: __m256i,
    /// The block's `d`.
    d: f32,
}

impl Dec {
    /// A unit whose block's `d` is `d0`, without signs or `bw`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    fn new(w: [__m512i; 4], sc: [__m512i; 4], d0: f32) -> Dec {
        Dec {
            w,
            sc,
            neg: [0; 4],
            bw: _mm256_setzero_si256(),
            bb: _mm256_setzero_si256(),
            gs: _mm256_setzero_si256(),
            d: d0,
        }
    }
}

/// An i-quant with a 64-byte decoder.
trait Wide: IqKind<X = BlockQ8_K> {
    /// At least the largest weight magnitude the decoder gives (so `w + BIAS` is an unsigned
    /// byte), and at most 63, so that a `vpmaddubsw` pair sum (up to `2 * 2 BIAS * 128` in
    /// magnitude) stays below 2^15.
    const BIAS: i8;
    /// Whether the sum includes `sum(bw * bsums)` (IQ1_S: `8 sumi + sumi1`).
    const BSUMS: bool = false;
    /// The ternary types: `decode_regs` gives the weights already biased (`t = w + 1`) and
    /// every scale word is 1, so [`bias`] only sets `bb` and the dot is one `vpdpbusd` per
    /// register.
    const TERNARY: bool = false;
    /// `decode_regs` gives the weights with their signs and `BIAS` already applied (the IQ1
    /// kinds, from a biased value table) and sets `bb` itself (see [`bias`]), so
    /// [`bias`] has nothing left to do.
    const BIASED: bool = false;
    /// Activation rows up to which more than [`LANE_N`] run as [`lane_tile`]s over chunks of
    /// [`LANE_N`] (each decoding the tile's units again) instead of [`act_tile`]: worth it where
    /// the decode is cheap (the ternary kinds); [`LANE_N`] (never) for the grid kinds, whose
    /// decode is most of a row's cost.
    const SPLIT_MAX: usize = LANE_N;
    /// Decodes the unit starting at `p` (its first block's first byte).
    ///
    /// # Safety
    /// The CPU has the tier's features (see [`gemm`]); `p` is valid for `UNIT` blocks of `W`.
    unsafe fn decode_regs(p: *const u8) -> Dec;
    /// [`Wide::decode_regs`] with GFNI's affine byte transforms (the same weights): the kinds
    /// without such a decoder keep theirs.
    ///
    /// # Safety
    /// As [`Wide::decode_regs`], and the CPU has GFNI.
    #[inline(always)]
    unsafe fn decode_regs_gf(p: *const u8) -> Dec {
        // SAFETY: the caller's contract.
        unsafe { Self::decode_regs(p) }
    }
    /// The factor taking the integer to the float that the reference multiplies by `d * x.d`
    /// (`sumf += d * x.d * term`; 1, which leaves every value's bits, but for IQ1).
    const TERM: f32 = 1.0;
}

/// The sums of the dwords of each of four registers.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn reduce4(a: &[__m512i; 4]) -> [i32; 4] {
    // 128-bit lanes: [a0+a2, a1+a3] of the first and second register, same for the other two
    let ab = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b01_00_01_00>(a[0], a[1]),
        _mm512_shuffle_i64x2::<0b11_10_11_10>(a[0], a[1]),
    );
    let cd = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b01_00_01_00>(a[2], a[3]),
        _mm512_shuffle_i64x2::<0b11_10_11_10>(a[2], a[3]),
    );
    // lane r: register r's four partial dwords
    let t = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(ab, cd),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(ab, cd),
    );
    let t = _mm512_add_epi32(t, _mm512_shuffle_epi32::<0b01_00_11_10>(t));
    let t = _mm512_add_epi32(t, _mm512_shuffle_epi32::<0b10_11_00_01>(t));
    let order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    let mut s = [0i32; 4];
    let r = _mm512_castsi512_si128(_mm512_permutexvar_epi32(order, t));
    // SAFETY: `s` is 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(s.as_mut_ptr() as *mut __m128i, r) };
    s
}

/// Scaled-mode dot products whose horizontal sums are taken four at a time ([`reduce4`]), with
/// what their epilogues need: the output index, the weight and the activation `d`. Flushed in
/// the order they came, so each output still sees its units in the reference's order.
struct Pending {
    acc: [__m512i; 4],
    at: [(usize, f32, f32); 4],
    len: usize,
}

impl Pending {
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
    fn new() -> Pending {
        Pending {
            acc: [_mm512_setzero_si512(); 4],
            at: [(0, 0.0, 0.0); 4],
            len: 0,
        }
    }

    /// Queues `acc` for `out[i]`, flushing when four are queued.
    #[inline(always)]
    fn push<K: Wide>(&mut self, acc: __m512i, i: usize, dw: f32, dx: f32, out: &mut [f32]) {
        self.acc[self.len] = acc;
        self.at[self.len] = (i, dw, dx);
        self.len += 1;
        if self.len == 4 {
            self.flush::<K>(out);
        }
    }

    /// Runs the queued epilogues, in order.
    #[inline(always)]
    fn flush<K: Wide>(&mut self, out: &mut [f32]) {
        if self.len == 0 {
            return;
        }
        // SAFETY: only reached from `gemm_wide`, whose caller guarantees the tier's features.
        let v = unsafe { reduce4(&self.acc) };
        for (&(i, dw, dx), &v) in self.at[..self.len].iter().zip(&v) {
            out[i] += dw * dx * (v as f32 * K::TERM);
        }
        self.len = 0;
    }
}

/// Applies `d`'s weight signs and adds `K::BIAS` to every weight (per unit, not per activation
/// row), and sets `bb` to minus `BIAS` times each 16 elements' scale word (`gs`): then `sum(sc
/// (w + BIAS) x) + sum(bb xsums)` is `sum(sc w x)`, exactly (`xsums`: the activations'
/// 16-element sums, computed here: a Q8_K block's `bsums` are not trusted to be them).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn bias<K: Wide>(d: &mut Dec) {
    if K::TERNARY {
        d.bb = _mm256_set1_epi16(-(K::BIAS as i16));
        return;
    }
    if K::BIASED {
        return;
    }
    let b = _mm512_set1_epi8(K::BIAS);
    for (w, &neg) in d.w.iter_mut().zip(&d.neg) {
        *w = _mm512_add_epi8(negate(*w, neg), b);
    }
    d.bb = _mm256_mullo_epi16(d.gs, _mm256_set1_epi16(-(K::BIAS as i16)));
}

/// The sixteen 16-element sums of each of `blocks` Q8_K blocks at `x`, as words, into `dst`.
///
/// # Safety
/// The CPU has the tier's features; `x` holds `blocks` blocks, `dst` `blocks` entries.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn xsums(x: &[BlockQ8_K], dst: &mut [[i16; 16]]) {
    let flip = _mm512_set1_epi8(-128);
    for (b, o) in x.iter().zip(dst) {
        let p = b as *const BlockQ8_K as *const u8;
        for c in 0..4 {
            // SAFETY: 64 bytes of the block's `qs`; unaligned load.
            let v = unsafe { _mm512_loadu_si512(p.add(Q8K_QS + 64 * c) as *const __m512i) };
            // x + 128 as unsigned bytes, summed eight at a time
            let s = _mm512_sad_epu8(_mm512_xor_si512(v, flip), _mm512_setzero_si512());
            let mut q = [0u64; 8];
            // SAFETY: `q` is 64 writable bytes; unaligned store.
            unsafe { _mm512_storeu_si512(q.as_mut_ptr() as *mut __m512i, s) };
            for g in 0..4 {
                o[4 * c + g] = (q[2 * g] + q[2 * g + 1]) as i16 - 16 * 128;
            }
        }
    }
}

/// The dword partial sums of biased unit `d` (see [`bias`]) against the Q8_K block at `xu`
/// whose 16-element sums are `xs`.
///
/// # Safety
/// The CPU has the tier's features; `xu` is one Q8_K block.
#[inline(always)]
unsafe fn dot_acc<K: Wide>(d: &Dec, xu: *const u8, xs: &[i16; 16]) -> __m512i {
    // SAFETY: the reads stay inside the activation block and `xs` (caller's contract); the
    // features are the caller's.
    unsafe {
        let xs = _mm256_loadu_si256(xs.as_ptr() as *const __m256i);
        let mut s = _mm256_madd_epi16(xs, d.bb);
        if K::BSUMS {
            let bsums = _mm256_loadu_si256(xu.add(Q8K_BSUMS) as *const __m256i);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(bsums, d.bw));
        }
        let mut acc = _mm512_zextsi256_si512(s);
        for c in 0..4 {
            let x = _mm512_loadu_si512(xu.add(Q8K_QS + 64 * c) as *const __m512i);
            acc = if K::TERNARY {
                _mm512_dpbusd_epi32(acc, d.w[c], x)
            } else {
                _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(d.w[c], x), d.sc[c])
            };
        }
        acc
    }
}

/// One activation block as [`act_tile`] reads it, copied once per call: the quants on cache
/// line boundaries (in a Q8_K block they start 4 bytes in, so each 64-byte load spans two
/// lines), their 16-element sums (see [`bias`]) and the block's `bsums`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct ActBlock {
    qs: [i8; QK_K],
    xs: [i16; QK_K / 16],
    bsums: [[u8; 2]; QK_K / 16],
}

impl ActBlock {
    const ZERO: ActBlock = ActBlock {
        qs: [0; QK_K],
        xs: [0; QK_K / 16],
        bsums: [[0; 2]; QK_K / 16],
    };
}

/// [`dot_acc`] of unit `d` against the `M` activation blocks from `a` (the other sums of the
/// 16 zero), register chunk by register chunk (the sums' dependency chains interleave, every
/// address a fixed offset).
///
/// # Safety
/// The CPU has the tier's features; `a` is valid for `M <= 16` blocks.
#[inline(always)]
unsafe fn dot_acts<K: Wide, const M: usize>(d: &Dec, a: *const ActBlock) -> [__m512i; ACTS] {
    // SAFETY: the reads stay inside the 16 blocks (caller's contract); the features are the
    // caller's.
    unsafe {
        let mut acc: [__m512i; ACTS] = core::array::from_fn(|j| {
            if j >= M {
                return _mm512_setzero_si512();
            }
            let b = &*a.add(j);
            let v = _mm256_load_si256(b.xs.as_ptr() as *const __m256i);
            let mut s = _mm256_madd_epi16(v, d.bb);
            if K::BSUMS {
                let bsums = _mm256_load_si256(b.bsums.as_ptr() as *const __m256i);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(bsums, d.bw));
            }
            _mm512_zextsi256_si512(s)
        });
        for c in 0..4 {
            for (j, acc) in acc[..M].iter_mut().enumerate() {
                let p = (*a.add(j)).qs.as_ptr().add(64 * c);
                let x = _mm512_load_si512(p as *const __m512i);
                *acc = if K::TERNARY {
                    _mm512_dpbusd_epi32(*acc, d.w[c], x)
                } else {
                    dpwssd(*acc, _mm512_maddubs_epi16(d.w[c], x), d.sc[c])
                };
            }
        }
        acc
    }
}

/// Weight rows whose float sums share one register's lanes ([`lane_tile`]).
const LANES: usize = 16;
/// Activation rows up to which whole 16-row tiles take [`lane_tile`].
const LANE_N: usize = 4;

/// The dword sums of 16 registers, register `r`'s in lane `r`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn reduce16(a: &[__m512i; LANES]) -> __m512i {
    // pairs: per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3]
    let s1: [__m512i; 8] = core::array::from_fn(|i| {
        let (a, b) = (a[2 * i], a[2 * i + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    });
    // quads: per 128-bit lane the four registers' lane sums
    let s2: [__m512i; 4] = core::array::from_fn(|i| {
        let (a, b) = (s1[2 * i], s1[2 * i + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    });
    let fold = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b),
        )
    };
    fold(fold(s2[0], s2[1]), fold(s2[2], s2[3]))
}

/// 16 weight rows from `wt` against `J` activation rows (row `r`'s output for activation `j`
/// at `out[r * stride + j]`): per
/// unit each row decoded once, its `J` integer sums taken across the rows into one register
/// per activation row ([`reduce16`]), and `sum += (d * x.d) * term` on 16 rows at once, in the
/// reference's order per output.
///
/// # Safety
/// The CPU has the tier's features; `wt` is valid for 16 rows of `units` units (`row_bytes`
/// apart); `xb` and `xs` hold `J` activation rows of `units` blocks.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn lane_tile<K: Wide, const J: usize, const G: bool>(
    wt: *const u8,
    row_bytes: usize,
    units: usize,
    xb: &[BlockQ8_K],
    xs: &[[i16; 16]],
    out: &mut [f32],
    stride: usize,
) {
    let unit_w_bytes = K::UNIT * size_of::<K::W>();
    let mut sum = [_mm512_setzero_ps(); J];
    // every unit writes all of `acc` before reading it: zeroed once per tile, not per unit
    // (when its J x 16 registers spill, zeroing them is a `memset`: 12-14% of a batch-4 TQ2_0
    // call)
    let mut acc = [[_mm512_setzero_si512(); LANES]; J];
    for u in 0..units {
        let mut dw = [0f32; LANES];
        for r in 0..LANES {
            let p = wt.wrapping_add(r * row_bytes + u * unit_w_bytes);
            // the same unit of the next tile's rows, so the loads run ahead of the decode
            prefetch_span(p.wrapping_add(LANES * row_bytes), unit_w_bytes);
            // SAFETY: row r of the tile holds unit u (caller's contract; GFNI when `G`).
            let mut d = unsafe { decode::<K, G>(p) };
            bias::<K>(&mut d);
            dw[r] = d.d;
            for (j, a) in acc.iter_mut().enumerate() {
                let xu = &xb[j * units + u];
                // SAFETY: `xu` is one Q8_K block.
                a[r] = unsafe {
                    dot_acc::<K>(&d, xu as *const BlockQ8_K as *const u8, &xs[j * units + u])
                };
            }
        }
        // SAFETY: `dw` is 64 readable bytes; unaligned load.
        let dw = unsafe { _mm512_loadu_ps(dw.as_ptr()) };
        for (j, (s, a)) in sum.iter_mut().zip(&acc).enumerate() {
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(reduce16(a)), _mm512_set1_ps(K::TERM));
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(xb[j * units + u].d()));
            *s = _mm512_add_ps(*s, _mm512_mul_ps(dd, t));
        }
    }
    for (j, s) in sum.iter().enumerate() {
        let mut v = [0f32; LANES];
        // SAFETY: `v` is 64 writable bytes; unaligned store.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *s) };
        for (r, &v) in v.iter().enumerate() {
            out[r * stride + j] = K::finish(v);
        }
    }
}

/// Activation rows whose float sums share one register's lanes ([`act_tile`]).
const ACTS: usize = 16;
/// Weight rows [`act_tile`] runs unit by unit at a time: their units (and float sums) stay in
/// L2 across the units, whatever the call's row count.
const ROW_BLOCK: usize = 64;
/// 16-row activation chunks per [`act_tile`] pass: one unit of them (20 KiB of [`ActBlock`]s)
/// stays in the L1 data cache while every weight row's unit runs against it.
const PASS_CHUNKS: usize = 4;

/// Weight rows `wt` (`rows` of them, `row_bytes` apart) against activation rows `j0 .. j0 +
/// jn` (`jn` at most `ACTS * PASS_CHUNKS`; `out` holds all `n` outputs of each row), unit by
/// unit: each row's unit decoded once and dotted with every activation row of the pass, each
/// 16 activation rows' integer sums reduced into one register, lane `j` = activation row `j`
/// ([`reduce16`]), and `sum += (d * x.d) * term` run on 16 outputs at once (`sums`, one
/// register per row and chunk), in the reference's order per output. Unit `u` of activation
/// row `j` is `acts[u * stride + j]`, its `d` `xd[u * stride + j]` (0 past the last row).
///
/// # Safety
/// The CPU has the tier's features (GFNI when `G`); `wt` is valid for `rows` rows of `units`
/// units; `j0` is a multiple of 16, `j0 + jn <= n` and `stride >= j0 + 16 * jn.div_ceil(16)`;
/// `acts` and `xd` hold `units * stride` entries.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn act_tile<K: Wide, const G: bool>(
    wt: *const u8,
    rows: usize,
    row_bytes: usize,
    units: usize,
    (acts, xd, stride): (&[ActBlock], &[f32], usize),
    (j0, jn, n): (usize, usize, usize),
    sums: &mut Vec<__m512>,
    out: &mut [f32],
) {
    let unit_w_bytes = K::UNIT * size_of::<K::W>();
    let chunks = jn.div_ceil(ACTS);
    sums.clear();
    sums.resize(rows * chunks, _mm512_setzero_ps());
    for u in 0..units {
        for (r, sr) in sums.chunks_exact_mut(chunks).enumerate() {
            let p = wt.wrapping_add(r * row_bytes + u * unit_w_bytes);
            // the same unit of the next block's row: a unit pass touches one line or two of
            // each row (no stream for the hardware prefetcher), so the next block is fetched
            // a whole block ahead
            prefetch_span(p.wrapping_add(ROW_BLOCK * row_bytes), unit_w_bytes);
            // SAFETY: row r holds unit u (caller's contract; GFNI when `G`).
            let mut d = unsafe { decode::<K, G>(p) };
            bias::<K>(&mut d);
            let dw = _mm512_set1_ps(d.d);
            for (c, s) in sr.iter_mut().enumerate() {
                let at = u * stride + j0 + c * ACTS;
                let a = &acts[at..at + ACTS];
                // a last chunk of up to 8 rows skips the 8 padding rows' dots
                // SAFETY: `a` is 16 blocks.
                let acc = unsafe {
                    if jn - c * ACTS <= ACTS / 2 {
                        dot_acts::<K, { ACTS / 2 }>(&d, a.as_ptr())
                    } else {
                        dot_acts::<K, ACTS>(&d, a.as_ptr())
                    }
                };
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(reduce16(&acc)), _mm512_set1_ps(K::TERM));
                let xdv = &xd[at..at + ACTS];
                // SAFETY: `xdv` is 64 readable bytes; unaligned load.
                let dd = _mm512_mul_ps(dw, unsafe { _mm512_loadu_ps(xdv.as_ptr()) });
                *s = _mm512_add_ps(*s, _mm512_mul_ps(dd, t));
            }
        }
    }
    for (r, sr) in sums.chunks_exact(chunks).enumerate() {
        for (c, s) in sr.iter().enumerate() {
            let jc = j0 + c * ACTS;
            let m = (jn - c * ACTS).min(ACTS);
            let mut v = [0f32; ACTS];
            // SAFETY: `v` is 64 writable bytes; unaligned store.
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *s) };
            for (o, &v) in out[r * n + jc..][..m].iter_mut().zip(&v) {
                *o = K::finish(v);
            }
        }
    }
}

/// The unit at `p` through [`Wide::decode_regs_gf`] when `G`, else [`Wide::decode_regs`].
///
/// # Safety
/// As [`Wide::decode_regs`]; the CPU has GFNI when `G`.
#[inline(always)]
unsafe fn decode<K: Wide, const G: bool>(p: *const u8) -> Dec {
    // SAFETY: the caller's contract.
    unsafe {
        if G {
            K::decode_regs_gf(p)
        } else {
            K::decode_regs(p)
        }
    }
}

thread_local! {
    /// The activations of the current call as [`act_tile`] reads them, their `d`s, and the
    /// float sums of a pass.
    #[allow(clippy::type_complexity)]
    static ACTS_BUF: core::cell::RefCell<(Vec<ActBlock>, Vec<f32>, Vec<__m512>)> =
        const { core::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// More than [`LANE_N`] activation rows: the activations copied unit-major into [`ActBlock`]s
/// (16-row groups, the last padded with zeros), then per [`ROW_BLOCK`] weight rows
/// [`act_tile`] passes over [`PASS_CHUNKS`] of those groups at a time.
///
/// # Safety
/// The CPU has the tier's features (GFNI when `G`); `wb` holds `out.len() / n` rows of `units`
/// units (`row_bytes` each), `xb` `n` activation rows of `units` blocks.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_acts<K: Wide, const G: bool>(
    wb: &[K::W],
    row_bytes: usize,
    units: usize,
    xb: &[BlockQ8_K],
    n: usize,
    out: &mut [f32],
) {
    let stride = n.div_ceil(ACTS) * ACTS;
    let pass = PASS_CHUNKS * ACTS;
    ACTS_BUF.with(|cell| {
        let (acts, xd, sums) = &mut *cell.borrow_mut();
        acts.clear();
        acts.resize(units * stride, ActBlock::ZERO);
        xd.clear();
        xd.resize(units * stride, 0.0);
        for (j, row) in xb.chunks_exact(units).enumerate() {
            for (u, b) in row.iter().enumerate() {
                let e = &mut acts[u * stride + j];
                e.qs = b.qs;
                e.bsums = b.bsums;
                // SAFETY: one block and one entry; the caller guarantees the features.
                unsafe { xsums(core::slice::from_ref(b), core::slice::from_mut(&mut e.xs)) };
                xd[u * stride + j] = b.d();
            }
        }
        // rows in blocks whose units stay cached while each of them runs, passes inside
        for (b, ob) in out.chunks_mut(ROW_BLOCK * n).enumerate() {
            let wt = wb[b * ROW_BLOCK * units * K::UNIT..].as_ptr() as *const u8;
            for j0 in (0..n).step_by(pass) {
                let jn = (n - j0).min(pass);
                // SAFETY: the caller's contract (the block's `ob.len() / n` rows from `wt`);
                // `acts` and `xd` hold `units` runs of `stride`.
                unsafe {
                    act_tile::<K, G>(
                        wt,
                        ob.len() / n,
                        row_bytes,
                        units,
                        (acts, xd, stride),
                        (j0, jn, n),
                        sums,
                        ob,
                    )
                };
            }
        }
    });
}

/// `out[r * n + j] = W[r] . x[j]` for one kind: unit by unit, each decoded once and run against
/// every activation row, each result accumulated in the reference's block order (with GFNI's
/// decoders when `G`).
///
/// # Safety
/// The CPU has the tier's features, and GFNI when `G`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gemm_wide<K: Wide, const G: bool>(
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    let Some((wb, xb, per_row)) = unit_blocks::<K>(k, w, rows, x, n, out) else {
        return false;
    };
    if n == 0 {
        return true;
    }
    let units = per_row / K::UNIT;
    let unit_w_bytes = K::UNIT * size_of::<K::W>();
    let row_bytes = per_row * size_of::<K::W>();
    if n > LANE_N.max(K::SPLIT_MAX) {
        // SAFETY: `unit_blocks` checked the lengths; the caller guarantees the features.
        unsafe { gemm_acts::<K, G>(wb, row_bytes, units, xb, n, out) };
        return true;
    }
    XSUMS.with(|cell| {
        let mut xs = cell.borrow_mut();
        xs.resize(xb.len(), [0; 16]);
        // SAFETY: one entry per activation block; the caller guarantees the features.
        unsafe { xsums(xb, &mut xs) };
        // whole 16-row tiles one row per lane, the rest below
        let whole = rows / LANES * LANES;
        let (out_lanes, out) = out.split_at_mut(whole * n);
        for (t, ot) in out_lanes.chunks_exact_mut(LANES * n).enumerate() {
            let wt = wb[t * LANES * per_row..].as_ptr() as *const u8;
            // activation rows in chunks of at most LANE_N (one chunk unless `K::SPLIT_MAX`)
            for j0 in (0..n).step_by(LANE_N) {
                let c = (n - j0).min(LANE_N);
                let (xc, sc) = (&xb[j0 * units..], &xs[j0 * units..]);
                let oc = &mut ot[j0..];
                // SAFETY: the tile's 16 rows exist, `xc`/`sc` hold activation rows j0..j0 + c;
                // the caller guarantees the features.
                unsafe {
                    match c {
                        1 => lane_tile::<K, 1, G>(wt, row_bytes, units, xc, sc, oc, n),
                        2 => lane_tile::<K, 2, G>(wt, row_bytes, units, xc, sc, oc, n),
                        3 => lane_tile::<K, 3, G>(wt, row_bytes, units, xc, sc, oc, n),
                        _ => lane_tile::<K, LANE_N, G>(wt, row_bytes, units, xc, sc, oc, n),
                    }
                }
            }
        }
        let wb = &wb[whole * per_row..];
        out.fill(0.0);
        let mut pending = Pending::new();
        // Rows in tiles of ROWS, so that the float chains of several outputs (each unit's
        // epilogue adds to its output in order) interleave instead of waiting on each other.
        for (wt, ot) in wb.chunks(ROWS * per_row).zip(out.chunks_mut(ROWS * n)) {
            for u in 0..units {
                for (r, wr) in wt.chunks_exact(per_row).enumerate() {
                    let wu = &wr[u * K::UNIT..][..K::UNIT];
                    let wp = wu.as_ptr() as *const u8;
                    // the same unit of the next tile's rows, so the loads run ahead of the decode
                    prefetch_span(wp.wrapping_add(ROWS * row_bytes), unit_w_bytes);
                    // SAFETY: `wu` is one whole weight unit; the caller guarantees the features.
                    let mut d = unsafe { decode::<K, G>(wp) };
                    bias::<K>(&mut d);
                    for j in 0..n {
                        let xu = &xb[(j * units + u) * K::X_UNIT..][..K::X_UNIT];
                        // SAFETY: `xu` is one Q8_K block (`unit_blocks` checked the lengths).
                        let acc = unsafe {
                            dot_acc::<K>(&d, xu.as_ptr() as *const u8, &xs[j * units + u])
                        };
                        pending.push::<K>(acc, r * n + j, d.d, xu[0].d(), ot);
                    }
                }
            }
            pending.flush::<K>(ot);
        }
        for acc in out.iter_mut() {
            *acc = K::finish(*acc);
        }
    });
    true
}

/// The 64-byte path for `ty`; false when it has none (or the lengths do not hold whole units).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI and VBMI (plus AVX2 and F16C).
pub(super) unsafe fn gemm(t: &mut Tile<'_>) -> bool {
    let (ty, k, rows, n) = (t.ty(), t.k(), t.rows(), t.n());
    let (w, x) = (t.w().bytes(), t.x().bytes());
    let out = t.out();
    // SAFETY: the caller guarantees the features every arm needs; the GFNI arm runs only when
    // `gfni()` says the CPU has it.
    unsafe {
        match ty {
            GgmlType::IQ2_XXS => gemm_wide::<Iq2Xxs, false>(k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_wide::<Iq3Xxs, false>(k, w, rows, x, n, out),
            GgmlType::IQ1_S => gemm_wide::<Iq1S, false>(k, w, rows, x, n, out),
            GgmlType::IQ4_XS
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4
            | GgmlType::NVFP4
            | GgmlType::Q1_0
            | GgmlType::Q2_0 => nl4::gemm(ty, k, w, rows, x, n, out),
            GgmlType::IQ2_XS => gemm_wide::<Iq2Xs, false>(k, w, rows, x, n, out),
            GgmlType::IQ2_S => gemm_wide::<Iq2S, false>(k, w, rows, x, n, out),
            GgmlType::IQ3_S => gemm_wide::<Iq3S, false>(k, w, rows, x, n, out),
            GgmlType::IQ1_M => gemm_wide::<Iq1M, false>(k, w, rows, x, n, out),
            GgmlType::TQ1_0 => gemm_wide::<Tq1_0, false>(k, w, rows, x, n, out),
            // GFNI: one affine byte transform per register instead of a shift and a mask
            GgmlType::TQ2_0 if gfni() => gemm_wide::<Tq2_0, true>(k, w, rows, x, n, out),
            GgmlType::TQ2_0 => gemm_wide::<Tq2_0, false>(k, w, rows, x, n, out),
            _ => false,
        }
    }
}
