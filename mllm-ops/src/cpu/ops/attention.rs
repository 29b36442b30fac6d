//! Causal attention of the step's queries over each sequence's KV cache.

use std::sync::Arc;

use mllm_core::op::{AttentionParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use super::kv_cache::KvCacheState;
use crate::cpu::kernels::attention::{attention_batch, AttnShape, SeqAttention};
use crate::cpu::kernels::SimdLevel;

/// The CPU attention op.
pub struct AttentionOp {
    shape: AttnShape,
    pool: Arc<ThreadPool>,
    max_simd: SimdLevel,
}

impl AttentionOp {
    /// An attention op, validating the head layout.
    pub fn new(p: AttentionParams, pool: Arc<ThreadPool>) -> Result<Self> {
        if p.n_kv_heads == 0 || !p.n_heads.is_multiple_of(p.n_kv_heads) {
            return Err(Error::Config(format!(
                "attention heads ({}) must be a multiple of KV heads ({})",
                p.n_heads, p.n_kv_heads
            )));
        }
        if p.sliding_window == Some(0) {
            return Err(Error::Config("sliding window must be positive".into()));
        }
        Ok(AttentionOp {
            shape: AttnShape {
                n_heads: p.n_heads,
                n_kv_heads: p.n_kv_heads,
                head_dim: p.head_dim,
                scale: p.scale,
                sliding_window: p.sliding_window,
            },
            pool,
            max_simd: SimdLevel::FASTEST_FIRST[0],
        })
    }

    /// The same op with its kernels at `max` or a slower SIMD level
    /// (default: the fastest this CPU has).
    pub fn with_max_simd(mut self, max: SimdLevel) -> Self {
        self.max_simd = max;
        self
    }
}

impl Op for AttentionOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let width = self.shape.n_heads * self.shape.head_dim;
        let rows = expect_rows("attention", "queries", inputs[0], width)?;
        Ok(Shape::new([rows, width]))
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        step: &StepLayout,
    ) -> Result<()> {
        let q = inputs[0].tensor("attention")?;
        let OpInput::State(state) = inputs[1] else {
            return Err(Error::shape("attention", "second input must be a KV cache"));
        };
        let cache = state
            .downcast_ref::<KvCacheState>()
            .ok_or_else(|| Error::shape("attention", "second input is not a CPU KV cache"))?;
        let width = self.shape.n_heads * self.shape.head_dim;
        if cache.row_len() != self.shape.n_kv_heads * self.shape.head_dim {
            return Err(Error::shape(
                "attention",
                format!(
                    "KV rows of {} floats do not match {} KV heads of {}",
                    cache.row_len(),
                    self.shape.n_kv_heads,
                    self.shape.head_dim
                ),
            ));
        }
        let mut seqs = Vec::with_capacity(step.seqs.len());
        let mut outs = Vec::with_capacity(step.seqs.len());
        let mut rest = &mut output[..];
        let mut at = 0;
        for seq in &step.seqs {
            if cache.len(seq.slot) < seq.past + seq.len {
                return Err(Error::InvalidInput(format!(
                    "KV cache slot {} holds {} positions, attention needs {}",
                    seq.slot,
                    cache.len(seq.slot),
                    seq.past + seq.len
                )));
            }
            if seq.start != at || rest.len() < seq.len * width {
                return Err(Error::shape(
                    "attention",
                    format!(
                        "sequence rows {}..{} do not follow row {at} within the {} query rows",
                        seq.start,
                        seq.start + seq.len,
                        q.shape.rows()
                    ),
                ));
            }
            let rows = seq.start * width..(seq.start + seq.len) * width;
            let (out, tail) = std::mem::take(&mut rest).split_at_mut(seq.len * width);
            rest = tail;
            at += seq.len;
            seqs.push(SeqAttention {
                q: &q.data[rows],
                n_q: seq.len,
                past: seq.past,
                k: cache.keys(seq.slot),
                v: cache.values(seq.slot),
            });
            outs.push(out);
        }
        attention_batch(&seqs, &self.shape, outs, &self.pool, self.max_simd);
        Ok(())
    }
}
