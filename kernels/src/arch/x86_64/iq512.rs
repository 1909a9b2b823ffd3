//! The i-quants on the AVX-512-VNNI tier when the CPU also has AVX512-VBMI: each 256-element
//! weight unit is decoded straight into four 64-byte registers (`decode`), together with the
//! per-pair scale words, and then used against every activation row of the call (decode once,
//! dot N rows). Grid points come from registers where the grid fits: ggml's u16 codes of the
//! 256-, 512- and 1024-point grids (IQ2_XXS, IQ3_XXS, IQ2_XS, IQ3_S, IQ2_S) are 8 to 32 registers
//! looked up with `vpermi2w` and a blend tree, their 2- or 3-bit fields expanded by
//! `vpmultishiftqb` + `vpermb`; the 2048-point IQ1 grid's codes are gathered (`vpgatherdd`) and
//! expanded the same way. Sign bytes are `vpmultishiftqb` + one `vpermi2b` of `KSIGNS_IQ2XS` (or
//! the block's own sign bytes). The constant layouts live in `tables`; IQ4_XS and IQ4_NL take
//! their own path (`nl4`: biased weights, one row per lane for the float sums).
//!
//! Exactness: the activations are packed once per call as `|x|` (unsigned bytes, so -128 is the
//! exact 128) plus their sign bits as 64-bit masks; per activation row a weight register is
//! negated where `x` is negative (masked `vpsubb`; no weight is -128), so `vpmaddubsw(|x|, w)`
//! gives the exact pair products (at most 2 * 128 * 127, below 2^15) and `vpdpwssd` with the scale
//! words adds them, scaled, into i32 lanes. Integer sums are exact in any order, so one
//! horizontal sum gives the reference's integer `bsum`; the float epilogue then repeats the scalar reference's operations in its
//! order. The IQ1 grids are decoded times 8 (IQ1_M adds its ±1 shift signs, IQ1_S adds the
//! activation `bsums` weighed by its signed scales to the same sum), so one integer is `8 sumi +
//! sumi1`, below 2^24, and the reference's `sumi + sumi1 / 8` is that integer over 8, exactly. The ternary types
//! return `false` and take the shared `iq` path.

use core::arch::x86_64::*;

use crate::arch::iq_tile::{
    act_chunk_offset, unit_blocks, Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, IqKind,
};
use crate::formats::kquants::layout::Q8K_BSUMS;
use crate::formats::{Block, BlockQ8_0, BlockQ8_K};
use crate::{GgmlType, Tile};
use core::mem::size_of;

mod decode;
mod nl4;
mod tables;

use super::kblock::{f16_to_f32, prefetch_span};
use decode::negate;

/// Weight rows whose units are interleaved (see [`gemm_wide`]).
const ROWS: usize = 4;

/// Bytes of one packed activation unit: `|x|` (256), the four sign masks (32), the blocks' `d`
/// as f32 (up to 8: 32).
const PACKED_UNIT: usize = 320;
/// Where a packed unit's f32 scales start.
const PACKED_D: usize = 288;

/// One decoded weight unit: signed weights, the scale word of every `vpmaddubsw` pair, and the
/// floats its epilogue needs (converted once per unit, not once per activation row).
#[derive(Clone, Copy)]
struct Dec {
    w: [__m512i; 4],
    sc: [__m512i; 4],
    /// The weights' sign bits still to apply (bit `i` of `neg[c]`: byte `i` of `w[c]`), merged
    /// with the activation signs into one negation per register and activation row.
    neg: [u64; 4],
    /// IQ1_S: the 16 words `ls * delta` by which `sumi1` weighs the activation `bsums`.
    bw: __m256i,
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
            d: d0,
        }
    }
}

/// How a kind's per-block integers are formed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One scaled sum (`bsum`; IQ1_M: `8 sumi1 + sumi2`, its weights being `8 grid + shift`).
    Scaled,
    /// The scaled sum plus `sum(bw * bsums)` (IQ1_S: `8 sumi + sumi1`).
    ScaledBsums,
}

/// An i-quant with a 64-byte decoder.
trait Wide: IqKind {
    const MODE: Mode;
    /// Decodes the unit starting at `p` (its first block's first byte).
    ///
    /// # Safety
    /// The CPU has the tier's features (see [`gemm`]); `p` is valid for `UNIT` blocks of `W`.
    unsafe fn decode_regs(p: *const u8) -> Dec;
    /// The scaled modes' integer as the float that the reference multiplies by `d * x.d`
    /// (`sumf += d * x.d * term`).
    #[inline(always)]
    fn term(v: i32) -> f32 {
        v as f32
    }
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
            out[i] += dw * dx * K::term(v);
        }
        self.len = 0;
    }
}

/// Packs `units` activation units of type `act` at `x` into `dst` (`PACKED_UNIT` bytes each).
///
/// # Safety
/// The CPU has the tier's features; `x` holds `units` whole units, `dst` `units * PACKED_UNIT`
/// bytes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn pack(act: GgmlType, x: *const u8, unit_bytes: usize, units: usize, dst: *mut u8) {
    for u in 0..units {
        // SAFETY: unit `u` and its packed slot are inside the buffers (caller's contract).
        unsafe {
            let (xu, du) = (x.add(u * unit_bytes), dst.add(u * PACKED_UNIT));
            for c in 0..4 {
                let lo = _mm256_loadu_si256(xu.add(act_chunk_offset(act, 2 * c)) as *const __m256i);
                let hi =
                    _mm256_loadu_si256(xu.add(act_chunk_offset(act, 2 * c + 1)) as *const __m256i);
                let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                _mm512_storeu_si512(du.add(64 * c) as *mut __m512i, _mm512_abs_epi8(v));
                let neg = _cvtmask64_u64(_mm512_movepi8_mask(v));
                (du.add(256 + 8 * c) as *mut u64).write_unaligned(neg);
            }
            let xd = if act == GgmlType::Q8_0 {
                let b = core::slice::from_raw_parts(xu as *const BlockQ8_0, 8);
                core::array::from_fn(|g| f16_to_f32(u16::from_le_bytes(b[g].d)))
            } else {
                [(*(xu as *const BlockQ8_K)).d(); 8]
            };
            (du.add(PACKED_D) as *mut [f32; 8]).write_unaligned(xd);
        }
    }
}

/// The scaled modes' dword partial sums of decoded unit `d` against the packed activation unit
/// `px` (and, for `ScaledBsums`, the `bsums` of the activation block at `xu`).
///
/// # Safety
/// The CPU has the tier's features; `px` is one packed unit, `xu` one activation unit.
#[inline(always)]
unsafe fn dot_acc<K: Wide>(d: &Dec, px: *const u8, xu: *const u8) -> __m512i {
    // SAFETY: the reads stay inside the packed unit and the activation unit (caller's contract);
    // the features are the caller's.
    unsafe {
        let mut acc = _mm512_setzero_si512();
        if K::MODE == Mode::ScaledBsums {
            let bsums = _mm256_loadu_si256(xu.add(Q8K_BSUMS) as *const __m256i);
            acc = _mm512_zextsi256_si512(_mm256_madd_epi16(bsums, d.bw));
        }
        for c in 0..4 {
            let neg = (px.add(256 + 8 * c) as *const u64).read_unaligned();
            let ax = _mm512_loadu_si512(px.add(64 * c) as *const __m512i);
            let p = _mm512_maddubs_epi16(ax, negate(d.w[c], d.neg[c] ^ neg));
            acc = _mm512_dpwssd_epi32(acc, p, d.sc[c]);
        }
        acc
    }
}

/// `out[r * n + j] = W[r] . x[j]` for one kind: unit by unit, each decoded once and run against
/// every activation row, each result accumulated in the reference's block order.
///
/// # Safety
/// The CPU has the tier's features.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gemm_wide<K: Wide>(
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
    let act = <K::X as Block>::TYPE;
    let units = per_row / K::UNIT;
    let unit_bytes = K::UNIT * size_of::<K::X>();
    let unit_w_bytes = K::UNIT * size_of::<K::W>();
    let row_bytes = per_row * size_of::<K::W>();
    super::PACKED.with(|cell| {
        let mut packed = cell.borrow_mut();
        packed.resize(n * units * PACKED_UNIT, 0);
        // SAFETY: `x` holds `n * units` activation units (checked by `unit_blocks`) and `packed`
        // was sized for them; the caller guarantees the features.
        unsafe { pack(act, x.as_ptr(), unit_bytes, n * units, packed.as_mut_ptr()) };
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
                    // SAFETY: `wu` is one whole weight unit; features as above.
                    let d = unsafe { K::decode_regs(wp) };
                    for j in 0..n {
                        let xu = xb[(j * units + u) * K::UNIT..][..K::UNIT].as_ptr() as *const u8;
                        // SAFETY: packed unit `j * units + u` exists.
                        let pu = unsafe { packed.as_ptr().add((j * units + u) * PACKED_UNIT) };
                        // SAFETY: as above: `pu` is one packed unit, `xu` one activation unit.
                        let xd = unsafe { (pu.add(PACKED_D) as *const [f32; 8]).read_unaligned() };
                        // SAFETY: as above.
                        let acc = unsafe { dot_acc::<K>(&d, pu, xu) };
                        pending.push::<K>(acc, r * n + j, d.d, xd[0], ot);
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
    // SAFETY: the caller guarantees the features every arm needs.
    unsafe {
        match ty {
            GgmlType::IQ2_XXS => gemm_wide::<Iq2Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ3_XXS => gemm_wide::<Iq3Xxs>(k, w, rows, x, n, out),
            GgmlType::IQ1_S => gemm_wide::<Iq1S>(k, w, rows, x, n, out),
            GgmlType::IQ4_XS | GgmlType::IQ4_NL => nl4::gemm(ty, k, w, rows, x, n, out),
            GgmlType::IQ2_XS => gemm_wide::<Iq2Xs>(k, w, rows, x, n, out),
            GgmlType::IQ2_S => gemm_wide::<Iq2S>(k, w, rows, x, n, out),
            GgmlType::IQ3_S => gemm_wide::<Iq3S>(k, w, rows, x, n, out),
            GgmlType::IQ1_M => gemm_wide::<Iq1M>(k, w, rows, x, n, out),
            _ => false,
        }
    }
}
