//! Memory-mapped reading of safetensors weights, single-file or sharded.

use std::cmp::Ordering;
use std::path::{Component, Path, PathBuf};

use indexmap::IndexMap;
use mllm_core::file::MappedFile;
use mllm_core::{DType, Error, Result};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::discover::WeightFiles;

/// The memory maps of every safetensors file of a model.
///
/// Tensors are borrowed from these maps by [`SourceWeights::tensors`], so a
/// conversion reads each tensor straight from the page cache.
#[derive(Debug)]
pub struct SourceWeights {
    /// `(path, map)` of each file, in the order the shards are first named.
    shards: Vec<(PathBuf, MappedFile)>,
    /// For sharded weights: tensor name to index into `shards`, as in `weight_map`.
    weight_map: Option<IndexMap<String, usize>>,
}

/// One tensor of the source weights, borrowed from its file's map.
#[derive(Clone, Debug)]
pub struct SourceTensor<'a> {
    /// Name in the source (Hugging Face) checkpoint.
    pub name: String,
    /// Element type, as the safetensors header says.
    pub dtype: Dtype,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// The raw little-endian bytes.
    pub data: &'a [u8],
    /// The file it lives in.
    pub file: &'a Path,
}

impl SourceTensor<'_> {
    /// The element type as an mllm [`DType`]; only F32, F16 and BF16 are read.
    pub fn mllm_dtype(&self) -> Result<DType> {
        match self.dtype {
            Dtype::F32 => Ok(DType::F32),
            Dtype::F16 => Ok(DType::F16),
            Dtype::BF16 => Ok(DType::BF16),
            other => Err(Error::UnsupportedDType(format!(
                "tensor '{}' in {} has dtype {other:?}; the converter reads F32, F16 and BF16",
                self.name,
                self.file.display()
            ))),
        }
    }
}

/// The `model.safetensors.index.json` fields the converter uses.
#[derive(Deserialize)]
struct ShardIndex {
    weight_map: IndexMap<String, String>,
}

/// A shard file name from `weight_map`: a relative path that stays inside the
/// index's directory.
fn shard_path(dir: &Path, index: &Path, shard: &str) -> Result<PathBuf> {
    let rel = Path::new(shard);
    if shard.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(Error::InvalidInput(format!(
            "{}: shard file name '{shard}' must be a relative path inside the model directory",
            index.display()
        )));
    }
    Ok(dir.join(rel))
}

impl SourceWeights {
    /// Maps the weight files (for sharded weights: every shard named in `weight_map`).
    pub fn open(weights: &WeightFiles) -> Result<Self> {
        match weights {
            WeightFiles::Single(path) => Ok(SourceWeights {
                shards: vec![(path.clone(), MappedFile::open(path)?)],
                weight_map: None,
            }),
            WeightFiles::Sharded(index) => {
                let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
                let parsed: ShardIndex = serde_json::from_str(&text).map_err(|e| {
                    Error::InvalidInput(format!(
                        "{} is not a valid safetensors index: {e}",
                        index.display()
                    ))
                })?;
                let dir = match index.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                let mut files: IndexMap<String, ()> = IndexMap::new();
                let mut weight_map = IndexMap::with_capacity(parsed.weight_map.len());
                for (name, shard) in parsed.weight_map {
                    let (i, _) = files.insert_full(shard, ());
                    weight_map.insert(name, i);
                }
                let shards = files
                    .keys()
                    .map(|shard| {
                        let path = shard_path(&dir, index, shard)?;
                        let map = MappedFile::open(&path)?;
                        Ok((path, map))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(SourceWeights {
                    shards,
                    weight_map: Some(weight_map),
                })
            }
        }
    }

    /// Every tensor, validated by the safetensors parser and sorted by name
    /// (numbers in names compare by value, so `layers.2` precedes `layers.10`).
    ///
    /// For sharded weights these are exactly the tensors of `weight_map`; one
    /// that is not in its shard is an [`Error::MissingTensor`].
    pub fn tensors(&self) -> Result<Vec<SourceTensor<'_>>> {
        let parsed = self
            .shards
            .iter()
            .map(|(path, map)| {
                SafeTensors::deserialize(map)
                    .map(|st| (path.as_path(), st))
                    .map_err(|e| {
                        Error::InvalidInput(format!(
                            "{} is not a valid safetensors file: {e}",
                            path.display()
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut out = Vec::new();
        match &self.weight_map {
            None => {
                for (path, st) in &parsed {
                    for (name, view) in st.iter() {
                        out.push(SourceTensor {
                            name: name.to_string(),
                            dtype: view.dtype(),
                            shape: view.shape().to_vec(),
                            data: view.data(),
                            file: path,
                        });
                    }
                }
            }
            Some(weight_map) => {
                for (name, &shard) in weight_map {
                    let (path, st) = &parsed[shard];
                    let view = st.tensor(name).map_err(|_| {
                        // The message reads: missing tensor 'NAME' in 'SHARD'.
                        Error::MissingTensor(format!(
                            "{name}' in '{}",
                            path.file_name().unwrap_or_default().to_string_lossy()
                        ))
                    })?;
                    out.push(SourceTensor {
                        name: name.clone(),
                        dtype: view.dtype(),
                        shape: view.shape().to_vec(),
                        data: view.data(),
                        file: path,
                    });
                }
            }
        }
        out.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        Ok(out)
    }
}

/// Orders names with embedded numbers by value (`a.2.b` < `a.10.b`), falling
/// back to plain byte order so the order is total and deterministic.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    while !x.is_empty() && !y.is_empty() {
        let (cx, rx) = split_run(x);
        let (cy, ry) = split_run(y);
        let ord = if cx[0].is_ascii_digit() && cy[0].is_ascii_digit() {
            let tx = trim_zeros(cx);
            let ty = trim_zeros(cy);
            tx.len().cmp(&ty.len()).then_with(|| tx.cmp(ty))
        } else {
            cx.cmp(cy)
        };
        if ord != Ordering::Equal {
            return ord;
        }
        x = rx;
        y = ry;
    }
    x.len().cmp(&y.len()).then_with(|| a.cmp(b))
}

/// Splits off the leading run of all-digit or all-non-digit bytes.
fn split_run(s: &[u8]) -> (&[u8], &[u8]) {
    let digit = s[0].is_ascii_digit();
    let end = s
        .iter()
        .position(|c| c.is_ascii_digit() != digit)
        .unwrap_or(s.len());
    s.split_at(end)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&c| c != b'0').unwrap_or(s.len());
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let mut names = vec![
            "model.layers.10.mlp",
            "model.layers.2.mlp",
            "lm_head.weight",
            "model.layers.1.mlp",
            "model.layers.01.mlp",
            "model.layers.2.attn",
            "model.layers",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "lm_head.weight",
                "model.layers",
                "model.layers.01.mlp",
                "model.layers.1.mlp",
                "model.layers.2.attn",
                "model.layers.2.mlp",
                "model.layers.10.mlp",
            ]
        );
    }
}
