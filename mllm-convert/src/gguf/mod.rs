//! GGUF import: reading GGUF files and converting their models to `.mllm`.
//!
//! - [`GgufFile`]: a memory-mapped, fully checked GGUF v2/v3 header with
//!   typed metadata ([`GgufValue`]) and tensors ([`GgufFile::tensor`]).
//! - [`import_gguf`]: the conversion [`convert`](crate::convert()) runs for a
//!   GGUF input; tensors keep their stored types and bytes.
//! - [`arch`]: the architectures (`llama`, `qwen2`, `qwen3`, `phi3`,
//!   `gemma`, `gpt2`): tensor names and what llama.cpp changed in them.
//! - [`config`]: the Hugging Face config synthesized from the metadata.
//! - [`rotary`]: the q/k row order of Llama files.
//! - [`tokenizer`]: the `tokenizer.json` rebuilt from the metadata (byte-level
//!   BPE here, SentencePiece in `spm`).

pub mod arch;
pub mod config;
mod cursor;
mod import;
mod reader;
pub mod rotary;
mod spm;
pub mod tokenizer;
mod types;
mod value;

use std::io::Read;
use std::path::Path;

pub use import::import_gguf;
pub use reader::{GgufFile, GgufTensor, GgufTensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
pub use types::{describe_ggml_type, dtype_for_ggml, ggml_type_name, KEPT_TYPES};
pub use value::{code as value_type, type_name as value_type_name, GgufArray, GgufValue};

/// True when `path` is a file named `*.gguf` or starting with the GGUF magic.
///
/// A `.gguf` name alone is enough, so that a damaged GGUF file is reported
/// by the GGUF reader rather than as an unknown kind of input.
pub fn is_gguf(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == GGUF_MAGIC)
}
