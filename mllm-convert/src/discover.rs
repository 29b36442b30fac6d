//! Finding a model's files from the path the user gave.

use std::path::{Path, PathBuf};

use mllm_core::{Error, Result};

/// Name of the single-file weights in a Hugging Face model directory.
pub const SAFETENSORS_FILE: &str = "model.safetensors";
/// Name of the shard index of sharded weights.
pub const SAFETENSORS_INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of the model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// Where the weights of a model are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightFiles {
    /// One `.safetensors` file holding every tensor.
    Single(PathBuf),
    /// A `model.safetensors.index.json` whose `weight_map` names the shard of each tensor.
    Sharded(PathBuf),
}

/// The files of a Hugging Face model, as found by [`discover`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFiles {
    /// The directory holding `config.json` (and the optional files next to it).
    pub dir: PathBuf,
    /// The `config.json` path.
    pub config: PathBuf,
    /// The weights.
    pub weights: WeightFiles,
}

impl ModelFiles {
    /// The path of an optional file next to `config.json`, if it exists.
    pub fn optional(&self, name: &str) -> Option<PathBuf> {
        let path = self.dir.join(name);
        path.is_file().then_some(path)
    }
}

/// Finds config and weights from an input path, which may be:
///
/// - a model directory with `config.json` and either `model.safetensors` or
///   `model.safetensors.index.json` (a single file wins when both exist);
/// - a single `.safetensors` file, with `config.json` next to it;
/// - a `*.safetensors.index.json` file, with `config.json` next to it.
///
/// A missing `config.json` is an [`Error::Config`] naming the path looked at.
pub fn discover(input: &Path) -> Result<ModelFiles> {
    let meta = std::fs::metadata(input).map_err(|e| Error::io(input, e))?;
    let (dir, weights) = if meta.is_dir() {
        let single = input.join(SAFETENSORS_FILE);
        let index = input.join(SAFETENSORS_INDEX_FILE);
        let weights = if single.is_file() {
            WeightFiles::Single(single)
        } else if index.is_file() {
            WeightFiles::Sharded(index)
        } else {
            return Err(Error::InvalidInput(format!(
                "{} has neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX_FILE}",
                input.display()
            )));
        };
        (input.to_path_buf(), weights)
    } else {
        let name = input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let weights = if name.ends_with(".safetensors") {
            WeightFiles::Single(input.to_path_buf())
        } else if name.ends_with(".index.json") {
            WeightFiles::Sharded(input.to_path_buf())
        } else {
            return Err(Error::InvalidInput(format!(
                "{} is not a model directory, a .safetensors file or a .safetensors.index.json file",
                input.display()
            )));
        };
        let dir = match input.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (dir, weights)
    };
    let config = dir.join(CONFIG_FILE);
    if !config.is_file() {
        return Err(Error::Config(format!(
            "no {CONFIG_FILE} found: looked for {}",
            config.display()
        )));
    }
    Ok(ModelFiles {
        dir,
        config,
        weights,
    })
}
