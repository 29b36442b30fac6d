//! A human-readable listing of a GGUF file: what `mllm-convert inspect`
//! prints for one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use mllm_core::Result;

use crate::describe::gguf_value;
use crate::gguf::{arch, describe_ggml_type, ggml_type_name, GgufFile, GgufValue};
use crate::inspect::{format_bytes, format_shape, write_table};

/// Arrays longer than this (token lists, scores) are shown by type and
/// length only.
const ARRAY_SHOWN: usize = 8;

/// Strings longer than this (chat templates) are shown by length only.
const STRING_SHOWN: usize = 120;

/// Opens a GGUF file and describes it: size, version, architecture and
/// whether this build imports it, every metadata entry, a table of the
/// tensors (name, GGUF type, shape in Hugging Face order, bytes, offset in
/// the data section) and the count of tensors per type. Tensors of a type
/// the importer does not read show `?` bytes.
pub fn inspect_gguf(path: &Path) -> Result<String> {
    let file = GgufFile::open(path)?;
    let size = std::fs::metadata(path)
        .map_err(|e| mllm_core::Error::io(path, e))?
        .len();
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<15} {value}");
    };
    line("file:", path.display().to_string());
    line("size:", format_bytes(size));
    line("format:", format!("GGUF v{}", file.version()));
    let architecture = match file.opt_str("general.architecture")? {
        Some(name) => match arch::find(name) {
            Ok(a) => format!("{name} (imports as {})", a.hf_architecture),
            Err(_) => format!("{name} (not imported by this build)"),
        },
        None => "none (general.architecture is missing)".to_string(),
    };
    line("architecture:", architecture);
    line("metadata:", format!("{} entries", file.metadata().len()));
    for (key, value) in file.metadata() {
        let _ = writeln!(out, "  {key} = {}", show(value));
    }

    let mut per_type: BTreeMap<u32, usize> = BTreeMap::new();
    let mut bytes = 0u64;
    let rows: Vec<[String; 5]> = file
        .tensors()
        .values()
        .map(|info| {
            *per_type.entry(info.ggml_type).or_default() += 1;
            let len = file.tensor(&info.name).ok().map(|t| t.data.len() as u64);
            bytes += len.unwrap_or(0);
            [
                info.name.clone(),
                ggml_type_name(info.ggml_type)
                    .map_or_else(|| describe_ggml_type(info.ggml_type), str::to_string),
                format_shape(&info.shape()),
                len.map_or_else(|| "?".to_string(), |l| l.to_string()),
                info.offset.to_string(),
            ]
        })
        .collect();
    write_table(
        &mut out,
        ["name", "type", "shape", "bytes", "offset"],
        &rows,
    );
    let types: Vec<String> = per_type
        .iter()
        .map(|(&t, n)| format!("{}: {n}", describe_ggml_type(t)))
        .collect();
    let _ = writeln!(
        out,
        "\ntotal: {} tensors, {} in readable types; {}",
        rows.len(),
        format_bytes(bytes),
        if types.is_empty() {
            "no tensors".to_string()
        } else {
            types.join(", ")
        }
    );
    Ok(out)
}

/// A metadata value on one line: numbers, bools and short strings as
/// they are, long strings and arrays summarized.
fn show(value: &GgufValue) -> String {
    if let Some(i) = value.as_int() {
        return i.to_string();
    }
    match value {
        GgufValue::F32(x) => x.to_string(),
        GgufValue::F64(x) => x.to_string(),
        GgufValue::Bool(b) => b.to_string(),
        GgufValue::String(s) if s.chars().count() <= STRING_SHOWN => format!("{s:?}"),
        GgufValue::String(s) => format!("<string of {} bytes>", s.len()),
        GgufValue::Array(a) if a.len() <= ARRAY_SHOWN => gguf_value(value).to_string(),
        GgufValue::Array(a) => format!("<{} of {} elements>", a.type_desc(), a.len()),
        other => format!("<{}>", other.type_desc()),
    }
}
