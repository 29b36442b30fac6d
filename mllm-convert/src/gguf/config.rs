//! The Hugging Face `config.json` and `generation_config.json` of a GGUF
//! model, synthesized from its `<arch>.*` metadata.

use mllm_core::{Error, Result};
use serde_json::{json, Map, Value};

use super::arch::{GgufArch, Rotary};
use super::reader::GgufFile;
use super::tokenizer::SpecialIds;

/// The attention geometry read from GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    /// `<arch>.block_count`.
    pub blocks: u64,
    /// `<arch>.attention.head_count`.
    pub heads: u64,
    /// `<arch>.attention.head_count_kv` (defaults to `heads`).
    pub kv_heads: u64,
    /// `<arch>.attention.key_length`, else `embedding_length / head_count`.
    pub head_dim: u64,
    /// `<arch>.rope.dimension_count` (defaults to `head_dim`): the leading
    /// dimensions of each head that rotate.
    pub rope_dims: u64,
}

fn positive(gguf: &GgufFile, key: &str) -> Result<u64> {
    match gguf.u64(key)? {
        0 => Err(Error::BadGguf(format!("metadata '{key}' is 0"))),
        n => Ok(n),
    }
}

impl AttentionParams {
    /// Reads and checks the attention geometry of `arch`. Only Phi-3 may
    /// rotate fewer dimensions than a head has.
    pub fn read(gguf: &GgufFile, arch: &GgufArch) -> Result<Self> {
        let key = |k: &str| arch.key(k);
        let hidden = positive(gguf, &key("embedding_length"))?;
        let heads = positive(gguf, &key("attention.head_count"))?;
        let kv_heads = gguf
            .opt_u64(&key("attention.head_count_kv"))?
            .unwrap_or(heads);
        let head_dim = match gguf.opt_u64(&key("attention.key_length"))? {
            Some(d) => d,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => {
                return Err(Error::Config(format!(
                    "{} {hidden} is not a multiple of {} {heads}",
                    key("embedding_length"),
                    key("attention.head_count")
                )))
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "the head dimension must be even and positive, got {head_dim}"
            )));
        }
        if let Some(v) = gguf.opt_u64(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(Error::Config(format!(
                    "{} {v} differs from the key length {head_dim}",
                    key("attention.value_length")
                )));
            }
        }
        let rope_dims = gguf
            .opt_u64(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        let partial_ok = arch.name == "phi3" && rope_dims > 0 && rope_dims.is_multiple_of(2);
        if rope_dims != head_dim && !(partial_ok && rope_dims < head_dim) {
            return Err(Error::Config(format!(
                "{} {rope_dims} differs from the head dimension {head_dim} (partial rotary embeddings are supported for phi3 only)",
                key("rope.dimension_count")
            )));
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::Config(format!(
                "{} ({heads}) must be a multiple of {} ({kv_heads})",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        Ok(AttentionParams {
            blocks: positive(gguf, &key("block_count"))?,
            heads,
            kv_heads,
            head_dim,
            rope_dims,
        })
    }

    /// Heads of a rotary projection.
    pub fn heads_of(&self, rotary: Rotary) -> u64 {
        match rotary {
            Rotary::Query => self.heads,
            Rotary::Key => self.kv_heads,
        }
    }
}

/// What the config needs besides the metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigInputs {
    /// Vocabulary size (the token list length).
    pub vocab_size: usize,
    /// Whether the model has its own output head (not the token embedding).
    pub has_output: bool,
    /// Attention projections carry biases.
    pub attention_bias: bool,
    /// MLP projections carry biases.
    pub mlp_bias: bool,
}

/// The Hugging Face `config.json` and `generation_config.json` of a GGUF
/// model of architecture `arch`.
///
/// Norm epsilons and `rope_theta` are the stored f32 values widened exactly
/// to f64 (so an epsilon stored as f32 1e-5 reads 9.999999747378752e-06, as
/// in the Hugging Face config made from the same file). A rope scaling type
/// other than `none` is an error, since the file does not carry enough to
/// reproduce it.
pub fn hf_configs(
    gguf: &GgufFile,
    arch: &GgufArch,
    inputs: &ConfigInputs,
) -> Result<(Value, Value)> {
    let key = |k: &str| arch.key(k);
    if let Some(kind) = gguf.opt_str(&key("rope.scaling.type"))? {
        if kind != "none" {
            return Err(Error::Config(format!(
                "{} '{kind}' is not supported",
                key("rope.scaling.type")
            )));
        }
    }
    let ids = SpecialIds::read(gguf)?;
    let id = |v: Option<u32>| v.map_or(Value::Null, |i| json!(i));
    let mut config = Map::new();
    let mut set = |k: &str, v: Value| {
        config.insert(k.to_string(), v);
    };
    set("architectures", json!([arch.hf_architecture]));
    set("model_type", json!(arch.model_type));
    set("vocab_size", json!(inputs.vocab_size));
    set("tie_word_embeddings", json!(!inputs.has_output));
    set("bos_token_id", id(ids.bos));
    set("eos_token_id", id(ids.eos));
    set("pad_token_id", id(ids.pad));
    if arch.name == "gpt2" {
        gpt2_config(gguf, arch, &mut set)?;
    } else {
        decoder_config(gguf, arch, inputs, &mut set)?;
    }
    let generation = json!({ "bos_token_id": id(ids.bos), "eos_token_id": id(ids.eos) });
    Ok((Value::Object(config), generation))
}

/// A required f32 metadata value, widened to f64.
fn required_f64(gguf: &GgufFile, key: &str) -> Result<f64> {
    gguf.opt_f64(key)?
        .ok_or_else(|| Error::BadGguf(format!("metadata key '{key}' is missing")))
}

/// The keys of the Llama-like decoders (llama, qwen2, qwen3, phi3, gemma).
fn decoder_config(
    gguf: &GgufFile,
    arch: &GgufArch,
    inputs: &ConfigInputs,
    set: &mut impl FnMut(&str, Value),
) -> Result<()> {
    let key = |k: &str| arch.key(k);
    let p = AttentionParams::read(gguf, arch)?;
    let context = positive(gguf, &key("context_length"))?;
    set("hidden_size", json!(gguf.u64(&key("embedding_length"))?));
    set(
        "intermediate_size",
        json!(positive(gguf, &key("feed_forward_length"))?),
    );
    set("num_hidden_layers", json!(p.blocks));
    set("num_attention_heads", json!(p.heads));
    set("num_key_value_heads", json!(p.kv_heads));
    set("head_dim", json!(p.head_dim));
    set(
        "rms_norm_eps",
        json!(required_f64(
            gguf,
            &key("attention.layer_norm_rms_epsilon")
        )?),
    );
    set(
        "rope_theta",
        json!(gguf.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0)),
    );
    set("rope_scaling", Value::Null);
    set("max_position_embeddings", json!(context));
    set("attention_bias", json!(inputs.attention_bias));
    set("mlp_bias", json!(inputs.mlp_bias));
    match arch.name {
        "gemma" => {
            set("hidden_act", json!("gelu_pytorch_tanh"));
            set("hidden_activation", json!("gelu_pytorch_tanh"));
        }
        "phi3" => {
            set("hidden_act", json!("silu"));
            set(
                "partial_rotary_factor",
                json!(p.rope_dims as f64 / p.head_dim as f64),
            );
            let original = gguf
                .opt_u64(&key("rope.scaling.original_context_length"))?
                .unwrap_or(context);
            set("original_max_position_embeddings", json!(original));
            let window = gguf.opt_u64(&key("attention.sliding_window"))?;
            set("sliding_window", window.map_or(Value::Null, |w| json!(w)));
        }
        "qwen2" => {
            set("hidden_act", json!("silu"));
            set("use_sliding_window", json!(false));
            set("sliding_window", Value::Null);
        }
        _ => set("hidden_act", json!("silu")),
    }
    Ok(())
}

/// GPT-2's keys.
fn gpt2_config(gguf: &GgufFile, arch: &GgufArch, set: &mut impl FnMut(&str, Value)) -> Result<()> {
    let key = |k: &str| arch.key(k);
    let hidden = positive(gguf, &key("embedding_length"))?;
    let heads = positive(gguf, &key("attention.head_count"))?;
    if !hidden.is_multiple_of(heads) {
        return Err(Error::Config(format!(
            "{} {hidden} is not a multiple of {} {heads}",
            key("embedding_length"),
            key("attention.head_count")
        )));
    }
    set("n_embd", json!(hidden));
    set("n_head", json!(heads));
    set("n_layer", json!(positive(gguf, &key("block_count"))?));
    set(
        "n_positions",
        json!(positive(gguf, &key("context_length"))?),
    );
    set(
        "n_inner",
        json!(positive(gguf, &key("feed_forward_length"))?),
    );
    set(
        "layer_norm_epsilon",
        json!(required_f64(gguf, &key("attention.layer_norm_epsilon"))?),
    );
    set("activation_function", json!("gelu_new"));
    set("scale_attn_weights", json!(true));
    Ok(())
}
