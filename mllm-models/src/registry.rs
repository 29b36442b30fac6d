//! The architecture registry: Hugging Face architecture names to model builders.
//!
//! Adding an architecture is one module in this crate plus one entry in
//! [`ARCHITECTURES`].

use mllm_core::{Error, Result};
use serde_json::Value;

use crate::{gemma, glm, gpt2, llama, opt, phi3, qwen3, CausalLm};

/// What the converter should do with a source tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorAction {
    /// Store it under this name.
    Keep(String),
    /// Store the 2-D tensor transposed (`[rows, cols]` becomes `[cols, rows]`)
    /// under this name, e.g. weights kept `[in, out]` by the checkpoint.
    Transpose(String),
    /// Leave it out (buffers the model recomputes, duplicated tied weights).
    Skip,
}

/// One supported architecture.
pub struct Architecture {
    /// Short family name (`llama`).
    pub family: &'static str,
    /// The `architectures` names in Hugging Face `config.json` it serves.
    pub hf_names: &'static [&'static str],
    /// Builds the module tree from `config.json`.
    pub build: fn(&Value) -> Result<Box<dyn CausalLm>>,
    /// Maps a Hugging Face tensor name to its name in the `.mllm` file.
    pub map_tensor: fn(&str) -> TensorAction,
}

/// Keeps weights under their Hugging Face names, dropping precomputed rotary
/// buffers that some checkpoints carry.
fn hf_names_without_rotary_buffers(name: &str) -> TensorAction {
    if name.ends_with("rotary_emb.inv_freq") {
        TensorAction::Skip
    } else {
        TensorAction::Keep(name.to_string())
    }
}

/// Every architecture this build supports.
pub static ARCHITECTURES: &[Architecture] = &[
    Architecture {
        family: "llama",
        hf_names: &["LlamaForCausalLM"],
        build: llama::build_llama,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "mistral",
        hf_names: &["MistralForCausalLM"],
        build: llama::build_mistral,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "qwen2",
        hf_names: &["Qwen2ForCausalLM"],
        build: llama::build_qwen2,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "qwen3",
        hf_names: &["Qwen3ForCausalLM"],
        build: qwen3::build_qwen3,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "phi3",
        hf_names: &["Phi3ForCausalLM"],
        build: phi3::build_phi3,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "gemma",
        hf_names: &["GemmaForCausalLM"],
        build: gemma::build_gemma,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "glm",
        hf_names: &["GlmForCausalLM"],
        build: glm::build_glm,
        map_tensor: hf_names_without_rotary_buffers,
    },
    Architecture {
        family: "gpt2",
        hf_names: &["GPT2LMHeadModel"],
        build: gpt2::build_gpt2,
        map_tensor: gpt2::map_gpt2_tensor,
    },
    Architecture {
        family: "opt",
        hf_names: &["OPTForCausalLM"],
        build: opt::build_opt,
        map_tensor: opt::map_opt_tensor,
    },
];

/// The architecture serving a Hugging Face architecture name.
pub fn find(hf_name: &str) -> Result<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .find(|a| a.hf_names.contains(&hf_name))
        .ok_or_else(|| Error::UnsupportedArchitecture(hf_name.to_string()))
}
