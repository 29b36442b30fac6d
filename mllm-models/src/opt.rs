//! OPT: learned absolute positions stored with an offset of two rows,
//! pre-LayerNorm blocks (`do_layer_norm_before`), biases on every
//! projection, a ReLU MLP and a head tied to the token embeddings.

use mllm_core::graph::{Graph, Module, Value};
use mllm_core::layers::{Attention, Embedding, KvCache, LayerNorm, Linear, PositionEmbedding};
use mllm_core::op::{Activation, AttentionParams};
use mllm_core::{Error, Result};
use serde_json::Value as Json;

use crate::config::{self, HfConfig};
use crate::registry::TensorAction;
use crate::CausalLm;

/// OPT's position table keeps two unused rows in front: position `p` reads row `p + 2`.
pub const OPT_POSITION_OFFSET: usize = 2;

/// OPT's LayerNorm epsilon (fixed, not in `config.json`).
const OPT_LAYER_NORM_EPS: f32 = 1e-5;

/// The hyper-parameters of an OPT model, read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct OptConfig {
    /// Rows of the embedding table and of the logits.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Width of the MLP.
    pub ffn_dim: usize,
    /// Learned positions, the longest context.
    pub max_position_embeddings: usize,
    /// The MLP activation (`activation_function`).
    pub activation: Activation,
    /// Biases on the projections (`enable_bias`).
    pub bias: bool,
    /// The head reads the token embedding table.
    pub tie_word_embeddings: bool,
}

impl OptConfig {
    /// Reads an OPT `config.json`. Post-LayerNorm OPT
    /// (`do_layer_norm_before: false`), a `word_embed_proj_dim` other than
    /// `hidden_size`, LayerNorms without weights and a removed final
    /// LayerNorm are refused.
    pub fn from_hf(json: &Json) -> Result<Self> {
        let c = HfConfig::new(json)?;
        let hidden_size = c.usize("hidden_size")?;
        let num_heads = c.usize("num_attention_heads")?;
        if num_heads == 0 || hidden_size == 0 || !hidden_size.is_multiple_of(num_heads) {
            return Err(Error::Config(format!(
                "hidden_size ({hidden_size}) must be a positive multiple of num_attention_heads ({num_heads})"
            )));
        }
        let unsupported =
            |what: &str| Err(Error::Config(format!("OPT with {what} is not supported")));
        if !c.opt_bool("do_layer_norm_before")?.unwrap_or(true) {
            return unsupported("do_layer_norm_before=false (post-LayerNorm)");
        }
        if c.opt_usize("word_embed_proj_dim")?.unwrap_or(hidden_size) != hidden_size {
            return unsupported("word_embed_proj_dim != hidden_size (project_in/out)");
        }
        if !c.opt_bool("layer_norm_elementwise_affine")?.unwrap_or(true) {
            return unsupported("layer_norm_elementwise_affine=false");
        }
        if c.opt_bool("_remove_final_layer_norm")?.unwrap_or(false) {
            return unsupported("_remove_final_layer_norm=true");
        }
        let act = c.opt_str("activation_function")?.unwrap_or("relu");
        Ok(OptConfig {
            vocab_size: c.usize("vocab_size")?,
            hidden_size,
            num_layers: c.usize("num_hidden_layers")?,
            num_heads,
            ffn_dim: c.usize("ffn_dim")?,
            max_position_embeddings: c.usize("max_position_embeddings")?,
            activation: config::activation(act)?,
            bias: c.opt_bool("enable_bias")?.unwrap_or(true),
            tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(true),
        })
    }
}

/// One OPT decoder layer: `x + out_proj(attn(ln(x)))`, then `x + fc2(act(fc1(ln(x))))`.
pub struct OptLayer {
    attn_norm: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    cache: KvCache,
    attn: Attention,
    out: Linear,
    mlp_norm: LayerNorm,
    fc1: Linear,
    act: Activation,
    fc2: Linear,
}

impl OptLayer {
    fn new(cfg: &OptConfig, layer: usize) -> Self {
        let p = format!("model.decoder.layers.{layer}");
        let (h, b) = (cfg.hidden_size, cfg.bias);
        let head_dim = h / cfg.num_heads;
        let norm = |n: &str| LayerNorm::new(h, OPT_LAYER_NORM_EPS, true, format!("{p}.{n}"));
        let proj = |n: &str| Linear::new(h, h, b, format!("{p}.self_attn.{n}"));
        OptLayer {
            attn_norm: norm("self_attn_layer_norm"),
            q: proj("q_proj"),
            k: proj("k_proj"),
            v: proj("v_proj"),
            cache: KvCache::new(cfg.num_heads, head_dim, format!("{p}.self_attn.kv_cache")),
            attn: Attention::new(
                AttentionParams {
                    n_heads: cfg.num_heads,
                    n_kv_heads: cfg.num_heads,
                    head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    sliding_window: None,
                },
                format!("{p}.self_attn.attn"),
            ),
            out: proj("out_proj"),
            mlp_norm: norm("final_layer_norm"),
            fc1: Linear::new(h, cfg.ffn_dim, b, format!("{p}.fc1")),
            act: cfg.activation,
            fc2: Linear::new(cfg.ffn_dim, h, b, format!("{p}.fc2")),
        }
    }
}

impl Module for OptLayer {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let h = self.attn_norm.call(g, x)?;
        let q = self.q.call(g, h)?;
        let k = self.k.call(g, h)?;
        let v = self.v.call(g, h)?;
        let kv = self.cache.call(g, k, v)?;
        let a = self.attn.call(g, q, kv)?;
        let a = self.out.call(g, a)?;
        let x = g.add(x, a)?;
        let h = self.mlp_norm.call(g, x)?;
        let h = self.fc1.call(g, h)?;
        let h = g.activation(self.act, h)?;
        let h = self.fc2.call(g, h)?;
        g.add(x, h)
    }
}

/// An OPT language model (`OPTForCausalLM`).
pub struct Opt {
    cfg: OptConfig,
    embed: Embedding,
    positions: PositionEmbedding,
    layers: Vec<OptLayer>,
    final_norm: LayerNorm,
    lm_head: Linear,
}

impl Opt {
    /// Builds the module tree with Hugging Face weight names.
    pub fn new(cfg: OptConfig) -> Self {
        let h = cfg.hidden_size;
        let head_weight = if cfg.tie_word_embeddings {
            "model.decoder.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        Opt {
            embed: Embedding::new(cfg.vocab_size, h, "model.decoder.embed_tokens"),
            positions: PositionEmbedding::new(
                cfg.max_position_embeddings + OPT_POSITION_OFFSET,
                h,
                OPT_POSITION_OFFSET,
                "model.decoder.embed_positions",
            ),
            layers: (0..cfg.num_layers)
                .map(|i| OptLayer::new(&cfg, i))
                .collect(),
            final_norm: LayerNorm::new(
                h,
                OPT_LAYER_NORM_EPS,
                true,
                "model.decoder.final_layer_norm",
            ),
            lm_head: Linear::with_weights(h, cfg.vocab_size, head_weight, None, "lm_head"),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OptConfig {
        &self.cfg
    }
}

impl Module for Opt {
    fn forward(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        let tok = self.embed.call(g, tokens)?;
        let pos = self.positions.call(g, tokens)?;
        let mut x = g.add(tok, pos)?;
        for layer in &self.layers {
            x = layer.forward(g, x)?;
        }
        let x = self.final_norm.call(g, x)?;
        let x = g.select_logits_rows(x)?;
        self.lm_head.call(g, x)
    }
}

impl CausalLm for Opt {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_position_embeddings
    }
}

/// Builds an OPT from `config.json`.
pub fn build_opt(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Opt::new(OptConfig::from_hf(json)?)))
}

/// OPT checkpoint names to `.mllm` names: adds the `model.` prefix that the
/// original checkpoints (`decoder.layers...`) lack.
pub fn map_opt_tensor(name: &str) -> TensorAction {
    if name.starts_with("decoder.") {
        TensorAction::Keep(format!("model.{name}"))
    } else {
        TensorAction::Keep(name.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names() {
        assert_eq!(
            map_opt_tensor("decoder.embed_positions.weight"),
            TensorAction::Keep("model.decoder.embed_positions.weight".into())
        );
        assert_eq!(
            map_opt_tensor("model.decoder.layers.0.fc1.weight"),
            TensorAction::Keep("model.decoder.layers.0.fc1.weight".into())
        );
    }

    #[test]
    fn unsupported_variants_are_config_errors() {
        let ok = serde_json::json!({
            "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "ffn_dim": 16, "max_position_embeddings": 32
        });
        let cfg = OptConfig::from_hf(&ok).unwrap();
        assert_eq!((cfg.activation, cfg.bias), (Activation::Relu, true));
        for (key, value) in [
            ("do_layer_norm_before", serde_json::json!(false)),
            ("word_embed_proj_dim", serde_json::json!(4)),
            ("layer_norm_elementwise_affine", serde_json::json!(false)),
            ("_remove_final_layer_norm", serde_json::json!(true)),
        ] {
            let mut j = ok.clone();
            j[key] = value;
            let err = OptConfig::from_hf(&j).unwrap_err();
            assert!(err.to_string().contains("not supported"), "{key}: {err}");
        }
    }
}
