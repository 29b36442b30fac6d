//! GLM-4 (`GlmForCausalLM`): the Llama layout with a fused `gate_up_proj`,
//! q/k/v biases (no output bias) and partial rotary embeddings that rotate
//! adjacent pairs of the first `head_dim * partial_rotary_factor` dims.

use mllm_core::Result;
use serde_json::Value as Json;

use crate::decoder::Decoder;
use crate::decoder_config::{DecoderConfig, HfDefaults};
use crate::CausalLm;

/// Reads a GLM `config.json` (defaults: `partial_rotary_factor` 0.5,
/// `attention_bias` true).
pub fn glm_config(json: &Json) -> Result<DecoderConfig> {
    let defaults = HfDefaults {
        partial_rotary_factor: 0.5,
        attention_bias: true,
        ..HfDefaults::default()
    };
    let mut cfg = DecoderConfig::from_hf(json, &defaults)?;
    cfg.fused_gate_up = true;
    cfg.rope_interleaved = true;
    cfg.o_bias = false;
    Ok(cfg)
}

/// Builds a GLM from `config.json`.
pub fn build_glm(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(glm_config(json)?)))
}
