//! A model defined outside the library: a one-block transformer built from
//! the public layers, written to a `.mllm` file with deterministic weights,
//! loaded with [`Model::load_with`] and run for a few greedy steps.
//!
//! ```text
//! cargo run --release --example custom_model -- --prompt-ids 3,1,4,1,5 --steps 4
//! ```
//!
//! The model (`TinyCustomLm`), for token ids `t`:
//!
//! ```text
//! x      = embed[t]                                     [tokens, 16]
//! q, k, v = rms(x, attn_norm) · Wqᵀ, Wkᵀ, Wvᵀ            2 query heads of 8, 1 kv head
//! x     += attention(rope(q), rope(k), v) · Woᵀ          causal, scale 1/√8, rotate-half rope
//! h      = rms(x, mlp_norm)
//! x     += (gelu_tanh(h · Wgᵀ) * (h · Wuᵀ)) · Wdᵀ        width 32
//! logits = rms(x, final_norm) · Whᵀ
//! ```
//!
//! with `rms(x, w) = x / sqrt(mean(x²) + 1e-5) * w`. It prints the written
//! file, one `logits K: v0,v1,...` line per greedy step (the logits that chose
//! the K-th new token) and `ids: a,b,c`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use mllm::core::file::{Metadata, MllmWriter, TensorSpec};
use mllm::core::layers::{Attention, Embedding, KvCache, Linear, RmsNorm, Rope};
use mllm::core::op::{Activation, AttentionParams, RopeParams};
use mllm::core::{DType, Error, Graph, LogitsMode, Module, Result, StepInput, Value};
use mllm::models::config::HfConfig;
use mllm::models::{CausalLm, LoadOptions, Model};
use serde_json::json;

/// The architecture name stored in the file.
const ARCHITECTURE: &str = "TinyCustomLm";

/// The hyper-parameters, read from the config stored in the file.
struct TinyConfig {
    vocab: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    rope_theta: f32,
    eps: f32,
    max_context: usize,
}

impl TinyConfig {
    fn from_json(json: &serde_json::Value) -> Result<Self> {
        let c = HfConfig::new(json)?;
        let cfg = TinyConfig {
            vocab: c.usize("vocab_size")?,
            hidden: c.usize("hidden_size")?,
            heads: c.usize("num_heads")?,
            kv_heads: c.usize("num_kv_heads")?,
            head_dim: c.usize("head_dim")?,
            intermediate: c.usize("intermediate_size")?,
            rope_theta: c.opt_f64("rope_theta")?.unwrap_or(10000.0) as f32,
            eps: c.opt_f64("rms_norm_eps")?.unwrap_or(1e-5) as f32,
            max_context: c.usize("max_context")?,
        };
        if cfg.kv_heads == 0 || !cfg.heads.is_multiple_of(cfg.kv_heads) {
            return Err(Error::Config(
                "num_heads must be a multiple of num_kv_heads".into(),
            ));
        }
        Ok(cfg)
    }

    /// Every weight: name and shape.
    fn weights(&self) -> Vec<(String, Vec<usize>)> {
        let (h, q, kv, i) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        );
        [
            ("embed.weight", vec![self.vocab, h]),
            ("block.attn_norm.weight", vec![h]),
            ("block.q.weight", vec![q, h]),
            ("block.k.weight", vec![kv, h]),
            ("block.v.weight", vec![kv, h]),
            ("block.o.weight", vec![h, q]),
            ("block.mlp_norm.weight", vec![h]),
            ("block.gate.weight", vec![i, h]),
            ("block.up.weight", vec![i, h]),
            ("block.down.weight", vec![h, i]),
            ("final_norm.weight", vec![h]),
            ("head.weight", vec![self.vocab, h]),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect()
    }
}

/// The model: a Module tree of layers, traced once into a graph.
struct TinyLm {
    cfg: TinyConfig,
    embed: Embedding,
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    rope_q: Rope,
    rope_k: Rope,
    cache: KvCache,
    attn: Attention,
    o: Linear,
    mlp_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    final_norm: RmsNorm,
    head: Linear,
}

impl TinyLm {
    fn new(cfg: TinyConfig) -> Self {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let (q, kv) = (cfg.heads * hd, cfg.kv_heads * hd);
        let rope = |heads: usize, name: &str| {
            let params = RopeParams {
                n_heads: heads,
                head_dim: hd,
                rotary_dim: hd,
                theta: cfg.rope_theta,
                llama3: None,
                interleaved: false,
            };
            Rope::new(params, name)
        };
        let attention = AttentionParams {
            n_heads: cfg.heads,
            n_kv_heads: cfg.kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            sliding_window: None,
        };
        TinyLm {
            embed: Embedding::new(cfg.vocab, h, "embed"),
            attn_norm: RmsNorm::new(h, cfg.eps, "block.attn_norm"),
            q: Linear::new(h, q, false, "block.q"),
            k: Linear::new(h, kv, false, "block.k"),
            v: Linear::new(h, kv, false, "block.v"),
            rope_q: rope(cfg.heads, "block.rope_q"),
            rope_k: rope(cfg.kv_heads, "block.rope_k"),
            cache: KvCache::new(cfg.kv_heads, hd, "block.kv_cache"),
            attn: Attention::new(attention, "block.attn"),
            o: Linear::new(q, h, false, "block.o"),
            mlp_norm: RmsNorm::new(h, cfg.eps, "block.mlp_norm"),
            gate: Linear::new(h, cfg.intermediate, false, "block.gate"),
            up: Linear::new(h, cfg.intermediate, false, "block.up"),
            down: Linear::new(cfg.intermediate, h, false, "block.down"),
            final_norm: RmsNorm::new(h, cfg.eps, "final_norm"),
            head: Linear::new(h, cfg.vocab, false, "head"),
            cfg,
        }
    }
}

impl Module for TinyLm {
    fn forward(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        let x = self.embed.call(g, tokens)?;
        let h = self.attn_norm.call(g, x)?;
        let q = self.q.call(g, h)?;
        let k = self.k.call(g, h)?;
        let v = self.v.call(g, h)?;
        let q = self.rope_q.call(g, q)?;
        let k = self.rope_k.call(g, k)?;
        let kv = self.cache.call(g, k, v)?;
        let a = self.attn.call(g, q, kv)?;
        let a = self.o.call(g, a)?;
        let x = g.add(x, a)?;
        let h = self.mlp_norm.call(g, x)?;
        let gate = self.gate.call(g, h)?;
        let up = self.up.call(g, h)?;
        let m = g.glu(Activation::GeluTanh, gate, up)?;
        let m = self.down.call(g, m)?;
        let x = g.add(x, m)?;
        let x = self.final_norm.call(g, x)?;
        let x = g.select_logits_rows(x)?;
        self.head.call(g, x)
    }
}

impl CausalLm for TinyLm {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab
    }

    fn max_context(&self) -> usize {
        self.cfg.max_context
    }
}

/// Builds the model for [`Model::load_with`].
fn build(architecture: &str, config: &serde_json::Value) -> Result<Box<dyn CausalLm>> {
    if architecture != ARCHITECTURE {
        return Err(Error::UnsupportedArchitecture(architecture.to_string()));
    }
    Ok(Box::new(TinyLm::new(TinyConfig::from_json(config)?)))
}

/// Deterministic weights (xorshift64*): norm scales `1 + 0.1·u`, matrices
/// `u / sqrt(columns)` and the embedding `u`, with `u` uniform in [-1, 1).
struct Weights(u64);

impl Weights {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (bits as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn tensor(&mut self, name: &str, shape: &[usize]) -> Vec<f32> {
        let n: usize = shape.iter().product();
        let scale = match shape {
            [_] => return (0..n).map(|_| 1.0 + 0.1 * self.uniform()).collect(),
            [_, cols] if !name.starts_with("embed") => 1.0 / (*cols as f32).sqrt(),
            _ => 1.0,
        };
        (0..n).map(|_| scale * self.uniform()).collect()
    }
}

/// Writes the model's config and deterministic f32 weights to `path`.
fn write_model(path: &Path) -> Result<usize> {
    let config = json!({
        "architectures": [ARCHITECTURE],
        "vocab_size": 32, "hidden_size": 16, "num_heads": 2, "num_kv_heads": 1,
        "head_dim": 8, "intermediate_size": 32, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "max_context": 64
    });
    let cfg = TinyConfig::from_json(&config)?;
    let mut rng = Weights(0x5eed);
    let mut writer = MllmWriter::new();
    writer.metadata(Metadata::new(ARCHITECTURE, config));
    let mut data = Vec::new();
    for (name, shape) in cfg.weights() {
        data.push(rng.tensor(&name, &shape));
        writer.add_tensor(TensorSpec::new(name, DType::F32, shape))?;
    }
    writer.write(path, |i, _| {
        Ok(Cow::Owned(
            data[i].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ))
    })?;
    Ok(data.len())
}

#[derive(Parser, Debug)]
#[command(about = "Write, load and run a model defined in this example")]
struct Args {
    /// Where to write the .mllm file (default: a temporary directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prompt token ids (below 32), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "3,1,4,1,5")]
    prompt_ids: Vec<u32>,
    /// Greedy steps to run.
    #[arg(long, default_value_t = 4)]
    steps: usize,
}

fn run(args: Args) -> Result<()> {
    let temp;
    let path = match &args.out {
        Some(p) => p.clone(),
        None => {
            temp = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
            temp.path().join("custom.mllm")
        }
    };
    let tensors = write_model(&path)?;
    println!("wrote {} ({tensors} tensors)", path.display());

    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let mut model = Model::load_with(&path, &opts, build)?;
    let mut ids = Vec::new();
    let mut input = args.prompt_ids.clone();
    for k in 0..args.steps {
        let logits = model.step(&StepInput::single(0, input, LogitsMode::Last))?;
        let row = logits.row(0);
        let values: Vec<String> = row.iter().map(f32::to_string).collect();
        println!("logits {k}: {}", values.join(","));
        let next = row
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 {
                    (i, v)
                } else {
                    best
                }
            })
            .0 as u32;
        ids.push(next);
        input = vec![next];
    }
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("ids: {}", ids.join(","));
    Ok(())
}

fn main() -> ExitCode {
    mllm::cli::exit_code(run(Args::parse()))
}
