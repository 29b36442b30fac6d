//! The pre-norm rotary decoder (the Llama layout) with the switches its
//! relatives need: fused projections, partial or interleaved rotary, per-head
//! q/k norms, `1 + weight` norms, scaled embeddings and any gated activation.
//! Weight names follow Hugging Face (`model.layers.{i}.self_attn.q_proj`, ...).

use mllm_core::graph::{Graph, Module, Value};
use mllm_core::layers::{Attention, Embedding, KvCache, Linear, RmsNorm, Rope};
use mllm_core::op::{Activation, AttentionParams, RopeParams};
use mllm_core::Result;

use crate::decoder_config::DecoderConfig;
use crate::CausalLm;

/// The q, k and v projections: three layers or one fused `qkv_proj`.
enum QkvProj {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// Self-attention with rotary positions and a KV cache.
pub struct DecoderAttention {
    qkv: QkvProj,
    q_dim: usize,
    kv_dim: usize,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    rope_q: Rope,
    rope_k: Rope,
    cache: KvCache,
    attn: Attention,
    o: Linear,
}

impl DecoderAttention {
    /// The attention block `name` (e.g. `model.layers.0.self_attn`).
    pub fn new(cfg: &DecoderConfig, name: &str) -> Self {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let q_dim = cfg.num_heads * hd;
        let kv_dim = cfg.num_kv_heads * hd;
        let b = cfg.qkv_bias;
        let qkv = if cfg.fused_qkv {
            QkvProj::Fused(Linear::new(
                h,
                q_dim + 2 * kv_dim,
                b,
                format!("{name}.qkv_proj"),
            ))
        } else {
            QkvProj::Separate {
                q: Linear::new(h, q_dim, b, format!("{name}.q_proj")),
                k: Linear::new(h, kv_dim, b, format!("{name}.k_proj")),
                v: Linear::new(h, kv_dim, b, format!("{name}.v_proj")),
            }
        };
        let norm = |which: &str, heads: usize| {
            RmsNorm::new(hd, cfg.rms_norm_eps, format!("{name}.{which}")).per_head(heads)
        };
        let rope = |heads: usize, which: &str| {
            let params = RopeParams {
                n_heads: heads,
                head_dim: hd,
                rotary_dim: cfg.rotary_dim,
                theta: cfg.rope_theta,
                llama3: cfg.llama3_scaling.clone(),
                interleaved: cfg.rope_interleaved,
            };
            Rope::new(params, format!("{name}.{which}"))
        };
        DecoderAttention {
            qkv,
            q_dim,
            kv_dim,
            qk_norm: cfg.qk_norm.then(|| {
                (
                    norm("q_norm", cfg.num_heads),
                    norm("k_norm", cfg.num_kv_heads),
                )
            }),
            rope_q: rope(cfg.num_heads, "rope_q"),
            rope_k: rope(cfg.num_kv_heads, "rope_k"),
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
            o: Linear::new(q_dim, h, cfg.o_bias, format!("{name}.o_proj")),
        }
    }
}

impl Module for DecoderAttention {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let (q, k, v) = match &self.qkv {
            QkvProj::Separate { q, k, v } => (q.call(g, x)?, k.call(g, x)?, v.call(g, x)?),
            QkvProj::Fused(qkv) => {
                let y = qkv.call(g, x)?;
                let (qd, kvd) = (self.q_dim, self.kv_dim);
                (
                    g.slice_columns(y, 0, qd)?,
                    g.slice_columns(y, qd, kvd)?,
                    g.slice_columns(y, qd + kvd, kvd)?,
                )
            }
        };
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.call(g, q)?, kn.call(g, k)?),
            None => (q, k),
        };
        let q = self.rope_q.call(g, q)?;
        let k = self.rope_k.call(g, k)?;
        let kv = self.cache.call(g, k, v)?;
        let a = self.attn.call(g, q, kv)?;
        self.o.call(g, a)
    }
}

/// The gate and up projections: two layers or one fused `gate_up_proj`.
enum GateUpProj {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

/// The gated feed-forward block: `down(act(gate(x)) * up(x))`.
pub struct DecoderMlp {
    gate_up: GateUpProj,
    intermediate: usize,
    act: Activation,
    down: Linear,
}

impl DecoderMlp {
    /// The MLP block `name` (e.g. `model.layers.0.mlp`).
    pub fn new(cfg: &DecoderConfig, name: &str) -> Self {
        let (h, i, b) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        let gate_up = if cfg.fused_gate_up {
            GateUpProj::Fused(Linear::new(h, 2 * i, b, format!("{name}.gate_up_proj")))
        } else {
            GateUpProj::Separate {
                gate: Linear::new(h, i, b, format!("{name}.gate_proj")),
                up: Linear::new(h, i, b, format!("{name}.up_proj")),
            }
        };
        DecoderMlp {
            gate_up,
            intermediate: i,
            act: cfg.activation,
            down: Linear::new(i, h, b, format!("{name}.down_proj")),
        }
    }
}

impl Module for DecoderMlp {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let (gate, up) = match &self.gate_up {
            GateUpProj::Separate { gate, up } => (gate.call(g, x)?, up.call(g, x)?),
            GateUpProj::Fused(gate_up) => {
                let y = gate_up.call(g, x)?;
                let i = self.intermediate;
                (g.slice_columns(y, 0, i)?, g.slice_columns(y, i, i)?)
            }
        };
        let h = g.glu(self.act, gate, up)?;
        self.down.call(g, h)
    }
}

/// One pre-norm decoder layer.
pub struct DecoderLayer {
    input_norm: RmsNorm,
    attn: DecoderAttention,
    post_attn_norm: RmsNorm,
    mlp: DecoderMlp,
}

impl DecoderLayer {
    /// Layer `name` (e.g. `model.layers.0`).
    pub fn new(cfg: &DecoderConfig, name: &str) -> Self {
        DecoderLayer {
            input_norm: norm(cfg, format!("{name}.input_layernorm")),
            attn: DecoderAttention::new(cfg, &format!("{name}.self_attn")),
            post_attn_norm: norm(cfg, format!("{name}.post_attention_layernorm")),
            mlp: DecoderMlp::new(cfg, &format!("{name}.mlp")),
        }
    }
}

impl Module for DecoderLayer {
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value> {
        let h = self.input_norm.call(g, x)?;
        let h = self.attn.forward(g, h)?;
        let x = g.add(x, h)?;
        let h = self.post_attn_norm.call(g, x)?;
        let h = self.mlp.forward(g, h)?;
        g.add(x, h)
    }
}

/// A hidden-size RMSNorm with the config's epsilon and weight convention.
fn norm(cfg: &DecoderConfig, name: String) -> RmsNorm {
    let n = RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps, name);
    if cfg.norm_unit_offset {
        n.with_unit_offset()
    } else {
        n
    }
}

/// A decoder-only causal language model of [`DecoderLayer`]s.
pub struct Decoder {
    cfg: DecoderConfig,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Decoder {
    /// Builds the module tree with Hugging Face weight names.
    pub fn new(cfg: DecoderConfig) -> Self {
        let h = cfg.hidden_size;
        let layers = (0..cfg.num_layers)
            .map(|i| DecoderLayer::new(&cfg, &format!("model.layers.{i}")))
            .collect();
        let head_weight = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        Decoder {
            embed: Embedding::new(cfg.vocab_size, h, "model.embed_tokens"),
            layers,
            norm: norm(&cfg, "model.norm".into()),
            lm_head: Linear::with_weights(h, cfg.vocab_size, head_weight, None, "lm_head"),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }
}

impl Module for Decoder {
    fn forward(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        let mut x = self.embed.call(g, tokens)?;
        if let Some(s) = self.cfg.embed_scale {
            x = g.scale(x, s)?;
        }
        for layer in &self.layers {
            x = layer.forward(g, x)?;
        }
        let x = self.norm.call(g, x)?;
        let x = g.select_logits_rows(x)?;
        self.lm_head.call(g, x)
    }
}

impl CausalLm for Decoder {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_position_embeddings
    }
}
