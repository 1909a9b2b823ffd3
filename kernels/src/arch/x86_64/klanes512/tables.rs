//! Constant layouts of the AVX-512 K-quant kernels (`klanes512`): the byte permutations and
//! `vpermb`/`vpermps` index vectors that place weights, scales, mins and float lanes, built at
//! compile time from the layout rules the parent module's docs describe.

use super::super::kblock::{Q3, Q4, Q5};
use core::arch::x86_64::*;

/// True for the kinds with mins (`sumf -= dmin * sumi`): Q4_K and Q5_K.
pub(super) const fn has_mins(k: u8) -> bool {
    k == Q4 || k == Q5
}

/// A 64-byte constant (vector index or mask), aligned for one load.
#[repr(C, align(64))]
pub(in crate::arch::x86_64) struct V64(pub(in crate::arch::x86_64) [u8; 64]);

impl V64 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::arch::x86_64) fn get(&self) -> __m512i {
        // SAFETY: 64 readable bytes (unaligned load; the alignment only helps).
        unsafe { _mm512_loadu_si512(self.0.as_ptr() as *const __m512i) }
    }
}

/// Q4_K/Q5_K: byte `8q + r` <- byte `q + 8r`, byte `8q + 4 + r` <- byte `32 + q + 8r` (dword
/// `2q` = lane `q` of the low 32 bytes' chunk, `2q + 1` = of the high 32 bytes' chunk).
pub(super) static PAIR_PERM: V64 = V64({
    let mut o = [0u8; 64];
    let mut q = 0;
    while q < 8 {
        let mut r = 0;
        while r < 4 {
            o[8 * q + r] = (q + 8 * r) as u8;
            o[8 * q + 4 + r] = (32 + q + 8 * r) as u8;
            r += 1;
        }
        q += 1;
    }
    o
});

/// The chunks `(ca, cb)` of Q4_K/Q5_K vector `v` (`qs` load `v / 2`, nibble `v % 2`).
pub(super) const fn chunks45(v: usize) -> (usize, usize) {
    let ca = 4 * (v / 2) + v % 2;
    (ca, ca + 2)
}

/// Q4_K/Q5_K `vpermt2b` indices of pair `p`'s vector `v` scale words from the tile's scale
/// bytes (row `r` in qword `r`; the second source is zero): i32 lane `4j + t` = (scale `ca`,
/// scale `cb`) of row `2p` for `t < 2`, of row `2p + 1` for `t >= 2`; odd bytes take zero.
const fn scale_idx(p: usize, v: usize) -> V64 {
    let (ca, cb) = chunks45(v);
    let mut o = [0u8; 64];
    let mut w = 0;
    while w < 32 {
        let lane = w / 2;
        let chunk = if w % 2 == 0 { ca } else { cb };
        let row = 2 * p + if lane % 4 >= 2 { 1 } else { 0 };
        o[2 * w] = (8 * row + chunk) as u8;
        o[2 * w + 1] = 64;
        w += 1;
    }
    V64(o)
}
const fn scale_idx4(p: usize) -> [V64; 4] {
    [
        scale_idx(p, 0),
        scale_idx(p, 1),
        scale_idx(p, 2),
        scale_idx(p, 3),
    ]
}
pub(super) static SCALE_IDX: [[V64; 4]; 4] =
    [scale_idx4(0), scale_idx4(1), scale_idx4(2), scale_idx4(3)];

/// Q5_K: the `qh` bit of each byte of vector `v` (bit `ca` in even dwords, `cb` in odd ones).
pub(super) const fn q5_sel(v: usize) -> V64 {
    let (ca, cb) = chunks45(v);
    let mut o = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        o[b] = 1u8 << if (b / 4) % 2 == 0 { ca } else { cb };
        b += 1;
    }
    V64(o)
}
pub(super) static Q5_SEL: [V64; 4] = [q5_sel(0), q5_sel(1), q5_sel(2), q5_sel(3)];

/// Transposed mins (`vpermb` of the 8 rows' min bytes, row `r` in bytes `8r..8r + 8`): i32
/// lane `L` = words (min `k`, min `k`) of row `L % 8`, `k = 2h + L / 8`; odd bytes take byte 64
/// (the second source: zero).
pub(super) const fn min_idx(h: usize) -> V64 {
    let mut o = [0u8; 64];
    let mut l = 0;
    while l < 16 {
        let k = 2 * h + l / 8;
        o[4 * l] = (8 * (l % 8) + k) as u8;
        o[4 * l + 1] = 64;
        o[4 * l + 2] = (8 * (l % 8) + k) as u8;
        o[4 * l + 3] = 64;
        l += 1;
    }
    V64(o)
}
pub(super) static MIN_IDX: [V64; 4] = [min_idx(0), min_idx(1), min_idx(2), min_idx(3)];

/// The float lane of pair-row `h` (0 or 1), reference lane `l`, for kind `k`.
pub(super) const fn out_lane(k: u8, h: usize, l: usize) -> usize {
    if has_mins(k) {
        4 * (l / 2) + 2 * h + l % 2
    } else {
        8 * h + l
    }
}

/// `vpermps` indices from the tile's halves as floats (Q4_K/Q5_K: row `r`'s `d`, `dmin` at
/// lanes `2r`, `2r + 1`; Q3_K/Q6_K: `d` at lane `r`) to pair `p`'s `d` in every float lane of
/// its two rows.
pub(super) const fn d_idx(k: u8, p: usize) -> [i32; 16] {
    let mut o = [0i32; 16];
    let mut h = 0;
    while h < 2 {
        let mut l = 0;
        while l < 8 {
            o[out_lane(k, h, l)] = if has_mins(k) {
                2 * (2 * p + h)
            } else {
                2 * p + h
            } as i32;
            l += 1;
        }
        h += 1;
    }
    o
}

/// Where chunk `c` of an activation block goes (32-byte slots) for Q3_K/Q6_K, so that 64-byte
/// vector `i` holds the two chunks of the weight vector `w[i]`: Q3_K (0, 4), (1, 5), (2, 6),
/// (3, 7); Q6_K in order.
pub(super) const fn slots(k: u8) -> [usize; 8] {
    match k {
        Q3 => [0, 2, 4, 6, 1, 3, 5, 7],
        _ => [0, 1, 2, 3, 4, 5, 6, 7],
    }
}

/// The `vgf2p8affineqb` matrix that moves source bit `src[i]` of every byte to bit `i` (`-1`:
/// zero): output bit `i` is the parity of `x & byte (7 - i)` of the matrix.
const fn gf(src: [i8; 8]) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        if src[i] >= 0 {
            m |= (1u64 << src[i]) << (8 * (7 - i));
        }
        i += 1;
    }
    m
}

/// A vector of matrices: `lo` for the low 32 bytes (qwords 0..4), `hi` for the high ones.
pub(in crate::arch::x86_64) const fn gf_halves(lo: [i8; 8], hi: [i8; 8]) -> V64 {
    let (a, b) = (gf(lo).to_le_bytes(), gf(hi).to_le_bytes());
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = if i < 32 { a[i % 8] } else { b[i % 8] };
        i += 1;
    }
    V64(o)
}

/// No source bit (see [`gf`]).
pub(in crate::arch::x86_64) const NONE: i8 = -1;
/// Bits 4..8 to 0..4 (a byte's high nibble).
pub(super) static GF_NIB_HI: V64 = gf_halves(
    [4, 5, 6, 7, NONE, NONE, NONE, NONE],
    [4, 5, 6, 7, NONE, NONE, NONE, NONE],
);
/// Q6_K low-nibble vectors: qh bits 0-1 (low half) / 2-3 (high half) to bits 4-5.
pub(super) static GF_Q6_LO: V64 = gf_halves(
    [NONE, NONE, NONE, NONE, 0, 1, NONE, NONE],
    [NONE, NONE, NONE, NONE, 2, 3, NONE, NONE],
);
/// Q6_K high-nibble vectors: qh bits 4-5 / 6-7 to bits 4-5.
pub(super) static GF_Q6_HI: V64 = gf_halves(
    [NONE, NONE, NONE, NONE, 4, 5, NONE, NONE],
    [NONE, NONE, NONE, NONE, 6, 7, NONE, NONE],
);
/// Q6_K signed scheme, low-nibble vectors: qh bit 0 / 2 to bit 4 and bit 1 / 3 to bits 5-7
/// (flipped by the transform's constant 0xE0: the 2-bit value minus 2, sign-extended).
pub(super) static GF_Q6_LO_S: V64 = gf_halves(
    [NONE, NONE, NONE, NONE, 0, 1, 1, 1],
    [NONE, NONE, NONE, NONE, 2, 3, 3, 3],
);
/// Q6_K signed scheme, high-nibble vectors: qh bits 4-5 / 6-7 likewise.
pub(super) static GF_Q6_HI_S: V64 = gf_halves(
    [NONE, NONE, NONE, NONE, 4, 5, 5, 5],
    [NONE, NONE, NONE, NONE, 6, 7, 7, 7],
);
/// Q3_K vector `s`: qs bits `2s, 2s + 1` to bits 0-1 (entry 0 unused: a mask does it).
const fn q3_qs(s: i8) -> V64 {
    let f = [2 * s, 2 * s + 1, NONE, NONE, NONE, NONE, NONE, NONE];
    gf_halves(f, f)
}
pub(super) static GF_Q3_QS: [V64; 4] = [q3_qs(0), q3_qs(1), q3_qs(2), q3_qs(3)];
/// Q3_K vector `s`: hmask bit `s` (low half) / `s + 4` (high half) to bit 2.
const fn q3_hm(s: i8) -> V64 {
    gf_halves(
        [NONE, NONE, s, NONE, NONE, NONE, NONE, NONE],
        [NONE, NONE, s + 4, NONE, NONE, NONE, NONE, NONE],
    )
}
pub(super) static GF_Q3_HM: [V64; 4] = [q3_hm(0), q3_hm(1), q3_hm(2), q3_hm(3)];
/// Q3_K signed scheme, vector `s`: the hmask bit to bits 2-7 (flipped by the constant 0xFC).
const fn q3_hm_s(s: i8) -> V64 {
    gf_halves(
        [NONE, NONE, s, s, s, s, s, s],
        [NONE, NONE, s + 4, s + 4, s + 4, s + 4, s + 4, s + 4],
    )
}
pub(super) static GF_Q3_HM_S: [V64; 4] = [q3_hm_s(0), q3_hm_s(1), q3_hm_s(2), q3_hm_s(3)];
