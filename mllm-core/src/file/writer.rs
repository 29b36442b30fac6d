//! Atomic writing of `.mllm` files with 64-byte aligned tensor data.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::{Metadata, ALIGNMENT, CHAT_TEMPLATE_ENTRY, MAGIC, META_ENTRY, TOKENIZER_ENTRY};
use crate::atomic::write_atomically;
use crate::{DType, Error, Result};

/// A tensor to be written: name, dtype and shape. Its bytes come later, one
/// tensor at a time, so a converter never holds the whole model in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name in the file.
    pub name: String,
    /// Element type of the stored bytes.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.into(),
        }
    }

    /// Bytes the tensor occupies in the file.
    pub fn byte_len(&self) -> Result<usize> {
        let numel = crate::shape::checked_numel(&self.shape).ok_or_else(|| {
            Error::InvalidInput(format!(
                "tensor '{}': shape {:?} is too large",
                self.name, self.shape
            ))
        })?;
        self.dtype.bytes_for(numel)
    }
}

/// Builds a `.mllm` file: metadata entries first, then tensors in the order added.
#[derive(Debug, Default)]
pub struct MllmWriter {
    metadata: Option<Metadata>,
    tokenizer_json: Option<String>,
    chat_template: Option<String>,
    tensors: Vec<TensorSpec>,
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGNMENT) * ALIGNMENT
}

impl MllmWriter {
    /// An empty writer (a plain mllm v1 file unless metadata is set).
    pub fn new() -> Self {
        Self::default()
    }

    /// Embeds metadata; tensor shapes are filled in from the added tensors.
    pub fn metadata(&mut self, meta: Metadata) -> &mut Self {
        self.metadata = Some(meta);
        self
    }

    /// Embeds a Hugging Face `tokenizer.json`.
    pub fn tokenizer_json(&mut self, json: impl Into<String>) -> &mut Self {
        self.tokenizer_json = Some(json.into());
        self
    }

    /// Embeds a chat template.
    pub fn chat_template(&mut self, template: impl Into<String>) -> &mut Self {
        self.chat_template = Some(template.into());
        self
    }

    /// Adds a tensor; its bytes are asked for when writing.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<&mut Self> {
        if super::is_metadata_entry(&spec.name) {
            return Err(Error::InvalidInput(format!(
                "tensor name '{}' is reserved for metadata",
                spec.name
            )));
        }
        if self.tensors.iter().any(|t| t.name == spec.name) {
            return Err(Error::InvalidInput(format!(
                "tensor '{}' added twice",
                spec.name
            )));
        }
        spec.byte_len()?;
        self.tensors.push(spec);
        Ok(self)
    }

    /// The tensors added so far.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Writes the file atomically (see [`write_atomically`]).
    ///
    /// `data(i, spec)` must return the bytes of tensor `i`, exactly
    /// `spec.byte_len()` of them.
    pub fn write<'d, F>(&self, path: impl AsRef<Path>, mut data: F) -> Result<()>
    where
        F: FnMut(usize, &TensorSpec) -> Result<Cow<'d, [u8]>>,
    {
        let path = path.as_ref();
        let meta_bytes = self.metadata.as_ref().map(|m| {
            let mut m = m.clone();
            m.tensors = self
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect();
            m.to_json_bytes()
        });
        let mut extras: Vec<(&str, &[u8])> = Vec::new();
        if let Some(b) = &meta_bytes {
            extras.push((META_ENTRY, b));
        }
        if let Some(t) = &self.tokenizer_json {
            extras.push((TOKENIZER_ENTRY, t.as_bytes()));
        }
        if let Some(t) = &self.chat_template {
            extras.push((CHAT_TEMPLATE_ENTRY, t.as_bytes()));
        }

        // Layout: every entry's name and length are known up front.
        let names_and_lens: Vec<(&str, u64, DType)> = extras
            .iter()
            .map(|(n, b)| (*n, b.len() as u64, DType::U8))
            .chain(
                self.tensors
                    .iter()
                    .map(|t| Ok((t.name.as_str(), t.byte_len()? as u64, t.dtype)))
                    .collect::<Result<Vec<_>>>()?,
            )
            .collect();
        let index_size: u64 = names_and_lens
            .iter()
            .map(|(n, _, _)| 4 + n.len() as u64 + 8 + 8 + 4)
            .sum();
        let mut offsets = Vec::with_capacity(names_and_lens.len());
        let mut cursor = 12 + index_size;
        for (_, len, _) in &names_and_lens {
            cursor = align_up(cursor);
            offsets.push(cursor);
            cursor += len;
        }

        write_atomically(path, |out| {
            let io = |e| Error::io(path, e);
            out.write_all(&MAGIC.to_le_bytes()).map_err(io)?;
            out.write_all(&index_size.to_le_bytes()).map_err(io)?;
            for ((name, len, dtype), offset) in names_and_lens.iter().zip(&offsets) {
                out.write_all(&(name.len() as i32).to_le_bytes())
                    .map_err(io)?;
                out.write_all(name.as_bytes()).map_err(io)?;
                out.write_all(&len.to_le_bytes()).map_err(io)?;
                out.write_all(&offset.to_le_bytes()).map_err(io)?;
                out.write_all(&dtype.code().to_le_bytes()).map_err(io)?;
            }
            let mut pos = 12 + index_size;
            let mut write_at =
                |out: &mut BufWriter<&File>, offset: u64, bytes: &[u8]| -> Result<()> {
                    let pad = (offset - pos) as usize;
                    out.write_all(&[0u8; ALIGNMENT as usize][..pad])
                        .map_err(io)?;
                    out.write_all(bytes).map_err(io)?;
                    pos = offset + bytes.len() as u64;
                    Ok(())
                };
            for ((_, bytes), offset) in extras.iter().zip(&offsets) {
                write_at(out, *offset, bytes)?;
            }
            for (i, (spec, offset)) in self
                .tensors
                .iter()
                .zip(&offsets[extras.len()..])
                .enumerate()
            {
                let bytes = data(i, spec)?;
                let expected = spec.byte_len()?;
                if bytes.len() != expected {
                    return Err(Error::SizeMismatch {
                        name: spec.name.clone(),
                        shape: spec.shape.clone(),
                        dtype: spec.dtype.to_string(),
                        len: bytes.len() as u64,
                        expected: expected as u64,
                    });
                }
                write_at(out, *offset, &bytes)?;
            }
            Ok(())
        })
    }
}
