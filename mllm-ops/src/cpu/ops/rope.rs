//! Rotary position embeddings at each token's position in its sequence.

use mllm_core::op::{Op, OpInput, RopeParams};
use mllm_core::step::StepLayout;
use std::sync::Arc;

use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use super::pieces::for_row_pieces;
use crate::cpu::kernels::rope::{apply_rope, rope_inv_freq, Llama3Scaling};

/// The CPU RoPE op, split by tokens over the pool for many tokens;
/// inverse frequencies are computed once.
pub struct RopeOp {
    params: RopeParams,
    inv_freq: Vec<f32>,
    pool: Arc<ThreadPool>,
}

impl RopeOp {
    /// A RoPE op, validating the rotary dimensions.
    pub fn new(params: RopeParams, pool: Arc<ThreadPool>) -> Result<Self> {
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
        Ok(RopeOp {
            params,
            inv_freq,
            pool,
        })
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
        let p = &self.params;
        let width = p.n_heads * p.head_dim;
        for_row_pieces(&self.pool, output, width, |first, out| {
            out.copy_from_slice(&x.data[first * width..][..out.len()]);
            let positions = &step.positions[first..][..out.len() / width];
            apply_rope(
                out,
                positions,
                p.n_heads,
                p.head_dim,
                p.rotary_dim,
                &self.inv_freq,
                p.interleaved,
            );
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{pool2, Rng};
    use crate::cpu::ops::pieces::PIECE;
    use mllm_core::tensor::TensorRef;

    /// Split by tokens over two threads, RoPE gives the bits of one kernel
    /// call over every token, each token at its own position, for a
    /// tensor of several pieces that ends in a partial one.
    #[test]
    fn split_rope_gives_the_bits_of_one_call() {
        let mut rng = Rng::new(13);
        let pool = Arc::new(pool2());
        let (heads, dim) = (9, 64);
        let width = heads * dim;
        let tokens = 2 * PIECE / width + 5;
        let params = RopeParams {
            n_heads: heads,
            head_dim: dim,
            rotary_dim: dim,
            theta: 10000.0,
            llama3: None,
            interleaved: false,
        };
        let mut op = RopeOp::new(params, pool).unwrap();
        let shape = Shape::new([tokens, width]);
        let x = rng.vec(tokens * width, 2.0);
        let step = StepLayout {
            positions: (0..tokens).map(|t| 3 * t + 17).collect(),
            ..StepLayout::default()
        };
        let input = [OpInput::Tensor(TensorRef {
            shape: &shape,
            data: &x,
        })];
        let mut got = vec![f32::NAN; x.len()];
        op.execute(&input, &mut got, &step).unwrap();
        let mut want = x.clone();
        apply_rope(
            &mut want,
            &step.positions,
            heads,
            dim,
            dim,
            &op.inv_freq,
            false,
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }
}
