//! `y = x W^T + b` with f32, f16, bf16 or block-quantized weights.

use std::sync::Arc;

use mllm_core::op::{LinearParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use crate::cpu::kernels::matmul::linear;
use crate::cpu::kernels::qkernel::{QuantKernel, QuantPath};
use crate::cpu::kernels::qmatmul::quant_linear;
use crate::cpu::weights::{load_f32_vector, FloatSlice, MatrixSlice, MatrixWeight};

/// The CPU linear layer.
pub struct LinearOp {
    params: LinearParams,
    weight: Option<MatrixWeight>,
    bias: Option<Vec<f32>>,
    pool: Arc<ThreadPool>,
    /// The variant used for quantized weights, chosen once for this CPU.
    quant: QuantKernel,
}

impl LinearOp {
    /// An unloaded linear op; quantized weights use
    /// [`QuantPath::Int16Activations`] (integer dot products with 16-bit
    /// activations for one row, the f32 path otherwise).
    pub fn new(params: LinearParams, pool: Arc<ThreadPool>) -> Self {
        LinearOp {
            params,
            weight: None,
            bias: None,
            pool,
            quant: QuantKernel::new(QuantPath::Int16Activations),
        }
    }

    /// Chooses how quantized weights treat the activations (the fastest
    /// instruction set of this CPU for that path).
    pub fn with_quant_path(mut self, path: QuantPath) -> Self {
        self.quant = QuantKernel::new(path);
        self
    }
}

impl Op for LinearOp {
    fn load(&mut self, weights: &dyn WeightSource) -> Result<()> {
        let p = &self.params;
        self.weight = Some(MatrixWeight::load(
            weights,
            &p.weight,
            [p.out_features, p.in_features],
            "linear",
        )?);
        self.bias = p
            .bias
            .as_ref()
            .map(|b| load_f32_vector(weights, b, p.out_features))
            .transpose()?;
        Ok(())
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let rows = expect_rows("linear", "input", inputs[0], self.params.in_features)?;
        Ok(Shape::new([rows, self.params.out_features]))
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("linear")?;
        let p = &self.params;
        let w = self
            .weight
            .as_ref()
            .ok_or_else(|| Error::InvalidInput(format!("linear '{}' ran before load", p.weight)))?;
        let rows = x.shape.rows();
        let bias = self.bias.as_deref();
        let (inf, outf, pool) = (p.in_features, p.out_features, &*self.pool);
        match w.slice() {
            MatrixSlice::Float(FloatSlice::F32(w)) => {
                linear(x.data, rows, inf, w, outf, bias, output, pool)
            }
            MatrixSlice::Float(FloatSlice::F16(w)) => {
                linear(x.data, rows, inf, w, outf, bias, output, pool)
            }
            MatrixSlice::Float(FloatSlice::BF16(w)) => {
                linear(x.data, rows, inf, w, outf, bias, output, pool)
            }
            MatrixSlice::Quant(w) => quant_linear(self.quant, x.data, rows, &w, bias, output, pool),
        }
        Ok(())
    }
}
