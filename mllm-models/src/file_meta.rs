//! What a model file says about itself (architecture, config, tokenizer,
//! chat template), completed by what the caller gives for plain mllm v1
//! files and checked against it for files that embed their own.

use std::path::{Path, PathBuf};

use mllm_core::file::MllmFile;
use mllm_core::{Error, Result};
use serde_json::Value;

use crate::config::HfConfig;
use crate::LoadOptions;

/// Files that describe a plain mllm v1 model (one without embedded
/// metadata), each optional: see [`LoadOptions::read_model_files`].
#[derive(Clone, Debug, Default)]
pub struct ModelFiles {
    /// The model's `config.json`.
    pub config: Option<PathBuf>,
    /// Its `tokenizer.json`.
    pub tokenizer: Option<PathBuf>,
    /// A chat template (Jinja source).
    pub chat_template: Option<PathBuf>,
}

impl LoadOptions {
    /// Reads the given files into [`LoadOptions::config`],
    /// [`LoadOptions::tokenizer_json`] and [`LoadOptions::chat_template`];
    /// errors name the file and what it was read for.
    pub fn read_model_files(&mut self, files: &ModelFiles) -> Result<()> {
        let read = |path: &Path, what: &str| {
            std::fs::read_to_string(path)
                .map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))
        };
        if let Some(path) = &files.config {
            let text = read(path, "config")?;
            let value = serde_json::from_str(&text).map_err(|e| {
                Error::Config(format!("config {}: not valid JSON: {e}", path.display()))
            })?;
            self.config = Some(value);
        }
        if let Some(path) = &files.tokenizer {
            self.tokenizer_json = Some(read(path, "tokenizer")?);
        }
        if let Some(path) = &files.chat_template {
            self.chat_template = Some(read(path, "chat template")?);
        }
        Ok(())
    }
}

/// The architecture and `config.json` a model loads with: the embedded ones,
/// or the given config for a file without metadata. A config given for a
/// file with metadata must agree with it (same architecture, same integer
/// fields such as sizes and counts); any contradiction is an error naming
/// the field.
pub(crate) fn config(file: &MllmFile, opts: &LoadOptions) -> Result<(String, Value)> {
    let path = file.path().display();
    match (&opts.config, file.metadata()) {
        (None, Some(meta)) => Ok((meta.architecture.clone(), meta.config.clone())),
        (Some(given), None) => {
            let architecture = HfConfig::new(given)?.architecture()?.to_string();
            Ok((architecture, given.clone()))
        }
        (Some(given), Some(meta)) => {
            let architecture = HfConfig::new(given)?.architecture()?;
            if architecture != meta.architecture {
                return Err(Error::Config(format!(
                    "the given config.json contradicts the metadata embedded in {path}: \
                     it names architecture {architecture}, the file {}",
                    meta.architecture
                )));
            }
            if let Some((key, embedded, ours)) = first_integer_difference(&meta.config, given) {
                return Err(Error::Config(format!(
                    "the given config.json contradicts the metadata embedded in {path}: \
                     '{key}' is {ours} in it and {embedded} in the file"
                )));
            }
            Ok((meta.architecture.clone(), meta.config.clone()))
        }
        (None, None) => Err(Error::Config(format!(
            "{path} is a plain mllm v1 file with no embedded metadata: pass the model's \
             config.json (--config on the command line, LoadOptions::config in code)"
        ))),
    }
}

/// The first top-level integer field (a size, a count) that both configs
/// have with different values: `(key, first's value, second's value)`.
fn first_integer_difference(a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    let (a, b) = (a.as_object()?, b.as_object()?);
    a.iter().find_map(|(key, va)| {
        let vb = b.get(key)?;
        (va.is_i64() && vb.is_i64() && va != vb).then(|| (key.clone(), va.clone(), vb.clone()))
    })
}

/// An embedded text (tokenizer, chat template) or the given one: a given
/// text for a file that embeds a different one is an error naming `what`.
pub(crate) fn text<'a>(
    file: &MllmFile,
    embedded: Option<&'a str>,
    given: Option<&'a str>,
    what: &str,
) -> Result<Option<&'a str>> {
    match (embedded, given) {
        (Some(e), Some(g)) if e != g => Err(Error::Config(format!(
            "the given {what} differs from the one embedded in {}",
            file.path().display()
        ))),
        (Some(e), _) => Ok(Some(e)),
        (None, g) => Ok(g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integer_fields_that_differ_are_found_and_others_ignored() {
        let a = json!({"hidden_size": 64, "rope_theta": 10000.0, "torch_dtype": "f32", "x": 1});
        let b = json!({"hidden_size": 64, "rope_theta": 500000.0, "torch_dtype": "bf16"});
        assert_eq!(first_integer_difference(&a, &b), None);
        let c = json!({"hidden_size": 32});
        assert_eq!(
            first_integer_difference(&a, &c),
            Some(("hidden_size".into(), json!(64), json!(32)))
        );
    }
}
