//! [`QMatrix`]: a weight matrix as the GEMMs take it, one value instead of a type, two sizes and a
//! byte slice passed side by side. Its length is checked once, when it is built, so code that
//! holds a `QMatrix` (the GEMM driver, the expert FFN, the model's weight accessors) never
//! re-derives or re-checks the row size. [`Tile`]: the one operand of every tier's GEMM entry
//! (scalar, x86, aarch64): weight rows, the activation rows (a `QMatrix` of the weights'
//! vec-dot type) and the output, checked against each other once when built.

use crate::formats::repack::Layout;
use crate::{GgmlType, KernelError};

/// `rows` rows of `cols` elements of type `ty` in `bytes` (exactly `rows * ty.row_bytes(cols)`
/// bytes: checked by [`QMatrix::new`]), row-major as in the file unless `layout` names a
/// repacked order ([`Layout`], built by `formats::repack::repack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: &'a [u8],
    layout: Layout,
}

impl<'a> QMatrix<'a> {
    /// A matrix over `bytes`; an error unless `cols` is a whole number of `ty` blocks and `bytes`
    /// holds exactly `rows` such rows.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<QMatrix<'a>, KernelError> {
        QMatrix::checked("weight matrix", ty, rows, cols, bytes)
    }

    /// `n` activation rows for a GEMM against `w`: of `w.ty().vec_dot_type()`, `w.cols()`
    /// elements each, contiguous in `bytes` (an error unless it holds exactly that).
    pub fn activations(
        w: &QMatrix<'_>,
        bytes: &'a [u8],
        n: usize,
    ) -> Result<QMatrix<'a>, KernelError> {
        QMatrix::checked(
            "gemm activation rows",
            w.ty.vec_dot_type(),
            n,
            w.cols,
            bytes,
        )
    }

    /// [`QMatrix::new`] with `what` naming the matrix in errors.
    fn checked(
        what: &'static str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<QMatrix<'a>, KernelError> {
        let row_bytes = ty.row_bytes(cols)?;
        let expected = row_bytes
            .checked_mul(rows)
            .ok_or_else(|| KernelError::Overflow {
                what,
                detail: format!("{rows} rows of {row_bytes} bytes"),
            })?;
        if bytes.len() != expected {
            return Err(KernelError::Length {
                what,
                expected,
                found: bytes.len(),
            });
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            bytes,
            layout: Layout::Gguf,
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row (the dot products' length `k`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// How the blocks are ordered in [`QMatrix::bytes`].
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The same matrix over other bytes (a copy of these elsewhere in memory, in the same
    /// layout); an error unless `bytes` has this matrix's length.
    pub fn with_bytes<'b>(&self, bytes: &'b [u8]) -> Result<QMatrix<'b>, KernelError> {
        QMatrix::new(self.ty, self.rows, self.cols, bytes)?.in_layout(self.layout)
    }

    /// These bytes read as `layout` (they must have been written in it, by
    /// `formats::repack::repack`); an error unless the layout fits the type and rows.
    pub fn in_layout(self, layout: Layout) -> Result<QMatrix<'a>, KernelError> {
        layout.check(self.ty, self.rows)?;
        Ok(QMatrix { layout, ..self })
    }

    /// Rows `start .. start + count` as a matrix of their own; an error unless they are all
    /// inside this one.
    pub fn row_range(&self, start: usize, count: usize) -> Result<QMatrix<'a>, KernelError> {
        let end =
            start
                .checked_add(count)
                .filter(|&e| e <= self.rows)
                .ok_or(KernelError::Rows {
                    start,
                    end: start.saturating_add(count),
                    rows: self.rows,
                })?;
        let group = self.layout.row_group();
        if !start.is_multiple_of(group) || !count.is_multiple_of(group) {
            return Err(KernelError::Layout {
                layout: self.layout.name(),
                expected: format!("row ranges in whole groups of {group} rows"),
                found: format!("rows {start}..{end}"),
            });
        }
        Ok(QMatrix {
            rows: count,
            bytes: &self.bytes[start * self.row_bytes..end * self.row_bytes],
            ..*self
        })
    }
}

/// One GEMM call as a tier takes it: `out[r * n + j] = w[r] . x[j]` for the `w.rows()` weight
/// rows and the `n = x.rows()` activation rows, `out` row-major by weight row.
///
/// **Architecture Invariant: a `Tile` is consistent by construction** (private fields, checked
/// in [`Tile::new`]): `x` has the weights' vec-dot type and row length, `out` holds exactly
/// `w.rows() * x.rows()` floats, and both matrices hold exactly their rows (as every
/// `QMatrix`); `x` is in GGUF order, `w` may be repacked (`w.layout()`: **a tier reads a
/// repacked `w` only if it has a path for that layout**, others leave it to the scalar
/// fallback, which restores GGUF order). The SIMD tiers' unsafe code reads through raw
/// pointers on that guarantee alone.
#[derive(Debug)]
pub struct Tile<'a> {
    w: QMatrix<'a>,
    x: QMatrix<'a>,
    out: &'a mut [f32],
}

impl<'a> Tile<'a> {
    /// A tile of `w` against `x` into `out`; an error unless `x` is `w.ty().vec_dot_type()`
    /// with `w.cols()` elements per row (build it with [`QMatrix::activations`]) and `out`
    /// holds `w.rows() * x.rows()` floats.
    pub fn new(
        w: QMatrix<'a>,
        x: QMatrix<'a>,
        out: &'a mut [f32],
    ) -> Result<Tile<'a>, KernelError> {
        if !w.ty.has_vec_dot() {
            return Err(KernelError::Unsupported {
                op: "gemm",
                ty: w.ty.name(),
            });
        }
        if x.layout != Layout::Gguf {
            return Err(KernelError::Layout {
                layout: x.layout.name(),
                expected: "gemm activation rows in gguf order".to_string(),
                found: format!("activation rows in {} order", x.layout.name()),
            });
        }
        if x.ty != w.ty.vec_dot_type() || x.cols != w.cols {
            return Err(KernelError::Operands {
                expected: format!(
                    "{} activations of {} elements for {} weights",
                    w.ty.vec_dot_type().name(),
                    w.cols,
                    w.ty.name()
                ),
                found: format!("{} of {}", x.ty.name(), x.cols),
            });
        }
        let cells = w
            .rows
            .checked_mul(x.rows)
            .ok_or_else(|| KernelError::Overflow {
                what: "gemm output",
                detail: format!("{} x {}", w.rows, x.rows),
            })?;
        if out.len() != cells {
            return Err(KernelError::Elements {
                what: "gemm output",
                expected: cells,
                found: out.len(),
            });
        }
        Ok(Tile { w, x, out })
    }

    /// The weight rows.
    pub fn w(&self) -> QMatrix<'a> {
        self.w
    }

    /// The activation rows.
    pub fn x(&self) -> QMatrix<'a> {
        self.x
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.w.ty
    }

    /// Elements per row (`k`).
    pub fn k(&self) -> usize {
        self.w.cols
    }

    /// Weight rows.
    pub fn rows(&self) -> usize {
        self.w.rows
    }

    /// Activation rows.
    pub fn n(&self) -> usize {
        self.x.rows
    }

    /// The output, `rows() * n()` floats, `out[r * n + j]`.
    pub fn out(&mut self) -> &mut [f32] {
        &mut *self.out
    }
}
