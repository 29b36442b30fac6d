//! The Llama family: Llama 2/3/3.x (incl. llama3 rope scaling), SmolLM,
//! Mistral (sliding window) and Qwen2 (q/k/v biases), tied or untied head.
//! All are the plain [`Decoder`].

use mllm_core::{Error, Result};
use serde_json::Value as Json;

use crate::config::HfConfig;
use crate::decoder::Decoder;
use crate::decoder_config::{DecoderConfig, HfDefaults};
use crate::CausalLm;

/// Which member of the family a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaFlavor {
    Llama,
    Mistral,
    Qwen2,
}

/// Reads a Hugging Face config of the given flavour.
pub fn llama_config(json: &Json, flavor: LlamaFlavor) -> Result<DecoderConfig> {
    let mut cfg = DecoderConfig::from_hf(json, &HfDefaults::default())?;
    let c = HfConfig::new(json)?;
    match flavor {
        LlamaFlavor::Llama => {}
        LlamaFlavor::Mistral => cfg.sliding_window = c.opt_usize("sliding_window")?,
        LlamaFlavor::Qwen2 => {
            if c.opt_bool("use_sliding_window")?.unwrap_or(false) {
                return Err(Error::Config(
                    "Qwen2 with use_sliding_window is not supported".into(),
                ));
            }
            // Qwen2 always has q/k/v biases and never an output bias.
            cfg.qkv_bias = true;
            cfg.o_bias = false;
        }
    }
    Ok(cfg)
}

/// Builds a Llama from `config.json`.
pub fn build_llama(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(llama_config(
        json,
        LlamaFlavor::Llama,
    )?)))
}

/// Builds a Mistral (Llama with a sliding window) from `config.json`.
pub fn build_mistral(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(llama_config(
        json,
        LlamaFlavor::Mistral,
    )?)))
}

/// Builds a Qwen2 (Llama with q/k/v biases) from `config.json`.
pub fn build_qwen2(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(llama_config(
        json,
        LlamaFlavor::Qwen2,
    )?)))
}
