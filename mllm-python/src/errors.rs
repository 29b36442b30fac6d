//! Python exceptions for mllm-rs errors: one base class and a subclass per
//! kind a caller may want to handle.

use mllm_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::PyErr;

create_exception!(
    mllm_rs,
    MllmError,
    PyException,
    "Base class of every error raised by mllm_rs."
);
create_exception!(
    mllm_rs,
    BadFileError,
    MllmError,
    "A model file that cannot be opened or used: missing, truncated, corrupt, \
     of an unknown dtype or architecture, or not matching its config."
);
create_exception!(
    mllm_rs,
    InvalidInputError,
    MllmError,
    "An argument that cannot be used: empty prompt, token id outside the \
     vocabulary, bad sampling value, bad chat message."
);
create_exception!(
    mllm_rs,
    ContextFullError,
    MllmError,
    "A sequence would grow past the model's context window."
);

/// The Python exception for an mllm-rs error.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::ContextFull { .. } => ContextFullError::new_err(message),
        Error::InvalidInput(_) | Error::Tokenizer(_) => InvalidInputError::new_err(message),
        Error::Device(_) => MllmError::new_err(message),
        Error::Io { .. }
        | Error::BadMagic { .. }
        | Error::TruncatedIndex(_)
        | Error::CorruptIndex(_)
        | Error::TensorOutOfBounds { .. }
        | Error::BadGguf(_)
        | Error::UnknownDType { .. }
        | Error::UnsupportedDType(_)
        | Error::MissingTensor(_)
        | Error::SizeMismatch { .. }
        | Error::ShapeMismatch { .. }
        | Error::BadMetadata { .. }
        | Error::Config(_)
        | Error::UnsupportedArchitecture(_) => BadFileError::new_err(message),
    }
}

/// `Result` of mllm-rs turned into a Python result.
pub trait IntoPy<T> {
    /// The value, or the error as its Python exception.
    fn py_err(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPy<T> for mllm_core::Result<T> {
    fn py_err(self) -> pyo3::PyResult<T> {
        self.map_err(to_py)
    }
}
