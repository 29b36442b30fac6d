//! `y = x W^T + b` with f32, f16, bf16 or block-quantized weights.

use std::sync::Arc;

use mllm_core::op::{LinearParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use crate::cpu::kernels::matmul::linear;
use crate::cpu::kernels::packed::{packed_linear, PackedQ4};
use crate::cpu::kernels::packed_q4k::{packed_q4k_linear, PackedQ4K};
use crate::cpu::kernels::packed_q5::{packed_q5_linear, PackedQ5};
use crate::cpu::kernels::packed_q6k::{packed_q6k_linear, PackedQ6K};
use crate::cpu::kernels::packed_q8::{packed_q8_linear, PackedQ8};
use crate::cpu::kernels::qkernel::{QuantKernel, QuantPath};
use crate::cpu::kernels::qmatmul::quant_linear;
use crate::cpu::weights::{
    load_f32_vector, AnyMatrix, FloatSlice, MatrixSlice, MatrixWeight, PackedMatrix,
};

/// A linear layer's weight as its kernels read it.
enum LinearWeight {
    /// In the file's layout (mostly read in place from the map).
    Plain(MatrixWeight),
    /// Q4_0 / Q4_1 for the packed integer kernel: repacked at load, with
    /// the mapped weight it was copied from (kept to release its pages),
    /// or stored packed in the file and read in place (`None`).
    PackedQ4(PackedQ4, Option<MatrixWeight>),
    /// Q8_0 packed the same way.
    PackedQ8(PackedQ8, Option<MatrixWeight>),
    /// Q5_0 / Q5_1 repacked at load, with its mapped source.
    PackedQ5(PackedQ5, MatrixWeight),
    /// Q4_K repacked at load, with its mapped source.
    PackedQ4K(PackedQ4K, MatrixWeight),
    /// Q6_K repacked at load, with its mapped source.
    PackedQ6K(PackedQ6K, MatrixWeight),
}

/// The CPU linear layer.
pub struct LinearOp {
    params: LinearParams,
    weight: Option<LinearWeight>,
    bias: Option<Vec<f32>>,
    pool: Arc<ThreadPool>,
    /// The variant used for quantized weights, chosen once for this CPU.
    quant: QuantKernel,
}

impl LinearOp {
    /// An unloaded linear op; quantized weights use
    /// [`QuantPath::Int16Activations`]: with AVX2, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0, Q4_K and Q6_K weights are repacked at load (see [`PackedQ4`],
    /// [`PackedQ5`], [`PackedQ8`], [`PackedQ4K`], [`PackedQ6K`]) and every step
    /// multiplies them with 16-bit activations; other Q8_0 / Q4 weights use
    /// integer dot products with 16-bit activations, the other block types
    /// the f32 path.
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
        let shape = [p.out_features, p.in_features];
        self.weight = Some(
            match AnyMatrix::load(weights, &p.weight, shape, "linear")? {
                AnyMatrix::Packed(PackedMatrix::Q4(w)) => LinearWeight::PackedQ4(w, None),
                AnyMatrix::Packed(PackedMatrix::Q8(w)) => LinearWeight::PackedQ8(w, None),
                AnyMatrix::Plain(w) => pack_if_faster(w, self.quant),
            },
        );
        self.bias = p
            .bias
            .as_ref()
            .map(|b| load_f32_vector(weights, b, p.out_features))
            .transpose()?;
        Ok(())
    }

    fn loaded(&mut self) {
        if let Some(
            LinearWeight::PackedQ4(_, Some(source))
            | LinearWeight::PackedQ8(_, Some(source))
            | LinearWeight::PackedQ5(_, source)
            | LinearWeight::PackedQ4K(_, source)
            | LinearWeight::PackedQ6K(_, source),
        ) = &self.weight
        {
            source.release_pages();
        }
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
        let w = match w {
            LinearWeight::PackedQ4(w, _) => {
                packed_linear(self.quant, x.data, rows, w, bias, output, pool);
                return Ok(());
            }
            LinearWeight::PackedQ8(w, _) => {
                packed_q8_linear(self.quant, x.data, rows, w, bias, output, pool);
                return Ok(());
            }
            LinearWeight::PackedQ5(w, _) => {
                packed_q5_linear(self.quant, x.data, rows, w, bias, output, pool);
                return Ok(());
            }
            LinearWeight::PackedQ4K(w, _) => {
                packed_q4k_linear(self.quant, x.data, rows, w, bias, output, pool);
                return Ok(());
            }
            LinearWeight::PackedQ6K(w, _) => {
                packed_q6k_linear(self.quant, x.data, rows, w, bias, output, pool);
                return Ok(());
            }
            LinearWeight::Plain(w) => w,
        };
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

/// `weight` repacked for a packed kernel when `kernel` uses them and the
/// weight is Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K with a row
/// count that is a multiple of eight; the mapped bytes then leave memory. Otherwise `weight`
/// unchanged.
fn pack_if_faster(weight: MatrixWeight, kernel: QuantKernel) -> LinearWeight {
    let MatrixSlice::Quant(m) = weight.slice() else {
        return LinearWeight::Plain(weight);
    };
    if !kernel.repacks_weights() {
        return LinearWeight::Plain(weight);
    }
    if let Ok(p) = PackedQ4::pack(&m) {
        weight.release_pages();
        return LinearWeight::PackedQ4(p, Some(weight));
    }
    if let Ok(p) = PackedQ8::pack(&m) {
        weight.release_pages();
        return LinearWeight::PackedQ8(p, Some(weight));
    }
    if let Ok(p) = PackedQ5::pack(&m) {
        weight.release_pages();
        return LinearWeight::PackedQ5(p, weight);
    }
    if let Ok(p) = PackedQ4K::pack(&m) {
        weight.release_pages();
        return LinearWeight::PackedQ4K(p, weight);
    }
    if let Ok(p) = PackedQ6K::pack(&m) {
        weight.release_pages();
        return LinearWeight::PackedQ6K(p, weight);
    }
    LinearWeight::Plain(weight)
}
