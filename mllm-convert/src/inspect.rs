//! A human-readable listing of a `.mllm` file (GGUF files: `inspect_gguf.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use mllm_core::file::{is_metadata_entry, MllmFile};
use mllm_core::{DType, Result};
use mllm_models::registry;
use serde_json::Value;

/// Config fields shown in the summary, with their labels.
const CONFIG_SUMMARY: &[(&str, &str)] = &[
    ("model_type", "type"),
    ("hidden_size", "hidden"),
    ("num_hidden_layers", "layers"),
    ("num_attention_heads", "heads"),
    ("num_key_value_heads", "kv heads"),
    ("head_dim", "head dim"),
    ("intermediate_size", "ffn"),
    ("vocab_size", "vocab"),
    ("max_position_embeddings", "context"),
    ("rope_theta", "rope theta"),
    ("sliding_window", "sliding window"),
    ("tie_word_embeddings", "tied embeddings"),
];

/// Formats a byte count as `N bytes` with a binary-unit approximation.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {} ({n} bytes)", UNITS[unit])
}

fn config_summary(config: &Value) -> String {
    let parts: Vec<String> = CONFIG_SUMMARY
        .iter()
        .filter_map(|(key, label)| {
            let v = config.get(*key).filter(|v| !v.is_null())?;
            let shown = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some(format!("{label} {shown}"))
        })
        .collect();
    if parts.is_empty() {
        "(none of the usual fields)".to_string()
    } else {
        parts.join(", ")
    }
}

pub(crate) fn format_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// Writes `rows` under `header` in aligned columns (the first three left
/// aligned, the last two right aligned), after a blank line.
pub(crate) fn write_table(out: &mut String, header: [&str; 5], rows: &[[String; 5]]) {
    let header = header.map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    out.push('\n');
    for row in std::iter::once(&header).chain(rows) {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4],
        );
    }
}

/// Describes a `.mllm` file ([`inspect_mllm`]) or a GGUF file
/// ([`inspect_gguf`](crate::inspect_gguf::inspect_gguf)) as text.
pub fn inspect(path: &Path) -> Result<String> {
    if crate::gguf::is_gguf(path) {
        crate::inspect_gguf::inspect_gguf(path)
    } else {
        inspect_mllm(path)
    }
}

/// Opens a `.mllm` file and describes it: size, format version, architecture,
/// a config summary, embedded tokenizer / chat template / generation config,
/// a table of every entry (name, dtype, shape, bytes, offset) and totals.
///
/// Shapes come from the metadata; plain mllm v1 files without it show `?`,
/// and the metadata entries themselves show `-`.
pub fn inspect_mllm(path: &Path) -> Result<String> {
    let file = MllmFile::open(path)?;
    let mut out = String::new();
    let meta = file.metadata();
    // Writing into a String cannot fail.
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<15} {value}");
    };
    line("file:", path.display().to_string());
    line("size:", format_bytes(file.file_len()));
    match meta {
        Some(m) => {
            line("format:", format!("mllm-rs metadata v{}", m.format_version));
            let family = match registry::find(&m.architecture) {
                Ok(a) => format!("family {}", a.family),
                Err(_) => "not supported by this build".to_string(),
            };
            line("architecture:", format!("{} ({family})", m.architecture));
            line("config:", config_summary(&m.config));
        }
        None => line("format:", "plain mllm v1 (no metadata)".to_string()),
    }
    line(
        "tokenizer:",
        match file.tokenizer_json()? {
            Some(t) => format!("embedded ({})", format_bytes(t.len() as u64)),
            None => "none".to_string(),
        },
    );
    line(
        "chat template:",
        match file.chat_template()? {
            Some(t) => format!("embedded ({})", format_bytes(t.len() as u64)),
            None => "none".to_string(),
        },
    );
    if meta.is_some() {
        line(
            "generation:",
            match meta.and_then(|m| m.generation_config.as_ref()) {
                Some(g) => g.to_string(),
                None => "none".to_string(),
            },
        );
    }

    let rows: Vec<[String; 5]> = file
        .entries()
        .iter()
        .map(|(name, e)| {
            let shape = if is_metadata_entry(name) {
                "-".to_string()
            } else {
                file.recorded_shape(name)
                    .map(format_shape)
                    .unwrap_or_else(|| "?".to_string())
            };
            [
                name.clone(),
                e.dtype.to_string(),
                shape,
                e.len.to_string(),
                e.offset.to_string(),
            ]
        })
        .collect();
    write_table(
        &mut out,
        ["name", "dtype", "shape", "bytes", "offset"],
        &rows,
    );

    let mut count = 0usize;
    let mut bytes = 0u64;
    let mut per_dtype: BTreeMap<i32, (DType, usize)> = BTreeMap::new();
    for (name, e) in file.entries() {
        if is_metadata_entry(name) {
            continue;
        }
        count += 1;
        bytes += e.len;
        per_dtype.entry(e.dtype.code()).or_insert((e.dtype, 0)).1 += 1;
    }
    let dtypes: Vec<String> = per_dtype
        .values()
        .map(|(d, n)| format!("{d}: {n}"))
        .collect();
    let dtypes = if dtypes.is_empty() {
        "no tensors".to_string()
    } else {
        dtypes.join(", ")
    };
    let _ = writeln!(
        out,
        "\ntotal: {count} tensors, {}; {dtypes}",
        format_bytes(bytes)
    );
    Ok(out)
}
