//! [`QMatrix`]: a weight matrix as the GEMMs take it, one value instead of a type, two sizes and a
//! byte slice passed side by side. Its length is checked once, when it is built, so code that
//! holds a `QMatrix` (the GEMM driver, the expert FFN, the model's weight accessors) never
//! re-derives or re-checks the row size.

use crate::{GgmlType, KernelError};

/// `rows` rows of `cols` elements of type `ty`, contiguous and row-major in `bytes` (exactly
/// `rows * ty.row_bytes(cols)` bytes: checked by [`QMatrix::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: &'a [u8],
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
        let row_bytes = ty.row_bytes(cols)?;
        let expected = row_bytes
            .checked_mul(rows)
            .ok_or_else(|| KernelError::Overflow {
                what: "weight matrix",
                detail: format!("{rows} rows of {row_bytes} bytes"),
            })?;
        if bytes.len() != expected {
            return Err(KernelError::Length {
                what: "weight matrix",
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

    /// The same matrix over other bytes (a copy of these elsewhere in memory); an error unless
    /// `bytes` has this matrix's length.
    pub fn with_bytes<'b>(&self, bytes: &'b [u8]) -> Result<QMatrix<'b>, KernelError> {
        QMatrix::new(self.ty, self.rows, self.cols, bytes)
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
        Ok(QMatrix {
            rows: count,
            bytes: &self.bytes[start * self.row_bytes..end * self.row_bytes],
            ..*self
        })
    }
}
