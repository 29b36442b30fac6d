//! The Llama architecture in GGUF: Hugging Face config synthesis, tensor
//! names, and the q/k row order.

use mllm_core::{Error, Result};
use serde_json::{json, Map, Value};

use super::reader::GgufFile;

/// The Hugging Face architecture name a GGUF `llama` model becomes.
pub const HF_ARCHITECTURE: &str = "LlamaForCausalLM";

/// Which rotary projection a tensor is, for the row-order fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotary {
    /// `attn_q`: rows grouped by the attention heads.
    Query,
    /// `attn_k`: rows grouped by the key/value heads.
    Key,
}

/// A GGUF tensor name translated to Hugging Face.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfTensorName {
    /// The Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Set for q/k projections, whose rows need reordering.
    pub rotary: Option<Rotary>,
}

/// Translates a GGUF Llama tensor name to its Hugging Face name.
///
/// `blocks` is the layer count: a `blk.N.` prefix with `N >= blocks` is an
/// error, and so is any name that is not part of a Llama model (for example
/// `rope_freqs.weight`, the precomputed rotary factors of Llama 3.1, which
/// the Hugging Face config cannot express).
pub fn hf_tensor_name(gguf_name: &str, blocks: u64) -> Result<HfTensorName> {
    let unknown = || {
        Error::InvalidInput(format!(
            "GGUF tensor '{gguf_name}' has no counterpart in a Hugging Face Llama model"
        ))
    };
    let (stem, suffix) = match gguf_name.rsplit_once('.') {
        Some((stem, s @ ("weight" | "bias"))) => (stem, s),
        _ => return Err(unknown()),
    };
    let plain = |name: &str| HfTensorName {
        name: format!("{name}.{suffix}"),
        rotary: None,
    };
    match stem {
        "token_embd" if suffix == "weight" => return Ok(plain("model.embed_tokens")),
        "output_norm" => return Ok(plain("model.norm")),
        "output" => return Ok(plain("lm_head")),
        "rope_freqs" => {
            return Err(Error::InvalidInput(format!(
                "GGUF tensor '{gguf_name}' (precomputed rotary frequency factors) is not supported"
            )))
        }
        _ => {}
    }
    let rest = stem.strip_prefix("blk.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: u64 = layer
        .parse()
        .ok()
        .filter(|l: &u64| l.to_string() == layer)
        .ok_or_else(unknown)?;
    if layer >= blocks {
        return Err(Error::InvalidInput(format!(
            "GGUF tensor '{gguf_name}' belongs to layer {layer}, but llama.block_count is {blocks}"
        )));
    }
    let (hf_part, rotary) = match part {
        "attn_norm" => ("input_layernorm", None),
        "attn_q" => ("self_attn.q_proj", Some(Rotary::Query)),
        "attn_k" => ("self_attn.k_proj", Some(Rotary::Key)),
        "attn_v" => ("self_attn.v_proj", None),
        "attn_output" => ("self_attn.o_proj", None),
        "ffn_norm" => ("post_attention_layernorm", None),
        "ffn_gate" => ("mlp.gate_proj", None),
        "ffn_up" => ("mlp.up_proj", None),
        "ffn_down" => ("mlp.down_proj", None),
        _ => return Err(unknown()),
    };
    Ok(HfTensorName {
        name: format!("model.layers.{layer}.{hf_part}.{suffix}"),
        rotary,
    })
}

/// The Llama hyper-parameters read from GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaParams {
    /// `llama.block_count`.
    pub blocks: u64,
    /// `llama.attention.head_count`.
    pub heads: u64,
    /// `llama.attention.head_count_kv` (defaults to `heads`).
    pub kv_heads: u64,
    /// `llama.attention.key_length`, else `embedding_length / head_count`.
    pub head_dim: u64,
}

fn positive(gguf: &GgufFile, key: &str) -> Result<u64> {
    match gguf.u64(key)? {
        0 => Err(Error::BadGguf(format!("metadata '{key}' is 0"))),
        n => Ok(n),
    }
}

impl LlamaParams {
    /// Reads and checks the attention geometry.
    pub fn read(gguf: &GgufFile) -> Result<Self> {
        let hidden = positive(gguf, "llama.embedding_length")?;
        let heads = positive(gguf, "llama.attention.head_count")?;
        let kv_heads = gguf
            .opt_u64("llama.attention.head_count_kv")?
            .unwrap_or(heads);
        let head_dim = match gguf.opt_u64("llama.attention.key_length")? {
            Some(d) => d,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => {
                return Err(Error::Config(format!(
                    "llama.embedding_length {hidden} is not a multiple of llama.attention.head_count {heads}"
                )))
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "the head dimension must be even and positive, got {head_dim}"
            )));
        }
        if let Some(v) = gguf.opt_u64("llama.attention.value_length")? {
            if v != head_dim {
                return Err(Error::Config(format!(
                    "llama.attention.value_length {v} differs from the key length {head_dim}"
                )));
            }
        }
        if let Some(r) = gguf.opt_u64("llama.rope.dimension_count")? {
            if r != head_dim {
                return Err(Error::Config(format!(
                    "llama.rope.dimension_count {r} differs from the head dimension {head_dim} (partial rotary embeddings are not supported)"
                )));
            }
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::Config(format!(
                "llama.attention.head_count ({heads}) must be a multiple of llama.attention.head_count_kv ({kv_heads})"
            )));
        }
        Ok(LlamaParams {
            blocks: positive(gguf, "llama.block_count")?,
            heads,
            kv_heads,
            head_dim,
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
    /// Whether the file has an `output.weight` (an untied head).
    pub has_output: bool,
    /// Attention projections carry biases.
    pub attention_bias: bool,
    /// MLP projections carry biases.
    pub mlp_bias: bool,
}

/// The Hugging Face `config.json` and `generation_config.json` of a GGUF
/// Llama model.
///
/// `rms_norm_eps` and `rope_theta` are the stored f32 values widened exactly
/// to f64 (so an epsilon stored as f32 1e-5 reads 9.999999747378752e-06, as
/// in the Hugging Face config made from the same file). A rope scaling type
/// other than `none` is an error, since the file does not carry enough to
/// reproduce it.
pub fn hf_configs(gguf: &GgufFile, inputs: &ConfigInputs) -> Result<(Value, Value)> {
    let p = LlamaParams::read(gguf)?;
    if let Some(kind) = gguf.opt_str("llama.rope.scaling.type")? {
        if kind != "none" {
            return Err(Error::Config(format!(
                "llama.rope.scaling.type '{kind}' is not supported"
            )));
        }
    }
    let eps = gguf
        .opt_f64("llama.attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| {
            Error::BadGguf(
                "metadata key 'llama.attention.layer_norm_rms_epsilon' is missing".into(),
            )
        })?;
    let rope_theta = gguf.opt_f64("llama.rope.freq_base")?.unwrap_or(10000.0);
    let ids = SpecialIds::read(gguf)?;
    let mut config = Map::new();
    let mut set = |k: &str, v: Value| {
        config.insert(k.to_string(), v);
    };
    set("architectures", json!([HF_ARCHITECTURE]));
    set("model_type", json!("llama"));
    set("hidden_size", json!(gguf.u64("llama.embedding_length")?));
    set(
        "intermediate_size",
        json!(positive(gguf, "llama.feed_forward_length")?),
    );
    set("num_hidden_layers", json!(p.blocks));
    set("num_attention_heads", json!(p.heads));
    set("num_key_value_heads", json!(p.kv_heads));
    set("head_dim", json!(p.head_dim));
    set("vocab_size", json!(inputs.vocab_size));
    set("rms_norm_eps", json!(eps));
    set("rope_theta", json!(rope_theta));
    set("rope_scaling", Value::Null);
    set(
        "max_position_embeddings",
        json!(positive(gguf, "llama.context_length")?),
    );
    set("tie_word_embeddings", json!(!inputs.has_output));
    set("hidden_act", json!("silu"));
    set("attention_bias", json!(inputs.attention_bias));
    set("mlp_bias", json!(inputs.mlp_bias));
    let id = |v: Option<u32>| v.map_or(Value::Null, |i| json!(i));
    set("bos_token_id", id(ids.bos));
    set("eos_token_id", id(ids.eos));
    set("pad_token_id", id(ids.pad));
    let generation = json!({ "bos_token_id": id(ids.bos), "eos_token_id": id(ids.eos) });
    Ok((Value::Object(config), generation))
}

/// The special token ids named in the tokenizer metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
}

impl SpecialIds {
    /// Reads the ids (each optional; present ones must fit in u32).
    pub fn read(gguf: &GgufFile) -> Result<Self> {
        let get = |what: &str| -> Result<Option<u32>> {
            let key = format!("tokenizer.ggml.{what}_token_id");
            gguf.opt_u64(&key)?
                .map(|v| {
                    u32::try_from(v)
                        .map_err(|_| Error::BadGguf(format!("metadata '{key}' = {v} is too large")))
                })
                .transpose()
        };
        Ok(SpecialIds {
            bos: get("bos")?,
            eos: get("eos")?,
            unk: get("unknown")?,
            pad: get("padding")?,
        })
    }
}

/// The row of the GGUF tensor that holds Hugging Face row `hf_row` of a
/// rotary projection with heads of `head_dim` rows.
///
/// Hugging Face keeps each head's rows in rotate-half order: the first half
/// of the head's rows pairs element-wise with the second half. GGUF Llama
/// files store the two halves interleaved instead (half 0 row `j` at `2j`,
/// half 1 row `j` at `2j + 1`), the order that rotates adjacent pairs.
pub fn gguf_row_of(hf_row: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let head = hf_row / head_dim;
    let within = hf_row % head_dim;
    head * head_dim + 2 * (within % half) + within / half
}

/// Reorders the rows of a GGUF q/k projection into the Hugging Face order.
///
/// Rows are moved whole (`row_bytes` each), so this works for quantized
/// rows as well: quantization blocks never cross a row.
pub fn unpermute_rows(data: &[u8], row_bytes: usize, heads: usize) -> Result<Vec<u8>> {
    let rows = data.len().checked_div(row_bytes).unwrap_or(0);
    if row_bytes == 0 || rows * row_bytes != data.len() || heads == 0 || !rows.is_multiple_of(heads)
    {
        return Err(Error::shape(
            "q/k row reordering",
            format!(
                "{} bytes are not {heads} heads of whole rows of {row_bytes} bytes",
                data.len()
            ),
        ));
    }
    let head_dim = rows / heads;
    if !head_dim.is_multiple_of(2) {
        return Err(Error::shape(
            "q/k row reordering",
            format!("{rows} rows in {heads} heads give an odd head dimension {head_dim}"),
        ));
    }
    let mut out = Vec::with_capacity(data.len());
    for hf_row in 0..rows {
        let src = gguf_row_of(hf_row, head_dim) * row_bytes;
        out.extend_from_slice(&data[src..src + row_bytes]);
    }
    Ok(out)
}
