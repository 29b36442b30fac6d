//! Rotary position embeddings at each token's position in its sequence.

use mllm_core::op::{Op, OpInput, RopeParams};
use mllm_core::step::StepLayout;
use std::sync::{Arc, Mutex, TryLockError};

use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use super::pieces::for_row_pieces;
use crate::cpu::kernels::rope::{
    apply_rope_angles, rope_angles_into, rope_inv_freq, Llama3Scaling,
};

/// The CPU RoPE op, split by tokens over the pool for many tokens;
/// inverse frequencies are computed once, each step's angles once for all
/// the ops that share a [`RopeAngles`].
pub struct RopeOp {
    params: RopeParams,
    inv_freq: Vec<f32>,
    pool: Arc<ThreadPool>,
    angles: Arc<RopeAngles>,
}

/// The cosines and sines of one step's RoPE angles, shared by the RoPE ops
/// of a backend: every layer rotates its queries and keys at the step's
/// positions with the same frequencies, so the first op of a step computes
/// them and the others read them (a SmolLM2 step has 60 RoPE ops, which
/// each spent most of their time on the sines and cosines). A call with
/// other positions or frequencies computes them afresh; one that finds the
/// table in use (another model's step at the same time) computes its own.
#[derive(Default)]
pub struct RopeAngles(Mutex<AngleTable>);

/// The angles of `positions` at `inv_freq`, `[positions][rotary_dim]` as
/// `rope_angles_into` writes them.
#[derive(Default)]
struct AngleTable {
    inv_freq: Vec<f32>,
    positions: Vec<usize>,
    values: Vec<f32>,
}

impl AngleTable {
    /// Whether the table holds the angles of `positions` at `inv_freq`.
    fn holds(&self, positions: &[usize], inv_freq: &[f32]) -> bool {
        self.positions == positions && self.inv_freq == inv_freq
    }

    /// Computes the angles of `positions` at `inv_freq`, split by tokens
    /// over `pool` for many. The positions are cleared first, so a table
    /// left half-written by a panic never matches.
    fn fill(&mut self, positions: &[usize], inv_freq: &[f32], pool: &ThreadPool) {
        self.positions.clear();
        let row = 2 * inv_freq.len();
        self.values.resize(positions.len() * row, 0.0);
        for_row_pieces(pool, &mut self.values, row, |first, out| {
            for (angles, &pos) in out.chunks_exact_mut(row).zip(&positions[first..]) {
                rope_angles_into(pos, inv_freq, angles);
            }
        });
        self.inv_freq.clear();
        self.inv_freq.extend_from_slice(inv_freq);
        self.positions.extend_from_slice(positions);
    }
}

impl RopeAngles {
    /// Calls `f` with the angles of `positions` at `inv_freq` (see
    /// [`AngleTable`]), computed unless the table holds them.
    fn with<R>(
        &self,
        positions: &[usize],
        inv_freq: &[f32],
        pool: &ThreadPool,
        f: impl FnOnce(&[f32]) -> R,
    ) -> R {
        let mut table = match self.0.try_lock() {
            Ok(table) => table,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                let mut own = AngleTable::default();
                own.fill(positions, inv_freq, pool);
                return f(&own.values);
            }
        };
        if !table.holds(positions, inv_freq) {
            table.fill(positions, inv_freq, pool);
        }
        f(&table.values)
    }
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
            angles: Arc::default(),
        })
    }

    /// The same op reading and writing the angles of `angles`, shared with
    /// the other RoPE ops of a backend (default: a table of its own).
    pub fn with_angles(mut self, angles: Arc<RopeAngles>) -> Self {
        self.angles = angles;
        self
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
        let rows = output.len() / width.max(1);
        let positions = step.positions.get(..rows).ok_or_else(|| {
            Error::shape(
                "rope",
                format!("{rows} rows but {} positions", step.positions.len()),
            )
        })?;
        let pool = &self.pool;
        self.angles.with(positions, &self.inv_freq, pool, |angles| {
            for_row_pieces(pool, output, width, |first, out| {
                out.copy_from_slice(&x.data[first * width..][..out.len()]);
                let tokens = out.len() / width;
                let angles = &angles[first * p.rotary_dim..][..tokens * p.rotary_dim];
                apply_rope_angles(
                    out,
                    angles,
                    p.n_heads,
                    p.head_dim,
                    p.rotary_dim,
                    p.interleaved,
                );
            })
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::rope::apply_rope;
    use crate::cpu::kernels::test_util::{bits, pool2, Rng};
    use crate::cpu::ops::pieces::PIECE;
    use mllm_core::tensor::TensorRef;

    /// The op's output for `x` at `positions`.
    fn run(op: &mut RopeOp, x: &[f32], positions: &[usize]) -> Vec<f32> {
        let width = op.params.n_heads * op.params.head_dim;
        let shape = Shape::new([x.len() / width, width]);
        let step = StepLayout {
            positions: positions.to_vec(),
            ..StepLayout::default()
        };
        let input = [OpInput::Tensor(TensorRef {
            shape: &shape,
            data: x,
        })];
        let mut out = vec![f32::NAN; x.len()];
        op.execute(&input, &mut out, &step).unwrap();
        out
    }

    /// One [`apply_rope`] call over `x` with `op`'s parameters.
    fn reference(op: &RopeOp, x: &[f32], positions: &[usize]) -> Vec<f32> {
        let p = &op.params;
        let mut want = x.to_vec();
        apply_rope(
            &mut want,
            positions,
            p.n_heads,
            p.head_dim,
            p.rotary_dim,
            &op.inv_freq,
            p.interleaved,
        );
        want
    }

    /// Ops sharing one angle table (queries and keys of one model, a
    /// partial rotary dimension, another model's frequencies), called in
    /// turn at changing positions, each give the bits of one kernel call
    /// with their own parameters: a table left from another op's positions
    /// or frequencies is never read.
    #[test]
    fn ops_sharing_angles_give_their_own_bits() {
        let mut rng = Rng::new(14);
        let pool = Arc::new(pool2());
        let angles = Arc::new(RopeAngles::default());
        let op = |n_heads, rotary_dim, theta, interleaved| {
            let params = RopeParams {
                n_heads,
                head_dim: 64,
                rotary_dim,
                theta,
                llama3: None,
                interleaved,
            };
            RopeOp::new(params, Arc::clone(&pool))
                .unwrap()
                .with_angles(Arc::clone(&angles))
        };
        let mut ops = [
            op(9, 64, 10000.0, false),
            op(3, 64, 10000.0, false),
            op(3, 32, 10000.0, true),
            op(3, 64, 500000.0, false),
        ];
        let long: Vec<usize> = (0..2 * PIECE / (3 * 64) + 7).map(|t| 2 * t + 5).collect();
        let steps = [vec![7], vec![8], long.clone(), vec![0, 1, 2], long];
        for positions in &steps {
            for op in &mut ops {
                let width = op.params.n_heads * op.params.head_dim;
                let x = rng.vec(positions.len() * width, 2.0);
                let want = reference(op, &x, positions);
                assert_eq!(bits(&run(op, &x, positions)), bits(&want));
            }
        }
    }

    /// Split by tokens over two threads, RoPE gives the bits of one kernel
    /// call over every token, each token at its own position, for a
    /// tensor of several pieces that ends in a partial one.
    #[test]
    fn split_rope_gives_the_bits_of_one_call() {
        let mut rng = Rng::new(13);
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
        let mut op = RopeOp::new(params, Arc::new(pool2())).unwrap();
        let x = rng.vec(tokens * width, 2.0);
        let positions: Vec<usize> = (0..tokens).map(|t| 3 * t + 17).collect();
        let got = run(&mut op, &x, &positions);
        assert_eq!(bits(&got), bits(&reference(&op, &x, &positions)));
    }

    /// Fewer positions than rows is a shape error, not a panic.
    #[test]
    fn missing_positions_are_an_error() {
        let params = RopeParams {
            n_heads: 2,
            head_dim: 8,
            rotary_dim: 8,
            theta: 10000.0,
            llama3: None,
            interleaved: false,
        };
        let mut op = RopeOp::new(params, Arc::new(pool2())).unwrap();
        let shape = Shape::new([3, 16]);
        let x = vec![1.0; 48];
        let step = StepLayout {
            positions: vec![0, 1],
            ..StepLayout::default()
        };
        let input = [OpInput::Tensor(TensorRef {
            shape: &shape,
            data: &x,
        })];
        let err = op.execute(&input, &mut [0.0; 48], &step).unwrap_err();
        assert!(err.to_string().contains("3 rows but 2 positions"), "{err}");
    }
}
