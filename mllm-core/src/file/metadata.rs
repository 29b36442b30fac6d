//! The JSON metadata embedded in `.mllm` files written by mllm-rs.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Version of the metadata layout written by this crate.
pub const FORMAT_VERSION: u32 = 1;

/// What a `.mllm` file says about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Metadata layout version ([`FORMAT_VERSION`] when written here).
    pub format_version: u32,
    /// Architecture name as in Hugging Face `config.json` (e.g. `LlamaForCausalLM`).
    pub architecture: String,
    /// The model's Hugging Face `config.json`.
    pub config: serde_json::Value,
    /// The model's `generation_config.json`, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_config: Option<serde_json::Value>,
    /// The shape of every tensor in the file, by name (filled in by the writer).
    #[serde(default)]
    pub tensors: IndexMap<String, Vec<usize>>,
}

impl Metadata {
    /// Metadata for an architecture and its config; tensor shapes are added by the writer.
    pub fn new(architecture: impl Into<String>, config: serde_json::Value) -> Self {
        Metadata {
            format_version: FORMAT_VERSION,
            architecture: architecture.into(),
            config,
            generation_config: None,
            tensors: IndexMap::new(),
        }
    }

    /// Parses the metadata entry's bytes.
    pub fn from_json_bytes(entry: &str, bytes: &[u8]) -> Result<Self> {
        let meta: Metadata = serde_json::from_slice(bytes).map_err(|e| Error::BadMetadata {
            entry: entry.to_string(),
            detail: e.to_string(),
        })?;
        if meta.format_version == 0 || meta.format_version > FORMAT_VERSION {
            return Err(Error::BadMetadata {
                entry: entry.to_string(),
                detail: format!(
                    "format_version {} is not supported (this build reads 1..={FORMAT_VERSION})",
                    meta.format_version
                ),
            });
        }
        Ok(meta)
    }

    /// Serializes to compact JSON (deterministic: fields and maps keep their order).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("metadata serializes: all keys are strings")
    }
}
