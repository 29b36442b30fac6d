//! Host tensors of f32 activations.

use crate::{Error, Result, Shape};

/// An owned f32 tensor on the host (logits, reference data, test inputs).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Shape,
    data: Vec<f32>,
}

impl Tensor {
    /// A tensor from a shape and matching data.
    pub fn new(shape: impl Into<Shape>, data: Vec<f32>) -> Result<Self> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(Error::shape(
                "Tensor::new",
                format!(
                    "shape {shape} holds {} values, got {}",
                    shape.numel(),
                    data.len()
                ),
            ));
        }
        Ok(Tensor { shape, data })
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// All values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Consumes the tensor into its values.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Row `i` of the tensor viewed as 2-D `[rows, last]` (a view, no copy).
    pub fn row(&self, i: usize) -> &[f32] {
        let n = self.shape.last();
        &self.data[i * n..(i + 1) * n]
    }

    /// Number of rows of the 2-D view.
    pub fn rows(&self) -> usize {
        self.shape.rows()
    }

    /// A borrowed view of the whole tensor.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            shape: &self.shape,
            data: &self.data,
        }
    }
}

/// A borrowed f32 tensor: a shape over a slice (no copy).
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// The shape of the view.
    pub shape: &'a Shape,
    /// Exactly `shape.numel()` values.
    pub data: &'a [f32],
}

impl<'a> TensorRef<'a> {
    /// Row `i` of the 2-D `[rows, last]` view.
    pub fn row(&self, i: usize) -> &'a [f32] {
        let n = self.shape.last();
        &self.data[i * n..(i + 1) * n]
    }
}
