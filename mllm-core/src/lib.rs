//! mllm-core: the pieces every other mllm-rs crate builds on.
//!
//! - [`DType`], [`Shape`] and [`Tensor`]: data types with mllm's codes, shapes, host tensors.
//! - [`file`](mod@file): the `.mllm` weight file (validated zero-copy reader, atomic aligned writer).
//! - [`graph`]: the [`Module`] / [`Layer`] / [`Op`] model and the traced [`Graph`].
//! - [`executor`]: plans buffers by liveness and runs a graph step by step on one or more [`Backend`]s.
//! - [`placement`]: which device each node runs on ([`Device`], [`Placement`]).
//! - [`line_buffer`]: growable buffers whose values start on a cache line.
//! - [`stacking`]: the graph pass that stacks linear layers sharing an input into one.

pub mod atomic;
pub mod backend;
pub mod dtype;
pub mod error;
pub mod executor;
pub mod file;
pub mod gating;
pub mod graph;
pub mod kv_dtype;
pub mod layers;
pub mod line_buffer;
pub mod npy;
pub mod op;
pub mod placement;
mod rebuild;
pub mod shape;
pub mod stacking;
pub mod step;
pub mod tensor;
pub mod weights;

pub use backend::Backend;
pub use dtype::DType;
pub use error::{Error, Result};
pub use executor::Executor;
pub use graph::{Graph, Module, Value};
pub use kv_dtype::KvDtype;
pub use layers::Layer;
pub use line_buffer::LineBuffer;
pub use op::{Op, OpDesc};
pub use placement::{Device, Placement};
pub use shape::Shape;
pub use step::{LogitsMode, SeqChunk, StepInput};
pub use tensor::Tensor;
