//! Token embedding lookup in an f32, f16, bf16 or block-quantized table.

use half::{bf16, f16};
use mllm_core::op::{EmbeddingParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{DType, Error, Result, Shape};

use crate::cpu::kernels::embedding::embedding;
use crate::cpu::kernels::qembedding::quant_embedding;
use crate::cpu::kernels::qmatmul::QuantMatrix;
use crate::cpu::weights::{AnyMatrix, FloatSlice, FloatWeight, MatrixWeight};

/// The CPU embedding op.
pub struct EmbeddingOp {
    params: EmbeddingParams,
    table: Option<AnyMatrix>,
}

impl EmbeddingOp {
    /// An unloaded embedding op.
    pub fn new(params: EmbeddingParams) -> Self {
        EmbeddingOp {
            params,
            table: None,
        }
    }
}

impl Op for EmbeddingOp {
    fn load(&mut self, weights: &dyn WeightSource) -> Result<()> {
        let p = &self.params;
        self.table = Some(AnyMatrix::load(
            weights,
            &p.weight,
            [p.vocab, p.dim],
            "embedding",
        )?);
        Ok(())
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        Ok(Shape::new([inputs[0].numel(), self.params.dim]))
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let OpInput::Tokens(ids) = inputs[0] else {
            return Err(Error::shape("embedding", "input must be token ids"));
        };
        let p = &self.params;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= p.vocab) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                p.vocab
            )));
        }
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("embedding ran before load".into()))?;
        let table = match table {
            AnyMatrix::Packed(t) => {
                for (&id, out) in ids.iter().zip(output.chunks_mut(p.dim)) {
                    t.row(id as usize, out);
                }
                return Ok(());
            }
            AnyMatrix::Plain(t) => t,
        };
        match table {
            MatrixWeight::Quant { data, qt, cols, .. } => {
                // A quantized table (a GGUF's, often tied to a head that was
                // repacked) is read row by row with positioned reads:
                // through the map, each row would also bring a window of
                // pages around it into the resident set.
                let row_bytes = cols / qt.block_len() * qt.block_bytes();
                let mut row = vec![0u8; row_bytes];
                for (&id, out) in ids.iter().zip(output.chunks_mut(p.dim)) {
                    data.read_at(id as usize * row_bytes, &mut row)?;
                    quant_embedding(&[0], &QuantMatrix::new(*qt, &row, 1, *cols)?, out);
                }
            }
            MatrixWeight::Float(FloatWeight::Mapped(data)) => {
                // A mapped float table is read the same way: it is often
                // tied to a head that keeps its own packed copy.
                let row_bytes = data.dtype().bytes_for(p.dim)?;
                let mut buf = vec![0u32; row_bytes.div_ceil(4)];
                for (&id, out) in ids.iter().zip(output.chunks_mut(p.dim)) {
                    let row = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut buf)[..row_bytes];
                    data.read_at(id as usize * row_bytes, row)?;
                    let row = &*row;
                    match data.dtype() {
                        DType::F32 => {
                            embedding(&[0], bytemuck::cast_slice::<_, f32>(row), p.dim, out)
                        }
                        DType::F16 => {
                            embedding(&[0], bytemuck::cast_slice::<_, f16>(row), p.dim, out)
                        }
                        _ => embedding(&[0], bytemuck::cast_slice::<_, bf16>(row), p.dim, out),
                    }
                }
            }
            MatrixWeight::Float(t) => match t.slice() {
                FloatSlice::F32(t) => embedding(ids, t, p.dim, output),
                FloatSlice::F16(t) => embedding(ids, t, p.dim, output),
                FloatSlice::BF16(t) => embedding(ids, t, p.dim, output),
            },
        }
        Ok(())
    }
}
