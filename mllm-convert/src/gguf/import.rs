//! GGUF → `.mllm`: tensors kept as stored, config and tokenizer rebuilt.

use std::borrow::Cow;
use std::path::Path;

use mllm_core::file::{Metadata, MllmWriter, TensorSpec};
use mllm_core::{DType, Error, Result};
use mllm_models::registry::{self, TensorAction};

use super::llama::{self, ConfigInputs, LlamaParams, Rotary};
use super::reader::{GgufFile, GgufTensor};
use super::tokenizer::tokenizer_json;
use crate::convert::{progress_bar, ConvertOptions, ConvertReport};
use crate::source::natural_cmp;

/// One tensor to write: its spec, its GGUF bytes, and the q/k heads when its
/// rows need reordering.
struct Planned<'a> {
    spec: TensorSpec,
    tensor: GgufTensor<'a>,
    rotary_heads: Option<usize>,
}

/// Converts the GGUF file `input` into the `.mllm` file `output`.
///
/// Every tensor keeps its stored type and bytes (F32, F16, BF16, Q4_0, Q4_1,
/// Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; any other type is an error naming it and the tensor);
/// only the rows of Llama q/k projections are reordered into the Hugging
/// Face rotary layout. Tensors get their Hugging Face names and shapes, the
/// config and generation config are synthesized from the metadata, the
/// tokenizer is rebuilt as a `tokenizer.json`, and `tokenizer.chat_template`
/// becomes the chat template. Only `opts.dtype == F32` (the default) is
/// accepted: a GGUF is not re-quantized here.
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
    let arch_name = gguf.str("general.architecture")?;
    if arch_name != "llama" {
        return Err(Error::UnsupportedArchitecture(format!(
            "{arch_name} (GGUF general.architecture; this build imports llama)"
        )));
    }
    let params = LlamaParams::read(&gguf)?;
    let tokenizer = tokenizer_json(&gguf)?;
    let chat_template = gguf.opt_str("tokenizer.chat_template")?.map(str::to_string);

    let mut plan = Vec::new();
    let mut has_output = false;
    let mut attention_bias = false;
    let mut mlp_bias = false;
    let mut embed_shape = None;
    let arch = registry::find(llama::HF_ARCHITECTURE)?;
    for name in gguf.tensors().keys() {
        let hf = llama::hf_tensor_name(name, params.blocks)?;
        let tensor = gguf.tensor(name)?;
        has_output |= hf.name == "lm_head.weight";
        attention_bias |= hf.name.ends_with(".bias") && hf.name.contains(".self_attn.");
        mlp_bias |= hf.name.ends_with(".bias") && hf.name.contains(".mlp.");
        if hf.name == "model.embed_tokens.weight" {
            embed_shape = Some(tensor.shape.clone());
        }
        let rotary_heads = hf.rotary.map(|r| params.heads_of(r) as usize);
        if let Some(heads) = rotary_heads {
            check_rotary_rows(&tensor, heads, params.head_dim as usize, hf.rotary)?;
        }
        match (arch.map_tensor)(&hf.name) {
            TensorAction::Skip => {}
            TensorAction::Keep(mllm_name) => plan.push(Planned {
                spec: TensorSpec::new(mllm_name, tensor.dtype, tensor.shape.clone()),
                tensor,
                rotary_heads,
            }),
            TensorAction::Transpose(_) => {
                return Err(Error::InvalidInput(format!(
                    "tensor '{name}': the architecture stores it transposed, which an import that keeps GGUF tensors as stored cannot do"
                )))
            }
        }
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
    let (config, generation) = llama::hf_configs(
        &gguf,
        &ConfigInputs {
            vocab_size,
            has_output,
            attention_bias,
            mlp_bias,
        },
    )?;
    // Building the model checks that the synthesized config is usable.
    mllm_models::config::check_layer_count(&config, gguf.tensors().len())?;
    (arch.build)(&config)?;
    plan.sort_by(|a, b| natural_cmp(&a.spec.name, &b.spec.name));

    let mut meta = Metadata::new(llama::HF_ARCHITECTURE, config);
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
        let bytes = match p.rotary_heads {
            None => Cow::Borrowed(p.tensor.data),
            Some(heads) => Cow::Owned(llama::unpermute_rows(
                p.tensor.data,
                p.tensor.row_bytes,
                heads,
            )?),
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
        architecture: llama::HF_ARCHITECTURE.to_string(),
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

/// Checks that a q/k projection has `heads × head_dim` rows.
fn check_rotary_rows(
    t: &GgufTensor<'_>,
    heads: usize,
    head_dim: usize,
    rotary: Option<Rotary>,
) -> Result<()> {
    let rows = t.shape[0];
    if rows != heads * head_dim {
        let what = match rotary {
            Some(Rotary::Key) => "key/value heads",
            _ => "attention heads",
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
