//! Converting a Hugging Face safetensors model into one `.mllm` file.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use mllm_core::file::{Metadata, MllmWriter, TensorSpec};
use mllm_core::{DType, Error, Result};
use mllm_models::registry::{self, TensorAction};

use crate::cast::{cast, is_float};
use crate::discover::discover;
use crate::model_info::ModelInfo;
use crate::source::{natural_cmp, SourceTensor, SourceWeights};
use crate::transpose::transpose_bytes;

/// How to convert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Storage type of tensors of rank 2 and more: F32, F16 or BF16.
    /// Tensors of rank 0 and 1 (norm weights, biases) always stay F32.
    pub dtype: DType,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for ConvertOptions {
    /// F32, no progress bar.
    fn default() -> Self {
        ConvertOptions {
            dtype: DType::F32,
            progress: false,
        }
    }
}

/// What [`convert`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertReport {
    /// Architecture name from `config.json` (e.g. `LlamaForCausalLM`).
    pub architecture: String,
    /// The file written.
    pub output: PathBuf,
    /// Storage type of tensors of rank 2 and more (for GGUF input, which
    /// keeps each tensor's type: the most common one).
    pub dtype: DType,
    /// Tensors written.
    pub tensors: usize,
    /// Source tensors left out by the architecture's name mapping.
    pub skipped: usize,
    /// Bytes of tensor data written (without metadata and padding).
    pub tensor_bytes: u64,
    /// Size of the written file.
    pub bytes_written: u64,
    /// Whether a `tokenizer.json` was embedded.
    pub tokenizer: bool,
    /// Whether a chat template was embedded.
    pub chat_template: bool,
}

/// Checks that `dtype` is a conversion target this build supports.
pub fn check_target_dtype(dtype: DType) -> Result<()> {
    if is_float(dtype) {
        return Ok(());
    }
    let why = if dtype.block_len() > 1 {
        "needs quantization support"
    } else {
        "is not a float type"
    };
    Err(Error::UnsupportedDType(format!(
        "{dtype} {why}; use f32, f16 or bf16"
    )))
}

/// Parses a target dtype name as given on the command line (`f32`, `f16`, `bf16`).
pub fn parse_target_dtype(name: &str) -> Result<DType> {
    let dtype: DType = name.parse().map_err(|_| {
        Error::InvalidInput(format!("unknown dtype '{name}'; use f32, f16 or bf16"))
    })?;
    check_target_dtype(dtype)?;
    Ok(dtype)
}

/// The dtype a tensor of `shape` is stored in for a `target` conversion.
pub fn stored_dtype(shape: &[usize], target: DType) -> DType {
    if shape.len() >= 2 {
        target
    } else {
        DType::F32
    }
}

/// A byte-count progress bar on stderr (hidden when not `enabled`).
pub(crate) fn progress_bar(total_bytes: u64, enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total_bytes);
    let style = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}) {wide_msg}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// Converts the model at `input` (a model directory, a `.safetensors` file or
/// a `model.safetensors.index.json`) into the `.mllm` file `output`. A GGUF
/// file (named `*.gguf` or starting with the GGUF magic) goes to
/// [`import_gguf`](crate::gguf::import_gguf) instead.
///
/// Tensor names go through the architecture's
/// [`map_tensor`](mllm_models::registry::Architecture::map_tensor), which may
/// also ask for a 2-D tensor to be transposed; tensors are
/// written sorted by name (numbers by value), so equal inputs give
/// byte-identical files. Tensors are read from memory maps and converted one
/// at a time. The file is written atomically (temporary file, then rename).
pub fn convert(input: &Path, output: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    if crate::gguf::is_gguf(input) {
        return crate::gguf::import_gguf(input, output, opts);
    }
    check_target_dtype(opts.dtype)?;
    let files = discover(input)?;
    let info = ModelInfo::read(&files)?;
    let arch = registry::find(&info.architecture)?;
    let weights = SourceWeights::open(&files.weights)?;

    // (spec, source dtype, source tensor, transpose).
    let mut plan: Vec<(TensorSpec, DType, SourceTensor<'_>, bool)> = Vec::new();
    let mut skipped = 0;
    for tensor in weights.tensors()? {
        let (name, transpose) = match (arch.map_tensor)(&tensor.name) {
            TensorAction::Skip => {
                skipped += 1;
                continue;
            }
            TensorAction::Keep(name) => (name, false),
            TensorAction::Transpose(name) => (name, true),
        };
        let shape = match (transpose, tensor.shape.as_slice()) {
            (false, s) => s.to_vec(),
            (true, &[rows, cols]) => vec![cols, rows],
            (true, s) => {
                return Err(Error::InvalidInput(format!(
                    "tensor '{}' of shape {s:?} cannot be transposed: it is not 2-D",
                    tensor.name
                )))
            }
        };
        let from = tensor.mllm_dtype()?;
        let to = stored_dtype(&shape, opts.dtype);
        plan.push((TensorSpec::new(name, to, shape), from, tensor, transpose));
    }
    if plan.is_empty() {
        return Err(Error::InvalidInput(format!(
            "{} holds no tensors to convert",
            input.display()
        )));
    }
    plan.sort_by(|a, b| natural_cmp(&a.0.name, &b.0.name));

    let mut meta = Metadata::new(info.architecture.clone(), info.config.clone());
    meta.generation_config = info.generation_config.clone();
    let mut writer = MllmWriter::new();
    writer.metadata(meta);
    if let Some(t) = &info.tokenizer_json {
        writer.tokenizer_json(t.as_str());
    }
    if let Some(t) = &info.chat_template {
        writer.chat_template(t.as_str());
    }
    let mut tensor_bytes = 0u64;
    for (spec, _, _, _) in &plan {
        tensor_bytes += spec.byte_len()? as u64;
        writer.add_tensor(spec.clone())?;
    }

    let bar = progress_bar(tensor_bytes, opts.progress);
    let result = writer.write(output, |i, spec| {
        let (_, from, tensor, transpose) = &plan[i];
        bar.set_message(spec.name.clone());
        let named = |e| match e {
            Error::UnsupportedDType(msg) => {
                Error::UnsupportedDType(format!("tensor '{}': {msg}", tensor.name))
            }
            other => other,
        };
        let bytes = if *transpose {
            let (rows, cols) = (tensor.shape[0], tensor.shape[1]);
            let t = transpose_bytes(tensor.data, rows, cols, from.block_bytes())?;
            let cast_t = match cast(&t, *from, spec.dtype).map_err(named)? {
                Cow::Borrowed(_) => None,
                Cow::Owned(v) => Some(v),
            };
            Cow::Owned(cast_t.unwrap_or(t))
        } else {
            cast(tensor.data, *from, spec.dtype).map_err(named)?
        };
        bar.inc(bytes.len() as u64);
        Ok(bytes)
    });
    bar.finish_and_clear();
    result?;

    let bytes_written = std::fs::metadata(output)
        .map_err(|e| Error::io(output, e))?
        .len();
    Ok(ConvertReport {
        architecture: info.architecture,
        output: output.to_path_buf(),
        dtype: opts.dtype,
        tensors: plan.len(),
        skipped,
        tensor_bytes,
        bytes_written,
        tokenizer: info.tokenizer_json.is_some(),
        chat_template: info.chat_template.is_some(),
    })
}
