//! mllm-rs: run large language models from one `.mllm` file.
//!
//! This facade re-exports the workspace crates so applications depend on one
//! package: [`core`] (tensors, the `.mllm` file, graph and executor),
//! [`ops`] (backends and kernels), [`models`] (architectures, tokenizer,
//! generation) and [`convert`] (safetensors to `.mllm`).

pub mod cli;
pub mod machine;

pub use mllm_convert as convert;
pub use mllm_core as core;
pub use mllm_models as models;
pub use mllm_ops as ops;
