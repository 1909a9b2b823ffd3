//! Repacked (interleaved) weight layouts: the same blocks as the GGUF file, reordered once when
//! weights become resident so that a SIMD tier loads its operands instead of building them on
//! every call. [`Layout`] names how a [`QMatrix`]'s bytes are ordered; [`repack`] and
//! [`to_gguf`] convert between the GGUF order and a repacked one (exact inverses, same length:
//! a repacked copy replaces the GGUF copy, it never adds to it).
//!
//! [`Layout::Rows4`] (Q8_0, Q4_0, IQ4_NL and MXFP4, a multiple of 4 rows): the rows are taken
//! four at a time, and for each group `g` and block `b` the four rows' blocks are stored
//! together at `(g * nb + b) * 4 * block_bytes` (`nb` blocks per row) as
//! - bytes `0..4S`: the four rows' scales (`S` bytes each: `d`, an f16, or MXFP4's E8M0 `e`),
//!   row order;
//! - then, for each row pair `p` (rows `2p`, `2p + 1` of the group) and each 8-byte chunk `c` of
//!   the block's quant bytes (`qs`: Q8_0 32 bytes, 4 chunks; the 4-bit types 16 bytes, 2
//!   chunks), 16 bytes at `4S + p * 2 * Q + 16 * c` (`Q` = quant bytes per block): row `2p`'s
//!   `qs[8c..8c + 8]` then row `2p + 1`'s.
//!
//! Each 16-byte run is an SMMLA `A` operand of the row pair as is (two rows' 8-byte k-slices,
//! `arch::aarch64::i8mm::pair`'s order), and the four f16 `d` load with one FCVTL. The 4-bit
//! types' runs hold the packed codes: `& 15` gives elements `8c..8c + 8`, `>> 4` elements
//! `16 + 8c..`, of both rows (IQ4_NL's and MXFP4's codes then go through their value tables). The quant bytes and scales are the file's, so the integer sums and the float
//! epilogue are exactly those of the GGUF path.
//!
//! Q4_K in [`Layout::Rows4`] (a multiple of 4 rows): the four rows' blocks `b` are stored
//! together at `(g * nb + b) * 4 * 144` as
//! - bytes `0..8`: the four rows' `d` (f16), row order; `8..16`: their `dmin`;
//! - `16..64`: the four rows' 12 packed scale bytes, row order (as in the file);
//! - `64..576`: for each row pair `p`, each 32-byte run `j` of the quants (`qs[32j..32j + 32]`:
//!   low nibbles are group `2j` of 32 elements, high nibbles group `2j + 1`) and each lane pair
//!   `i` (reference lanes `2i`, `2i + 1`), 16 bytes at `64 + 256p + 64j + 16i`: the four bytes
//!   `qs[32j + 2i + 8m]` (m = 0..4) of row `2p`, the same of row `2p + 1`, then the four bytes
//!   `qs[32j + 2i + 1 + 8m]` of row `2p`, of row `2p + 1`.
//!
//! Q5_K likewise (4 x 176 bytes): `d`, `dmin`, scales as Q4_K's, then at `64 + 64p` row pair
//! `p`'s 32 `qh` bytes in the same lane-pair order as one quant run (`qh[t]` holds the fifth
//! bits of the elements whose low bits are in `qs[32j + t]`), then the quant runs at
//! `192 + 256p + 64j + 16i`.
//!
//! Q6_K in [`Layout::Rows4`] (4 x 210 bytes; a multiple of 4 rows), each row's bytes together
//! (no row pairs: SDOT reads a row's vectors as they are; the i8mm tiles zip a row pair's
//! lanes together as they decode, `arch::aarch64::rows4_q6`):
//! - bytes `0..8`: the four rows' `d` (f16), row order;
//! - `8..72`: each row `h`'s 16 scales at `8 + 16h`, in the order [`Q6_CHAIN`] (position `j`
//!   holds scale `Q6_CHAIN[j]`), the order the SDOT kernel walks the groups of 16;
//! - `72 + 192h`: row `h`'s quants, for each half `k` of the block (elements `128k..128k +
//!   128`) 96 bytes at `72 + 192h + 96k`: the two 16-byte vectors of `qh[32k..32k + 32]`, then
//!   those of `ql[64k..64k + 32]` and of `ql[64k + 32..64k + 64]`; vector `i` of a 32-byte run
//!   `v` holds `v[4i + l + 8m]` at byte `4l + m` (l, m = 0..4).
//!
//! So each 4-byte lane of a `ql` vector is one reference lane (`e % 8`): its low nibbles are
//! 2 + 2 elements of two consecutive groups of 16, its high nibbles the same of the groups 64
//! elements on, and the `qh` vector at the same place holds the top two bits of all four
//! (bits `2f..2f + 2`: field `f` = low nibbles of `ql[64k..]`, of `ql[64k + 32..]`, high
//! nibbles of each).
//!
//! Q3_K in [`Layout::Rows4`] (4 x 110 bytes; a multiple of 4 rows), each row's bytes together:
//! bytes `0..8` the four rows' `d`, `8..56` each row `h`'s 12 scale bytes at `8 + 12h` (as in
//! the file), then row `h`'s quants at `56 + 96h`: the two 16-byte vectors of `hmask[0..32]`,
//! then those of `qs[32k..32k + 32]` for `k` = 0, 1, each vector in Q6_K's lane order (byte
//! `4l + m` of vector `i` is `v[4i + l + 8m]`). Byte `t` of a `qs` run holds elements `128k +
//! 32j + t` (j = 0..4, all of lane `t % 8`) and `hmask[t]` their high bits, so each 4-byte lane
//! of a decoded field is one reference lane: 2 + 2 elements of groups `8k + 2j`, `8k + 2j + 1`.
//!
//! Each 4-byte run of Q4_K/Q5_K is one reference lane (`e % 8`) of a group pair: `zip1/zip2.4s(v & 15,
//! v >> 4)` of a 16-byte run are the SMMLA `A` operands of lanes `2i` and `2i + 1` (8 elements
//! of one lane per row, 4 from each group: the lane-grouped order of
//! `arch::aarch64::unpack::lanes8_chunks`), and `uzp1/uzp2.4s` of two runs give one row's
//! bytes in `unpack::PERM32` order for SDOT, with no table lookups.
//!
//! Which layout resident weights get is [`crate::dispatch::resident_layout`]'s choice (the
//! active tier's); tiers that do not read a layout get the matrix back in GGUF order
//! (`scalar::gemm_block`, one temporary copy per tile), so every layout works on every tier.

use crate::{GgmlType, KernelError, QMatrix};

/// How a matrix's blocks are ordered in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Row-major, each row its blocks in order: the file's layout.
    #[default]
    Gguf,
    /// Four rows' blocks interleaved (see the module documentation): Q8_0, Q4_0, IQ4_NL, MXFP4,
    /// Q3_K, Q4_K, Q5_K, Q6_K.
    Rows4,
}

/// Rows per group of [`Layout::Rows4`].
pub const ROWS4: usize = 4;

impl Layout {
    /// The name used in errors and reports.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Gguf => "gguf",
            Layout::Rows4 => "rows4",
        }
    }

    /// Rows a row range of this layout must start at and hold a multiple of.
    pub fn row_group(self) -> usize {
        match self {
            Layout::Gguf => 1,
            Layout::Rows4 => ROWS4,
        }
    }

    /// Whether a `rows`-row matrix of `ty` can have this layout.
    pub fn fits(self, ty: GgmlType, rows: usize) -> bool {
        match self {
            Layout::Gguf => true,
            Layout::Rows4 => rows4_block(ty).is_some() && rows.is_multiple_of(ROWS4),
        }
    }

    /// An error unless a `rows`-row matrix of `ty` can have this layout.
    pub(crate) fn check(self, ty: GgmlType, rows: usize) -> Result<(), KernelError> {
        if self.fits(ty, rows) {
            return Ok(());
        }
        Err(KernelError::Layout {
            layout: self.name(),
            expected: "q8_0, q4_0, iq4_nl, mxfp4, q3_k, q4_k, q5_k or q6_k weights in a multiple \
                       of 4 rows"
                .to_string(),
            found: format!("{} weights in {rows} rows", ty.name()),
        })
    }
}

/// The 32-element types [`Layout::Rows4`] takes: (bytes per block, bytes of its one scale,
/// which precede the quants).
fn rows4_legacy(ty: GgmlType) -> Option<(usize, usize)> {
    use crate::formats::{BlockIq4Nl, BlockMxfp4, BlockQ4_0, BlockQ8_0};
    use std::mem::{offset_of, size_of};
    match ty {
        GgmlType::Q8_0 => Some((size_of::<BlockQ8_0>(), offset_of!(BlockQ8_0, qs))),
        GgmlType::Q4_0 => Some((size_of::<BlockQ4_0>(), offset_of!(BlockQ4_0, qs))),
        GgmlType::IQ4_NL => Some((size_of::<BlockIq4Nl>(), offset_of!(BlockIq4Nl, qs))),
        GgmlType::MXFP4 => Some((size_of::<BlockMxfp4>(), offset_of!(BlockMxfp4, qs))),
        _ => None,
    }
}

/// Bytes per block of a type [`Layout::Rows4`] takes.
fn rows4_block(ty: GgmlType) -> Option<usize> {
    if let Some((bb, _)) = rows4_legacy(ty) {
        return Some(bb);
    }
    match ty {
        GgmlType::Q4_K => Some(144),
        GgmlType::Q5_K => Some(176),
        GgmlType::Q3_K => Some(110),
        GgmlType::Q6_K => Some(210),
        _ => None,
    }
}

/// [`rows4_at`] for Q4_K (`qh`: false) and Q5_K (`qh`: true): d, dmin, scales, then Q5_K's
/// 32 `qh` bytes, then the 128 quant bytes, each run of 32 in lane-pair order (see the module
/// documentation).
fn rows4_k_at(qh: bool, h: usize, i: usize) -> usize {
    let (p, r) = (h / 2, h % 2);
    // Byte `t` of a 32-byte run: its lane-pair slot within the row pair's 64 bytes.
    let slot = |t: usize| 16 * ((t % 8) / 2) + 8 * (t % 2) + 4 * r + t / 8;
    let qs_base = if qh { 192 } else { 64 };
    match i {
        0..=3 => 8 * (i / 2) + 2 * h + i % 2,
        4..=15 => 16 + 12 * h + (i - 4),
        16..=47 if qh => 64 + 64 * p + slot(i - 16),
        _ => {
            let q = i - if qh { 48 } else { 16 };
            qs_base + 256 * p + 64 * (q / 32) + slot(q % 32)
        }
    }
}

/// The order of Q6_K's 16 scale groups in [`Layout::Rows4`] (position `j` holds group
/// `Q6_CHAIN[j]`): per half of the block, the groups of `ql[64k..]`'s low nibbles, of its high
/// nibbles, then the same for `ql[64k + 32..]`. Its own inverse.
pub const Q6_CHAIN: [usize; 16] = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15];

/// Where byte `t` of a 32-byte run lands in its two 16-byte vectors of Q3_K's and Q6_K's
/// [`Layout::Rows4`]: vector `(t % 8) / 4`, byte `4 (t % 4) + t / 8` of it.
fn lane_slot(t: usize) -> usize {
    16 * ((t % 8) / 4) + 4 * (t % 4) + t / 8
}

/// [`rows4_at`] for Q3_K (see the module documentation).
fn rows4_q3_at(h: usize, i: usize) -> usize {
    let row = 56 + 96 * h;
    match i {
        0..=95 => row + 32 * (i / 32) + lane_slot(i % 32),
        96..=107 => 8 + 12 * h + (i - 96),
        _ => 2 * h + (i - 108),
    }
}

/// [`rows4_at`] for Q6_K (see the module documentation).
fn rows4_q6_at(h: usize, i: usize) -> usize {
    let slot = lane_slot;
    let row = 72 + 192 * h;
    match i {
        0..=127 => row + 96 * (i / 64) + 32 + 32 * ((i % 64) / 32) + slot(i % 32),
        128..=191 => row + 96 * ((i - 128) / 32) + slot((i - 128) % 32),
        192..=207 => 8 + 16 * h + Q6_CHAIN[i - 192],
        _ => 2 * h + (i - 208),
    }
}

/// Where byte `i` of row `h` (0..4 in its group)'s block lands inside the group's block of
/// [`Layout::Rows4`] (`i` counts the block's bytes as in the file; `bb`: bytes per block).
fn rows4_at(ty: GgmlType, bb: usize, h: usize, i: usize) -> usize {
    if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
        return rows4_k_at(ty == GgmlType::Q5_K, h, i);
    }
    if ty == GgmlType::Q6_K {
        return rows4_q6_at(h, i);
    }
    if ty == GgmlType::Q3_K {
        return rows4_q3_at(h, i);
    }
    let (p, r) = (h / 2, h % 2);
    // `rows4_block` admits no other type
    let sb = rows4_legacy(ty).map_or(2, |(_, sb)| sb);
    if i < sb {
        return sb * h + i;
    }
    let q = bb - sb;
    let (c, e) = ((i - sb) / 8, (i - sb) % 8);
    ROWS4 * sb + p * 2 * q + 16 * c + 8 * r + e
}

/// Where the quants of a [`Layout::Rows4`] group block of a 32-element type start (after the
/// four rows' scales); None for the other types.
pub fn rows4_quants_at(ty: GgmlType) -> Option<usize> {
    rows4_legacy(ty).map(|(_, sb)| ROWS4 * sb)
}

/// `w` (GGUF order) in `layout`, written to `dst` (exactly `w.bytes().len()` bytes); returns the
/// matrix over `dst`. An error when `w` is not in GGUF order, the layout does not fit it, or
/// `dst` has another length.
pub fn repack<'b>(
    w: &QMatrix<'_>,
    layout: Layout,
    dst: &'b mut [u8],
) -> Result<QMatrix<'b>, KernelError> {
    convert(w, layout, dst, false)
}

/// `w` (any layout) in GGUF order, written to `dst` (exactly `w.bytes().len()` bytes); returns
/// the matrix over `dst`.
pub fn to_gguf<'b>(w: &QMatrix<'_>, dst: &'b mut [u8]) -> Result<QMatrix<'b>, KernelError> {
    let layout = w.layout();
    convert(w, layout, dst, true)
}

/// The one conversion between GGUF order and `layout` (`back`: from `layout` to GGUF).
fn convert<'b>(
    w: &QMatrix<'_>,
    layout: Layout,
    dst: &'b mut [u8],
    back: bool,
) -> Result<QMatrix<'b>, KernelError> {
    let src = w.bytes();
    if dst.len() != src.len() {
        return Err(KernelError::Length {
            what: "repacked weight matrix",
            expected: src.len(),
            found: dst.len(),
        });
    }
    if !back && w.layout() != Layout::Gguf {
        return Err(KernelError::Layout {
            layout: w.layout().name(),
            expected: "weights in gguf order to repack".to_string(),
            found: format!("weights in {} order", w.layout().name()),
        });
    }
    layout.check(w.ty(), w.rows())?;
    match layout {
        Layout::Gguf => dst.copy_from_slice(src),
        Layout::Rows4 => {
            let (ty, bb) = (w.ty(), rows4_block(w.ty()).unwrap_or(1));
            let nb = w.row_bytes() / bb;
            for g in 0..w.rows() / ROWS4 {
                for h in 0..ROWS4 {
                    let row = (g * ROWS4 + h) * w.row_bytes();
                    for b in 0..nb {
                        let group = (g * nb + b) * ROWS4 * bb;
                        for i in 0..bb {
                            let (gguf, packed) = (row + b * bb + i, group + rows4_at(ty, bb, h, i));
                            if back {
                                dst[gguf] = src[packed];
                            } else {
                                dst[packed] = src[gguf];
                            }
                        }
                    }
                }
            }
        }
    }
    let out = QMatrix::new(w.ty(), w.rows(), w.cols(), dst)?;
    if back {
        Ok(out)
    } else {
        out.in_layout(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
        let len = rows * ty.row_bytes(k).expect("whole blocks");
        (0..len).map(|i| (i * 131 + 7) as u8).collect()
    }

    #[test]
    fn rows4_round_trips_and_moves_every_byte() {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::MXFP4,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q3_K,
            GgmlType::Q6_K,
        ] {
            let (rows, k) = (8, 2 * ty.block_len());
            let src = matrix(ty, rows, k);
            let w = QMatrix::new(ty, rows, k, &src).expect("matrix");
            let mut packed = vec![0u8; src.len()];
            let p = repack(&w, Layout::Rows4, &mut packed).expect("repack");
            assert_eq!(p.layout(), Layout::Rows4);
            let mut back = vec![0u8; src.len()];
            let g = to_gguf(&p, &mut back).expect("back");
            assert_eq!(g.layout(), Layout::Gguf);
            assert_eq!(back, src, "{ty:?}");
            assert_ne!(packed, src, "{ty:?}: the repack must reorder");
            let (mut a, mut b) = (packed.clone(), src.clone());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{ty:?}: a permutation of the bytes");
        }
    }

    #[test]
    fn rows4_places_one_byte_scales_then_row_pairs() {
        // MXFP4: 17-byte blocks, a 1-byte scale `e`, then 16 bytes of codes
        let (rows, k, bb) = (4, 32, 17);
        let ty = GgmlType::MXFP4;
        let src = matrix(ty, rows, k);
        let w = QMatrix::new(ty, rows, k, &src).expect("matrix");
        let mut packed = vec![0u8; src.len()];
        repack(&w, Layout::Rows4, &mut packed).expect("repack");
        let e: Vec<u8> = (0..4).map(|h| src[h * bb]).collect();
        assert_eq!(packed[..4], e[..]);
        // pair 0: row 0's codes 0..8, row 1's 0..8, row 0's 8..16, row 1's 8..16
        assert_eq!(packed[4..12], src[1..9]);
        assert_eq!(packed[12..20], src[bb + 1..bb + 9]);
        assert_eq!(packed[20..28], src[9..17]);
        // pair 1 ends the group with row 3's codes 8..16
        assert_eq!(packed[60..68], src[3 * bb + 9..4 * bb]);
        assert_eq!(rows4_quants_at(ty), Some(4));
        assert_eq!(rows4_quants_at(GgmlType::IQ4_NL), Some(8));
    }

    #[test]
    fn rows4_places_scales_then_row_pairs() {
        let (rows, k) = (4, 32);
        let ty = GgmlType::Q8_0;
        let src = matrix(ty, rows, k);
        let w = QMatrix::new(ty, rows, k, &src).expect("matrix");
        let mut packed = vec![0u8; src.len()];
        repack(&w, Layout::Rows4, &mut packed).expect("repack");
        // d of row 2, then row 1's quants 8..16 in the second half of pair 0's chunk 1
        assert_eq!(packed[4..6], src[2 * 34..2 * 34 + 2]);
        assert_eq!(packed[8 + 16 + 8..8 + 32], src[34 + 2 + 8..34 + 2 + 16]);
        // row 3's quants 24..32 end the group
        assert_eq!(packed[128..136], src[3 * 34 + 26..4 * 34]);
    }

    #[test]
    fn rows4_places_q4_k_lanes_by_row_pair() {
        let (rows, k) = (4, 256);
        let ty = GgmlType::Q4_K;
        let src = matrix(ty, rows, k);
        let w = QMatrix::new(ty, rows, k, &src).expect("matrix");
        let mut packed = vec![0u8; src.len()];
        repack(&w, Layout::Rows4, &mut packed).expect("repack");
        let qs = |row: usize, at: usize| src[row * 144 + 16 + at];
        // dmin of row 3, the scale bytes of row 1
        assert_eq!(packed[14..16], src[3 * 144 + 2..3 * 144 + 4]);
        assert_eq!(packed[28..40], src[144 + 4..144 + 16]);
        // pair 0, run 0, lanes 0/1: row 0's qs[0, 8, 16, 24], row 1's, row 0's qs[1, 9, ..]
        let run: Vec<u8> = [(0, 0), (1, 0), (0, 1), (1, 1)]
            .iter()
            .flat_map(|&(r, l)| (0..4).map(move |m| qs(r, l + 8 * m)))
            .collect();
        assert_eq!(packed[64..80], run[..]);
        // pair 1 (rows 2, 3), run 3, lanes 6/7: row 3's qs[96 + 7 + 8m] end the group
        let tail: Vec<u8> = (0..4).map(|m| qs(3, 96 + 7 + 8 * m)).collect();
        assert_eq!(packed[572..576], tail[..]);
    }

    #[test]
    fn rows4_places_q6_k_lanes_row_by_row() {
        let (rows, k) = (4, 256);
        let ty = GgmlType::Q6_K;
        let src = matrix(ty, rows, k);
        let w = QMatrix::new(ty, rows, k, &src).expect("matrix");
        let mut packed = vec![0u8; src.len()];
        repack(&w, Layout::Rows4, &mut packed).expect("repack");
        let blk = |row: usize, at: usize| src[row * 210 + at];
        // d of row 3; row 1's scales in chain order (groups 0, 1, 4, 5, 2, ...)
        assert_eq!(packed[6..8], src[3 * 210 + 208..4 * 210]);
        let chain: Vec<u8> = Q6_CHAIN.iter().map(|&g| blk(1, 192 + g)).collect();
        assert_eq!(packed[24..40], chain[..]);
        // row 0, half 0: qh vector 0 holds qh[l + 8m] for lanes 0..4 at 4l + m
        let qh0: Vec<u8> = (0..16).map(|b| blk(0, 128 + b / 4 + 8 * (b % 4))).collect();
        assert_eq!(packed[72..88], qh0[..]);
        // row 2, half 1, ql[96..128] (the second ql run of the half), vector 1: lanes 4..8
        let v: Vec<u8> = (0..16)
            .map(|b| blk(2, 96 + 4 + b / 4 + 8 * (b % 4)))
            .collect();
        let at = 72 + 192 * 2 + 96 + 64 + 16;
        assert_eq!(packed[at..at + 16], v[..]);
        // the last row's last vector ends the group block
        assert_eq!(at + 192 + 16, 4 * 210);
    }

    #[test]
    fn rows4_places_q3_k_lanes_row_by_row() {
        let (rows, k) = (4, 256);
        let ty = GgmlType::Q3_K;
        let src = matrix(ty, rows, k);
        let w = QMatrix::new(ty, rows, k, &src).expect("matrix");
        let mut packed = vec![0u8; src.len()];
        repack(&w, Layout::Rows4, &mut packed).expect("repack");
        let blk = |row: usize, at: usize| src[row * 110 + at];
        // d of row 2, row 3's scale bytes
        assert_eq!(packed[4..6], src[2 * 110 + 108..3 * 110]);
        assert_eq!(packed[44..56], src[3 * 110 + 96..3 * 110 + 108]);
        // row 1's hmask vector 1: hmask[4 + l + 8m] at 4l + m
        let hm: Vec<u8> = (0..16).map(|b| blk(1, 4 + b / 4 + 8 * (b % 4))).collect();
        assert_eq!(packed[56 + 96 + 16..56 + 96 + 32], hm[..]);
        // row 3's qs[32..64] vector 1 ends the group block
        let qs: Vec<u8> = (0..16)
            .map(|b| blk(3, 32 + 32 + 4 + b / 4 + 8 * (b % 4)))
            .collect();
        assert_eq!(packed[440 - 16..440], qs[..]);
    }

    #[test]
    fn rows4_rejects_what_it_cannot_hold() {
        let src = matrix(GgmlType::Q8_0, 6, 32);
        let w = QMatrix::new(GgmlType::Q8_0, 6, 32, &src).expect("matrix");
        let mut dst = vec![0u8; src.len()];
        assert!(matches!(
            repack(&w, Layout::Rows4, &mut dst),
            Err(KernelError::Layout { .. })
        ));
        let src = matrix(GgmlType::Q2_K, 4, 256);
        let w = QMatrix::new(GgmlType::Q2_K, 4, 256, &src).expect("matrix");
        let mut dst = vec![0u8; src.len()];
        assert!(repack(&w, Layout::Rows4, &mut dst).is_err());
        let mut short = vec![0u8; 3];
        assert!(matches!(
            repack(&w, Layout::Gguf, &mut short),
            Err(KernelError::Length { .. })
        ));
    }

    #[test]
    fn rows4_row_ranges_keep_whole_groups() {
        let src = matrix(GgmlType::Q4_0, 8, 64);
        let w = QMatrix::new(GgmlType::Q4_0, 8, 64, &src).expect("matrix");
        let mut packed = vec![0u8; src.len()];
        let p = repack(&w, Layout::Rows4, &mut packed).expect("repack");
        let r = p.row_range(4, 4).expect("a whole group");
        assert_eq!(r.layout(), Layout::Rows4);
        assert!(std::ptr::eq(r.bytes(), &p.bytes()[src.len() / 2..]));
        assert!(p.row_range(2, 4).is_err());
        assert!(p.row_range(0, 2).is_err());
    }
}
