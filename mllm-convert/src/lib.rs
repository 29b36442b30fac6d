//! mllm-convert: turns Hugging Face safetensors models into `.mllm` files,
//! quantizes them, and describes `.mllm` files.
//!
//! - [`convert()`] and [`convert_with_policy`]: a model directory,
//!   `.safetensors` file or shard index in, one `.mllm` file out (f32, f16,
//!   bf16 or block-quantized storage per the [`policy`]: rank < 2 tensors
//!   stay F32); or a GGUF file in ([`gguf`]), its tensors kept as stored.
//! - [`quantize_file`]: an existing `.mllm` file requantized under a policy.
//! - [`inspect()`]: a human-readable listing of a `.mllm` file.
//! - [`discover()`] and [`ModelInfo`]: finding and reading a model's files.
//!
//! ```no_run
//! use std::path::Path;
//! use mllm_convert::{convert, ConvertOptions};
//! use mllm_core::DType;
//!
//! let opts = ConvertOptions { dtype: DType::F16, progress: true };
//! let report = convert(Path::new("models/llama"), Path::new("llama.mllm"), &opts)?;
//! println!("{} tensors, {} bytes", report.tensors, report.bytes_written);
//! # Ok::<(), mllm_core::Error>(())
//! ```
//!
//! Quantizing, with the token embedding kept at 8 bits:
//!
//! ```no_run
//! use std::path::Path;
//! use mllm_convert::{quantize_file, DTypePolicy, QuantizeOptions};
//! use mllm_core::DType;
//!
//! let policy = DTypePolicy {
//!     embed_dtype: Some(DType::Q8_0),
//!     ..DTypePolicy::new(DType::Q4K)
//! };
//! let opts = QuantizeOptions { policy, progress: true };
//! let report = quantize_file(Path::new("llama.mllm"), Path::new("llama-q4_k.mllm"), &opts)?;
//! println!("{} tensors, {} fallbacks", report.tensors, report.fallbacks);
//! # Ok::<(), mllm_core::Error>(())
//! ```

mod attach;
mod cast;
mod convert;
pub mod default_model;
mod describe;
mod discover;
mod encode;
pub mod gguf;
mod inspect;
mod inspect_gguf;
mod model_info;
pub mod policy;
mod requantize;
mod source;
mod transpose;
mod write;

pub use attach::{attach, AttachOptions, AttachReport};
pub use cast::cast;
pub use convert::{convert, convert_with_policy, ConvertOptions, ConvertReport, QuantizeOptions};
pub use describe::describe;
pub use discover::{
    discover, ModelFiles, WeightFiles, CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE,
};
pub use inspect::{format_bytes, inspect, inspect_mllm};
pub use inspect_gguf::inspect_gguf;
pub use model_info::{
    ModelInfo, CHAT_TEMPLATE_FILE, GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
pub use policy::{
    check_target_dtype, parse_target_dtype, DTypePolicy, Storage, TensorRole, TARGET_DTYPES,
};
pub use requantize::quantize_file;
pub use source::{natural_cmp, SourceTensor, SourceWeights};
