//! Gemma: the Llama layout with embeddings scaled by `sqrt(hidden_size)`,
//! RMSNorm scaling by `1 + weight`, a GeGLU MLP (tanh GELU) and a tied head.

use mllm_core::Result;
use serde_json::Value as Json;

use crate::config::{self, HfConfig};
use crate::decoder::Decoder;
use crate::decoder_config::{DecoderConfig, HfDefaults};
use crate::CausalLm;

/// Reads a Gemma `config.json`. The MLP activation is `hidden_activation`
/// when given (Gemma checkpoints set it to `gelu_pytorch_tanh` next to a
/// legacy `hidden_act`), else `hidden_act`.
pub fn gemma_config(json: &Json) -> Result<DecoderConfig> {
    let defaults = HfDefaults {
        hidden_act: "gelu_pytorch_tanh",
        tie_word_embeddings: true,
        ..HfDefaults::default()
    };
    let mut cfg = DecoderConfig::from_hf(json, &defaults)?;
    if let Some(act) = HfConfig::new(json)?.opt_str("hidden_activation")? {
        cfg.activation = config::activation(act)?;
    }
    cfg.norm_unit_offset = true;
    cfg.embed_scale = Some((cfg.hidden_size as f64).sqrt() as f32);
    Ok(cfg)
}

/// Builds a Gemma from `config.json`.
pub fn build_gemma(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::new(gemma_config(json)?)))
}
