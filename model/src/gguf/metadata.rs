//! GGUF metadata: the typed [`Value`] tree and [`Metadata`], an ordered key/value table with
//! getters that convert between compatible types (any integer that fits, f32 from f64) and
//! report a typed error when the file holds something else under the key.

use std::collections::HashMap;

use super::GgufError;

/// One metadata value, exactly as stored in the file (arrays may nest).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
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
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// The value as a wide integer, if it is an integer of any width.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as f64, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// A short description for error messages: the type, plus the value for scalars.
    pub(crate) fn describe(&self) -> String {
        match self {
            Value::Str(s) if s.len() <= 40 => format!("string {s:?}"),
            Value::Str(_) => "string".to_string(),
            Value::Array(a) => format!("array of {} values", a.len()),
            Value::Bool(b) => format!("bool {b}"),
            Value::F32(v) => format!("f32 {v}"),
            Value::F64(v) => format!("f64 {v}"),
            other => match other.as_i128() {
                Some(v) => format!("{} {v}", other.type_name()),
                None => other.type_name().to_string(),
            },
        }
    }
}

/// The key/value table of a GGUF file, in file order.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

fn wrong(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.describe(),
    }
}

fn int_as<T: TryFrom<i128>>(key: &str, expected: &'static str, v: &Value) -> Result<T, GgufError> {
    v.as_i128()
        .and_then(|i| T::try_from(i).ok())
        .ok_or_else(|| wrong(key, expected, v))
}

impl Metadata {
    /// Adds a key; returns false (and changes nothing) if the key is already present.
    pub(crate) fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All keys and values in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// `key` as u32: any integer type whose value fits.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key)
            .map(|v| int_as(key, "an integer that fits in u32", v))
            .transpose()
    }

    /// `key` as u64: any integer type whose value fits.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key)
            .map(|v| int_as(key, "an integer that fits in u64", v))
            .transpose()
    }

    /// `key` as i64: any integer type whose value fits.
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.get(key)
            .map(|v| int_as(key, "an integer that fits in i64", v))
            .transpose()
    }

    /// `key` as f32: f32 as is, f64 rounded to f32 (integers are refused: a float key holding
    /// an integer means the file is not what we think it is).
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get(key)
            .map(|v| match *v {
                Value::F32(f) => Ok(f),
                Value::F64(f) => Ok(f as f32),
                _ => Err(wrong(key, "a float", v)),
            })
            .transpose()
    }

    /// `key` as bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key)
            .map(|v| match *v {
                Value::Bool(b) => Ok(b),
                _ => Err(wrong(key, "a bool", v)),
            })
            .transpose()
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key)
            .map(|v| match v {
                Value::Str(s) => Ok(s.as_str()),
                _ => Err(wrong(key, "a string", v)),
            })
            .transpose()
    }

    /// `key` as an array (of anything).
    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>, GgufError> {
        self.get(key)
            .map(|v| match v {
                Value::Array(a) => Ok(a.as_slice()),
                _ => Err(wrong(key, "an array", v)),
            })
            .transpose()
    }

    /// `key` as an array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(a) = self.get_array(key)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| match v {
                Value::Str(s) => Ok(s.as_str()),
                _ => Err(wrong(key, "an array of strings", v)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// `key` as an array of i32: elements of any integer type whose values fit.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        let Some(a) = self.get_array(key)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| int_as(key, "an array of integers that fit in i32", v))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// `key` as an array of f32: f32 elements as is, f64 rounded.
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(a) = self.get_array(key)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| match *v {
                Value::F32(f) => Ok(f),
                Value::F64(f) => Ok(f as f32),
                _ => Err(wrong(key, "an array of floats", v)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}
