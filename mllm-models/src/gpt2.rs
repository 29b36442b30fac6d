//! GPT-2: learned absolute positions, pre-LayerNorm blocks with a fused
//! `c_attn` (q, k, v stacked on the output axis), a GELU MLP and a head tied
//! to the token embeddings.
//!
//! GPT-2's `Conv1D` layers store their weights `[in, out]`; the converter
//! transposes them to the `[out, in]` that [`Linear`] reads
//! ([`map_gpt2_tensor`]).

use mllm_core::graph::{Graph, Module, Value};
use mllm_core::layers::{Attention, Embedding, KvCache, LayerNorm, Linear, PositionEmbedding};
use mllm_core::op::{Activation, AttentionParams};
use mllm_core::{Error, Result};
use serde_json::Value as Json;

use crate::config::{self, HfConfig};
use crate::registry::TensorAction;
use crate::CausalLm;

/// The hyper-parameters of a GPT-2 model, read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Rows of the embedding table and of the logits.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Width of the MLP (`n_inner`, default `4 * n_embd`).
    pub n_inner: usize,
    /// Learned positions, the longest context.
    pub n_positions: usize,
    /// LayerNorm epsilon.
    pub layer_norm_epsilon: f32,
    /// The MLP activation (`activation_function`).
    pub activation: Activation,
    /// Divide attention scores by `sqrt(head_dim)` (`scale_attn_weights`).
    pub scale_attn_weights: bool,
    /// Further divide them by `layer index + 1`.
    pub scale_attn_by_inverse_layer_idx: bool,
    /// The head reads the token embedding table.
    pub tie_word_embeddings: bool,
}

impl Gpt2Config {
    /// Reads a GPT-2 `config.json`.
    pub fn from_hf(json: &Json) -> Result<Self> {
        let c = HfConfig::new(json)?;
        if c.opt_bool("add_cross_attention")?.unwrap_or(false) {
            return Err(Error::Config(
                "GPT-2 with cross-attention is not a decoder-only model".into(),
            ));
        }
        let n_embd = c.usize("n_embd")?;
        let n_head = c.usize("n_head")?;
        if n_head == 0 || n_embd == 0 || !n_embd.is_multiple_of(n_head) {
            return Err(Error::Config(format!(
                "n_embd ({n_embd}) must be a positive multiple of n_head ({n_head})"
            )));
        }
        let act = c.opt_str("activation_function")?.unwrap_or("gelu_new");
        Ok(Gpt2Config {
            vocab_size: c.usize("vocab_size")?,
            n_embd,
            n_layer: c.usize("n_layer")?,
            n_head,
            n_inner: c.opt_usize("n_inner")?.unwrap_or(4 * n_embd),
            n_positions: c.usize("n_positions")?,
            layer_norm_epsilon: c.opt_f64("layer_norm_epsilon")?.unwrap_or(1e-5) as f32,
            activation: config::activation(act)?,
            scale_attn_weights: c.opt_bool("scale_attn_weights")?.unwrap_or(true),
            scale_attn_by_inverse_layer_idx: c
                .opt_bool("scale_attn_by_inverse_layer_idx")?
                .unwrap_or(false),
            tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(true),
        })
    }
}

/// One GPT-2 block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
pub struct Gpt2Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    cache: KvCache,
    attn: Attention,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    act: Activation,
    mlp_proj: Linear,
    n_embd: usize,
}

impl Gpt2Block {
    fn new(cfg: &Gpt2Config, layer: usize) -> Self {
        let p = format!("transformer.h.{layer}");
        let (h, eps) = (cfg.n_embd, cfg.layer_norm_epsilon);
        let head_dim = h / cfg.n_head;
        let mut scale = if cfg.scale_attn_weights {
            1.0 / (head_dim as f32).sqrt()
        } else {
            1.0
        };
        if cfg.scale_attn_by_inverse_layer_idx {
            scale /= (layer + 1) as f32;
        }
        Gpt2Block {
            ln_1: LayerNorm::new(h, eps, true, format!("{p}.ln_1")),
            c_attn: Linear::new(h, 3 * h, true, format!("{p}.attn.c_attn")),
            cache: KvCache::new(cfg.n_head, head_dim, format!("{p}.attn.kv_cache")),
            attn: Attention::new(
                AttentionParams {
                    n_heads: cfg.n_head,
                    n_kv_heads: cfg.n_head,
                    head_dim,
                    scale,
                    sliding_window: None,
                },
                format!("{p}.attn.attn"),
            ),
            attn_proj: Linear::new(h, h, true, format!("{p}.attn.c_proj")),
            ln_2: LayerNorm::new(h, eps, true, format!("{p}.ln_2")),
            c_fc: Linear::new(h, cfg.n_inner, true, format!("{p}.mlp.c_fc")),
            act: cfg.activation,
            mlp_proj: Linear::new(cfg.n_inner, h, true, format!("{p}.mlp.c_proj")),
            n_embd: h,
        }
    }
}

impl Module for Gpt2Block {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let h = self.ln_1.call(g, x)?;
        let qkv = self.c_attn.call(g, h)?;
        let n = self.n_embd;
        let q = g.slice_columns(qkv, 0, n)?;
        let k = g.slice_columns(qkv, n, n)?;
        let v = g.slice_columns(qkv, 2 * n, n)?;
        let kv = self.cache.call(g, k, v)?;
        let a = self.attn.call(g, q, kv)?;
        let a = self.attn_proj.call(g, a)?;
        let x = g.add(x, a)?;
        let h = self.ln_2.call(g, x)?;
        let h = self.c_fc.call(g, h)?;
        let h = g.activation(self.act, h)?;
        let h = self.mlp_proj.call(g, h)?;
        g.add(x, h)
    }
}

/// A GPT-2 language model (`GPT2LMHeadModel`).
pub struct Gpt2 {
    cfg: Gpt2Config,
    wte: Embedding,
    wpe: PositionEmbedding,
    blocks: Vec<Gpt2Block>,
    ln_f: LayerNorm,
    lm_head: Linear,
}

impl Gpt2 {
    /// Builds the module tree with Hugging Face weight names.
    pub fn new(cfg: Gpt2Config) -> Self {
        let h = cfg.n_embd;
        let head_weight = if cfg.tie_word_embeddings {
            "transformer.wte.weight"
        } else {
            "lm_head.weight"
        };
        Gpt2 {
            wte: Embedding::new(cfg.vocab_size, h, "transformer.wte"),
            wpe: PositionEmbedding::new(cfg.n_positions, h, 0, "transformer.wpe"),
            blocks: (0..cfg.n_layer).map(|i| Gpt2Block::new(&cfg, i)).collect(),
            ln_f: LayerNorm::new(h, cfg.layer_norm_epsilon, true, "transformer.ln_f"),
            lm_head: Linear::with_weights(h, cfg.vocab_size, head_weight, None, "lm_head"),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.cfg
    }
}

impl Module for Gpt2 {
    fn forward(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        let tok = self.wte.call(g, tokens)?;
        let pos = self.wpe.call(g, tokens)?;
        let mut x = g.add(tok, pos)?;
        for block in &self.blocks {
            x = block.forward(g, x)?;
        }
        let x = self.ln_f.call(g, x)?;
        let x = g.select_logits_rows(x)?;
        self.lm_head.call(g, x)
    }
}

impl CausalLm for Gpt2 {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.n_positions
    }
}

/// Builds a GPT-2 from `config.json`.
pub fn build_gpt2(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Gpt2::new(Gpt2Config::from_hf(json)?)))
}

/// GPT-2 checkpoint names to `.mllm` names: adds the `transformer.` prefix
/// that the original checkpoints lack, transposes the `Conv1D` weights
/// (`c_attn`, `c_proj`, `c_fc`) to `[out, in]`, and drops the causal-mask
/// buffers (`attn.bias`, `attn.masked_bias`).
pub fn map_gpt2_tensor(name: &str) -> TensorAction {
    if name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
        return TensorAction::Skip;
    }
    let name = if name.starts_with("transformer.") || name.starts_with("lm_head.") {
        name.to_string()
    } else {
        format!("transformer.{name}")
    };
    let conv1d = [
        ".attn.c_attn.weight",
        ".attn.c_proj.weight",
        ".mlp.c_fc.weight",
        ".mlp.c_proj.weight",
    ];
    if name.starts_with("transformer.h.") && conv1d.iter().any(|s| name.ends_with(s)) {
        TensorAction::Transpose(name)
    } else {
        TensorAction::Keep(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names() {
        use TensorAction::*;
        let cases = [
            (
                "transformer.h.0.attn.c_attn.weight",
                Transpose("transformer.h.0.attn.c_attn.weight".into()),
            ),
            (
                "h.11.mlp.c_proj.weight",
                Transpose("transformer.h.11.mlp.c_proj.weight".into()),
            ),
            (
                "transformer.h.0.attn.c_attn.bias",
                Keep("transformer.h.0.attn.c_attn.bias".into()),
            ),
            ("wte.weight", Keep("transformer.wte.weight".into())),
            ("transformer.h.3.attn.bias", Skip),
            ("h.3.attn.masked_bias", Skip),
            ("lm_head.weight", Keep("lm_head.weight".into())),
        ];
        for (name, want) in cases {
            assert_eq!(map_gpt2_tensor(name), want, "{name}");
        }
    }

    #[test]
    fn config_errors() {
        let ok = serde_json::json!({
            "vocab_size": 10, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 16
        });
        let cfg = Gpt2Config::from_hf(&ok).unwrap();
        assert_eq!((cfg.n_inner, cfg.activation), (32, Activation::GeluTanh));
        for (key, value) in [
            ("n_head", serde_json::json!(3)),
            ("add_cross_attention", serde_json::json!(true)),
            ("activation_function", serde_json::json!("tanh")),
        ] {
            let mut j = ok.clone();
            j[key] = value;
            assert!(matches!(Gpt2Config::from_hf(&j), Err(Error::Config(_))));
        }
    }
}
