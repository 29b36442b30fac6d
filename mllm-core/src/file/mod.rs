//! The `.mllm` weight file: mllm's magic-20012 container.
//!
//! Layout (little-endian throughout):
//!
//! ```text
//! i32  magic = 20012
//! u64  index_size                  bytes of index entries that follow
//! entries, until index_size is consumed:
//!      i32 name_len, name bytes (UTF-8), u64 data_len, u64 offset (absolute), i32 dtype
//! tensor data
//! ```
//!
//! Files written by mllm-rs align every tensor's data to [`ALIGNMENT`] bytes
//! and carry extra [`DType::U8`](crate::DType::U8) entries with JSON metadata
//! (see [`Metadata`]); readers of plain mllm v1 files see those as extra
//! tensors, and a plain v1 file without them still loads here.

mod mapped;
mod metadata;
mod reader;
mod writer;

pub use mapped::MappedFile;
pub use metadata::{Metadata, FORMAT_VERSION};
pub use reader::{IndexEntry, MllmFile, TensorData};
pub use writer::{MllmWriter, TensorSpec};

/// The magic number every `.mllm` file starts with.
pub const MAGIC: i32 = 20012;
/// Alignment of tensor data in files written by mllm-rs.
pub const ALIGNMENT: u64 = 64;
/// Entry holding the JSON [`Metadata`].
pub const META_ENTRY: &str = "mllm.meta";
/// Entry holding the Hugging Face `tokenizer.json` text.
pub const TOKENIZER_ENTRY: &str = "mllm.tokenizer";
/// Entry holding the chat template (a Jinja source).
pub const CHAT_TEMPLATE_ENTRY: &str = "mllm.chat_template";

/// True for the names of the metadata entries that are not model tensors.
pub fn is_metadata_entry(name: &str) -> bool {
    matches!(name, META_ENTRY | TOKENIZER_ENTRY | CHAT_TEMPLATE_ENTRY)
}
