//! GGUF → `.mllm`: tensors kept as stored, config and tokenizer rebuilt.

use std::borrow::Cow;
use std::path::Path;

use mllm_core::file::{Metadata, MllmWriter, TensorSpec};
use mllm_core::{DType, Error, Result};
use mllm_models::registry::{self, TensorAction};

use super::arch::{self, GgufArch, Rotary};
use super::config::{hf_configs, AttentionParams, ConfigInputs};
use super::reader::{GgufFile, GgufTensor};
use super::rotary::unpermute_rows;
use super::tokenizer::tokenizer_json;
use crate::convert::{progress_bar, ConvertOptions, ConvertReport};
use crate::source::natural_cmp;

/// What the import changes in a tensor's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fix {
    /// Copied as stored.
    None,
    /// q/k rows reordered from llama.cpp's interleaved rotary order (the
    /// projection's head count).
    Unpermute(usize),
    /// An f32 norm weight stored as `1 + w`: 1 is subtracted.
    MinusOne,
}

/// One tensor to write: its spec, its GGUF bytes and what to change in them.
struct Planned<'a> {
    spec: TensorSpec,
    tensor: GgufTensor<'a>,
    fix: Fix,
}

/// Converts the GGUF file `input` into the `.mllm` file `output`.
///
/// The architectures are those of [`arch::ARCHITECTURES`] (`llama`, `qwen2`,
/// `qwen3`, `phi3`, `gemma`, `gpt2`). Every tensor keeps its stored type
/// and bytes (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
/// Q6_K; any other type is an error naming it and the tensor), except what
/// llama.cpp's converter changed: the rows of Llama q/k projections are
/// reordered into the Hugging Face rotary layout, Gemma's norm weights
/// (stored as `1 + w`) get 1 subtracted, and GPT-2's copy of the token
/// embedding as `output.weight` is dropped (the head is tied). GGUF stores
/// every matrix `[out, in]`, the layout of the `.mllm` models, so GPT-2's
/// Conv1D weights need no transposing. Tensors get their Hugging Face names
/// and shapes, the config and generation config are synthesized from the
/// metadata, the tokenizer is rebuilt as a `tokenizer.json`, and
/// `tokenizer.chat_template` becomes the chat template. Only
/// `opts.dtype == F32` (the default) is accepted: a GGUF is not
/// re-quantized here.
///
/// The report's `dtype` is the most common type among the matrices.
pub fn import_gguf(input: &Path, output: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    if opts.dtype != DType::F32 {
        return Err(Error::InvalidInput(format!(
            "--dtype {} does not apply to GGUF input: GGUF tensors are kept as stored \
             (re-quantizing is the job of the separate `quantize` command)",
            opts.dtype
        )));
    }
    let gguf = GgufFile::open(input)?;
    let gguf_arch = arch::find(gguf.str("general.architecture")?)?;
    let params = AttentionParams::read(&gguf, gguf_arch)?;
    let tokenizer = tokenizer_json(&gguf)?;
    let chat_template = gguf.opt_str("tokenizer.chat_template")?.map(str::to_string);

    let tied_copy = tied_head_copy(&gguf, gguf_arch)?;
    let mut plan = Vec::new();
    let mut has_output = false;
    let mut attention_bias = false;
    let mut mlp_bias = false;
    let mut embed_shape = None;
    let model_arch = registry::find(gguf_arch.hf_architecture)?;
    for name in gguf.tensors().keys() {
        if tied_copy && name == "output.weight" {
            continue;
        }
        let hf = gguf_arch.hf_tensor_name(name, params.blocks)?;
        let tensor = gguf.tensor(name)?;
        has_output |= hf.name == "lm_head.weight";
        attention_bias |= hf.name.ends_with(".bias") && hf.name.contains(".self_attn.");
        mlp_bias |= hf.name.ends_with(".bias") && hf.name.contains(".mlp.");
        if name == "token_embd.weight" {
            embed_shape = Some(tensor.shape.clone());
        }
        let fix = if let Some(rotary) = hf.rotary {
            let heads = params.heads_of(rotary) as usize;
            check_rotary_rows(&tensor, heads, params.head_dim as usize, rotary)?;
            Fix::Unpermute(heads)
        } else if hf.plus_one {
            if tensor.dtype != DType::F32 {
                return Err(Error::UnsupportedDType(format!(
                    "tensor '{name}': a {} norm weight is stored as 1 + w, which the import \
                     undoes in f32 only, not in {}",
                    gguf_arch.name, tensor.dtype
                )));
            }
            Fix::MinusOne
        } else {
            Fix::None
        };
        // GGUF matrices are [out, in] already: a checkpoint stored [in, out]
        // (the reason for `Transpose`) is not what this file holds.
        let mllm_name = match (model_arch.map_tensor)(&hf.name) {
            TensorAction::Skip => continue,
            TensorAction::Keep(n) | TensorAction::Transpose(n) => n,
        };
        plan.push(Planned {
            spec: TensorSpec::new(mllm_name, tensor.dtype, tensor.shape.clone()),
            tensor,
            fix,
        });
    }
    if plan.is_empty() {
        return Err(Error::InvalidInput(format!(
            "{} holds no tensors to convert",
            input.display()
        )));
    }
    let embed = embed_shape.ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let vocab_size = match gguf.opt_strings("tokenizer.ggml.tokens")? {
        Some(tokens) => tokens.len(),
        None => embed[0],
    };
    if embed[0] != vocab_size || embed.len() != 2 {
        return Err(Error::shape(
            "token_embd.weight",
            format!("shape {embed:?} does not match a vocabulary of {vocab_size} tokens"),
        ));
    }
    let (config, generation) = hf_configs(
        &gguf,
        gguf_arch,
        &ConfigInputs {
            vocab_size,
            has_output,
            attention_bias,
            mlp_bias,
        },
    )?;
    // Building the model checks that the synthesized config is usable.
    mllm_models::config::check_layer_count(&config, gguf.tensors().len())?;
    (model_arch.build)(&config)?;
    plan.sort_by(|a, b| natural_cmp(&a.spec.name, &b.spec.name));

    let mut meta = Metadata::new(gguf_arch.hf_architecture, config);
    meta.generation_config = Some(generation);
    let mut writer = MllmWriter::new();
    writer.metadata(meta);
    if let Some(t) = &tokenizer {
        writer.tokenizer_json(t.as_str());
    }
    if let Some(t) = &chat_template {
        writer.chat_template(t.as_str());
    }
    let mut tensor_bytes = 0u64;
    for p in &plan {
        tensor_bytes += p.tensor.data.len() as u64;
        writer.add_tensor(p.spec.clone())?;
    }

    let bar = progress_bar(tensor_bytes, opts.progress);
    let result = writer.write(output, |i, spec| {
        let p = &plan[i];
        bar.set_message(spec.name.clone());
        let bytes = match p.fix {
            Fix::None => Cow::Borrowed(p.tensor.data),
            Fix::Unpermute(heads) => {
                Cow::Owned(unpermute_rows(p.tensor.data, p.tensor.row_bytes, heads)?)
            }
            Fix::MinusOne => Cow::Owned(minus_one(p.tensor.data)),
        };
        bar.inc(bytes.len() as u64);
        Ok(bytes)
    });
    bar.finish_and_clear();
    result?;

    let bytes_written = std::fs::metadata(output)
        .map_err(|e| Error::io(output, e))?
        .len();
    Ok(ConvertReport {
        architecture: gguf_arch.hf_architecture.to_string(),
        output: output.to_path_buf(),
        dtype: dominant_matrix_dtype(&plan),
        tensors: plan.len(),
        skipped: gguf.tensors().len() - plan.len(),
        fallbacks: 0,
        tensor_bytes,
        bytes_written,
        tokenizer: tokenizer.is_some(),
        chat_template: chat_template.is_some(),
    })
}

/// Whether `output.weight` is llama.cpp's copy of the token embedding for
/// an architecture that ties them (same type, shape and bytes).
fn tied_head_copy(gguf: &GgufFile, arch: &GgufArch) -> Result<bool> {
    let has = |name: &str| gguf.tensors().contains_key(name);
    if !arch.copies_tied_head || !has("output.weight") || !has("token_embd.weight") {
        return Ok(false);
    }
    let (head, embed) = (
        gguf.tensor("output.weight")?,
        gguf.tensor("token_embd.weight")?,
    );
    Ok(head.dtype == embed.dtype && head.shape == embed.shape && head.data == embed.data)
}

/// Little-endian f32 values with 1 subtracted from each.
fn minus_one(data: &[u8]) -> Vec<u8> {
    data.as_chunks::<4>()
        .0
        .iter()
        .flat_map(|b| (f32::from_le_bytes(*b) - 1.0).to_le_bytes())
        .collect()
}

/// Checks that a q/k projection has `heads × head_dim` rows.
fn check_rotary_rows(
    t: &GgufTensor<'_>,
    heads: usize,
    head_dim: usize,
    rotary: Rotary,
) -> Result<()> {
    let rows = t.shape[0];
    if rows != heads * head_dim {
        let what = match rotary {
            Rotary::Key => "key/value heads",
            Rotary::Query => "attention heads",
        };
        return Err(Error::shape(
            format!("tensor '{}'", t.name),
            format!("{rows} rows, expected {heads} {what} of {head_dim}"),
        ));
    }
    Ok(())
}

/// The most common type among tensors of rank 2 and more (F32 when none).
fn dominant_matrix_dtype(plan: &[Planned<'_>]) -> DType {
    let mut counts: Vec<(DType, usize)> = Vec::new();
    for p in plan.iter().filter(|p| p.spec.shape.len() >= 2) {
        match counts.iter_mut().find(|(d, _)| *d == p.spec.dtype) {
            Some((_, n)) => *n += 1,
            None => counts.push((p.spec.dtype, 1)),
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or(DType::F32, |(d, _)| d)
}
