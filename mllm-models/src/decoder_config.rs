//! The hyper-parameters of a pre-norm rotary decoder and how they are read
//! from the `config.json` keys that Llama-style models share.

use mllm_core::op::{Activation, Llama3RopeScaling};
use mllm_core::{Error, Result};
use serde_json::Value as Json;

use crate::config::{self, HfConfig};

/// Everything a [`Decoder`](crate::decoder::Decoder) is built from. The
/// switches after `tie_word_embeddings` are where Llama's relatives differ.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// Rows of the embedding table and of the logits.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Llama 3 frequency scaling, when `rope_type` is `llama3`.
    pub llama3_scaling: Option<Llama3RopeScaling>,
    /// Longest sequence (prompt plus generated tokens).
    pub max_position_embeddings: usize,
    /// The head reads the embedding table.
    pub tie_word_embeddings: bool,
    /// Leading dims of each head that rotate (`head_dim * partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Rotate adjacent pairs (GLM) instead of the two halves.
    pub rope_interleaved: bool,
    /// Biases on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Biases in the MLP.
    pub mlp_bias: bool,
    /// One `qkv_proj` (q, k, v stacked on the output axis) instead of three.
    pub fused_qkv: bool,
    /// One `gate_up_proj` (gate, then up) instead of two.
    pub fused_gate_up: bool,
    /// Per-head RMSNorm of queries and keys before RoPE (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// RMSNorm scales by `1 + weight` (Gemma).
    pub norm_unit_offset: bool,
    /// Multiplier of the token embeddings (Gemma: `sqrt(hidden_size)`).
    pub embed_scale: Option<f32>,
    /// The gate's activation in the MLP.
    pub activation: Activation,
    /// Each query sees itself and the `w - 1` previous tokens.
    pub sliding_window: Option<usize>,
}

/// The defaults of an architecture's Hugging Face config class, used when
/// `config.json` leaves a key out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HfDefaults {
    /// `hidden_act`.
    pub hidden_act: &'static str,
    /// `partial_rotary_factor`.
    pub partial_rotary_factor: f64,
    /// `attention_bias`.
    pub attention_bias: bool,
    /// `tie_word_embeddings`.
    pub tie_word_embeddings: bool,
}

impl Default for HfDefaults {
    /// Llama's defaults.
    fn default() -> Self {
        HfDefaults {
            hidden_act: "silu",
            partial_rotary_factor: 1.0,
            attention_bias: false,
            tie_word_embeddings: false,
        }
    }
}

impl DecoderConfig {
    /// Reads the keys Llama-style configs share. The architecture switches
    /// start as plain Llama (separate projections, no q/k norm, no embedding
    /// scale, no sliding window); `attention_bias` sets both `qkv_bias` and
    /// `o_bias`.
    pub fn from_hf(json: &Json, defaults: &HfDefaults) -> Result<Self> {
        let c = HfConfig::new(json)?;
        let hidden_size = c.usize("hidden_size")?;
        let num_heads = c.usize("num_attention_heads")?;
        if num_heads == 0 || hidden_size == 0 {
            return Err(Error::Config(
                "hidden_size and num_attention_heads must be positive".into(),
            ));
        }
        let num_kv_heads = c.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(Error::Config(format!(
                "num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            )));
        }
        let head_dim = c.opt_usize("head_dim")?.unwrap_or(hidden_size / num_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "head_dim must be even and positive, got {head_dim}"
            )));
        }
        let rope = RopeConfig::from_hf(&c, head_dim, defaults.partial_rotary_factor)?;
        let act = c.opt_str("hidden_act")?.unwrap_or(defaults.hidden_act);
        let attention_bias = c
            .opt_bool("attention_bias")?
            .unwrap_or(defaults.attention_bias);
        Ok(DecoderConfig {
            vocab_size: c.usize("vocab_size")?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size")?,
            num_layers: c.usize("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: c.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta: rope.theta,
            llama3_scaling: rope.llama3,
            max_position_embeddings: c.opt_usize("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: c
                .opt_bool("tie_word_embeddings")?
                .unwrap_or(defaults.tie_word_embeddings),
            rotary_dim: rope.rotary_dim,
            rope_interleaved: false,
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            mlp_bias: c.opt_bool("mlp_bias")?.unwrap_or(false),
            fused_qkv: false,
            fused_gate_up: false,
            qk_norm: false,
            norm_unit_offset: false,
            embed_scale: None,
            activation: config::activation(act)?,
            sliding_window: None,
        })
    }
}

/// Rotary settings: `rope_theta`, `rope_scaling` / `rope_parameters` and
/// `partial_rotary_factor`, in both the transformers 4 and 5 layouts.
struct RopeConfig {
    theta: f32,
    llama3: Option<Llama3RopeScaling>,
    rotary_dim: usize,
}

impl RopeConfig {
    fn from_hf(c: &HfConfig, head_dim: usize, default_factor: f64) -> Result<Self> {
        let params = c.sub("rope_parameters")?;
        let theta = match c.opt_f64("rope_theta")? {
            Some(t) => t,
            None => match &params {
                Some(p) => p.opt_f64("rope_theta")?.unwrap_or(10000.0),
                None => 10000.0,
            },
        } as f32;
        let factor = match c.opt_f64("partial_rotary_factor")? {
            Some(f) => f,
            None => match &params {
                Some(p) => p
                    .opt_f64("partial_rotary_factor")?
                    .unwrap_or(default_factor),
                None => default_factor,
            },
        };
        let rotary_dim = (head_dim as f64 * factor) as usize;
        if factor <= 0.0 || factor > 1.0 || rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "partial_rotary_factor {factor} of head_dim {head_dim} must give an even rotary dim between 2 and head_dim"
            )));
        }
        let scaling = match c.sub("rope_scaling")? {
            Some(s) => Some(s),
            None => params,
        };
        let llama3 = match scaling {
            None => None,
            Some(s) => {
                let kind = match s.opt_str("rope_type")? {
                    Some(t) => Some(t),
                    None => s.opt_str("type")?,
                };
                match kind.unwrap_or("default") {
                    "default" => None,
                    "llama3" => Some(llama3_scaling(&s)?),
                    other => {
                        return Err(Error::Config(format!(
                            "rope type '{other}' is not supported"
                        )))
                    }
                }
            }
        };
        Ok(RopeConfig {
            theta,
            llama3,
            rotary_dim,
        })
    }
}

fn llama3_scaling(s: &HfConfig) -> Result<Llama3RopeScaling> {
    let num = |k: &str| -> Result<f32> {
        s.opt_f64(k)?
            .map(|v| v as f32)
            .ok_or_else(|| Error::Config(format!("llama3 rope scaling needs '{k}'")))
    };
    Ok(Llama3RopeScaling {
        factor: num("factor")?,
        low_freq_factor: num("low_freq_factor")?,
        high_freq_factor: num("high_freq_factor")?,
        original_max_position_embeddings: num("original_max_position_embeddings")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Json {
        json!({
            "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
        })
    }

    #[test]
    fn llama_defaults() {
        let c = DecoderConfig::from_hf(&base(), &HfDefaults::default()).unwrap();
        assert_eq!((c.head_dim, c.rotary_dim, c.num_kv_heads), (16, 16, 2));
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.activation, Activation::Silu);
        assert!(!c.tie_word_embeddings && !c.qkv_bias && c.llama3_scaling.is_none());
    }

    #[test]
    fn partial_rotary_factor_from_either_layout() {
        let mut j = base();
        j["rope_parameters"] = json!({"rope_theta": 500.0, "partial_rotary_factor": 0.75});
        let c = DecoderConfig::from_hf(&j, &HfDefaults::default()).unwrap();
        assert_eq!((c.rotary_dim, c.rope_theta), (12, 500.0));
        j["partial_rotary_factor"] = json!(0.5);
        let c = DecoderConfig::from_hf(&j, &HfDefaults::default()).unwrap();
        assert_eq!(c.rotary_dim, 8);
        let glm = HfDefaults {
            partial_rotary_factor: 0.5,
            ..HfDefaults::default()
        };
        assert_eq!(DecoderConfig::from_hf(&base(), &glm).unwrap().rotary_dim, 8);
    }

    #[test]
    fn bad_configs_are_errors() {
        for (key, value) in [
            ("partial_rotary_factor", json!(0.1)),
            ("partial_rotary_factor", json!(1.5)),
            ("num_key_value_heads", json!(3)),
            ("hidden_act", json!("mish")),
            ("rope_scaling", json!({"rope_type": "longrope"})),
        ] {
            let mut j = base();
            j[key] = value;
            let err = DecoderConfig::from_hf(&j, &HfDefaults::default()).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{key}: {err}");
        }
    }
}
