//! RMSNorm and LayerNorm over the last dimension (or over each group of it).

use mllm_core::op::{NormParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{Error, Result, Shape};

use super::expect_rows;
use crate::cpu::kernels::norm::{layer_norm, rms_norm};
use crate::cpu::weights::load_f32_vector;

/// Checks that `shape` is `[tokens, groups * dim]`.
fn check_input(op: &str, p: &NormParams, shape: &Shape) -> Result<Shape> {
    if p.groups == 0 {
        return Err(Error::Config(format!("{op}: groups must be positive")));
    }
    expect_rows(op, "input", shape, p.groups * p.dim)?;
    Ok(shape.clone())
}

/// The CPU RMSNorm op.
pub struct RmsNormOp {
    params: NormParams,
    weight: Vec<f32>,
}

impl RmsNormOp {
    /// An unloaded RMSNorm.
    pub fn new(params: NormParams) -> Self {
        RmsNormOp {
            params,
            weight: Vec::new(),
        }
    }
}

impl Op for RmsNormOp {
    fn load(&mut self, weights: &dyn WeightSource) -> Result<()> {
        self.weight = load_f32_vector(weights, &self.params.weight, self.params.dim)?;
        Ok(())
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        check_input("rms_norm", &self.params, inputs[0])
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("rms_norm")?;
        let p = &self.params;
        rms_norm(
            x.data,
            x.shape.rows() * p.groups,
            p.dim,
            &self.weight,
            p.eps,
            p.unit_offset,
            output,
        );
        Ok(())
    }
}

/// The CPU LayerNorm op.
pub struct LayerNormOp {
    params: NormParams,
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl LayerNormOp {
    /// An unloaded LayerNorm.
    pub fn new(params: NormParams) -> Self {
        LayerNormOp {
            params,
            weight: Vec::new(),
            bias: None,
        }
    }
}

impl Op for LayerNormOp {
    fn load(&mut self, weights: &dyn WeightSource) -> Result<()> {
        let p = &self.params;
        self.weight = load_f32_vector(weights, &p.weight, p.dim)?;
        self.bias = p
            .bias
            .as_ref()
            .map(|b| load_f32_vector(weights, b, p.dim))
            .transpose()?;
        Ok(())
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        check_input("layer_norm", &self.params, inputs[0])
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("layer_norm")?;
        let p = &self.params;
        layer_norm(
            x.data,
            x.shape.rows() * p.groups,
            p.dim,
            &self.weight,
            self.bias.as_deref(),
            p.eps,
            output,
        );
        Ok(())
    }
}
