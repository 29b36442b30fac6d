//! A model file described as data (JSON): what `inspect` prints, for
//! programs. Reads `.mllm` and GGUF files.

use std::path::Path;

use mllm_core::file::{is_metadata_entry, MllmFile};
use mllm_core::Result;
use serde_json::{json, Map, Value};

use crate::gguf::{ggml_type_name, is_gguf, GgufArray, GgufFile, GgufValue};

/// Arrays longer than this (token lists) are described by type and length
/// only.
const ARRAY_SHOWN: usize = 16;

/// Describes the `.mllm` or GGUF file at `path`: `format`, `size`, the
/// metadata (`architecture`, `config`, … for `.mllm`; every key for GGUF)
/// and `tensors` (`name`, `dtype`, `shape`, `bytes` or `offset`).
pub fn describe(path: &Path) -> Result<Value> {
    if is_gguf(path) {
        describe_gguf(path)
    } else {
        describe_mllm(path)
    }
}

fn describe_mllm(path: &Path) -> Result<Value> {
    let file = MllmFile::open(path)?;
    let meta = file.metadata();
    let tensors: Vec<Value> = file
        .entries()
        .iter()
        .filter(|(name, _)| !is_metadata_entry(name))
        .map(|(name, e)| {
            json!({
                "name": name,
                "dtype": e.dtype.to_string(),
                "shape": file.recorded_shape(name),
                "bytes": e.len,
                "offset": e.offset,
            })
        })
        .collect();
    Ok(json!({
        "path": path.display().to_string(),
        "format": if meta.is_some() { "mllm" } else { "mllm v1" },
        "size": file.file_len(),
        "architecture": meta.map(|m| m.architecture.clone()),
        "config": meta.map(|m| m.config.clone()),
        "generation_config": meta.and_then(|m| m.generation_config.clone()),
        "tokenizer": file.tokenizer_json()?.is_some(),
        "chat_template": file.chat_template()?.is_some(),
        "tensors": tensors,
    }))
}

fn describe_gguf(path: &Path) -> Result<Value> {
    let file = GgufFile::open(path)?;
    let metadata: Map<String, Value> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), gguf_value(v)))
        .collect();
    let tensors: Vec<Value> = file
        .tensors()
        .values()
        .map(|t| {
            json!({
                "name": t.name,
                "dtype": ggml_type_name(t.ggml_type).map_or_else(|| format!("ggml type {}", t.ggml_type), str::to_string),
                "shape": t.ne.iter().rev().collect::<Vec<_>>(),
                "offset": t.offset,
            })
        })
        .collect();
    let size = std::fs::metadata(path)
        .map_err(|e| mllm_core::Error::io(path, e))?
        .len();
    Ok(json!({
        "path": path.display().to_string(),
        "format": format!("gguf v{}", file.version()),
        "size": size,
        "metadata": metadata,
        "tensors": tensors,
    }))
}

/// A GGUF metadata value as JSON (arrays over [`ARRAY_SHOWN`] elements by
/// type and length only).
pub(crate) fn gguf_value(v: &GgufValue) -> Value {
    if let Some(i) = v.as_int() {
        return i64::try_from(i).map_or_else(|_| json!(i.to_string()), Value::from);
    }
    match v {
        GgufValue::F32(x) => json!(x),
        GgufValue::F64(x) => json!(x),
        GgufValue::Bool(b) => json!(b),
        GgufValue::String(s) => json!(s),
        GgufValue::Array(a) => gguf_array(a),
        _ => Value::Null,
    }
}

fn gguf_array(a: &GgufArray) -> Value {
    if a.len() > ARRAY_SHOWN {
        return json!({ "type": a.type_desc(), "len": a.len() });
    }
    match a {
        GgufArray::U8(v) => json!(v),
        GgufArray::I8(v) => json!(v),
        GgufArray::U16(v) => json!(v),
        GgufArray::I16(v) => json!(v),
        GgufArray::U32(v) => json!(v),
        GgufArray::I32(v) => json!(v),
        GgufArray::F32(v) => json!(v),
        GgufArray::Bool(v) => json!(v),
        GgufArray::String(v) => json!(v),
        GgufArray::Array(v) => Value::Array(v.iter().map(gguf_array).collect()),
        GgufArray::U64(v) => json!(v),
        GgufArray::I64(v) => json!(v),
        GgufArray::F64(v) => json!(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_arrays_are_summarized_and_short_ones_kept() {
        let long = GgufArray::String((0..40).map(|i| i.to_string()).collect());
        assert_eq!(
            gguf_array(&long),
            json!({"type": "array of string", "len": 40})
        );
        assert_eq!(gguf_array(&GgufArray::I32(vec![1, -2])), json!([1, -2]));
        assert_eq!(
            gguf_value(&GgufValue::U64(u64::MAX)),
            json!(u64::MAX.to_string())
        );
        assert_eq!(gguf_value(&GgufValue::U32(7)), json!(7));
    }
}
