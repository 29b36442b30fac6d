//! `y = x W^T + b` with f32, f16, bf16 or block-quantized weights.

use std::ops::Range;
use std::sync::Arc;

use mllm_core::op::{LinearParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use crate::cpu::kernels::matmul::{linear_at, HalfBits};
use crate::cpu::kernels::packed::{packed_linear, PackedQ4};
use crate::cpu::kernels::packed_half::{packed_half_linear, PackedHalf};
use crate::cpu::kernels::packed_q4k::{packed_kquant_linear, PackedQ4K};
use crate::cpu::kernels::packed_q5::{packed_q5_linear, PackedQ5};
use crate::cpu::kernels::packed_q5k::PackedQ5K;
use crate::cpu::kernels::packed_q6k::{packed_q6k_linear, PackedQ6K};
use crate::cpu::kernels::packed_q8::{packed_q8_linear, PackedQ8};
use crate::cpu::kernels::qkernel::{QuantKernel, QuantPath, SimdLevel};
use crate::cpu::kernels::qmatmul::{quant_linear, QuantMatrix};
use crate::cpu::kernels::weight_memory::WeightArena;
use crate::cpu::weights::{
    load_f32_vector, AnyMatrix, FloatSlice, MatrixSlice, MatrixWeight, PackedMatrix,
};
use crate::quant::QuantType;

/// A linear layer's weight as its kernels read it.
enum LinearWeight {
    /// In the file's layout (mostly read in place from the map).
    Plain(MatrixWeight),
    /// In a packed layout for an integer or f16/bf16 kernel: repacked at
    /// load, with the mapped weight it was copied from (kept to release its
    /// pages; `None` for a copy, which is dropped), or stored packed in the
    /// file and read in place (`None`).
    Packed(PackedWeight, Option<MatrixWeight>),
}

/// A weight in one of the packed layouts.
enum PackedWeight {
    Q4(PackedQ4),
    Q5(PackedQ5),
    Q8(PackedQ8),
    Q4K(PackedQ4K),
    Q5K(PackedQ5K),
    Q6K(PackedQ6K),
    Half(PackedHalf),
}

impl PackedWeight {
    /// `m` repacked in its type's layout into a buffer from `arena`, if
    /// the type has one and `m` fits it (see each layout's `pack`), calling
    /// `copied` with each range of rows once it is packed.
    fn pack(
        m: &QuantMatrix<'_>,
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Option<PackedWeight> {
        match m.quant_type() {
            QuantType::Q4_0 | QuantType::Q4_1 => PackedQ4::pack_with(m, arena, copied)
                .ok()
                .map(PackedWeight::Q4),
            QuantType::Q5_0 | QuantType::Q5_1 => PackedQ5::pack_with(m, arena, copied)
                .ok()
                .map(PackedWeight::Q5),
            QuantType::Q8_0 => PackedQ8::pack_with(m, arena, copied)
                .ok()
                .map(PackedWeight::Q8),
            QuantType::Q4K => PackedQ4K::pack_with(m, arena, copied)
                .ok()
                .map(PackedWeight::Q4K),
            QuantType::Q5K => PackedQ5K::pack_with(m, arena, copied)
                .ok()
                .map(PackedWeight::Q5K),
            QuantType::Q6K => PackedQ6K::pack_with(m, arena, copied)
                .ok()
                .map(PackedWeight::Q6K),
            QuantType::Q2K | QuantType::Q3K | QuantType::IQ4NL | QuantType::IQ4XS => None,
        }
    }

    /// The layer's product with this weight (see `packed_linear`).
    fn linear(
        &self,
        k: QuantKernel,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
        pool: &ThreadPool,
    ) {
        match self {
            PackedWeight::Q4(w) => packed_linear(k, x, rows, w, bias, y, pool),
            PackedWeight::Q5(w) => packed_q5_linear(k, x, rows, w, bias, y, pool),
            PackedWeight::Q8(w) => packed_q8_linear(k, x, rows, w, bias, y, pool),
            PackedWeight::Q4K(w) => packed_kquant_linear(k, x, rows, w, bias, y, pool),
            PackedWeight::Q5K(w) => packed_kquant_linear(k, x, rows, w, bias, y, pool),
            PackedWeight::Q6K(w) => packed_q6k_linear(k, x, rows, w, bias, y, pool),
            PackedWeight::Half(w) => packed_half_linear(k, x, rows, w, bias, y, pool),
        }
    }
}

/// The CPU linear layer.
pub struct LinearOp {
    params: LinearParams,
    weight: Option<LinearWeight>,
    bias: Option<Vec<f32>>,
    pool: Arc<ThreadPool>,
    /// The variant used for quantized weights, chosen once for this CPU.
    quant: QuantKernel,
    /// The level of the FMA micro-kernels for plain f32/f16/bf16 weights.
    float: QuantKernel,
    /// The fastest SIMD level both kernels may use.
    max_simd: SimdLevel,
    /// Where repacked weights go (a buffer of their own without one).
    arena: Option<Arc<WeightArena>>,
}

impl LinearOp {
    /// An unloaded linear op; quantized weights use
    /// [`QuantPath::Int16Activations`]: with AVX2, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0, Q4_K, Q5_K and Q6_K weights are repacked at load (see
    /// [`PackedQ4`], [`PackedQ5`], [`PackedQ8`], [`PackedQ4K`], [`PackedQ5K`],
    /// [`PackedQ6K`]) and every step
    /// multiplies them with 16-bit activations; other Q8_0 / Q4 weights use
    /// integer dot products with 16-bit activations, the other block types
    /// the f32 path.
    pub fn new(params: LinearParams, pool: Arc<ThreadPool>) -> Self {
        LinearOp {
            params,
            weight: None,
            bias: None,
            pool,
            quant: QuantKernel::new(QuantPath::Int16Activations),
            float: QuantKernel::new(QuantPath::F32Activations),
            max_simd: SimdLevel::FASTEST_FIRST[0],
            arena: None,
        }
    }

    /// Repacks weights into buffers from `arena`, shared with the model's
    /// other layers (see `weight_memory`).
    pub fn with_weight_arena(mut self, arena: Arc<WeightArena>) -> Self {
        self.arena = Some(arena);
        self
    }

    /// Chooses how quantized weights treat the activations (the fastest
    /// instruction set of this CPU for that path, within the layer's SIMD
    /// cap).
    pub fn with_quant_path(mut self, path: QuantPath) -> Self {
        self.quant = QuantKernel::capped(path, self.max_simd);
        self
    }

    /// Runs every kernel of this layer at `max` or a slower level (see
    /// [`QuantKernel::capped`]), whichever activation path it takes.
    pub fn with_max_simd(mut self, max: SimdLevel) -> Self {
        self.max_simd = max;
        self.quant = QuantKernel::capped(self.quant.path(), max);
        self.float = QuantKernel::capped(QuantPath::F32Activations, max);
        self
    }
}

impl Op for LinearOp {
    fn load(&mut self, weights: &dyn WeightSource) -> Result<()> {
        let p = &self.params;
        let shape = [p.out_features, p.in_features];
        self.weight = Some(
            match AnyMatrix::load(weights, &p.weight, shape, "linear")? {
                AnyMatrix::Packed(PackedMatrix::Q4(w)) => {
                    LinearWeight::Packed(PackedWeight::Q4(w), None)
                }
                AnyMatrix::Packed(PackedMatrix::Q8(w)) => {
                    LinearWeight::Packed(PackedWeight::Q8(w), None)
                }
                AnyMatrix::Plain(w) => {
                    let arena = self.arena.as_deref();
                    self.pool
                        .install(|| pack_if_faster(w, shape, self.quant, arena))
                }
            },
        );
        self.bias = p
            .bias
            .as_ref()
            .map(|b| load_f32_vector(weights, b, p.out_features))
            .transpose()?;
        Ok(())
    }

    fn loaded(&mut self) {
        if let Some(LinearWeight::Packed(_, Some(source))) = &self.weight {
            source.release_pages();
        }
        if let Some(arena) = &self.arena {
            arena.trim();
        }
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let rows = expect_rows("linear", "input", inputs[0], self.params.in_features)?;
        Ok(Shape::new([rows, self.params.out_features]))
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("linear")?;
        let p = &self.params;
        let w = self
            .weight
            .as_ref()
            .ok_or_else(|| Error::InvalidInput(format!("linear '{}' ran before load", p.weight)))?;
        let rows = x.shape.rows();
        let bias = self.bias.as_deref();
        let (inf, outf, pool, fk) = (p.in_features, p.out_features, &*self.pool, self.float);
        let w = match w {
            LinearWeight::Packed(w, _) => {
                w.linear(self.quant, x.data, rows, bias, output, pool);
                return Ok(());
            }
            LinearWeight::Plain(w) => w,
        };
        match w.slice() {
            MatrixSlice::Float(FloatSlice::F32(w)) => {
                linear_at(fk, x.data, rows, inf, w, outf, bias, output, pool)
            }
            MatrixSlice::Float(FloatSlice::F16(w)) => {
                linear_at(fk, x.data, rows, inf, w, outf, bias, output, pool)
            }
            MatrixSlice::Float(FloatSlice::BF16(w)) => {
                linear_at(fk, x.data, rows, inf, w, outf, bias, output, pool)
            }
            MatrixSlice::Quant(w) => quant_linear(self.quant, x.data, rows, &w, bias, output, pool),
        }
        Ok(())
    }
}

/// `weight` repacked for a packed kernel when `kernel` uses them and the
/// weight is Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K with a
/// row count that is a multiple of eight, or f16 / bf16 with rows in
/// eights and columns in 32s, into a buffer from `arena`; the mapped
/// bytes leave memory part by part as they are copied (a large head would
/// otherwise be resident twice while it is packed). Otherwise `weight`
/// unchanged.
fn pack_if_faster(
    weight: MatrixWeight,
    [rows, cols]: [usize; 2],
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
) -> LinearWeight {
    if !kernel.repacks_weights() {
        return LinearWeight::Plain(weight);
    }
    let release = |row_bytes: usize| {
        let weight = &weight;
        move |r: Range<usize>| weight.release_range(r.start * row_bytes..r.end * row_bytes)
    };
    let half = |bits: &[u16], kind| {
        PackedHalf::pack_with(bits, kind, [rows, cols], arena, &release(2 * cols))
            .ok()
            .map(PackedWeight::Half)
    };
    let packed = match weight.slice() {
        MatrixSlice::Quant(m) => PackedWeight::pack(&m, arena, &release(m.row_bytes())),
        MatrixSlice::Float(FloatSlice::F16(w)) => half(bytemuck::cast_slice(w), HalfBits::F16),
        MatrixSlice::Float(FloatSlice::BF16(w)) => half(bytemuck::cast_slice(w), HalfBits::Bf16),
        MatrixSlice::Float(FloatSlice::F32(_)) => None,
    };
    match packed {
        Some(p) => {
            weight.release_pages();
            LinearWeight::Packed(p, weight.is_mapped().then_some(weight))
        }
        None => LinearWeight::Plain(weight),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::pool1;

    fn op() -> LinearOp {
        let params = LinearParams {
            in_features: 32,
            out_features: 8,
            weight: "w".into(),
            bias: None,
        };
        LinearOp::new(params, Arc::new(pool1()))
    }

    /// The SIMD cap holds whichever of the path and the cap is set first.
    #[test]
    fn the_cap_holds_in_either_order() {
        let path = QuantPath::Int8Packed;
        for max in SimdLevel::FASTEST_FIRST {
            let want = QuantKernel::capped(path, max);
            let float = QuantKernel::capped(QuantPath::F32Activations, max);
            let first = op().with_quant_path(path).with_max_simd(max);
            let second = op().with_max_simd(max).with_quant_path(path);
            for o in [first, second] {
                assert_eq!((o.quant, o.float), (want, float), "capped at {max}");
            }
        }
    }
}
