//! Copies a range of columns (one part of a fused projection's output).

use mllm_core::op::{ColumnSlice, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, Result, Shape};

use crate::cpu::kernels::columns::slice_columns;

/// The CPU column slice op.
pub struct SliceColumnsOp {
    slice: ColumnSlice,
}

impl SliceColumnsOp {
    /// Copies the columns of `slice`.
    pub fn new(slice: ColumnSlice) -> Self {
        SliceColumnsOp { slice }
    }
}

impl Op for SliceColumnsOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let ColumnSlice { start, len } = self.slice;
        match inputs[0].dims() {
            [rows, cols] if start.checked_add(len).is_some_and(|end| end <= *cols) => {
                Ok(Shape::new([*rows, len]))
            }
            _ => Err(Error::shape(
                "slice_columns",
                format!(
                    "columns {start}..{} do not fit input {}",
                    start.saturating_add(len),
                    inputs[0]
                ),
            )),
        }
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("slice_columns")?;
        slice_columns(
            x.data,
            x.shape.last(),
            self.slice.start,
            self.slice.len,
            output,
        );
        Ok(())
    }
}
