//! Reading the JSON and text files that travel with the weights: config,
//! generation config, tokenizer and chat template.

use std::path::{Path, PathBuf};

use mllm_core::{Error, Result};
use mllm_models::config::HfConfig;
use serde_json::Value;

use crate::discover::{ModelFiles, CONFIG_FILE};

/// Generation defaults file next to `config.json`.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// Hugging Face tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Tokenizer settings, which may carry a `chat_template`.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Stand-alone chat template (newer checkpoints).
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Everything about a model except its tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelInfo {
    /// `config.json`, as parsed (key order kept).
    pub config: Value,
    /// The first entry of the config's `architectures`.
    pub architecture: String,
    /// `generation_config.json`, when present.
    pub generation_config: Option<Value>,
    /// The text of `tokenizer.json`, when present.
    pub tokenizer_json: Option<String>,
    /// The chat template: `chat_template.jinja`, else the `chat_template` of
    /// `tokenizer_config.json` (a string, or the `default` entry of a list of
    /// named templates).
    pub chat_template: Option<String>,
}

impl ModelInfo {
    /// Reads the config and the optional files found next to it.
    pub fn read(files: &ModelFiles) -> Result<Self> {
        Self::read_in(&files.config, &|name| files.optional(name))
    }

    /// Reads `config.json` and the optional files of a Hugging Face model
    /// directory (its weights are not needed).
    pub fn read_dir(dir: &Path) -> Result<Self> {
        let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        Self::read_in(&dir.join(CONFIG_FILE), &optional)
    }

    /// Reads `config` and the optional files `optional(name)` finds.
    fn read_in(config: &Path, optional: &dyn Fn(&str) -> Option<PathBuf>) -> Result<Self> {
        let config_path = config;
        let config = read_json(config_path)?;
        let architecture = HfConfig::new(&config)
            .map_err(|e| in_file(config_path, e))?
            .architecture()
            .map_err(|e| in_file(config_path, e))?
            .to_string();
        let generation_config = optional(GENERATION_CONFIG_FILE)
            .map(|p| read_json(&p))
            .transpose()?;
        let tokenizer_json = optional(TOKENIZER_FILE)
            .map(|p| read_tokenizer(&p))
            .transpose()?;
        let chat_template = match optional(CHAT_TEMPLATE_FILE) {
            Some(p) => Some(read_text(&p)?),
            None => match optional(TOKENIZER_CONFIG_FILE) {
                Some(p) => template_from_tokenizer_config(&read_json(&p)?),
                None => None,
            },
        };
        Ok(ModelInfo {
            config,
            architecture,
            generation_config,
            tokenizer_json,
            chat_template,
        })
    }
}

/// The `chat_template` of a `tokenizer_config.json`: a string, or from a list
/// of `{"name", "template"}` objects the one named `default`.
fn template_from_tokenizer_config(json: &Value) -> Option<String> {
    match json.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// Prefixes a config error with the file it came from.
fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::Config(msg) => Error::Config(format!("{}: {msg}", path.display())),
        other => other,
    }
}

/// The text of a `tokenizer.json`, checked to be JSON.
pub(crate) fn read_tokenizer(path: &Path) -> Result<String> {
    let text = read_text(path)?;
    serde_json::from_str::<Value>(&text)
        .map_err(|e| Error::Tokenizer(format!("{} is not valid JSON: {e}", path.display())))?;
    Ok(text)
}

pub(crate) fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = read_text(path)?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("{} is not valid JSON: {e}", path.display())))
}
