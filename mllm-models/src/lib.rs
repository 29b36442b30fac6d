//! mllm-models: architectures as trees of Modules, the architecture registry,
//! model loading, tokenization and generation.

pub mod beam;
pub mod chat;
pub mod config;
pub mod conversation;
pub mod decoder;
pub mod decoder_config;
mod file_meta;
pub mod gemma;
pub mod generation;
pub mod glm;
pub mod gpt2;
pub mod llama;
pub mod model;
pub mod opt;
pub mod phi3;
pub mod prefill;
pub mod qwen3;
pub mod registry;
pub mod sampling;
pub mod text;
pub mod tokenizer;
mod tokenizer_json;

pub use beam::{
    beam_search, beam_search_batch, BeamOptions, BeamResult, EarlyStopping, Hypothesis,
};
pub use file_meta::ModelFiles;
pub use generation::{generate, generate_batch, GenerateOptions, Generation, StopReason};
pub use model::{LoadOptions, Model};
pub use prefill::{prefill, prefill_batch, prefill_steps, PREFILL_STEP_TOKENS};
pub use sampling::{Sampler, SamplingParams};
pub use tokenizer::Tokenizer;

use mllm_core::Module;

/// A causal language model: a Module from token ids to logits.
pub trait CausalLm: Module + Send {
    /// Rows of the output logits.
    fn vocab_size(&self) -> usize;
    /// Longest sequence the model supports (prompt plus generated tokens).
    fn max_context(&self) -> usize;
}
