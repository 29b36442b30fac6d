//! Qwen3: the Llama layout with a per-head RMSNorm of queries and keys
//! (`q_norm`, `k_norm`) before RoPE, and a `head_dim` of its own.

use mllm_core::{Error, Result};
use serde_json::Value as Json;

use crate::config::HfConfig;
use crate::decoder::Decoder;
use crate::decoder_config::{DecoderConfig, HfDefaults};
use crate::CausalLm;

/// Reads a Qwen3 `config.json`.
pub fn qwen3_config(json: &Json) -> Result<DecoderConfig> {
    if HfConfig::new(json)?
        .opt_bool("use_sliding_window")?
        .unwrap_or(false)
    {
        return Err(Error::Config(
            "Qwen3 with use_sliding_window is not supported".into(),
        ));
    }
    let mut cfg = DecoderConfig::from_hf(json, &HfDefaults::default())?;
    cfg.qk_norm = true;
    Ok(cfg)
}

/// Builds a Qwen3 from `config.json`.
pub fn build_qwen3(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(qwen3_config(json)?)))
}
