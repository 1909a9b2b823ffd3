//! Parsing one GGUF file (v2/v3, little-endian) from its bytes: header, metadata, tensor infos,
//! alignment, and every consistency check on tensor shapes, types, offsets and overlaps. All
//! reads go through a bounds-checked cursor and every count is capped by the bytes left in the
//! file before anything is allocated, so a hostile file costs at most O(file size) memory.

use std::collections::HashMap;

use super::metadata::{Metadata, Value};
use super::types::{kernel_type, type_layout};
use super::FormatError;
use nightshift_kernels::GgmlType;

/// The magic bytes that open every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays may nest; deeper than this is refused (no real file nests at all).
pub const MAX_NESTING: usize = 8;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;

/// A format problem and the byte offset where it was found.
#[derive(Debug)]
pub struct Bad {
    pub offset: u64,
    pub kind: FormatError,
}

type R<T> = Result<T, Bad>;

/// A tensor as described in one file, with its byte range inside that file.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    pub start: u64,
    pub size: u64,
}

/// Everything in one file except the tensor bytes.
#[derive(Debug)]
pub struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<RawTensor>,
    pub alignment: u64,
    /// Offset of the tensor data section (end of header, aligned).
    pub data_start: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn bad(&self, kind: FormatError) -> Bad {
        Bad {
            offset: self.pos as u64,
            kind,
        }
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> R<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.bad(FormatError::Truncated {
                what: what(),
                need: n,
                have: self.remaining(),
            }));
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> R<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> R<u32> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> R<u64> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// A count of items each at least `min_size` bytes long, refused if they cannot fit.
    fn count(&mut self, min_size: u64, what: &dyn Fn() -> String) -> R<u64> {
        let start = self.pos;
        let n = self.u64(what)?;
        if n.saturating_mul(min_size) > self.remaining() {
            return Err(Bad {
                offset: start as u64,
                kind: FormatError::CountTooLarge {
                    what: what(),
                    count: n,
                    remaining: self.remaining(),
                },
            });
        }
        Ok(n)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> R<String> {
        let start = self.pos;
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(Bad {
                offset: start as u64,
                kind: FormatError::InvalidUtf8 { what: what() },
            }),
        }
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> R<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let b = self.array::<1>(what)?[0];
                Value::Bool(b != 0)
            }
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.bad(FormatError::NestingTooDeep {
                        what: what(),
                        max: MAX_NESTING,
                    }));
                }
                let at = self.pos;
                let elem_ty = self.u32(what)?;
                let Some(min) = min_value_size(elem_ty) else {
                    return Err(Bad {
                        offset: at as u64,
                        kind: FormatError::BadValueType {
                            what: what(),
                            ty: elem_ty,
                        },
                    });
                };
                let n = self.count(min, what)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_ty, depth + 1, what)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            _ => return Err(self.bad(FormatError::BadValueType { what: what(), ty })),
        })
    }
}

/// The fewest bytes a value of GGUF type `ty` can occupy, or None for an unknown type.
fn min_value_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

/// Parses the header of one GGUF file held in `buf` (the whole file).
pub fn parse(buf: &[u8]) -> R<Parsed> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.take(4, &|| "magic".into()).map_err(|_| Bad {
        offset: 0,
        kind: FormatError::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        },
    })?;
    if magic != MAGIC {
        return Err(Bad {
            offset: 0,
            kind: FormatError::BadMagic {
                found: magic.to_vec(),
            },
        });
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(Bad {
            offset: 4,
            kind: FormatError::UnsupportedVersion(version),
        });
    }
    // A tensor info is at least name length + n_dims + type + offset; a kv at least key length +
    // type + one byte of value. Both counts come before their items, so check against the bytes
    // after the two counts.
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    for (what, n, min) in [("tensor info", n_tensors, 24u64), ("metadata", n_kv, 13u64)] {
        if n.saturating_mul(min) > c.remaining() {
            return Err(Bad {
                offset: if what == "tensor info" { 8 } else { 16 },
                kind: FormatError::CountTooLarge {
                    what: what.into(),
                    count: n,
                    remaining: c.remaining(),
                },
            });
        }
    }

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let at = c.pos as u64;
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata value of {key}");
        let ty = c.u32(&what)?;
        let value = c.value(ty, 0, &what)?;
        if !metadata.insert(key.clone(), value) {
            return Err(Bad {
                offset: at,
                kind: FormatError::DuplicateKey(key),
            });
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_i128() {
            Some(a) if a > 0 && (a as u128).is_power_of_two() && a <= u32::MAX as i128 => a as u64,
            Some(a) => {
                return Err(Bad {
                    offset: c.pos as u64,
                    kind: FormatError::BadAlignment(a.max(0) as u64),
                })
            }
            None => {
                return Err(Bad {
                    offset: c.pos as u64,
                    kind: FormatError::AlignmentType(v.describe()),
                })
            }
        },
    };

    struct Info {
        at: u64,
        name: String,
        ty: GgmlType,
        dims: Vec<u64>,
        offset: u64,
        size: u64,
    }
    let mut infos = Vec::with_capacity(n_tensors as usize);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let at = c.pos as u64;
        let name = c.string(&|| format!("tensor #{i} name"))?;
        let what = || format!("tensor {name}");
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(Bad {
                offset: at,
                kind: FormatError::TooManyDims { name, n_dims },
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let ty_id = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let bad = |kind| Bad { offset: at, kind };
        if seen.insert(name.clone(), ()).is_some() {
            return Err(bad(FormatError::DuplicateTensor(name)));
        }
        if let Some(&d) = dims.iter().find(|&&d| d > i64::MAX as u64) {
            return Err(bad(FormatError::DimTooLarge { name, dim: d }));
        }
        let Some(n_elem) = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
            return Err(bad(FormatError::ShapeOverflow { name }));
        };
        if n_elem > i64::MAX as u64 {
            return Err(bad(FormatError::ShapeOverflow { name }));
        }
        let Some(layout) = type_layout(ty_id) else {
            return Err(bad(FormatError::UnknownTensorType { name, id: ty_id }));
        };
        let Some(ty) = kernel_type(ty_id) else {
            return Err(bad(FormatError::UnsupportedTensorType {
                name,
                ty: layout.name,
            }));
        };
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % layout.block_len != 0 {
            return Err(bad(FormatError::RowNotBlockMultiple {
                name,
                ty: layout.name,
                ne0,
                block: layout.block_len,
            }));
        }
        let Some(size) = (n_elem / layout.block_len).checked_mul(layout.block_bytes) else {
            return Err(bad(FormatError::ShapeOverflow { name }));
        };
        if offset % alignment != 0 {
            return Err(bad(FormatError::MisalignedTensor {
                name,
                offset,
                align: alignment,
            }));
        }
        infos.push(Info {
            at,
            name,
            ty,
            dims,
            offset,
            size,
        });
    }

    let header_end = c.pos as u64;
    let data_start = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    let mut tensors = Vec::with_capacity(infos.len());
    for t in infos {
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => tensors.push((
                t.at,
                RawTensor {
                    name: t.name,
                    ty: t.ty,
                    dims: t.dims,
                    start,
                    size: t.size,
                },
            )),
            _ => {
                return Err(Bad {
                    offset: t.at,
                    kind: FormatError::TensorOutOfBounds {
                        name: t.name,
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    },
                })
            }
        }
    }

    // Overlaps: sort by start, each tensor must begin at or after the end of the previous one.
    // Empty tensors occupy no bytes and overlap nothing.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].1.size > 0)
        .collect();
    order.sort_by_key(|&i| (tensors[i].1.start, i));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]].1, &tensors[w[1]].1);
        if b.start < a.start + a.size {
            return Err(Bad {
                offset: tensors[w[1]].0,
                kind: FormatError::TensorOverlap {
                    name: b.name.clone(),
                    other: a.name.clone(),
                },
            });
        }
    }

    Ok(Parsed {
        version,
        metadata,
        tensors: tensors.into_iter().map(|(_, t)| t).collect(),
        alignment,
        data_start,
    })
}
