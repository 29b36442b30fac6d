//! mllm-convert: turns Hugging Face safetensors models into `.mllm` files, and
//! describes `.mllm` files.
//!
//! - [`convert`]: a model directory, `.safetensors` file or shard index in,
//!   one `.mllm` file out (F32, F16 or BF16 storage; rank < 2 tensors stay F32);
//!   or a GGUF file in ([`gguf`]), its tensors kept as stored.
//! - [`inspect`]: a human-readable listing of a `.mllm` file.
//! - [`discover`] and [`ModelInfo`]: finding and reading a model's files.
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

mod cast;
mod convert;
pub mod default_model;
mod discover;
pub mod gguf;
mod inspect;
mod model_info;
mod source;
mod transpose;

pub use cast::cast;
pub use convert::{
    check_target_dtype, convert, parse_target_dtype, stored_dtype, ConvertOptions, ConvertReport,
};
pub use discover::{
    discover, ModelFiles, WeightFiles, CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE,
};
pub use inspect::{format_bytes, inspect};
pub use model_info::{
    ModelInfo, CHAT_TEMPLATE_FILE, GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
pub use source::{natural_cmp, SourceTensor, SourceWeights};
