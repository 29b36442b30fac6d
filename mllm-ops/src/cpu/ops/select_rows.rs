//! Keeps the rows that get logits: the last token of each sequence, or all.

use mllm_core::op::{Op, OpInput};
use mllm_core::step::{LogitsMode, StepLayout};
use mllm_core::{Result, Shape};

/// The CPU row selection op.
#[derive(Default)]
pub struct SelectLogitsRowsOp;

impl Op for SelectLogitsRowsOp {
    fn reshape(&mut self, inputs: &[&Shape], step: &StepLayout) -> Result<Shape> {
        let cols = inputs[0].last();
        super::expect_rows("select_logits_rows", "input", inputs[0], cols)?;
        Ok(Shape::new([step.logits_rows(), cols]))
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("select_logits_rows")?;
        match step.logits {
            Some(LogitsMode::Last) => {
                let cols = x.shape.last();
                for (i, seq) in step.seqs.iter().enumerate() {
                    output[i * cols..(i + 1) * cols]
                        .copy_from_slice(x.row(seq.start + seq.len - 1));
                }
            }
            _ => output.copy_from_slice(x.data),
        }
        Ok(())
    }
}
