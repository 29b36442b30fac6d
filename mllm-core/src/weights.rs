//! Where ops find their weights.

use crate::file::{MllmFile, TensorData};
use crate::Result;

/// A source of named weights, checked against the shape the model expects.
///
/// [`MllmFile`] is the usual source; tests and examples may provide their own.
pub trait WeightSource {
    /// The weight `name`, which must have `shape`; fails with a named error
    /// when it is missing or its size does not match.
    fn weight(&self, name: &str, shape: &[usize]) -> Result<TensorData>;
}

impl WeightSource for MllmFile {
    fn weight(&self, name: &str, shape: &[usize]) -> Result<TensorData> {
        self.tensor_with_shape(name, shape)
    }
}
