//! Converting a Hugging Face safetensors model into one `.mllm` file.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use mllm_core::file::{Metadata, TensorSpec};
use mllm_core::{DType, Error, Result};
use mllm_models::registry::{self, TensorAction};

use crate::discover::discover;
use crate::encode::encode_stored;
use crate::model_info::ModelInfo;
use crate::policy::{DTypePolicy, Storage};
use crate::source::{natural_cmp, SourceTensor, SourceWeights};
use crate::transpose::transpose_bytes;
use crate::write::{in_tensor, write_file, Header};

/// How to convert, with one storage type for every matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Storage type of tensors of rank 2 and more: one of the
    /// [`TARGET_DTYPES`](crate::TARGET_DTYPES) (f32, f16, bf16, q8_0, q4_0,
    /// q4_1, q5_0, q5_1, q4_k, q5_k, q6_k), subject to the [fallback rule](crate::policy).
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

/// How to store tensors when converting ([`convert_with_policy`]) or
/// requantizing ([`quantize_file`](crate::quantize_file)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// The storage type of each tensor role.
    pub policy: DTypePolicy,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for QuantizeOptions {
    /// Everything F32, no progress bar.
    fn default() -> Self {
        QuantizeOptions {
            policy: DTypePolicy::new(DType::F32),
            progress: false,
        }
    }
}

/// What a conversion ([`convert`], [`convert_with_policy`]) or a
/// requantization ([`quantize_file`](crate::quantize_file)) wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertReport {
    /// Architecture name from `config.json` (e.g. `LlamaForCausalLM`).
    pub architecture: String,
    /// The file written.
    pub output: PathBuf,
    /// Storage type asked for tensors of rank 2 and more (for GGUF input,
    /// which keeps each tensor's type: the most common one).
    pub dtype: DType,
    /// Tensors written.
    pub tensors: usize,
    /// Source tensors left out by the architecture's name mapping.
    pub skipped: usize,
    /// Tensors whose rows are not whole blocks of the type asked for, stored
    /// in the [fallback](crate::policy) type instead.
    pub fallbacks: usize,
    /// Bytes of tensor data written (without metadata and padding).
    pub tensor_bytes: u64,
    /// Size of the written file.
    pub bytes_written: u64,
    /// Whether a `tokenizer.json` was embedded.
    pub tokenizer: bool,
    /// Whether a chat template was embedded.
    pub chat_template: bool,
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
/// a `model.safetensors.index.json`) into the `.mllm` file `output`, every
/// matrix in `opts.dtype`: [`convert_with_policy`] with
/// [`DTypePolicy::new`]. A GGUF file (named `*.gguf` or starting with the
/// GGUF magic) goes to [`import_gguf`](crate::gguf::import_gguf) instead.
pub fn convert(input: &Path, output: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    let opts = QuantizeOptions {
        policy: DTypePolicy::new(opts.dtype),
        progress: opts.progress,
    };
    convert_with_policy(input, output, &opts)
}

/// Converts the model at `input` into the `.mllm` file `output`, storing
/// each tensor as `opts.policy` says (see [`crate::policy`]).
///
/// Tensor names go through the architecture's
/// [`map_tensor`](mllm_models::registry::Architecture::map_tensor), which may
/// also ask for a 2-D tensor to be transposed; tensors are
/// written sorted by name (numbers by value), so equal inputs give
/// byte-identical files. Tensors are read from memory maps (f32, f16 or
/// bf16), widened to f32 when quantized, and converted one at a time. The
/// file is written atomically (temporary file, then rename).
///
/// GGUF input keeps its tensors as stored: only the default policy (F32, no
/// embedding or head type) is accepted for it.
pub fn convert_with_policy(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
) -> Result<ConvertReport> {
    let policy = &opts.policy;
    if crate::gguf::is_gguf(input) {
        if policy.packed {
            return Err(Error::InvalidInput(
                "--packed does not apply to GGUF input: import the file, then write a packed \
                 copy with `quantize --packed`"
                    .into(),
            ));
        }
        if policy.embed_dtype.is_some() || policy.head_dtype.is_some() {
            return Err(Error::InvalidInput(
                "embedding and head dtypes do not apply to GGUF input: GGUF tensors are kept \
                 as stored (requantize the imported file with `quantize`)"
                    .into(),
            ));
        }
        let gguf_opts = ConvertOptions {
            dtype: policy.dtype,
            progress: opts.progress,
        };
        return crate::gguf::import_gguf(input, output, &gguf_opts);
    }
    policy.check()?;
    let files = discover(input)?;
    let info = ModelInfo::read(&files)?;
    let arch = registry::find(&info.architecture)?;
    let weights = SourceWeights::open(&files.weights)?;

    // (spec, source dtype, source tensor, transpose).
    let mut plan: Vec<(TensorSpec, DType, SourceTensor<'_>, bool, Storage)> = Vec::new();
    let mut skipped = 0;
    let mut fallbacks = 0;
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
        let storage = policy.storage(&name, &shape);
        fallbacks += usize::from(storage.fallback);
        plan.push((
            TensorSpec::new(name, storage.dtype, shape),
            from,
            tensor,
            transpose,
            storage,
        ));
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
    let header = Header {
        meta,
        tokenizer_json: info.tokenizer_json.as_deref(),
        chat_template: info.chat_template.as_deref(),
    };
    let specs: Vec<TensorSpec> = plan.iter().map(|p| p.0.clone()).collect();
    let written = write_file(output, header, &specs, opts.progress, |i| {
        let (spec, from, tensor, transpose, storage) = &plan[i];
        let named = |e| in_tensor(&tensor.name, e);
        if *transpose {
            let (rows, cols) = (tensor.shape[0], tensor.shape[1]);
            let t = transpose_bytes(tensor.data, rows, cols, from.block_bytes())?;
            let encoded = match encode_stored(&t, *from, storage, &spec.shape).map_err(named)? {
                Cow::Borrowed(_) => None,
                Cow::Owned(v) => Some(v),
            };
            Ok(Cow::Owned(encoded.unwrap_or(t)))
        } else {
            encode_stored(tensor.data, *from, storage, &spec.shape).map_err(named)
        }
    })?;

    Ok(ConvertReport {
        architecture: info.architecture,
        output: output.to_path_buf(),
        dtype: policy.dtype,
        tensors: plan.len(),
        skipped,
        fallbacks,
        tensor_bytes: written.tensor_bytes,
        bytes_written: written.bytes_written,
        tokenizer: info.tokenizer_json.is_some(),
        chat_template: info.chat_template.is_some(),
    })
}
