//! Reading Hugging Face `config.json` fields with clear errors.

use mllm_core::op::Activation;
use mllm_core::{Error, Result};
use serde_json::Value;

/// The activation a Hugging Face `hidden_act` / `activation_function` name denotes.
pub fn activation(name: &str) -> Result<Activation> {
    match name {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
        "gelu" => Ok(Activation::Gelu),
        "relu" => Ok(Activation::Relu),
        other => Err(Error::Config(format!(
            "activation '{other}' is not supported (silu, gelu, gelu_new, gelu_pytorch_tanh, relu)"
        ))),
    }
}

/// Typed access to a Hugging Face config object.
pub struct HfConfig<'a> {
    json: &'a Value,
}

impl<'a> HfConfig<'a> {
    /// Wraps a parsed `config.json`; it must be a JSON object.
    pub fn new(json: &'a Value) -> Result<Self> {
        if !json.is_object() {
            return Err(Error::Config("config.json must be a JSON object".into()));
        }
        Ok(HfConfig { json })
    }

    /// The raw value of `key`, treating JSON null as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    /// A required positive integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| Error::Config(format!("missing '{key}'")))
    }

    /// An optional non-negative integer.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                Error::Config(format!("'{key}' must be a non-negative integer, got {v}"))
            }),
        }
    }

    /// An optional number.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("'{key}' must be a number, got {v}"))),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("'{key}' must be true or false, got {v}"))),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("'{key}' must be a string, got {v}"))),
        }
    }

    /// A nested object (e.g. `rope_scaling`), when present.
    pub fn sub(&self, key: &str) -> Result<Option<HfConfig<'a>>> {
        self.get(key).map(HfConfig::new).transpose()
    }

    /// Token ids given as a number or a list of numbers (`eos_token_id`).
    pub fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let bad = || Error::Config(format!("'{key}' must be a token id or a list of ids"));
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(bad)
                })
                .collect(),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(|n| vec![n])
                .ok_or_else(bad),
        }
    }

    /// The first entry of `architectures`.
    pub fn architecture(&self) -> Result<&'a str> {
        self.get("architectures")
            .and_then(|a| a.as_array())
            .and_then(|a| a.first())
            .and_then(|a| a.as_str())
            .ok_or_else(|| {
                Error::Config("missing 'architectures' (e.g. [\"LlamaForCausalLM\"])".into())
            })
    }
}

/// The keys architectures read their layer count from.
const LAYER_COUNT_KEYS: [&str; 3] = ["num_hidden_layers", "n_layer", "num_layers"];

/// Checks that the layer count a config asks for (`num_hidden_layers`,
/// `n_layer` or `num_layers`) is at most `tensors`, the number of tensors
/// the weights hold: every layer needs at least one, so a larger count
/// cannot be backed by the file, and it is refused before anything is
/// built for it.
pub fn check_layer_count(config: &serde_json::Value, tensors: usize) -> Result<()> {
    for key in LAYER_COUNT_KEYS {
        if let Some(n) = config.get(key).and_then(serde_json::Value::as_u64) {
            if n > tensors as u64 {
                return Err(Error::Config(format!(
                    "config '{key}' is {n}, but the weights hold only {tensors} tensors"
                )));
            }
        }
    }
    Ok(())
}
