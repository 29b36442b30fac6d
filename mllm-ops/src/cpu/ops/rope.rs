//! Rotary position embeddings at each token's position in its sequence.

use mllm_core::op::{Op, OpInput, RopeParams};
use mllm_core::step::StepLayout;
use mllm_core::{Error, Result, Shape};

use super::expect_rows;
use crate::cpu::kernels::rope::{apply_rope, rope_inv_freq, Llama3Scaling};

/// The CPU RoPE op; inverse frequencies are computed once.
pub struct RopeOp {
    params: RopeParams,
    inv_freq: Vec<f32>,
}

impl RopeOp {
    /// A RoPE op, validating the rotary dimensions.
    pub fn new(params: RopeParams) -> Result<Self> {
        if params.rotary_dim == 0
            || !params.rotary_dim.is_multiple_of(2)
            || params.rotary_dim > params.head_dim
        {
            return Err(Error::Config(format!(
                "rotary dim {} must be even and at most head_dim {}",
                params.rotary_dim, params.head_dim
            )));
        }
        let scaling = params.llama3.as_ref().map(|s| Llama3Scaling {
            factor: s.factor,
            low_freq_factor: s.low_freq_factor,
            high_freq_factor: s.high_freq_factor,
            original_max_position_embeddings: s.original_max_position_embeddings,
        });
        let inv_freq = rope_inv_freq(params.rotary_dim, params.theta, scaling.as_ref());
        Ok(RopeOp { params, inv_freq })
    }
}

impl Op for RopeOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let p = &self.params;
        expect_rows("rope", "input", inputs[0], p.n_heads * p.head_dim)?;
        Ok(inputs[0].clone())
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("rope")?;
        output.copy_from_slice(x.data);
        let p = &self.params;
        apply_rope(
            output,
            &step.positions,
            p.n_heads,
            p.head_dim,
            p.rotary_dim,
            &self.inv_freq,
            p.interleaved,
        );
        Ok(())
    }
}
