//! Writing a planned `.mllm` file: metadata entries, then the tensors one at
//! a time, with a progress bar.

use std::borrow::Cow;
use std::path::Path;

use mllm_core::file::{Metadata, MllmWriter, TensorSpec};
use mllm_core::{Error, Result};

use crate::convert::progress_bar;

/// The non-tensor content of a file to write.
pub(crate) struct Header<'a> {
    /// Metadata (tensor shapes are filled in from the specs).
    pub meta: Metadata,
    /// The `tokenizer.json` text to embed.
    pub tokenizer_json: Option<&'a str>,
    /// The chat template to embed.
    pub chat_template: Option<&'a str>,
}

/// What [`write_file`] wrote.
pub(crate) struct Written {
    /// Bytes of tensor data (without metadata and padding).
    pub tensor_bytes: u64,
    /// Size of the file.
    pub bytes_written: u64,
}

/// Writes `header` and the tensors of `specs` atomically to `output`;
/// `data(i)` returns the bytes of `specs[i]`.
pub(crate) fn write_file<'d, F>(
    output: &Path,
    header: Header<'_>,
    specs: &[TensorSpec],
    progress: bool,
    mut data: F,
) -> Result<Written>
where
    F: FnMut(usize) -> Result<Cow<'d, [u8]>>,
{
    let mut writer = MllmWriter::new();
    writer.metadata(header.meta);
    if let Some(t) = header.tokenizer_json {
        writer.tokenizer_json(t);
    }
    if let Some(t) = header.chat_template {
        writer.chat_template(t);
    }
    let mut tensor_bytes = 0u64;
    for spec in specs {
        tensor_bytes += spec.byte_len()? as u64;
        writer.add_tensor(spec.clone())?;
    }
    let bar = progress_bar(tensor_bytes, progress);
    let result = writer.write(output, |i, spec| {
        bar.set_message(spec.name.clone());
        let bytes = data(i)?;
        bar.inc(bytes.len() as u64);
        Ok(bytes)
    });
    bar.finish_and_clear();
    result?;
    let bytes_written = std::fs::metadata(output)
        .map_err(|e| Error::io(output, e))?
        .len();
    Ok(Written {
        tensor_bytes,
        bytes_written,
    })
}

/// Prefixes the message of a dtype or input error with the tensor it is about.
pub(crate) fn in_tensor(name: &str, e: Error) -> Error {
    match e {
        Error::UnsupportedDType(msg) => Error::UnsupportedDType(format!("tensor '{name}': {msg}")),
        Error::InvalidInput(msg) => Error::InvalidInput(format!("tensor '{name}': {msg}")),
        other => other,
    }
}
