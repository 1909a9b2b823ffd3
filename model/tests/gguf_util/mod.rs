//! Test-only GGUF writer shared by the gguf_* tests: builds small GGUF images byte by byte (so
//! tests can corrupt any field) and re-writes a parsed model as a split set.
#![allow(dead_code)]

use nightshift_model::gguf::Value;

/// GGUF value type id of a value.
pub fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

pub fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// The value's payload (without its type id).
pub fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(s) => put_str(out, s.as_bytes()),
        Value::Array(items) => {
            // Empty arrays are written as arrays of u8, as gguf-py does for an empty list.
            let ty = items.first().map_or(0, value_type);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

/// Where things landed in a built image (for targeted corruption).
#[derive(Default, Debug)]
pub struct Layout {
    /// Byte offset of each kv's key length.
    pub kv_at: Vec<usize>,
    /// Byte offset of each tensor info's name length.
    pub tensor_at: Vec<usize>,
    /// Byte offset of each tensor info's n_dims field.
    pub n_dims_at: Vec<usize>,
    /// Byte offset of each tensor info's type field.
    pub type_at: Vec<usize>,
    /// Byte offset of each tensor info's offset field.
    pub offset_at: Vec<usize>,
    pub data_start: usize,
}

pub struct Builder {
    pub version: u32,
    pub alignment: usize,
    pub kvs: Vec<(String, Value)>,
    pub tensors: Vec<Tensor>,
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
    pub fn kv(mut self, key: &str, v: Value) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }
    /// An F32 tensor holding 0, 1, 2, ...
    pub fn f32_tensor(self, name: &str, dims: &[u64]) -> Self {
        let n: u64 = dims.iter().product();
        let data = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        self.tensor(name, dims, 0, data)
    }

    pub fn build(&self) -> (Vec<u8>, Layout) {
        let mut out = Vec::new();
        let mut lay = Layout::default();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            lay.kv_at.push(out.len());
            put_str(&mut out, k.as_bytes());
            out.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let align = self.alignment;
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            lay.tensor_at.push(out.len());
            put_str(&mut out, t.name.as_bytes());
            lay.n_dims_at.push(out.len());
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            lay.type_at.push(out.len());
            out.extend_from_slice(&t.ty.to_le_bytes());
            lay.offset_at.push(out.len());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        lay.data_start = out.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(lay.data_start + off, 0);
            out.extend_from_slice(&t.data);
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        (out, lay)
    }
}

pub fn set_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn set_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
