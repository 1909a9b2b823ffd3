//! A streaming GGUF v3 writer: header, metadata key/values of every GGUF type, tensor infos with
//! 32-byte aligned offsets, then the tensor data appended tensor by tensor in the declared order.
//!
//! All tensor infos are declared up front (their byte sizes follow from type and shape), so the
//! data can be produced and written a chunk at a time: a multi-GB model needs little RAM. The
//! writer checks that every tensor receives exactly its byte size before the next one starts.

use std::io::{self, Write};

use nightshift_kernels::GgmlType;

use super::GenError;

/// GGUF's default (and our only) data alignment.
pub const ALIGNMENT: u64 = 32;

/// A metadata value, with GGUF's value types.
#[derive(Clone, Debug, PartialEq)]
pub enum KvValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    /// Elements must all have one type (GGUF arrays are homogeneous); nested arrays allowed.
    Array(Vec<KvValue>),
}

impl KvValue {
    /// GGUF's numeric value type.
    pub fn type_id(&self) -> u32 {
        match self {
            KvValue::U8(_) => 0,
            KvValue::I8(_) => 1,
            KvValue::U16(_) => 2,
            KvValue::I16(_) => 3,
            KvValue::U32(_) => 4,
            KvValue::I32(_) => 5,
            KvValue::F32(_) => 6,
            KvValue::Bool(_) => 7,
            KvValue::Str(_) => 8,
            KvValue::Array(_) => 9,
            KvValue::U64(_) => 10,
            KvValue::I64(_) => 11,
            KvValue::F64(_) => 12,
        }
    }

    /// An array of strings.
    pub fn strs<S: AsRef<str>>(items: &[S]) -> KvValue {
        KvValue::Array(
            items
                .iter()
                .map(|s| KvValue::Str(s.as_ref().to_string()))
                .collect(),
        )
    }
}

/// One tensor as declared in the header: name, type, ggml dims (dims[0] = row length).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDecl {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorDecl {
    /// Elements in one row (dims[0]).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of dims[1..]).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of the tensor's data.
    pub fn n_bytes(&self) -> Result<u64, GenError> {
        let row = self
            .ty
            .row_bytes(self.row_len() as usize)
            .map_err(|e| GenError::Shape {
                tensor: self.name.clone(),
                detail: e.to_string(),
            })?;
        Ok(row as u64 * self.n_rows())
    }
}

/// Streams one GGUF file. Create it with the metadata and all tensor declarations, then call
/// [`GgufWriter::write_data`] with each tensor's bytes in order (in as many pieces as wanted),
/// then [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    out: W,
    pos: u64,
    tensors: Vec<(TensorDecl, u64)>,
    current: usize,
    written_in_current: u64,
}

fn pad_len(pos: u64) -> u64 {
    (ALIGNMENT - pos % ALIGNMENT) % ALIGNMENT
}

impl<W: Write> GgufWriter<W> {
    /// Writes header, metadata and tensor infos, padded to the data section.
    pub fn new(out: W, kv: &[(String, KvValue)], tensors: &[TensorDecl]) -> Result<Self, GenError> {
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            if t.dims.is_empty() || t.dims.len() > 4 {
                return Err(GenError::Shape {
                    tensor: t.name.clone(),
                    detail: format!("expected 1 to 4 dims, found {}", t.dims.len()),
                });
            }
            let n = t.n_bytes()?;
            sizes.push((t.clone(), offset));
            offset += n + pad_len(n);
        }
        let mut w = GgufWriter {
            out,
            pos: 0,
            tensors: sizes,
            current: 0,
            written_in_current: 0,
        };
        w.raw(b"GGUF")?;
        w.u32(3)?;
        w.u64(tensors.len() as u64)?;
        w.u64(kv.len() as u64)?;
        for (key, value) in kv {
            w.string(key)?;
            w.u32(value.type_id())?;
            w.value(value)?;
        }
        for i in 0..w.tensors.len() {
            let (decl, off) = w.tensors[i].clone();
            w.string(&decl.name)?;
            w.u32(decl.dims.len() as u32)?;
            for d in &decl.dims {
                w.u64(*d)?;
            }
            w.u32(decl.ty.id())?;
            w.u64(off)?;
        }
        w.pad()?;
        Ok(w)
    }

    /// The declared tensors with their offsets inside the data section.
    pub fn tensors(&self) -> &[(TensorDecl, u64)] {
        &self.tensors
    }

    /// Appends data of the current tensor; moves to the next tensor when this one is complete.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<(), GenError> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some((decl, _)) = self.tensors.get(self.current) else {
                return Err(GenError::Stream(format!(
                    "expected no more tensor data, found {} extra bytes",
                    rest.len()
                )));
            };
            let size = decl.n_bytes()?;
            let need = size - self.written_in_current;
            let take = (need as usize).min(rest.len());
            let (now, later) = rest.split_at(take);
            self.raw(now)?;
            self.written_in_current += take as u64;
            rest = later;
            if self.written_in_current == size {
                self.pad()?;
                self.current += 1;
                self.written_in_current = 0;
            }
        }
        Ok(())
    }

    /// Name of the tensor whose data is expected next, if any.
    pub fn expecting(&self) -> Option<&str> {
        self.tensors.get(self.current).map(|t| t.0.name.as_str())
    }

    /// Flushes and returns the sink; errors if a tensor did not get all its data.
    pub fn finish(mut self) -> Result<W, GenError> {
        // zero-byte tensors are complete without any write
        while let Some((decl, _)) = self.tensors.get(self.current) {
            if decl.n_bytes()? != 0 || self.written_in_current != 0 {
                return Err(GenError::Stream(format!(
                    "expected data for every tensor, `{}` got {} bytes",
                    decl.name, self.written_in_current
                )));
            }
            self.current += 1;
        }
        self.out.flush()?;
        Ok(self.out)
    }

    fn raw(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = pad_len(self.pos) as usize;
        self.raw(&[0u8; ALIGNMENT as usize][..n])
    }

    fn u32(&mut self, v: u32) -> io::Result<()> {
        self.raw(&v.to_le_bytes())
    }

    fn u64(&mut self, v: u64) -> io::Result<()> {
        self.raw(&v.to_le_bytes())
    }

    fn string(&mut self, s: &str) -> io::Result<()> {
        self.u64(s.len() as u64)?;
        self.raw(s.as_bytes())
    }

    fn value(&mut self, v: &KvValue) -> Result<(), GenError> {
        match v {
            KvValue::U8(x) => self.raw(&x.to_le_bytes())?,
            KvValue::I8(x) => self.raw(&x.to_le_bytes())?,
            KvValue::U16(x) => self.raw(&x.to_le_bytes())?,
            KvValue::I16(x) => self.raw(&x.to_le_bytes())?,
            KvValue::U32(x) => self.raw(&x.to_le_bytes())?,
            KvValue::I32(x) => self.raw(&x.to_le_bytes())?,
            KvValue::U64(x) => self.raw(&x.to_le_bytes())?,
            KvValue::I64(x) => self.raw(&x.to_le_bytes())?,
            KvValue::F32(x) => self.raw(&x.to_le_bytes())?,
            KvValue::F64(x) => self.raw(&x.to_le_bytes())?,
            KvValue::Bool(x) => self.raw(&[u8::from(*x)])?,
            KvValue::Str(s) => self.string(s)?,
            KvValue::Array(items) => {
                let elem = items
                    .first()
                    .map_or(KvValue::U8(0).type_id(), KvValue::type_id);
                if let Some(bad) = items.iter().find(|i| i.type_id() != elem) {
                    return Err(GenError::Stream(format!(
                        "expected a homogeneous array of type {elem}, found an element of type {}",
                        bad.type_id()
                    )));
                }
                self.u32(elem)?;
                self.u64(items.len() as u64)?;
                for i in items {
                    self.value(i)?;
                }
            }
        }
        Ok(())
    }
}
