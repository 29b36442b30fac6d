//! The error type shared by every mllm-rs crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading, planning or running a model.
///
/// Each variant names the problem precisely, so a user can tell a corrupt file
/// from a wrong config or a prompt that does not fit the context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error on a named file.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the `.mllm` magic number.
    #[error("not a .mllm file: magic number is {found}, expected {expected}")]
    BadMagic { found: i32, expected: i32 },
    /// The index runs past the end of the file or an entry inside it is cut short.
    #[error("truncated index: {0}")]
    TruncatedIndex(String),
    /// The index is readable but wrong: a negative length, a bad name, a duplicate.
    #[error("corrupt index: {0}")]
    CorruptIndex(String),
    /// A tensor's data range lies (partly) outside the file.
    #[error("tensor '{name}': data at offset {offset} with length {len} runs past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    /// A GGUF file that cannot be read: bad magic, unknown version, a section
    /// cut short, a malformed metadata value or tensor description.
    #[error("invalid GGUF file: {0}")]
    BadGguf(String),
    /// A dtype code that mllm-rs does not know.
    #[error("tensor '{name}': unknown dtype code {code}")]
    UnknownDType { name: String, code: i32 },
    /// A dtype that is known but not supported where it was used.
    #[error("{0}")]
    UnsupportedDType(String),
    /// A tensor the model needs is not in the file.
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    /// A tensor's byte size does not match its shape and dtype.
    #[error("tensor '{name}': {len} bytes do not match shape {shape:?} of dtype {dtype} ({expected} bytes)")]
    SizeMismatch {
        name: String,
        shape: Vec<usize>,
        dtype: String,
        len: u64,
        expected: u64,
    },
    /// Shapes that do not fit together (a weight or an op input).
    #[error("shape mismatch in {context}: {detail}")]
    ShapeMismatch { context: String, detail: String },
    /// A metadata entry that is not valid JSON or lacks a required field.
    #[error("malformed metadata '{entry}': {detail}")]
    BadMetadata { entry: String, detail: String },
    /// A model configuration that cannot be used.
    #[error("invalid model config: {0}")]
    Config(String),
    /// An architecture that is not in the registry.
    #[error("unsupported architecture '{0}'")]
    UnsupportedArchitecture(String),
    /// A device that cannot run what was placed on it: its driver library
    /// is missing, or it has no implementation of an op.
    #[error("device: {0}")]
    Device(String),
    /// A sequence would grow past the model's context window.
    #[error(
        "context full: sequence {slot} needs {needed} positions but the context holds {limit}"
    )]
    ContextFull {
        slot: usize,
        needed: usize,
        limit: usize,
    },
    /// Tokenizer problems (missing, unparsable, or failing to encode).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Any other invalid argument from the caller.
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

/// Result with the mllm-rs [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A shape mismatch with its context.
    pub fn shape(context: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::ShapeMismatch {
            context: context.into(),
            detail: detail.into(),
        }
    }
}
