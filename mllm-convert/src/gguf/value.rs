//! GGUF metadata values: the thirteen value types and typed arrays.

/// Value type codes as stored before every metadata value.
pub mod code {
    /// `u8`
    pub const U8: u32 = 0;
    /// `i8`
    pub const I8: u32 = 1;
    /// `u16`
    pub const U16: u32 = 2;
    /// `i16`
    pub const I16: u32 = 3;
    /// `u32`
    pub const U32: u32 = 4;
    /// `i32`
    pub const I32: u32 = 5;
    /// `f32`
    pub const F32: u32 = 6;
    /// `bool` (one byte, 0 or 1)
    pub const BOOL: u32 = 7;
    /// `string` (u64 byte length, UTF-8 bytes)
    pub const STRING: u32 = 8;
    /// `array` (u32 element type, u64 count, elements)
    pub const ARRAY: u32 = 9;
    /// `u64`
    pub const U64: u32 = 10;
    /// `i64`
    pub const I64: u32 = 11;
    /// `f64`
    pub const F64: u32 = 12;
}

/// The name of a value type code (`"u32"`), or `None` for an unknown code.
pub fn type_name(code: u32) -> Option<&'static str> {
    Some(match code {
        code::U8 => "u8",
        code::I8 => "i8",
        code::U16 => "u16",
        code::I16 => "i16",
        code::U32 => "u32",
        code::I32 => "i32",
        code::F32 => "f32",
        code::BOOL => "bool",
        code::STRING => "string",
        code::ARRAY => "array",
        code::U64 => "u64",
        code::I64 => "i64",
        code::F64 => "f64",
        _ => return None,
    })
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value, stored with its element type so that large arrays
/// (token lists) take no more memory than in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufValue {
    /// A description of the type for messages: `u32`, `array of string`.
    pub fn type_desc(&self) -> String {
        let name = match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(a) => return a.type_desc(),
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        };
        name.to_string()
    }

    /// Any integer value as `i128` (which holds every GGUF integer type).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A float value widened exactly to `f64` (an f32 keeps its exact value).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(f64::from(v)),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl GgufArray {
    /// A description of the type for messages: `array of string`.
    pub fn type_desc(&self) -> String {
        let elem = match self {
            GgufArray::U8(_) => "u8".to_string(),
            GgufArray::I8(_) => "i8".to_string(),
            GgufArray::U16(_) => "u16".to_string(),
            GgufArray::I16(_) => "i16".to_string(),
            GgufArray::U32(_) => "u32".to_string(),
            GgufArray::I32(_) => "i32".to_string(),
            GgufArray::F32(_) => "f32".to_string(),
            GgufArray::Bool(_) => "bool".to_string(),
            GgufArray::String(_) => "string".to_string(),
            GgufArray::Array(items) => match items.first() {
                Some(inner) => inner.type_desc(),
                None => "array".to_string(),
            },
            GgufArray::U64(_) => "u64".to_string(),
            GgufArray::I64(_) => "i64".to_string(),
            GgufArray::F64(_) => "f64".to_string(),
        };
        format!("array of {elem}")
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of an array of strings.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The elements of an array of `f32`.
    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            GgufArray::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements of an array of any integer type, as `i64` (`None` for
    /// other element types and for `u64` values above `i64::MAX`).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        fn all<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            GgufArray::U8(v) => all(v, |x| Some(x.into())),
            GgufArray::I8(v) => all(v, |x| Some(x.into())),
            GgufArray::U16(v) => all(v, |x| Some(x.into())),
            GgufArray::I16(v) => all(v, |x| Some(x.into())),
            GgufArray::U32(v) => all(v, |x| Some(x.into())),
            GgufArray::I32(v) => all(v, |x| Some(x.into())),
            GgufArray::U64(v) => all(v, |x| i64::try_from(x).ok()),
            GgufArray::I64(v) => Some(v.clone()),
            _ => None,
        }
    }
}
