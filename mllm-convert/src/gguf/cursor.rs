//! Little-endian reads from the GGUF header with bounds checks.

use mllm_core::{Error, Result};

use super::value::{code, type_name, GgufArray, GgufValue};

/// Arrays nested deeper than this are rejected (they only make sense one or
/// two levels deep, and unbounded nesting would exhaust the stack).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// A read position in the file's bytes. Every read checks that the bytes are
/// there, so truncation is an error naming what was being read.
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at `pos`.
    pub fn new(bytes: &'a [u8], pos: usize) -> Self {
        Cursor { bytes, pos }
    }

    /// The current offset in the file.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes; `what` names the field for the error message.
    pub fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(Error::BadGguf(format!(
                "truncated: {} needs {n} bytes at offset {} but the file ends at {}",
                what(),
                self.pos,
                self.bytes.len()
            )));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    /// A `u32`.
    pub fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A `u64`.
    pub fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A string: `u64` byte length, then UTF-8 bytes.
    pub fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|e| Error::BadGguf(format!("{} is not UTF-8: {e}", what())))
    }

    /// A metadata value of type `ty`.
    pub fn value(&mut self, ty: u32, what: &dyn Fn() -> String) -> Result<GgufValue> {
        Ok(match ty {
            code::U8 => GgufValue::U8(u8::from_le_bytes(self.array(what)?)),
            code::I8 => GgufValue::I8(i8::from_le_bytes(self.array(what)?)),
            code::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            code::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            code::U32 => GgufValue::U32(u32::from_le_bytes(self.array(what)?)),
            code::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            code::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            code::BOOL => GgufValue::Bool(self.bool(what)?),
            code::STRING => GgufValue::String(self.string(what)?),
            code::ARRAY => GgufValue::Array(self.array_value(0, what)?),
            code::U64 => GgufValue::U64(u64::from_le_bytes(self.array(what)?)),
            code::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            code::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(unknown_type(other, what)),
        })
    }

    fn bool(&mut self, what: &dyn Fn() -> String) -> Result<bool> {
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Error::BadGguf(format!(
                "{} is a bool stored as byte {b} (expected 0 or 1)",
                what()
            ))),
        }
    }

    /// An array: `u32` element type, `u64` count, then the elements.
    fn array_value(&mut self, depth: usize, what: &dyn Fn() -> String) -> Result<GgufArray> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(Error::BadGguf(format!(
                "{} nests arrays more than {MAX_ARRAY_DEPTH} levels deep",
                what()
            )));
        }
        let ty = self.u32(&|| format!("element type of {}", what()))?;
        let count = self.u64(&|| format!("element count of {}", what()))?;
        if type_name(ty).is_none() {
            return Err(unknown_type(ty, what));
        }
        // Checking the smallest possible size of the elements first keeps a
        // huge count from turning into a huge allocation.
        let left = (self.bytes.len() - self.pos) as u64;
        if count.saturating_mul(min_elem_bytes(ty)) > left {
            return Err(Error::BadGguf(format!(
                "truncated: {} claims {count} elements of type {} but only {left} bytes follow",
                what(),
                type_name(ty).unwrap_or("?")
            )));
        }
        let n = count as usize;
        let elem = |i: usize| move || format!("element {i} of {}", what());
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(<$t>::from_le_bytes(self.array(&elem(i))?));
                }
                GgufArray::$variant(v)
            }};
        }
        Ok(match ty {
            code::U8 => fixed!(U8, u8),
            code::I8 => fixed!(I8, i8),
            code::U16 => fixed!(U16, u16),
            code::I16 => fixed!(I16, i16),
            code::U32 => fixed!(U32, u32),
            code::I32 => fixed!(I32, i32),
            code::F32 => fixed!(F32, f32),
            code::U64 => fixed!(U64, u64),
            code::I64 => fixed!(I64, i64),
            code::F64 => fixed!(F64, f64),
            code::BOOL => {
                GgufArray::Bool((0..n).map(|i| self.bool(&elem(i))).collect::<Result<_>>()?)
            }
            code::STRING => GgufArray::String(
                (0..n)
                    .map(|i| self.string(&elem(i)))
                    .collect::<Result<_>>()?,
            ),
            _ => GgufArray::Array(
                (0..n)
                    .map(|i| self.array_value(depth + 1, &elem(i)))
                    .collect::<Result<_>>()?,
            ),
        })
    }
}

/// The fewest bytes one element of type `ty` can take.
fn min_elem_bytes(ty: u32) -> u64 {
    match ty {
        code::U8 | code::I8 | code::BOOL => 1,
        code::U16 | code::I16 => 2,
        code::U32 | code::I32 | code::F32 => 4,
        code::STRING | code::U64 | code::I64 | code::F64 => 8,
        _ => 12,
    }
}

fn unknown_type(ty: u32, what: &dyn Fn() -> String) -> Error {
    Error::BadGguf(format!(
        "{} has unknown value type {ty} (known types are 0..=12)",
        what()
    ))
}
