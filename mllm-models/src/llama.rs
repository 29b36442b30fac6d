//! The Llama family: Llama 2/3/3.x (incl. llama3 rope scaling), SmolLM,
//! Mistral (sliding window) and Qwen2 (q/k/v biases), tied or untied head.

use mllm_core::graph::{Graph, Module, Value};
use mllm_core::layers::{Attention, Embedding, KvCache, Linear, RmsNorm, Rope};
use mllm_core::op::{AttentionParams, Llama3RopeScaling, RopeParams};
use mllm_core::{Error, Result};
use serde_json::Value as Json;

use crate::config::HfConfig;
use crate::CausalLm;

/// The hyper-parameters of a Llama-family model, read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub llama3_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Biases on the q/k/v projections (Qwen2, `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (`attention_bias` in Llama).
    pub o_bias: bool,
    /// Biases in the MLP (`mlp_bias`).
    pub mlp_bias: bool,
    pub sliding_window: Option<usize>,
}

/// Which member of the family a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaFlavor {
    Llama,
    Mistral,
    Qwen2,
}

impl LlamaConfig {
    /// Reads a Hugging Face config of the given flavour.
    pub fn from_hf(json: &Json, flavor: LlamaFlavor) -> Result<Self> {
        let c = HfConfig::new(json)?;
        let hidden_size = c.usize("hidden_size")?;
        let num_heads = c.usize("num_attention_heads")?;
        if num_heads == 0 || hidden_size == 0 {
            return Err(Error::Config(
                "hidden_size and num_attention_heads must be positive".into(),
            ));
        }
        let num_kv_heads = c.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::Config(format!(
                "num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            )));
        }
        let head_dim = c.opt_usize("head_dim")?.unwrap_or(hidden_size / num_heads);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(Error::Config(format!(
                "head_dim must be even and positive, got {head_dim}"
            )));
        }
        if let Some(act) = c.opt_str("hidden_act")? {
            if act != "silu" {
                return Err(Error::Config(format!(
                    "hidden_act '{act}' is not supported (expected silu)"
                )));
            }
        }
        let rope_params = c.sub("rope_parameters")?;
        let rope_theta = match c.opt_f64("rope_theta")? {
            Some(t) => t,
            None => match &rope_params {
                Some(p) => p.opt_f64("rope_theta")?.unwrap_or(10000.0),
                None => 10000.0,
            },
        } as f32;
        let scaling = match c.sub("rope_scaling")? {
            Some(s) => Some(s),
            None => rope_params,
        };
        let llama3_scaling = match scaling {
            None => None,
            Some(s) => {
                let kind = match s.opt_str("rope_type")? {
                    Some(t) => Some(t),
                    None => s.opt_str("type")?,
                };
                match kind.unwrap_or("default") {
                    "default" => None,
                    "llama3" => {
                        let num = |k: &str| -> Result<f32> {
                            s.opt_f64(k)?.map(|v| v as f32).ok_or_else(|| {
                                Error::Config(format!("llama3 rope scaling needs '{k}'"))
                            })
                        };
                        Some(Llama3RopeScaling {
                            factor: num("factor")?,
                            low_freq_factor: num("low_freq_factor")?,
                            high_freq_factor: num("high_freq_factor")?,
                            original_max_position_embeddings: num(
                                "original_max_position_embeddings",
                            )?,
                        })
                    }
                    other => {
                        return Err(Error::Config(format!(
                            "rope type '{other}' is not supported"
                        )))
                    }
                }
            }
        };
        let attention_bias = c.opt_bool("attention_bias")?.unwrap_or(false);
        let sliding_window = match flavor {
            LlamaFlavor::Mistral => c.opt_usize("sliding_window")?,
            LlamaFlavor::Qwen2 if c.opt_bool("use_sliding_window")?.unwrap_or(false) => {
                return Err(Error::Config(
                    "Qwen2 with use_sliding_window is not supported".into(),
                ))
            }
            _ => None,
        };
        Ok(LlamaConfig {
            vocab_size: c.usize("vocab_size")?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size")?,
            num_layers: c.usize("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: c.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            llama3_scaling,
            max_position_embeddings: c.opt_usize("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: flavor == LlamaFlavor::Qwen2 || attention_bias,
            o_bias: flavor != LlamaFlavor::Qwen2 && attention_bias,
            mlp_bias: c.opt_bool("mlp_bias")?.unwrap_or(false),
            sliding_window,
        })
    }
}

/// Self-attention with rotary positions and a KV cache.
pub struct LlamaAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    rope_q: Rope,
    rope_k: Rope,
    cache: KvCache,
    attn: Attention,
}

impl LlamaAttention {
    fn new(cfg: &LlamaConfig, name: &str) -> Self {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let q_dim = cfg.num_heads * hd;
        let kv_dim = cfg.num_kv_heads * hd;
        let rope = |heads: usize| RopeParams {
            n_heads: heads,
            head_dim: hd,
            rotary_dim: hd,
            theta: cfg.rope_theta,
            llama3: cfg.llama3_scaling.clone(),
            interleaved: false,
        };
        LlamaAttention {
            q: Linear::new(h, q_dim, cfg.qkv_bias, format!("{name}.q_proj")),
            k: Linear::new(h, kv_dim, cfg.qkv_bias, format!("{name}.k_proj")),
            v: Linear::new(h, kv_dim, cfg.qkv_bias, format!("{name}.v_proj")),
            o: Linear::new(q_dim, h, cfg.o_bias, format!("{name}.o_proj")),
            rope_q: Rope::new(rope(cfg.num_heads), format!("{name}.rope_q")),
            rope_k: Rope::new(rope(cfg.num_kv_heads), format!("{name}.rope_k")),
            cache: KvCache::new(cfg.num_kv_heads, hd, format!("{name}.kv_cache")),
            attn: Attention::new(
                AttentionParams {
                    n_heads: cfg.num_heads,
                    n_kv_heads: cfg.num_kv_heads,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    sliding_window: cfg.sliding_window,
                },
                format!("{name}.attn"),
            ),
        }
    }
}

impl Module for LlamaAttention {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let q = self.q.call(g, x)?;
        let k = self.k.call(g, x)?;
        let v = self.v.call(g, x)?;
        let q = self.rope_q.call(g, q)?;
        let k = self.rope_k.call(g, k)?;
        let kv = self.cache.call(g, k, v)?;
        let a = self.attn.call(g, q, kv)?;
        self.o.call(g, a)
    }
}

/// The SwiGLU feed-forward block.
pub struct LlamaMlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl LlamaMlp {
    fn new(cfg: &LlamaConfig, name: &str) -> Self {
        let (h, i, b) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        LlamaMlp {
            gate: Linear::new(h, i, b, format!("{name}.gate_proj")),
            up: Linear::new(h, i, b, format!("{name}.up_proj")),
            down: Linear::new(i, h, b, format!("{name}.down_proj")),
        }
    }
}

impl Module for LlamaMlp {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let gate = self.gate.call(g, x)?;
        let up = self.up.call(g, x)?;
        let h = g.swiglu(gate, up)?;
        self.down.call(g, h)
    }
}

/// One pre-norm decoder layer.
pub struct LlamaDecoderLayer {
    input_norm: RmsNorm,
    attn: LlamaAttention,
    post_attn_norm: RmsNorm,
    mlp: LlamaMlp,
}

impl Module for LlamaDecoderLayer {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let h = self.input_norm.call(g, x)?;
        let h = self.attn.forward(g, h)?;
        let x = g.add(x, h)?;
        let h = self.post_attn_norm.call(g, x)?;
        let h = self.mlp.forward(g, h)?;
        g.add(x, h)
    }
}

/// A Llama-family causal language model.
pub struct Llama {
    cfg: LlamaConfig,
    embed: Embedding,
    layers: Vec<LlamaDecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Llama {
    /// Builds the module tree with Hugging Face weight names.
    pub fn new(cfg: LlamaConfig) -> Self {
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                LlamaDecoderLayer {
                    input_norm: RmsNorm::new(h, eps, format!("{p}.input_layernorm")),
                    attn: LlamaAttention::new(&cfg, &format!("{p}.self_attn")),
                    post_attn_norm: RmsNorm::new(h, eps, format!("{p}.post_attention_layernorm")),
                    mlp: LlamaMlp::new(&cfg, &format!("{p}.mlp")),
                }
            })
            .collect();
        let head_weight = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        Llama {
            embed: Embedding::new(cfg.vocab_size, h, "model.embed_tokens"),
            layers,
            norm: RmsNorm::new(h, eps, "model.norm"),
            lm_head: Linear::with_weights(h, cfg.vocab_size, head_weight, None, "lm_head"),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }
}

impl Module for Llama {
    fn forward(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        let mut x = self.embed.call(g, tokens)?;
        for layer in &self.layers {
            x = layer.forward(g, x)?;
        }
        let x = self.norm.call(g, x)?;
        let x = g.select_logits_rows(x)?;
        self.lm_head.call(g, x)
    }
}

impl CausalLm for Llama {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_position_embeddings
    }
}

/// Builds a Llama from `config.json`.
pub fn build_llama(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Llama::new(LlamaConfig::from_hf(
        json,
        LlamaFlavor::Llama,
    )?)))
}

/// Builds a Mistral (Llama with a sliding window) from `config.json`.
pub fn build_mistral(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Llama::new(LlamaConfig::from_hf(
        json,
        LlamaFlavor::Mistral,
    )?)))
}

/// Builds a Qwen2 (Llama with q/k/v biases) from `config.json`.
pub fn build_qwen2(json: &Json) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Llama::new(LlamaConfig::from_hf(
        json,
        LlamaFlavor::Qwen2,
    )?)))
}
