//! Requantizing an existing `.mllm` file under a new storage policy.

use std::path::Path;

use mllm_core::file::{is_metadata_entry, MllmFile, TensorSpec, FORMAT_VERSION, META_ENTRY};
use mllm_core::{Error, Result};

use crate::convert::{ConvertReport, QuantizeOptions};
use crate::encode::encode_stored;
use crate::source::natural_cmp;
use crate::write::{in_tensor, write_file, Header};

/// Rewrites the `.mllm` file `input` as `output` with every tensor stored as
/// `opts.policy` says (see [`crate::policy`]).
///
/// The metadata (architecture, config, generation config), tokenizer and
/// chat template are carried over unchanged. Each tensor (f32, f16, bf16
/// or a block-quantized type the CPU reads) whose storage type changes is decoded to
/// f32 and re-encoded; one already in its storage type is copied as is.
/// Tensors are written sorted by name like [`convert`](crate::convert()), so
/// requantizing an f32 file gives the file a direct conversion with the
/// same policy gives. The output is written atomically, so it may replace
/// the input.
///
/// A plain mllm v1 file (without metadata) is an error: the policy needs
/// each tensor's shape, which only the metadata records. The report's
/// `skipped` is always 0.
pub fn quantize_file(input: &Path, output: &Path, opts: &QuantizeOptions) -> Result<ConvertReport> {
    opts.policy.check()?;
    let file = MllmFile::open(input)?;
    let meta = file.metadata().ok_or_else(|| {
        Error::InvalidInput(format!(
            "{} is a plain mllm v1 file without metadata: requantizing needs the tensor shapes \
             that only files written by mllm-rs record",
            input.display()
        ))
    })?;

    if let Some(name) = file
        .entries()
        .keys()
        .find(|n| !is_metadata_entry(n) && !meta.tensors.contains_key(*n))
    {
        return Err(Error::BadMetadata {
            entry: META_ENTRY.to_string(),
            detail: format!("no shape recorded for tensor '{name}'"),
        });
    }
    let mut sources = Vec::with_capacity(meta.tensors.len());
    let mut specs = Vec::with_capacity(meta.tensors.len());
    let mut storages = Vec::with_capacity(meta.tensors.len());
    let mut fallbacks = 0;
    let mut names: Vec<&String> = meta.tensors.keys().collect();
    names.sort_by(|a, b| natural_cmp(a, b));
    for name in names {
        let tensor = file.tensor(name)?;
        let storage = opts.policy.storage(name, tensor.shape().dims());
        fallbacks += usize::from(storage.fallback);
        specs.push(TensorSpec::new(
            name.as_str(),
            storage.dtype,
            tensor.shape().dims(),
        ));
        sources.push(tensor);
        storages.push(storage);
    }

    let mut new_meta = meta.clone();
    new_meta.format_version = FORMAT_VERSION;
    new_meta.tensors.clear();
    let header = Header {
        meta: new_meta,
        tokenizer_json: file.tokenizer_json()?,
        chat_template: file.chat_template()?,
    };
    let written = write_file(output, header, &specs, opts.progress, |i| {
        let (spec, src) = (&specs[i], &sources[i]);
        encode_stored(src.bytes(), src.dtype(), &storages[i], &spec.shape)
            .map_err(|e| in_tensor(&spec.name, e))
    })?;

    Ok(ConvertReport {
        architecture: meta.architecture.clone(),
        output: output.to_path_buf(),
        dtype: opts.policy.dtype,
        tensors: specs.len(),
        skipped: 0,
        fallbacks,
        tensor_bytes: written.tensor_bytes,
        bytes_written: written.bytes_written,
        tokenizer: file.tokenizer_json()?.is_some(),
        chat_template: file.chat_template()?.is_some(),
    })
}
