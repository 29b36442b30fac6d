//! Phi-3: the Llama layout with a fused `qkv_proj`, a fused `gate_up_proj`
//! and partial rotary embeddings (`partial_rotary_factor`).

use mllm_core::Result;
use serde_json::Value as Json;

use crate::config::HfConfig;
use crate::decoder::Decoder;
use crate::decoder_config::{DecoderConfig, HfDefaults};
use crate::CausalLm;

/// Reads a Phi-3 `config.json`. `longrope` scaling is refused (only the
/// default and llama3 rope types are supported).
pub fn phi3_config(json: &Json) -> Result<DecoderConfig> {
    let mut cfg = DecoderConfig::from_hf(json, &HfDefaults::default())?;
    cfg.fused_qkv = true;
    cfg.fused_gate_up = true;
    cfg.qkv_bias = false;
    cfg.o_bias = false;
    cfg.sliding_window = HfConfig::new(json)?.opt_usize("sliding_window")?;
    Ok(cfg)
}

/// Builds a Phi-3 from `config.json`.
pub fn build_phi3(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(phi3_config(json)?)))
}
