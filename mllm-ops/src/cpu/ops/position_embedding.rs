//! Learned absolute position embeddings (GPT-2 `wpe`, OPT `embed_positions`).

use mllm_core::op::{Op, OpInput, PositionEmbeddingParams};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{Error, Result, Shape};

use crate::cpu::kernels::embedding::embedding;
use crate::cpu::weights::{FloatSlice, FloatWeight};

/// The CPU position embedding op: row `position + offset` of the table for
/// every token of the step.
pub struct PositionEmbeddingOp {
    params: PositionEmbeddingParams,
    table: Option<FloatWeight>,
    rows: Vec<u32>,
}

impl PositionEmbeddingOp {
    /// An unloaded position embedding op.
    pub fn new(params: PositionEmbeddingParams) -> Self {
        PositionEmbeddingOp {
            params,
            table: None,
            rows: Vec::new(),
        }
    }
}

impl Op for PositionEmbeddingOp {
    fn load(&mut self, weights: &dyn WeightSource) -> Result<()> {
        let p = &self.params;
        self.table = Some(FloatWeight::load(
            weights,
            &p.weight,
            &[p.rows, p.dim],
            "position_embedding",
        )?);
        Ok(())
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        Ok(Shape::new([inputs[0].numel(), self.params.dim]))
    }

    fn execute(
        &mut self,
        _inputs: &[OpInput<'_>],
        output: &mut [f32],
        step: &StepLayout,
    ) -> Result<()> {
        let p = &self.params;
        self.rows.clear();
        for &pos in &step.positions {
            let row = pos
                .checked_add(p.offset)
                .filter(|&r| r < p.rows)
                .and_then(|r| u32::try_from(r).ok())
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "position {pos} is beyond the {} learned positions",
                        p.rows.saturating_sub(p.offset)
                    ))
                })?;
            self.rows.push(row);
        }
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("position embedding ran before load".into()))?;
        match table.slice() {
            FloatSlice::F32(t) => embedding(&self.rows, t, p.dim, output),
            FloatSlice::F16(t) => embedding(&self.rows, t, p.dim, output),
            FloatSlice::BF16(t) => embedding(&self.rows, t, p.dim, output),
        }
        Ok(())
    }
}
