//! Elementwise ops: add, mul, scale, activations, gated activations and softmax.

use std::sync::Arc;

use mllm_core::op::{Activation, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::pieces::{for_pieces, PIECE};
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

/// `a + b` or `a * b`, split over `pool` when large.
pub struct BinaryOp {
    mul: bool,
    pool: Arc<ThreadPool>,
}

impl BinaryOp {
    /// Elementwise sum.
    pub fn add(pool: Arc<ThreadPool>) -> Self {
        BinaryOp { mul: false, pool }
    }

    /// Elementwise product.
    pub fn mul(pool: Arc<ThreadPool>) -> Self {
        BinaryOp { mul: true, pool }
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
        let a = inputs[0].tensor(self.name())?.data;
        let b = inputs[1].tensor(self.name())?.data;
        let mul = self.mul;
        for_pieces(&self.pool, output, |at, out| {
            let (a, b) = (&a[at..at + out.len()], &b[at..at + out.len()]);
            if mul {
                elementwise::mul(a, b, out);
            } else {
                elementwise::add(a, b, out);
            }
        });
        Ok(())
    }
}

/// `act(gate) * up`, split over `pool` when large; the output may take
/// over `up`'s buffer.
pub struct GluOp {
    act: Activation,
    pool: Arc<ThreadPool>,
}

/// Values of `up` copied out at a time when the output overwrites it (a
/// multiple of every kernel's vector width that divides [`PIECE`], so each
/// element takes the same path as in one call over the whole row).
const IN_PLACE_CHUNK: usize = 1024;

const _: () = assert!(PIECE.is_multiple_of(IN_PLACE_CHUNK));

impl GluOp {
    /// The gated form of `act`.
    pub fn new(act: Activation, pool: Arc<ThreadPool>) -> Self {
        GluOp { act, pool }
    }

    fn apply(&self, gate: &[f32], up: &[f32], output: &mut [f32]) {
        activation::glu(self.act, gate, up, output)
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
        let up = match inputs[1] {
            OpInput::InOutput => None,
            other => Some(other.tensor("glu")?.data),
        };
        for_pieces(&self.pool, output, |at, out| {
            let gate = &gate[at..at + out.len()];
            match up {
                Some(up) => self.apply(gate, &up[at..at + out.len()], out),
                None => {
                    let mut up = [0.0f32; IN_PLACE_CHUNK];
                    for (g, o) in gate
                        .chunks(IN_PLACE_CHUNK)
                        .zip(out.chunks_mut(IN_PLACE_CHUNK))
                    {
                        let up = &mut up[..o.len()];
                        up.copy_from_slice(o);
                        self.apply(g, up, o);
                    }
                }
            }
        });
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
    use crate::cpu::kernels::test_util::{bits, Rng};
    use mllm_core::tensor::TensorRef;

    /// Split over two threads, with `up` in its own buffer or already in
    /// the output (the executor's in-place case), the GLU gives the bits of
    /// one kernel call over the whole tensor, for every activation and a
    /// length of several pieces that ends in a partial chunk and a partial
    /// vector; so do the sum and the product.
    #[test]
    fn split_and_in_place_ops_give_the_bits_of_one_call() {
        let mut rng = Rng::new(7);
        let n = 2 * PIECE + IN_PLACE_CHUNK + 13;
        let shape = Shape::new([n]);
        let gate = rng.vec(n, 4.0);
        let up = rng.vec(n, 4.0);
        let step = StepLayout::default();
        let pool = Arc::new(crate::cpu::kernels::test_util::pool2());
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
            let mut op = GluOp::new(act, Arc::clone(&pool));
            assert_eq!(op.overwritable_input(), Some(1));
            let mut one_call = vec![f32::NAN; n];
            op.apply(&gate, &up, &mut one_call);
            let mut apart = vec![f32::NAN; n];
            op.execute(&[tensor(&gate), tensor(&up)], &mut apart, &step)
                .unwrap();
            assert_eq!(bits(&apart), bits(&one_call), "{act:?} apart");
            let mut in_place = up.clone();
            op.execute(&[tensor(&gate), OpInput::InOutput], &mut in_place, &step)
                .unwrap();
            assert_eq!(bits(&in_place), bits(&one_call), "{act:?} in place");
        }
        for (mut op, kernel) in [
            (
                BinaryOp::add(Arc::clone(&pool)),
                elementwise::add as fn(&[f32], &[f32], &mut [f32]),
            ),
            (BinaryOp::mul(Arc::clone(&pool)), elementwise::mul),
        ] {
            let mut one_call = vec![f32::NAN; n];
            kernel(&gate, &up, &mut one_call);
            let mut split = vec![f32::NAN; n];
            op.execute(&[tensor(&gate), tensor(&up)], &mut split, &step)
                .unwrap();
            assert_eq!(bits(&split), bits(&one_call), "{}", op.name());
        }
    }
}
