//! Weights bound to CPU ops: zero-copy slices of the mapped file when the
//! dtype and alignment allow, owned copies otherwise.

use half::{bf16, f16};
use mllm_core::file::TensorData;
use mllm_core::weights::WeightSource;
use mllm_core::{DType, Error, Result};

/// A borrowed weight of one of the float dtypes the kernels read.
#[derive(Clone, Copy)]
pub enum FloatSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// A float weight matrix or table (f32, f16 or bf16).
pub enum FloatWeight {
    /// Read in place from the memory map.
    Mapped(TensorData),
    /// The file's bytes were not aligned for the element type: a copy.
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl FloatWeight {
    /// Binds `name` with `shape`; fails on dtypes the float kernels cannot read.
    pub fn load(weights: &dyn WeightSource, name: &str, shape: &[usize], op: &str) -> Result<Self> {
        let data = weights.weight(name, shape)?;
        let aligned = match data.dtype() {
            DType::F32 => bytemuck::try_cast_slice::<u8, f32>(data.bytes()).is_ok(),
            DType::F16 | DType::BF16 => bytemuck::try_cast_slice::<u8, u16>(data.bytes()).is_ok(),
            other => {
                return Err(Error::UnsupportedDType(format!(
                    "{op}: weight '{name}' has dtype {other}, which this op does not support on the CPU"
                )))
            }
        };
        if aligned {
            return Ok(FloatWeight::Mapped(data));
        }
        let bytes = data.bytes();
        Ok(match data.dtype() {
            DType::F32 => FloatWeight::F32(bytemuck::pod_collect_to_vec(bytes)),
            DType::F16 => FloatWeight::F16(bytemuck::pod_collect_to_vec(bytes)),
            _ => FloatWeight::BF16(bytemuck::pod_collect_to_vec(bytes)),
        })
    }

    /// The elements as a typed slice.
    pub fn slice(&self) -> FloatSlice<'_> {
        match self {
            FloatWeight::Mapped(d) => {
                // Alignment and length were checked when the weight was bound.
                let bytes = d.bytes();
                match d.dtype() {
                    DType::F32 => FloatSlice::F32(bytemuck::cast_slice(bytes)),
                    DType::F16 => FloatSlice::F16(bytemuck::cast_slice(bytes)),
                    _ => FloatSlice::BF16(bytemuck::cast_slice(bytes)),
                }
            }
            FloatWeight::F32(v) => FloatSlice::F32(v),
            FloatWeight::F16(v) => FloatSlice::F16(v),
            FloatWeight::BF16(v) => FloatSlice::BF16(v),
        }
    }
}

/// Loads a small vector (norm scale, bias) as owned f32 values.
pub fn load_f32_vector(weights: &dyn WeightSource, name: &str, len: usize) -> Result<Vec<f32>> {
    let w = FloatWeight::load(weights, name, &[len], "vector")?;
    Ok(match w.slice() {
        FloatSlice::F32(s) => s.to_vec(),
        FloatSlice::F16(s) => s.iter().map(|x| x.to_f32()).collect(),
        FloatSlice::BF16(s) => s.iter().map(|x| x.to_f32()).collect(),
    })
}
