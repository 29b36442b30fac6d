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

/// `act(gate) * up`; the output may take over `up`'s buffer.
pub struct GluOp {
    act: Activation,
}

/// Values of `up` copied out at a time when the output overwrites it (a
/// multiple of every kernel's vector width, so each element takes the same
/// path as in one call over the whole row).
const IN_PLACE_CHUNK: usize = 1024;

impl GluOp {
    /// The gated form of `act`.
    pub fn new(act: Activation) -> Self {
        GluOp { act }
    }

    fn apply(&self, gate: &[f32], up: &[f32], output: &mut [f32]) {
        match self.act {
            Activation::Silu => activation::swiglu(gate, up, output),
            Activation::GeluTanh => activation::geglu_tanh(gate, up, output),
            Activation::Gelu => activation::geglu(gate, up, output),
            Activation::Relu => activation::reglu(gate, up, output),
        }
    }
}

impl Op for GluOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        same_shapes("glu", inputs)
    }

    fn overwritable_input(&self) -> Option<usize> {
        Some(1)
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let gate = inputs[0].tensor("glu")?.data;
        match inputs[1] {
            OpInput::InOutput => {
                let mut up = [0.0f32; IN_PLACE_CHUNK];
                for (g, o) in gate
                    .chunks(IN_PLACE_CHUNK)
                    .zip(output.chunks_mut(IN_PLACE_CHUNK))
                {
                    let up = &mut up[..o.len()];
                    up.copy_from_slice(o);
                    self.apply(g, up, o);
                }
            }
            other => self.apply(gate, other.tensor("glu")?.data, output),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::Rng;
    use mllm_core::tensor::TensorRef;

    /// With `up` already in the output (the executor's in-place case) the
    /// GLU gives the same bits as with three buffers, for every activation
    /// and a length that ends in a partial chunk and a partial vector.
    #[test]
    fn glu_over_its_up_input_gives_the_same_bits() {
        let mut rng = Rng::new(7);
        let n = 2 * IN_PLACE_CHUNK + 13;
        let shape = Shape::new([n]);
        let gate = rng.vec(n, 4.0);
        let up = rng.vec(n, 4.0);
        let step = StepLayout::default();
        let tensor = |data| {
            OpInput::Tensor(TensorRef {
                shape: &shape,
                data,
            })
        };
        for act in [
            Activation::Silu,
            Activation::GeluTanh,
            Activation::Gelu,
            Activation::Relu,
        ] {
            let mut op = GluOp::new(act);
            assert_eq!(op.overwritable_input(), Some(1));
            let mut apart = vec![f32::NAN; n];
            op.execute(&[tensor(&gate), tensor(&up)], &mut apart, &step)
                .unwrap();
            let mut in_place = up.clone();
            op.execute(&[tensor(&gate), OpInput::InOutput], &mut in_place, &step)
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&in_place), bits(&apart), "{act:?}");
        }
    }
}
