//! `mllm_rs`: mllm-rs from Python. Load a `.mllm` or `.gguf` model,
//! generate, stream, chat, batch, tokenize and read logits as numpy
//! arrays; convert and inspect files. The model computes with the GIL
//! released, and a long generation stops on Ctrl-C.

mod errors;
mod files;
mod model;
mod sampling;
mod stream;

use pyo3::prelude::*;

/// The Python module.
#[pymodule]
fn mllm_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MllmError", py.get_type::<errors::MllmError>())?;
    m.add("BadFileError", py.get_type::<errors::BadFileError>())?;
    m.add(
        "InvalidInputError",
        py.get_type::<errors::InvalidInputError>(),
    )?;
    m.add(
        "ContextFullError",
        py.get_type::<errors::ContextFullError>(),
    )?;
    m.add_class::<model::Model>()?;
    m.add_class::<stream::TextIterator>()?;
    m.add_function(wrap_pyfunction!(files::convert, m)?)?;
    m.add_function(wrap_pyfunction!(files::inspect, m)?)?;
    Ok(())
}
