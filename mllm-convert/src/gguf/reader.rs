//! Memory-mapped reading of GGUF files (versions 2 and 3, little-endian).
//!
//! Layout:
//!
//! ```text
//! "GGUF"  u32 version  u64 tensor_count  u64 kv_count
//! kv_count × (string key, u32 value type, value)
//! tensor_count × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml type, u64 offset)
//! padding to the alignment (`general.alignment`, default 32)
//! tensor data; each tensor at data_start + offset
//! ```
//!
//! Strings are a `u64` byte length followed by UTF-8 bytes. `ne[0]` is the
//! innermost (contiguous) dimension, so the row-major shape is `ne` reversed.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use mllm_core::file::MappedFile;
use mllm_core::{DType, Error, Result};

use super::cursor::Cursor;
use super::types::{describe_ggml_type, dtype_for_ggml, KEPT_TYPES};
use super::value::{GgufArray, GgufValue};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a GGUF tensor may have.
pub const MAX_DIMS: u32 = 4;

/// One tensor description from the header, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions with `ne[0]` innermost.
    pub ne: Vec<u64>,
    /// ggml type id.
    pub ggml_type: u32,
    /// Offset of the data, relative to the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The shape outermost first (Hugging Face order): `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A tensor of a kept type, borrowed from the map.
#[derive(Clone, Debug)]
pub struct GgufTensor<'a> {
    /// Tensor name in the GGUF file.
    pub name: &'a str,
    /// Element type (see [`dtype_for_ggml`]).
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Bytes of one row (`ne[0]` elements).
    pub row_bytes: usize,
    /// The stored bytes.
    pub data: &'a [u8],
}

/// An opened GGUF file: the parsed header over a memory map.
///
/// Opening reads and checks the whole header (magic, version, every metadata
/// value, every tensor description, the alignment); tensor data is located
/// and bounds-checked by [`GgufFile::tensor`]. A corrupt file is an
/// [`Error::BadGguf`] naming the problem, never a panic.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: MappedFile,
    version: u32,
    metadata: IndexMap<String, GgufValue>,
    tensors: IndexMap<String, GgufTensorInfo>,
    alignment: u64,
    data_start: u64,
}

impl GgufFile {
    /// Opens, maps and parses a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let map = MappedFile::open(path)?;
        let header = parse(&map)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            alignment: header.alignment,
            data_start: header.data_start,
            map,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata key and value, in file order.
    pub fn metadata(&self) -> &IndexMap<String, GgufValue> {
        &self.metadata
    }

    /// Every tensor description, in file order.
    pub fn tensors(&self) -> &IndexMap<String, GgufTensorInfo> {
        &self.tensors
    }

    /// Alignment of the data section.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// A tensor's bytes with its mllm dtype and shape.
    ///
    /// Fails for a missing name ([`Error::MissingTensor`]), a ggml type the
    /// importer does not keep ([`Error::UnsupportedDType`] naming the type and
    /// the tensor), rows that are not whole blocks, and data that runs past
    /// the end of the file ([`Error::TensorOutOfBounds`]).
    pub fn tensor(&self, name: &str) -> Result<GgufTensor<'_>> {
        let (name, info) = self
            .tensors
            .get_key_value(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        let dtype = dtype_for_ggml(info.ggml_type).ok_or_else(|| {
            Error::UnsupportedDType(format!(
                "tensor '{name}' has GGUF type {}; the importer keeps {KEPT_TYPES} as stored and reads no other type",
                describe_ggml_type(info.ggml_type)
            ))
        })?;
        let row_len = info.ne[0] as usize;
        if !row_len.is_multiple_of(dtype.block_len()) {
            return Err(Error::BadGguf(format!(
                "tensor '{name}': rows of {row_len} {dtype} values are not whole blocks of {}",
                dtype.block_len()
            )));
        }
        let row_bytes = dtype
            .bytes_for(row_len)
            .map_err(|e| Error::BadGguf(format!("tensor '{name}': {e}")))?;
        let rows = info.ne[1..].iter().product::<u64>();
        let len = (row_bytes as u64).checked_mul(rows);
        let start = self.data_start.checked_add(info.offset);
        let file_len = self.map.len() as u64;
        let (start, len) = match (start, len) {
            (Some(s), Some(l)) if s.checked_add(l).is_some_and(|end| end <= file_len) => (s, l),
            _ => {
                return Err(Error::TensorOutOfBounds {
                    name: name.clone(),
                    offset: start.unwrap_or(u64::MAX),
                    len: len.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        };
        Ok(GgufTensor {
            name,
            dtype,
            shape: info.shape(),
            row_bytes,
            data: &self.map[start as usize..(start + len) as usize],
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// An optional non-negative integer (any integer type).
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_int()
                .and_then(|n| u64::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a non-negative integer", v)),
        }
    }

    /// A required non-negative integer.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.opt_u64(key)?.ok_or_else(|| missing(key))
    }

    /// An optional float (f32 widened exactly, or f64).
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a float", v)),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a string", v)),
        }
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?.ok_or_else(|| missing(key))
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a bool", v)),
        }
    }

    /// An optional array of strings.
    pub fn opt_strings(&self, key: &str) -> Result<Option<&[String]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(GgufArray::as_strings)
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an array of string", v)),
        }
    }

    /// An optional array of `f32`.
    pub fn opt_f32s(&self, key: &str) -> Result<Option<&[f32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(GgufArray::as_f32s)
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an array of f32", v)),
        }
    }

    /// An optional array of integers (any integer element type).
    pub fn opt_ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(GgufArray::to_i64s)
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an array of integers", v)),
        }
    }
}

fn missing(key: &str) -> Error {
    Error::BadGguf(format!("metadata key '{key}' is missing"))
}

fn wrong_type(key: &str, expected: &str, found: &GgufValue) -> Error {
    Error::BadGguf(format!(
        "metadata '{key}' must be {expected}, found {}",
        found.type_desc()
    ))
}

/// The parsed header.
struct Header {
    version: u32,
    metadata: IndexMap<String, GgufValue>,
    tensors: IndexMap<String, GgufTensorInfo>,
    alignment: u64,
    data_start: u64,
}

fn parse(bytes: &[u8]) -> Result<Header> {
    if bytes.len() < 4 {
        return Err(Error::BadGguf(format!(
            "file is {} bytes, too short for the magic \"GGUF\"",
            bytes.len()
        )));
    }
    if bytes[..4] != GGUF_MAGIC {
        return Err(Error::BadGguf(format!(
            "bad magic {:?} (expected \"GGUF\")",
            String::from_utf8_lossy(&bytes[..4])
        )));
    }
    let mut c = Cursor::new(bytes, 4);
    let version = c.u32(&|| "version".to_string())?;
    if version != 2 && version != 3 {
        let hint = if matches!(version.swap_bytes(), 2 | 3) {
            " (a big-endian file, which this build does not read)"
        } else if version == 1 {
            " (version 1 is obsolete)"
        } else {
            ""
        };
        return Err(Error::BadGguf(format!(
            "unsupported version {version}{hint}; this build reads versions 2 and 3"
        )));
    }
    let tensor_count = c.u64(&|| "tensor count".to_string())?;
    let kv_count = c.u64(&|| "metadata count".to_string())?;

    // Counts come from the file: no capacity is reserved from them, and each
    // entry consumes bytes, so a bogus count ends in a truncation error.
    let mut metadata = IndexMap::new();
    for i in 0..kv_count {
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        let what = || format!("metadata '{key}'");
        let ty = c.u32(&|| format!("value type of {}", what()))?;
        let value = c.value(ty, &what)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(Error::BadGguf(format!(
                "metadata key '{key}' appears twice"
            )));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if *a > 0 => u64::from(*a),
        Some(GgufValue::U32(_)) => {
            return Err(Error::BadGguf("general.alignment is 0".to_string()))
        }
        Some(other) => {
            return Err(wrong_type("general.alignment", "a u32", other));
        }
    };

    let mut tensors = IndexMap::new();
    for i in 0..tensor_count {
        let info = tensor_info(&mut c, i)?;
        if let Some(old) = tensors.insert(info.name.clone(), info) {
            return Err(Error::BadGguf(format!(
                "tensor '{}' is described twice",
                old.name
            )));
        }
    }

    let end = c.pos() as u64;
    let data_start = end.div_ceil(alignment) * alignment;
    if data_start > bytes.len() as u64 && !tensors.is_empty() {
        return Err(Error::BadGguf(format!(
            "truncated: the data section starts at offset {data_start} but the file ends at {}",
            bytes.len()
        )));
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

fn tensor_info(c: &mut Cursor<'_>, i: u64) -> Result<GgufTensorInfo> {
    let name = c.string(&|| format!("name of tensor {i}"))?;
    let what = |field: &str| format!("{field} of tensor '{name}'");
    let n_dims = c.u32(&|| what("dimension count"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(Error::BadGguf(format!(
            "tensor '{name}' has {n_dims} dimensions (1..={MAX_DIMS} allowed)"
        )));
    }
    let ne = (0..n_dims)
        .map(|d| c.u64(&|| what(&format!("dimension {d}"))))
        .collect::<Result<Vec<u64>>>()?;
    if ne.contains(&0) {
        return Err(Error::BadGguf(format!(
            "tensor '{name}' has a zero dimension: ne = {ne:?}"
        )));
    }
    let numel = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    if numel.is_none_or(|n| usize::try_from(n).is_err()) {
        return Err(Error::BadGguf(format!(
            "tensor '{name}' is too large: ne = {ne:?}"
        )));
    }
    let ggml_type = c.u32(&|| what("type"))?;
    let offset = c.u64(&|| what("data offset"))?;
    Ok(GgufTensorInfo {
        name,
        ne,
        ggml_type,
        offset,
    })
}
