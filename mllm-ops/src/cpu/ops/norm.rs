//! RMSNorm and LayerNorm over the last dimension (or over each group of it).

use mllm_core::op::{NormParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use std::sync::Arc;

use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use super::pieces::for_row_pieces;
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

/// The CPU RMSNorm op, split by rows over the pool for many rows.
pub struct RmsNormOp {
    params: NormParams,
    weight: Vec<f32>,
    pool: Arc<ThreadPool>,
}

impl RmsNormOp {
    /// An unloaded RMSNorm.
    pub fn new(params: NormParams, pool: Arc<ThreadPool>) -> Self {
        RmsNormOp {
            params,
            weight: Vec::new(),
            pool,
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
        for_row_pieces(&self.pool, output, p.dim, |first, out| {
            let x = &x.data[first * p.dim..][..out.len()];
            let rows = out.len() / p.dim;
            rms_norm(x, rows, p.dim, &self.weight, p.eps, p.unit_offset, out);
        });
        Ok(())
    }
}

/// The CPU LayerNorm op, split by rows over the pool for many rows.
pub struct LayerNormOp {
    params: NormParams,
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    pool: Arc<ThreadPool>,
}

impl LayerNormOp {
    /// An unloaded LayerNorm.
    pub fn new(params: NormParams, pool: Arc<ThreadPool>) -> Self {
        LayerNormOp {
            params,
            weight: Vec::new(),
            bias: None,
            pool,
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
        let bias = self.bias.as_deref();
        for_row_pieces(&self.pool, output, p.dim, |first, out| {
            let x = &x.data[first * p.dim..][..out.len()];
            layer_norm(x, out.len() / p.dim, p.dim, &self.weight, bias, p.eps, out);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{bits, pool2, Rng};
    use crate::cpu::ops::pieces::PIECE;
    use mllm_core::tensor::TensorRef;

    fn params(dim: usize, groups: usize) -> NormParams {
        NormParams {
            dim,
            groups,
            eps: 1e-5,
            weight: "w".into(),
            bias: Some("b".into()),
            unit_offset: false,
        }
    }

    /// Split by rows over two threads, RMSNorm and LayerNorm (whole rows
    /// and groups of a row) give the bits of one kernel call over every
    /// row, for a tensor of several pieces that ends in a partial one.
    #[test]
    fn split_norms_give_the_bits_of_one_call() {
        let mut rng = Rng::new(11);
        let pool = Arc::new(pool2());
        for (dim, groups) in [(576, 1), (64, 9)] {
            let rows = 2 * PIECE / (dim * groups) + 7;
            let shape = Shape::new([rows, dim * groups]);
            let x = rng.vec(rows * dim * groups, 3.0);
            let (weight, bias) = (rng.vec(dim, 1.0), rng.vec(dim, 1.0));
            let input = [OpInput::Tensor(TensorRef {
                shape: &shape,
                data: &x,
            })];
            let step = StepLayout::default();
            let n = rows * groups;
            let mut rms = RmsNormOp::new(params(dim, groups), Arc::clone(&pool));
            rms.weight = weight.clone();
            let mut want = vec![f32::NAN; x.len()];
            rms_norm(&x, n, dim, &weight, 1e-5, false, &mut want);
            let mut got = vec![f32::NAN; x.len()];
            rms.execute(&input, &mut got, &step).unwrap();
            assert_eq!(bits(&got), bits(&want), "rms_norm {dim} x {groups}");
            let mut ln = LayerNormOp::new(params(dim, groups), Arc::clone(&pool));
            (ln.weight, ln.bias) = (weight.clone(), Some(bias.clone()));
            layer_norm(&x, n, dim, &weight, Some(&bias), 1e-5, &mut want);
            ln.execute(&input, &mut got, &step).unwrap();
            assert_eq!(bits(&got), bits(&want), "layer_norm {dim} x {groups}");
        }
    }
}
