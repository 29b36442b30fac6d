//! Elementwise ops: add, mul, scale, activations, gated activations and softmax.

use mllm_core::op::{Activation, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, Result, Shape};

use crate::cpu::kernels::{activation, elementwise, softmax};

fn same_shapes(op: &str, inputs: &[&Shape]) -> Result<Shape> {
    if inputs[0] != inputs[1] {
        return Err(Error::shape(
            op,
            format!(
                "inputs must have equal shapes, got {} and {}",
                inputs[0], inputs[1]
            ),
        ));
    }
    Ok(inputs[0].clone())
}

/// `a + b` or `a * b`.
pub struct BinaryOp {
    mul: bool,
}

impl BinaryOp {
    /// Elementwise sum.
    pub fn add() -> Self {
        BinaryOp { mul: false }
    }

    /// Elementwise product.
    pub fn mul() -> Self {
        BinaryOp { mul: true }
    }

    fn name(&self) -> &'static str {
        if self.mul {
            "mul"
        } else {
            "add"
        }
    }
}

impl Op for BinaryOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        same_shapes(self.name(), inputs)
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let a = inputs[0].tensor(self.name())?;
        let b = inputs[1].tensor(self.name())?;
        if self.mul {
            elementwise::mul(a.data, b.data, output);
        } else {
            elementwise::add(a.data, b.data, output);
        }
        Ok(())
    }
}

/// `act(gate) * up`.
pub struct GluOp {
    act: Activation,
}

impl GluOp {
    /// The gated form of `act`.
    pub fn new(act: Activation) -> Self {
        GluOp { act }
    }
}

impl Op for GluOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        same_shapes("glu", inputs)
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let gate = inputs[0].tensor("glu")?.data;
        let up = inputs[1].tensor("glu")?.data;
        match self.act {
            Activation::Silu => activation::swiglu(gate, up, output),
            Activation::GeluTanh => activation::geglu_tanh(gate, up, output),
            Activation::Gelu => activation::geglu(gate, up, output),
            Activation::Relu => activation::reglu(gate, up, output),
        }
        Ok(())
    }
}

/// `x * factor`.
pub struct ScaleOp {
    factor: f32,
}

impl ScaleOp {
    /// Multiplies by `factor`.
    pub fn new(factor: f32) -> Self {
        ScaleOp { factor }
    }
}

impl Op for ScaleOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        Ok(inputs[0].clone())
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("scale")?;
        elementwise::scale(x.data, self.factor, output);
        Ok(())
    }
}

/// An activation function.
pub struct ActivationOp {
    act: Activation,
}

impl ActivationOp {
    /// The op for `act`.
    pub fn new(act: Activation) -> Self {
        ActivationOp { act }
    }
}

impl Op for ActivationOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        Ok(inputs[0].clone())
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("activation")?.data;
        match self.act {
            Activation::Silu => activation::silu(x, output),
            Activation::GeluTanh => activation::gelu_tanh(x, output),
            Activation::Gelu => activation::gelu(x, output),
            Activation::Relu => activation::relu(x, output),
        }
        Ok(())
    }
}

/// Softmax over the last dimension.
#[derive(Default)]
pub struct SoftmaxOp;

impl Op for SoftmaxOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        Ok(inputs[0].clone())
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("softmax")?;
        output.copy_from_slice(x.data);
        softmax::softmax_rows(output, x.shape.last());
        Ok(())
    }
}
