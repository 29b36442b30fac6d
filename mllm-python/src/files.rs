//! File functions: `convert`, `inspect`, and which file `Model` loads.

use std::path::PathBuf;

use mllm_convert::gguf::is_gguf;
use mllm_convert::{
    convert as convert_file, default_model, describe, parse_target_dtype, ConvertOptions,
};
use mllm_core::{Error, Result};
use pyo3::prelude::*;

use crate::errors::IntoPy;

/// The `.mllm` file to load for `path`: the default model when `None`, a
/// GGUF converted into a temporary directory (kept alive by the returned
/// guard), or the file itself.
pub fn loadable_path(path: Option<PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    let Some(path) = path else {
        return Ok((default_model::ensure_model()?, None));
    };
    if !is_gguf(&path) {
        return Ok((path, None));
    }
    let dir = tempfile::Builder::new()
        .prefix("mllm-rs-gguf-")
        .tempdir()
        .map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let out = dir.path().join("model.mllm");
    convert_file(&path, &out, &ConvertOptions::default())?;
    Ok((out, Some(dir)))
}

/// Converts a Hugging Face model (a directory, a `.safetensors` file or a
/// `model.safetensors.index.json`) or a GGUF file into the `.mllm` file
/// `dst`, matrices stored as `dtype` (one of `mllm-convert`'s targets: f32,
/// f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k,
/// q6_k, iq4_xs; GGUF tensors keep their types). Returns a dict describing
/// what was written.
#[pyfunction]
#[pyo3(signature = (src, dst, dtype="f32", progress=false))]
pub fn convert<'py>(
    py: Python<'py>,
    src: PathBuf,
    dst: PathBuf,
    dtype: &str,
    progress: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let dtype = parse_target_dtype(dtype).py_err()?;
    let report = py
        .detach(|| convert_file(&src, &dst, &ConvertOptions { dtype, progress }))
        .py_err()?;
    let value = serde_json::json!({
        "architecture": report.architecture,
        "output": report.output.display().to_string(),
        "dtype": report.dtype.to_string(),
        "tensors": report.tensors,
        "skipped": report.skipped,
        "fallbacks": report.fallbacks,
        "tensor_bytes": report.tensor_bytes,
        "bytes_written": report.bytes_written,
        "tokenizer": report.tokenizer,
        "chat_template": report.chat_template,
    });
    json_to_py(py, &value)
}

/// Describes a `.mllm` or `.gguf` file: format, size, metadata and every
/// tensor (name, dtype, shape, ...), as a dict.
#[pyfunction]
pub fn inspect<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let value = py.detach(|| describe(&path)).py_err()?;
    json_to_py(py, &value)
}

/// A JSON value as Python objects.
pub fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?
        .call_method1("loads", (value.to_string(),))
}
