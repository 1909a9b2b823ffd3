//! IQ4_XS and IQ4_NL on the AVX-512-VNNI tier (VBMI CPUs, beside the grid kinds of `iq512`):
//! biased weights, one weight row per lane for the float epilogue.
//!
//! Integers: a nibble is looked up by `vpshufb` as `kvalue + 128` (1..=241, an unsigned byte),
//! so `vpdpbusd` takes the activation bytes as they are (signed) and adds `sum(w x) + 128
//! sum(x)` per 32-element group; the activations are packed once per call with `128 sum(x)` of
//! each group, subtracted after the horizontal sums (exact: integers). The packed activations
//! are laid out like the nibbles (`[low nibbles | high nibbles]` of 64 `qs` bytes = groups
//! `4h..4h + 4`, one group per 128-bit lane), so no weight byte is moved and no sign applied.
//!
//! Floats: the reference adds `dl * sumi` per group and block to one sum per output, in order:
//! eight dependent adds per unit and output. Rows go in tiles of 16: each row's eight products
//! (computed as the reference computes them, each rounded once) are transposed so that one
//! register holds group `g` of 16 rows, and eight vector adds (no FMA) advance 16 outputs in the
//! reference's order. Rows past the last whole tile take the same integers with scalar adds.

use core::arch::x86_64::*;
use core::mem::size_of;

use super::super::kblock::{f16_to_f32, prefetch_span};
use super::super::klanes512::V64;
use super::tables::{IQ4NL_BYTES, IQ4NL_QS, IQ4XS_QS};
use crate::arch::iq_tile::{act_chunk_offset, unit_blocks, Iq4Nl, Iq4Xs, IqKind};
use crate::formats::{Block, BlockQ8_0, BlockQ8_K, KVALUES_IQ4NL};
use crate::GgmlType;
/// Rows whose float sums share one register's lanes.
const LANES: usize = 16;
/// Activation rows up to which a row tile decodes each unit straight into registers and keeps
/// its sums there (`row_tile`); more take `wide_tile`, which decodes each unit once into a buffer.
const CHUNK: usize = 4;
/// Bytes of one packed activation unit: `x` (256), `128 sum(x)` per group (32), the blocks' `d`
/// per group as f32 (32).
const PACKED_UNIT: usize = 320;
/// Where a packed unit's `128 sum(x)` per group start (after the 256 bytes of `x`).
const PACKED_BIAS: usize = 256;
/// Where a packed unit's f32 scales start.
const PACKED_D: usize = 288;

/// `KVALUES_IQ4NL + 128` in every 16-byte lane (the `vpshufb` table of the biased weights).
static BIASED_VALUES: V64 = V64({
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = (KVALUES_IQ4NL[i % 16] as i16 + 128) as u8;
        i += 1;
    }
    o
});

/// One decoded unit: biased weights in the packed activations' order and the floats of its
/// epilogue.
struct Dec4 {
    w: [__m512i; 4],
    /// The blocks' `d` per group (IQ4_XS: its one `d` eight times).
    d: __m256,
    /// IQ4_XS: the group scales `code - 32` as floats.
    s: __m256,
}

/// An IQ4 kind: where its unit's `qs` bytes and floats are.
trait Nl4: IqKind {
    /// Whether the products carry a group scale (`dl = (d x.d) s`; IQ4_NL: `dl = d x.d`).
    const SCALED: bool;
    /// The unit's 128 `qs` bytes: lane `l` of register `h` holds the 16 bytes of group `4h + l`.
    ///
    /// # Safety
    /// The CPU has the tier's features; `p` is valid for one unit.
    unsafe fn qs(p: *const u8) -> [__m512i; 2];
    /// The blocks' `d` per group and the group scales (unused unless `SCALED`).
    ///
    /// # Safety
    /// As [`Nl4::qs`].
    unsafe fn floats(p: *const u8) -> (__m256, __m256);
}

/// Four 16-byte pieces into one register (`at(l)`: the address of lane `l`'s bytes).
///
/// # Safety
/// The CPU has AVX-512 F; every `at(l)` is valid for 16 bytes.
#[inline(always)]
unsafe fn lanes4(at: impl Fn(usize) -> *const u8) -> __m512i {
    // SAFETY: the caller's contract; unaligned loads.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(at(0) as *const __m128i));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(at(1) as *const __m128i));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(at(2) as *const __m128i));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(at(3) as *const __m128i))
    }
}

impl Nl4 for Iq4Xs {
    const SCALED: bool = true;
    #[inline(always)]
    unsafe fn qs(p: *const u8) -> [__m512i; 2] {
        // SAFETY: `p` is one block with 128 `qs` bytes, group `g`'s at `16 g`.
        core::array::from_fn(|h| unsafe {
            _mm512_loadu_si512(p.add(IQ4XS_QS + 64 * h) as *const __m512i)
        })
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is one block (alignment 1); the features are the caller's.
        unsafe {
            let b = &*(p as *const Self::W);
            let d = _mm256_set1_ps(f16_to_f32(u16::from_le_bytes(b.d)));
            // the eight 6-bit codes (`BlockIq4Xs::scale`): low nibble `g` of `scales_l` (bit
            // 16 + 4g below) and bits 2g..2g+2 of `scales_h`, as `code - 32` in f32
            let bits = u16::from_le_bytes(b.scales_h) as u64
                | (u32::from_le_bytes(b.scales_l) as u64) << 16;
            let v = _mm_set1_epi64x(bits as i64);
            let lo_at = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 44, 40, 36, 32, 28, 24, 20, 16);
            let hi_at = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
            let lo = _mm_and_si128(_mm_multishift_epi64_epi8(lo_at, v), _mm_set1_epi8(0x0f));
            let hi = _mm_and_si128(_mm_multishift_epi64_epi8(hi_at, v), _mm_set1_epi8(3));
            let code = _mm256_cvtepu8_epi32(_mm_or_si128(lo, _mm_slli_epi16::<4>(hi)));
            let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(code, _mm256_set1_epi32(32)));
            (d, s)
        }
    }
}

impl Nl4 for Iq4Nl {
    const SCALED: bool = false;
    #[inline(always)]
    unsafe fn qs(p: *const u8) -> [__m512i; 2] {
        // SAFETY: `p` is eight blocks, each with 16 `qs` bytes; the features are the caller's.
        core::array::from_fn(|h| unsafe { lanes4(|l| p.add(IQ4NL_BYTES * (4 * h + l) + IQ4NL_QS)) })
    }
    #[inline(always)]
    unsafe fn floats(p: *const u8) -> (__m256, __m256) {
        // SAFETY: `p` is eight blocks (alignment 1).
        let b = unsafe { core::slice::from_raw_parts(p as *const Self::W, 8) };
        // SAFETY: the caller's CPU has F16C.
        let d: [f32; 8] =
            core::array::from_fn(|g| unsafe { f16_to_f32(u16::from_le_bytes(b[g].d)) });
        // SAFETY: eight readable floats (AVX present).
        (unsafe { _mm256_loadu_ps(d.as_ptr()) }, unsafe {
            _mm256_set1_ps(1.0)
        })
    }
}

/// Decodes the unit at `p`: both nibbles of each `qs` register through the biased table.
///
/// # Safety
/// The CPU has the tier's features; `p` is valid for one unit of `K`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn decode<K: Nl4>(p: *const u8) -> Dec4 {
    // SAFETY: the caller's contract.
    let (q, (d, s)) = unsafe { (K::qs(p), K::floats(p)) };
    let (values, nib) = (BIASED_VALUES.get(), _mm512_set1_epi8(0x0f));
    let lo = |q: __m512i| _mm512_shuffle_epi8(values, _mm512_and_si512(q, nib));
    let hi =
        |q: __m512i| _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib));
    Dec4 {
        w: [lo(q[0]), hi(q[0]), lo(q[1]), hi(q[1])],
        d,
        s,
    }
}

/// The eight group sums (group `g` in dword `g`) of two registers whose 128-bit lane `l` holds
/// partial sums of group `l` (`a`) and `4 + l` (`b`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn groups(a: __m512i, b: __m512i) -> __m256i {
    // per lane [a0+a2, b0+b2, a1+a3, b1+b3], then both halves added: dword 4l = group l,
    // 4l + 1 = group 4 + l
    let s = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let t = _mm512_add_epi32(s, _mm512_shuffle_epi32::<0b01_00_11_10>(s));
    let order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, t))
}

/// Packs `units` activation units of type `act` at `x` into `dst` (`PACKED_UNIT` bytes each):
/// the `x` bytes as `[low half | high half]` of groups 0..4, then of groups 4..8 (16 bytes per
/// lane, see `Nl4::qs`), `128 sum(x)` per group, the blocks' `d` per group.
///
/// # Safety
/// The CPU has the tier's features; `x` holds `units` whole units, `dst` `units * PACKED_UNIT`
/// bytes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn pack(act: GgmlType, x: *const u8, unit_bytes: usize, units: usize, dst: *mut u8) {
    let ones = _mm512_set1_epi8(1);
    for u in 0..units {
        // SAFETY: unit `u` and its packed slot are inside the buffers (caller's contract).
        unsafe {
            let (xu, du) = (x.add(u * unit_bytes), dst.add(u * PACKED_UNIT));
            let mut sums = [_mm512_setzero_si512(); 2];
            for (h, sum) in sums.iter_mut().enumerate() {
                for half in 0..2 {
                    let v = lanes4(|l| xu.add(act_chunk_offset(act, 4 * h + l) + 16 * half));
                    _mm512_storeu_si512(du.add(64 * (2 * h + half)) as *mut __m512i, v);
                    *sum = _mm512_dpbusd_epi32(*sum, ones, v);
                }
            }
            let bias = _mm256_slli_epi32::<7>(groups(sums[0], sums[1]));
            _mm256_storeu_si256(du.add(PACKED_BIAS) as *mut __m256i, bias);
            let xd: [f32; 8] = if act == GgmlType::Q8_0 {
                let b = core::slice::from_raw_parts(xu as *const BlockQ8_0, 8);
                core::array::from_fn(|g| f16_to_f32(u16::from_le_bytes(b[g].d)))
            } else {
                [(*(xu as *const BlockQ8_K)).d(); 8]
            };
            (du.add(PACKED_D) as *mut [f32; 8]).write_unaligned(xd);
        }
    }
}

/// The eight products `dl * sumi` of decoded unit `d` against the packed activation unit `px`,
/// each as the reference rounds it (`dl = (d x.d) s`, or `d x.d` for IQ4_NL).
///
/// # Safety
/// The CPU has the tier's features; `px` is one packed unit.
#[inline(always)]
unsafe fn products<K: Nl4>(d: &Dec4, px: *const u8) -> __m256 {
    // SAFETY: the reads stay inside the packed unit (caller's contract); the features are the
    // caller's.
    unsafe {
        let x: [__m512i; 4] =
            core::array::from_fn(|c| _mm512_loadu_si512(px.add(64 * c) as *const __m512i));
        let z = _mm512_setzero_si512();
        let a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, d.w[0], x[0]), d.w[1], x[1]);
        let b = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, d.w[2], x[2]), d.w[3], x[3]);
        let bias = _mm256_loadu_si256(px.add(PACKED_BIAS) as *const __m256i);
        let sumi = _mm256_sub_epi32(groups(a, b), bias);
        let mut dl = _mm256_mul_ps(d.d, _mm256_loadu_ps(px.add(PACKED_D) as *const f32));
        if K::SCALED {
            dl = _mm256_mul_ps(dl, d.s);
        }
        _mm256_mul_ps(dl, _mm256_cvtepi32_ps(sumi))
    }
}

/// Output row of lane `l` after [`add_columns`]' transpose.
#[inline(always)]
fn lane_row(l: usize) -> usize {
    [0, 2, 1, 3][l / 4] * 4 + l % 4
}

/// `acc += column g` for g = 0..8 in order, where row `r` of the 16 x 8 matrix `p` is output
/// row `r`'s eight products: lane `l` of `acc` is output row [`lane_row`]`(l)`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn add_columns(p: &[__m256; LANES], acc: &mut __m512) {
    // z[i]: rows i and 8 + i in the two 256-bit halves; each half is then an 8 x 8 transpose
    let z: [__m512; 8] = core::array::from_fn(|i| {
        let lo = _mm512_castps_pd(_mm512_castps256_ps512(p[i]));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(p[8 + i])))
    });
    let t: [__m512; 8] = core::array::from_fn(|i| {
        let (a, b) = (z[2 * (i / 2)], z[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4q + e]: element e (and e + 4 in the odd 128-bit lanes) of rows 4q..4q+4 (and 8 more)
    let u: [__m512; 8] = core::array::from_fn(|i| {
        let (q, e) = (i / 4, i % 4);
        let (a, b) = (t[4 * q + e / 2], t[4 * q + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b)
        } else {
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b)
        }
    });
    for g in 0..8 {
        let (a, b) = (u[g % 4], u[4 + g % 4]);
        let col = if g < 4 {
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b)
        };
        *acc = _mm512_add_ps(*acc, col);
    }
}

/// Where a row's units are.
struct Geometry {
    units: usize,
    unit_w_bytes: usize,
    row_bytes: usize,
}

/// The sums of 16 weight rows from `wt` against `J` activation rows (`px(jj, u)`: packed unit
/// `u` of activation `jj`), lane `l` of `sums[jj]` being row [`lane_row`]`(l)`.
///
/// # Safety
/// The CPU has the tier's features; `wt` is valid for 16 rows of `geo`, `px` gives packed units.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn row_tile<K: Nl4, const J: usize>(
    wt: *const u8,
    geo: &Geometry,
    px: impl Fn(usize, usize) -> *const u8,
    sums: &mut [[f32; LANES]; CHUNK],
) {
    let mut acc = [_mm512_setzero_ps(); J];
    for u in 0..geo.units {
        let mut p = [[_mm256_setzero_ps(); LANES]; J];
        for r in 0..LANES {
            let at = wt.wrapping_add(r * geo.row_bytes + u * geo.unit_w_bytes);
            // the same unit of the next tile's rows, so the loads run ahead
            prefetch_span(at.wrapping_add(LANES * geo.row_bytes), geo.unit_w_bytes);
            // SAFETY: row r of the tile holds unit u (caller's contract).
            let d = unsafe { decode::<K>(at) };
            for (jj, pj) in p.iter_mut().enumerate() {
                // SAFETY: `px` gives one packed unit (caller's contract).
                pj[r] = unsafe { products::<K>(&d, px(jj, u)) };
            }
        }
        for (a, pj) in acc.iter_mut().zip(&p) {
            add_columns(pj, a);
        }
    }
    for (s, a) in sums.iter_mut().zip(&acc) {
        // SAFETY: `s` is 64 writable bytes; unaligned store.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), *a) };
    }
}

/// [`row_tile`] for more activation rows than [`CHUNK`]: each row's unit decoded once into a
/// buffer, then taken against each activation row; `acc[j]` holds activation `j`'s sums (lane
/// order as [`row_tile`]).
///
/// # Safety
/// As [`row_tile`]; `acc` has `n` entries, all zero.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn wide_tile<K: Nl4>(
    wt: *const u8,
    geo: &Geometry,
    px: impl Fn(usize, usize) -> *const u8,
    acc: &mut [[f32; LANES]],
) {
    for u in 0..geo.units {
        let dec: [Dec4; LANES] = core::array::from_fn(|r| {
            let at = wt.wrapping_add(r * geo.row_bytes + u * geo.unit_w_bytes);
            prefetch_span(at.wrapping_add(LANES * geo.row_bytes), geo.unit_w_bytes);
            // SAFETY: row r of the tile holds unit u (caller's contract).
            unsafe { decode::<K>(at) }
        });
        for (j, a) in acc.iter_mut().enumerate() {
            let p: [__m256; LANES] = core::array::from_fn(|r| {
                // SAFETY: `px` gives one packed unit (caller's contract).
                unsafe { products::<K>(&dec[r], px(j, u)) }
            });
            // SAFETY: `a` is 64 bytes; unaligned accesses.
            unsafe {
                let mut v = _mm512_loadu_ps(a.as_ptr());
                add_columns(&p, &mut v);
                _mm512_storeu_ps(a.as_mut_ptr(), v);
            }
        }
    }
}

/// `out[r * n + j] = W[r] . x[j]` for one IQ4 kind (see the module doc).
///
/// # Safety
/// The CPU has the tier's features.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn gemm_nl4<K: Nl4>(
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    let Some((wb, _, per_row)) = unit_blocks::<K>(k, w, rows, x, n, out) else {
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
    super::super::PACKED.with(|cell| {
        let mut packed = cell.borrow_mut();
        packed.resize(n * units * PACKED_UNIT, 0);
        // SAFETY: `x` holds `n * units` activation units (checked by `unit_blocks`) and `packed`
        // was sized for them; the caller guarantees the features.
        unsafe { pack(act, x.as_ptr(), unit_bytes, n * units, packed.as_mut_ptr()) };
        let px = |j: usize, u: usize| -> *const u8 {
            // SAFETY: packed unit `j * units + u` exists (j < n, u < units).
            unsafe { packed.as_ptr().add((j * units + u) * PACKED_UNIT) }
        };
        let whole = rows / LANES * LANES;
        let wp = wb.as_ptr() as *const u8;
        let geo = Geometry {
            units,
            unit_w_bytes,
            row_bytes,
        };
        let mut sums = [[0f32; LANES]; CHUNK];
        let mut acc = Vec::new();
        for r0 in (0..whole).step_by(LANES) {
            let wt = wp.wrapping_add(r0 * row_bytes);
            if n > CHUNK {
                acc.clear();
                acc.resize(n, [0f32; LANES]);
            }
            // SAFETY: rows r0..r0 + 16 exist; `px` gives packed units; features as above.
            unsafe {
                match n {
                    1 => row_tile::<K, 1>(wt, &geo, px, &mut sums),
                    2 => row_tile::<K, 2>(wt, &geo, px, &mut sums),
                    3 => row_tile::<K, 3>(wt, &geo, px, &mut sums),
                    CHUNK => row_tile::<K, CHUNK>(wt, &geo, px, &mut sums),
                    _ => wide_tile::<K>(wt, &geo, px, &mut acc),
                }
            }
            let tile = if n <= CHUNK { &sums[..n] } else { &acc[..] };
            for (j, v) in tile.iter().enumerate() {
                for (l, &s) in v.iter().enumerate() {
                    out[(r0 + lane_row(l)) * n + j] = K::finish(s);
                }
            }
        }
        for r in whole..rows {
            out[r * n..(r + 1) * n].fill(0.0);
            for u in 0..units {
                let at = wp.wrapping_add(r * row_bytes + u * unit_w_bytes);
                // SAFETY: row r holds unit u; features as above.
                let d = unsafe { decode::<K>(at) };
                for j in 0..n {
                    let mut v = [0f32; 8];
                    // SAFETY: as above; `v` is 32 writable bytes.
                    unsafe { _mm256_storeu_ps(v.as_mut_ptr(), products::<K>(&d, px(j, u))) };
                    let o = &mut out[r * n + j];
                    for s in v {
                        *o += s;
                    }
                }
            }
            for o in &mut out[r * n..(r + 1) * n] {
                *o = K::finish(*o);
            }
        }
    });
    true
}

/// The IQ4_XS / IQ4_NL path; false for other types or lengths that are not whole units.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI and VBMI (plus AVX2 and F16C).
pub(super) unsafe fn gemm(
    ty: GgmlType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) -> bool {
    // SAFETY: the caller guarantees the features.
    unsafe {
        match ty {
            GgmlType::IQ4_XS => gemm_nl4::<Iq4Xs>(k, w, rows, x, n, out),
            GgmlType::IQ4_NL => gemm_nl4::<Iq4Nl>(k, w, rows, x, n, out),
            _ => false,
        }
    }
}
