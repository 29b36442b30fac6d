//! Turning a plain mllm v1 file (tensors only, as mllm's own converter
//! writes them) into a self-describing one: the config, tokenizer,
//! generation config and chat template are added as metadata entries and
//! the tensor data is copied unchanged.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use mllm_core::file::{is_metadata_entry, Metadata, MllmFile, MllmWriter, TensorSpec};
use mllm_core::weights::TrackedWeights;
use mllm_core::{DType, Error, Executor, Graph, Result};
use mllm_models::config::HfConfig;
use mllm_models::registry;
use mllm_ops::cpu::CpuBackend;

use crate::model_info::{read_json, read_text, read_tokenizer, ModelInfo};

/// What `attach` adds: a Hugging Face model directory and/or single files
/// (a single file wins over the directory's).
#[derive(Clone, Debug, Default)]
pub struct AttachOptions {
    /// A model directory holding `config.json` and the optional files.
    pub hf_dir: Option<PathBuf>,
    /// `config.json` (required unless `hf_dir` is given).
    pub config: Option<PathBuf>,
    /// `tokenizer.json`.
    pub tokenizer: Option<PathBuf>,
    /// `generation_config.json`.
    pub generation_config: Option<PathBuf>,
    /// A chat template (Jinja source).
    pub chat_template: Option<PathBuf>,
}

/// What `attach` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachReport {
    /// The architecture of the config.
    pub architecture: String,
    /// Tensors copied.
    pub tensors: usize,
    /// Of those, the ones the architecture does not use (kept 1-D).
    pub unused: usize,
    /// Whether a tokenizer was embedded.
    pub tokenizer: bool,
    /// Whether a chat template was embedded.
    pub chat_template: bool,
}

/// Writes `output`: the plain mllm v1 file `input` with the metadata of
/// `opts` embedded. Every weight the config's architecture needs must be in
/// the file with the size its shape asks for; that is checked (by binding
/// the weights as a model load does) before anything is written, and the
/// file is written atomically. Fails on a file that already embeds
/// metadata.
pub fn attach(input: &Path, output: &Path, opts: &AttachOptions) -> Result<AttachReport> {
    let file = MllmFile::open(input)?;
    if file.metadata().is_some() {
        return Err(Error::InvalidInput(format!(
            "{} already embeds its metadata; attach is for plain mllm v1 files",
            input.display()
        )));
    }
    let info = gather(opts)?;
    let shapes = weight_shapes(&file, &info)?;

    let mut writer = MllmWriter::new();
    let mut meta = Metadata::new(info.architecture.clone(), info.config.clone());
    meta.generation_config = info.generation_config.clone();
    writer.metadata(meta);
    if let Some(t) = &info.tokenizer_json {
        writer.tokenizer_json(t.clone());
    }
    if let Some(t) = &info.chat_template {
        writer.chat_template(t.clone());
    }
    let mut unused = 0;
    for (name, entry) in file.entries() {
        if is_metadata_entry(name) {
            continue;
        }
        let shape = match shapes.get(name) {
            Some(shape) => shape.clone(),
            None => {
                unused += 1;
                flat_shape(name, entry.dtype, entry.len)?
            }
        };
        writer.add_tensor(TensorSpec::new(name.clone(), entry.dtype, shape))?;
    }
    writer.write(output, |_, spec| {
        let bytes = file
            .entry_bytes(&spec.name)
            .ok_or_else(|| Error::MissingTensor(spec.name.clone()))?;
        Ok(Cow::Borrowed(bytes))
    })?;
    Ok(AttachReport {
        architecture: info.architecture,
        tensors: writer.tensors().len(),
        unused,
        tokenizer: info.tokenizer_json.is_some(),
        chat_template: info.chat_template.is_some(),
    })
}

/// The model information from the options: the directory's files, each
/// replaced by the single file given for it.
fn gather(opts: &AttachOptions) -> Result<ModelInfo> {
    let mut info = match &opts.hf_dir {
        Some(dir) => ModelInfo::read_dir(dir)?,
        None if opts.config.is_some() => ModelInfo::default(),
        None => {
            return Err(Error::Config(
                "attach needs the model's config: pass --config config.json or --hf-dir DIR".into(),
            ))
        }
    };
    if let Some(config) = &opts.config {
        info.config = read_json(config)?;
        info.architecture = HfConfig::new(&info.config)?.architecture()?.to_string();
    }
    if let Some(p) = &opts.tokenizer {
        info.tokenizer_json = Some(read_tokenizer(p)?);
    }
    if let Some(p) = &opts.generation_config {
        info.generation_config = Some(read_json(p)?);
    }
    if let Some(p) = &opts.chat_template {
        info.chat_template = Some(read_text(p)?);
    }
    Ok(info)
}

/// The shape of every weight the architecture of `info` reads from `file`,
/// found by binding the model's weights to the file (which checks that
/// each is present with the size of its shape).
fn weight_shapes(file: &MllmFile, info: &ModelInfo) -> Result<IndexMap<String, Vec<usize>>> {
    mllm_models::config::check_layer_count(&info.config, file.entries().len())?;
    let model = (registry::find(&info.architecture)?.build)(&info.config)?;
    let graph = Graph::trace(model.as_ref())?;
    let recorder = TrackedWeights::new(file);
    Executor::new(graph, &CpuBackend::new(1)?, &recorder, 1)?;
    Ok(recorder.into_shapes())
}

/// A 1-D shape for a tensor the architecture does not read: its element
/// count, from its byte length and dtype.
fn flat_shape(name: &str, dtype: DType, len: u64) -> Result<Vec<usize>> {
    let len = usize::try_from(len)
        .map_err(|_| Error::InvalidInput(format!("tensor '{name}' is too large")))?;
    if !len.is_multiple_of(dtype.block_bytes()) {
        return Err(Error::InvalidInput(format!(
            "tensor '{name}': {len} bytes are not whole {dtype} blocks"
        )));
    }
    Ok(vec![len / dtype.block_bytes() * dtype.block_len()])
}
