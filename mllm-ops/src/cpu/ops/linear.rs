//! `y = x W^T + b` with f32, f16, bf16 or block-quantized weights.

use std::ops::Range;
use std::sync::Arc;

use mllm_core::op::{Activation, LinearParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::weights::WeightSource;
use mllm_core::{DType, Error, Result, Shape};
use rayon::ThreadPool;

use super::expect_rows;
use crate::cpu::kernels::activation::glu;
use crate::cpu::kernels::columns::place_columns;
use crate::cpu::kernels::matmul::{linear_at, HalfBits};
use crate::cpu::kernels::packed::{packed_linear, stacked_ranges, PackedQ4, GROUP_ROWS};
use crate::cpu::kernels::packed_half::{packed_half_linear, PackedHalf};
use crate::cpu::kernels::packed_q4k::{packed_kquant_linear, packed_q4k_linear, PackedQ4K};
use crate::cpu::kernels::packed_q5::{packed_q5_linear, PackedQ5};
use crate::cpu::kernels::packed_q5k::PackedQ5K;
use crate::cpu::kernels::packed_q6k::{packed_q6k_linear, PackedQ6K};
use crate::cpu::kernels::packed_q8::{packed_q8_linear, PackedQ8};
use crate::cpu::kernels::qact::ActivationScratch;
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
    /// load, with the mapped weights it was copied from (kept to release
    /// their pages; copies are dropped), or stored packed in the file and
    /// read in place (no sources).
    Packed(PackedWeight, Vec<MatrixWeight>),
    /// The weights of stacked layers that could not become one matrix
    /// (see [`LinearOp::stacked`]), each with its output width, run one
    /// after another.
    Parts(Vec<(LinearWeight, usize)>),
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
    /// `parts` (one matrix, or several of one type and width stacked)
    /// repacked as one matrix in their type's layout into a buffer from
    /// `arena`, if the type has one and every part fits it (see each
    /// layout's `pack_with`), calling `copied` with each range of stacked
    /// rows once it is packed.
    fn pack(
        parts: &[QuantMatrix<'_>],
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Option<PackedWeight> {
        let packed = match parts.first()?.quant_type() {
            QuantType::Q4_0 | QuantType::Q4_1 => {
                PackedQ4::pack_with(parts, arena, copied).map(PackedWeight::Q4)
            }
            QuantType::Q5_0 | QuantType::Q5_1 => {
                PackedQ5::pack_with(parts, arena, copied).map(PackedWeight::Q5)
            }
            QuantType::Q8_0 => PackedQ8::pack_with(parts, arena, copied).map(PackedWeight::Q8),
            QuantType::Q4K => PackedQ4K::pack_with(parts, arena, copied).map(PackedWeight::Q4K),
            QuantType::Q5K => PackedQ5K::pack_with(parts, arena, copied).map(PackedWeight::Q5K),
            QuantType::Q6K => PackedQ6K::pack_with(parts, arena, copied).map(PackedWeight::Q6K),
            QuantType::Q2K | QuantType::Q3K | QuantType::IQ4NL | QuantType::IQ4XS => return None,
        };
        packed.ok()
    }

    /// Makes the products give `act(gate) · up` (see `RowOutputs::Gated`):
    /// for a matrix packed from a gate and an up weight group by group in
    /// turn. The f16/bf16 layout has no gated products.
    fn gate(&mut self, act: Activation) -> Result<()> {
        match self {
            PackedWeight::Q4(w) => w.gate(act),
            PackedWeight::Q5(w) => w.gate(act),
            PackedWeight::Q8(w) => w.gate(act),
            PackedWeight::Q4K(w) => w.gate(act),
            PackedWeight::Q5K(w) => w.gate(act),
            PackedWeight::Q6K(w) => w.gate(act),
            PackedWeight::Half(_) => Err(Error::UnsupportedDType(
                "f16/bf16 weights have no gated packed products".into(),
            )),
        }
    }

    /// Whether block type `qt` has a packed layout.
    fn has_layout(qt: QuantType) -> bool {
        match qt {
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K => true,
            QuantType::Q2K | QuantType::Q3K | QuantType::IQ4NL | QuantType::IQ4XS => false,
        }
    }

    /// The layer's product with this weight (see `packed_linear`).
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        k: QuantKernel,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
        pool: &ThreadPool,
        scratch: &ActivationScratch,
    ) {
        match self {
            PackedWeight::Q4(w) => packed_linear(k, x, rows, w, bias, y, pool, scratch),
            PackedWeight::Q5(w) => packed_q5_linear(k, x, rows, w, bias, y, pool, scratch),
            PackedWeight::Q8(w) => packed_q8_linear(k, x, rows, w, bias, y, pool, scratch),
            PackedWeight::Q4K(w) => packed_q4k_linear(k, x, rows, w, bias, y, pool, scratch),
            PackedWeight::Q5K(w) => packed_kquant_linear(k, x, rows, w, bias, y, pool, scratch),
            PackedWeight::Q6K(w) => packed_q6k_linear(k, x, rows, w, bias, y, pool, scratch),
            PackedWeight::Half(w) => packed_half_linear(k, x, rows, w, bias, y, pool),
        }
    }
}

/// The CPU linear layer, several stacked into one, or a gated MLP's gate
/// and up layers with their gated activation.
pub struct LinearOp {
    /// The layer, or the stacked layers in output order (gate and up for a
    /// gated op).
    layers: Vec<LinearParams>,
    in_features: usize,
    /// The output width: every layer's outputs (one layer's for a gated
    /// op).
    out_features: usize,
    /// The gated activation `act(gate) · up` of a gated op.
    gated: Option<Activation>,
    weight: Option<LinearWeight>,
    /// One part's outputs, before they go to their columns (`Parts` only;
    /// a gated op's gate products).
    part_out: Vec<f32>,
    /// A gated op's up products (`Parts` only).
    up_out: Vec<f32>,
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
    /// Where packed kernels quantize the activations.
    scratch: Arc<ActivationScratch>,
}

impl LinearOp {
    /// An unloaded linear op; quantized weights use
    /// [`QuantPath::Int16Activations`]: with AVX2, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0, Q4_K, Q5_K and Q6_K weights are repacked at load (see
    /// [`PackedQ4`], [`PackedQ5`], [`PackedQ8`], [`PackedQ4K`], `PackedQ5K`,
    /// [`PackedQ6K`]) and every step
    /// multiplies them with 16-bit activations; other Q8_0 / Q4 weights use
    /// integer dot products with 16-bit activations, the other block types
    /// the f32 path.
    pub fn new(params: LinearParams, pool: Arc<ThreadPool>) -> Self {
        Self::stacked(vec![params], pool)
    }

    /// One op for `layers` (at least one, all with the same
    /// `in_features`), its outputs each layer's in turn: at load, weights
    /// of one type that its kernels repack are packed together as one
    /// matrix; otherwise each layer keeps its weight and runs on its own.
    pub fn stacked(layers: Vec<LinearParams>, pool: Arc<ThreadPool>) -> Self {
        let in_features = layers.first().map_or(0, |p| p.in_features);
        let out_features = layers.iter().map(|p| p.out_features).sum();
        LinearOp {
            layers,
            in_features,
            out_features,
            gated: None,
            weight: None,
            part_out: Vec::new(),
            up_out: Vec::new(),
            bias: None,
            pool,
            quant: QuantKernel::new(QuantPath::Int16Activations),
            float: QuantKernel::new(QuantPath::F32Activations),
            max_simd: SimdLevel::FASTEST_FIRST[0],
            arena: None,
            scratch: Arc::default(),
        }
    }

    /// One op for a gated MLP's `gate` and `up` layers (same shape, no
    /// bias) and the gated activation `act(gate) · up` after them, its
    /// output `gate.out_features` wide: at load, weights of one type that
    /// the integer kernels repack are packed as one matrix, a group of gate
    /// rows then the up group of the same rows, and the kernels' products
    /// meet in the cache (see `RowOutputs::Gated`); otherwise both layers
    /// run on their own and the activation after them.
    pub fn gated(
        gate: LinearParams,
        up: LinearParams,
        act: Activation,
        pool: Arc<ThreadPool>,
    ) -> Self {
        let out_features = gate.out_features;
        let mut op = Self::stacked(vec![gate, up], pool);
        op.out_features = out_features;
        op.gated = Some(act);
        op
    }

    /// Repacks weights into buffers from `arena`, shared with the model's
    /// other layers (see `weight_memory`).
    pub fn with_weight_arena(mut self, arena: Arc<WeightArena>) -> Self {
        self.arena = Some(arena);
        self
    }

    /// Quantizes activations into the buffers of `scratch`, shared with
    /// the model's other layers (see [`ActivationScratch`]).
    pub fn with_activation_scratch(mut self, scratch: Arc<ActivationScratch>) -> Self {
        self.scratch = scratch;
        self
    }

    /// Chooses how quantized weights treat the activations (the fastest
    /// instruction set of this CPU for that path, within the layer's SIMD
    /// cap).
    pub fn with_quant_path(mut self, path: QuantPath) -> Self {
        self.quant = QuantKernel::capped(path, self.max_simd);
        self
    }

    /// Whether the loaded weights are one matrix: always for one layer;
    /// for stacked layers, whether they could be packed together (see
    /// [`LinearOp::stacked`]).
    pub fn is_one_matrix(&self) -> bool {
        matches!(
            self.weight,
            Some(LinearWeight::Plain(_) | LinearWeight::Packed(..))
        )
    }

    /// Whether this op repacks weights of `dtype` for its kernels (rows
    /// and columns permitting).
    pub fn repacks(&self, dtype: DType) -> bool {
        let packed_type = match QuantType::from_dtype(dtype) {
            Some(qt) => PackedWeight::has_layout(qt),
            None => matches!(dtype, DType::F16 | DType::BF16),
        };
        self.quant.repacks_weights() && packed_type
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
        let in_f = self.in_features;
        if let Some(p) = self.layers.iter().find(|p| p.in_features != in_f) {
            return Err(Error::shape(
                format!("linear '{}'", p.weight),
                format!(
                    "stacked with layers of {in_f} inputs, it has {}",
                    p.in_features
                ),
            ));
        }
        if self.gated.is_some() {
            self.check_gated()?;
        }
        let mut matrices = Vec::with_capacity(self.layers.len());
        for p in &self.layers {
            let shape = [p.out_features, in_f];
            matrices.push((AnyMatrix::load(weights, &p.weight, shape, "linear")?, shape));
        }
        let arena = self.arena.as_deref();
        let (kernel, pool) = (self.quant, &*self.pool);
        self.weight = Some(match (self.gated, <[_; 1]>::try_from(matrices)) {
            (None, Ok([(m, shape)])) => bind(m, shape, kernel, arena, pool),
            (None, Err(parts)) => bind_stacked(parts, in_f, kernel, arena, pool),
            (Some(act), Err(parts)) => bind_gated(parts, act, kernel, arena, pool),
            (Some(_), Ok(_)) => unreachable!("a gated op has two layers"),
        });
        self.bias = self.load_bias(weights)?;
        Ok(())
    }

    fn loaded(&mut self) {
        if let Some(w) = &self.weight {
            w.release_sources();
        }
        if let Some(arena) = &self.arena {
            arena.trim();
        }
    }

    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let rows = expect_rows("linear", "input", inputs[0], self.in_features)?;
        Ok(Shape::new([rows, self.out_features]))
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        _step: &StepLayout,
    ) -> Result<()> {
        let x = inputs[0].tensor("linear")?;
        let w = self.weight.as_ref().ok_or_else(|| {
            Error::InvalidInput(format!(
                "linear '{}' ran before load",
                self.layers[0].weight
            ))
        })?;
        let rows = x.shape.rows();
        let bias = self.bias.as_deref();
        let kernels = Kernels {
            quant: self.quant,
            float: self.float,
            pool: &self.pool,
            scratch: &self.scratch,
        };
        if let (Some(act), LinearWeight::Parts(parts)) = (self.gated, w) {
            let [(gate, out_f), (up, _)] = &parts[..] else {
                unreachable!("a gated op's parts are its gate and up weights")
            };
            let shape = [*out_f, self.in_features];
            self.part_out.resize(rows * out_f, 0.0);
            self.up_out.resize(rows * out_f, 0.0);
            kernels.product(gate, x.data, rows, shape, None, &mut self.part_out);
            kernels.product(up, x.data, rows, shape, None, &mut self.up_out);
            glu(act, &self.part_out, &self.up_out, output);
            return Ok(());
        }
        let LinearWeight::Parts(parts) = w else {
            let shape = [self.layers_rows(), self.in_features];
            kernels.product(w, x.data, rows, shape, bias, output);
            return Ok(());
        };
        let mut start = 0;
        for (part, out_f) in parts {
            let part_bias = bias.map(|b| &b[start..start + out_f]);
            self.part_out.resize(rows * out_f, 0.0);
            let shape = [*out_f, self.in_features];
            kernels.product(part, x.data, rows, shape, part_bias, &mut self.part_out);
            place_columns(&self.part_out, *out_f, output, self.out_features, start);
            start += out_f;
        }
        Ok(())
    }
}

impl LinearOp {
    /// Weight rows of every layer (a gated op's gate and up rows).
    fn layers_rows(&self) -> usize {
        self.layers.iter().map(|p| p.out_features).sum()
    }

    /// Fails unless a gated op's gate and up layers have one shape and no
    /// bias.
    fn check_gated(&self) -> Result<()> {
        let [gate, up] = &self.layers[..] else {
            return Err(Error::InvalidInput(format!(
                "a gated linear op takes a gate and an up layer, not {}",
                self.layers.len()
            )));
        };
        if gate.out_features != up.out_features {
            return Err(Error::shape(
                format!("gated linear '{}' + '{}'", gate.weight, up.weight),
                format!(
                    "gate has {} outputs, up {}",
                    gate.out_features, up.out_features
                ),
            ));
        }
        if let Some(p) = self.layers.iter().find(|p| p.bias.is_some()) {
            return Err(Error::InvalidInput(format!(
                "gated linear '{}': gate and up layers with a bias are not fused",
                p.weight
            )));
        }
        Ok(())
    }

    /// Every layer's bias, stacked, or `None` when no layer has one; a
    /// stack of layers with and without bias is refused.
    fn load_bias(&self, weights: &dyn WeightSource) -> Result<Option<Vec<f32>>> {
        let with_bias = self.layers.iter().filter(|p| p.bias.is_some()).count();
        if with_bias == 0 {
            return Ok(None);
        }
        if with_bias < self.layers.len() {
            return Err(Error::InvalidInput(format!(
                "linear '{}': stacked layers must all have a bias or none",
                self.layers[0].weight
            )));
        }
        let mut bias = Vec::with_capacity(self.out_features);
        for p in &self.layers {
            let name = p.bias.as_deref().unwrap_or_default();
            bias.extend(load_f32_vector(weights, name, p.out_features)?);
        }
        Ok(Some(bias))
    }
}

/// What a linear op multiplies with: its kernel variants, pool and
/// activation scratch.
struct Kernels<'a> {
    quant: QuantKernel,
    float: QuantKernel,
    pool: &'a ThreadPool,
    scratch: &'a ActivationScratch,
}

impl Kernels<'_> {
    /// `y = x w^T + bias` for one weight `w` (not `Parts`) of `[out_f,
    /// in_f]`: `x` is `[rows, in_f]`, `y` `[rows, out_f]`.
    fn product(
        &self,
        w: &LinearWeight,
        x: &[f32],
        rows: usize,
        [out_f, in_f]: [usize; 2],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) {
        let (pool, fk) = (self.pool, self.float);
        match w {
            LinearWeight::Packed(w, _) => {
                w.linear(self.quant, x, rows, bias, y, pool, self.scratch)
            }
            LinearWeight::Plain(w) => match w.slice() {
                MatrixSlice::Float(FloatSlice::F32(w)) => {
                    linear_at(fk, x, rows, in_f, w, out_f, bias, y, pool)
                }
                MatrixSlice::Float(FloatSlice::F16(w)) => {
                    linear_at(fk, x, rows, in_f, w, out_f, bias, y, pool)
                }
                MatrixSlice::Float(FloatSlice::BF16(w)) => {
                    linear_at(fk, x, rows, in_f, w, out_f, bias, y, pool)
                }
                MatrixSlice::Quant(w) => quant_linear(self.quant, x, rows, &w, bias, y, pool),
            },
            LinearWeight::Parts(_) => unreachable!("parts run one by one"),
        }
    }
}

impl LinearWeight {
    /// Drops the mapped pages of the weights this one was repacked from.
    fn release_sources(&self) {
        match self {
            LinearWeight::Packed(_, sources) => sources.iter().for_each(|w| w.release_pages()),
            LinearWeight::Parts(parts) => parts.iter().for_each(|(w, _)| w.release_sources()),
            LinearWeight::Plain(_) => {}
        }
    }
}

/// A layer's weight as its kernels read it: a packed file's layout as it
/// is, any other repacked when `kernel` gains by it (see `pack_if_faster`).
fn bind(
    m: AnyMatrix,
    shape: [usize; 2],
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
    pool: &ThreadPool,
) -> LinearWeight {
    match m {
        AnyMatrix::Packed(PackedMatrix::Q4(w)) => LinearWeight::Packed(PackedWeight::Q4(w), vec![]),
        AnyMatrix::Packed(PackedMatrix::Q8(w)) => LinearWeight::Packed(PackedWeight::Q8(w), vec![]),
        AnyMatrix::Plain(w) => pool.install(|| pack_if_faster(w, shape, kernel, arena)),
    }
}

/// Stacked layers' weights (`[rows, in_f]` each) as one packed matrix
/// where [`pack_weights`] can make one of them, otherwise each bound on
/// its own and run in turn (`Parts`).
fn bind_stacked(
    parts: Vec<(AnyMatrix, [usize; 2])>,
    in_f: usize,
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
    pool: &ThreadPool,
) -> LinearWeight {
    let weights: Vec<&MatrixWeight> = parts.iter().filter_map(|(m, _)| m.plain()).collect();
    let packed = (weights.len() == parts.len())
        .then(|| pool.install(|| pack_weights(&weights, in_f, kernel, arena)))
        .flatten();
    packed_or_parts(packed, parts, kernel, arena, pool)
}

/// `packed`, kept with the weights of `parts` it was copied from, or
/// without it each part bound on its own, to run in turn (`Parts`).
fn packed_or_parts(
    packed: Option<PackedWeight>,
    parts: Vec<(AnyMatrix, [usize; 2])>,
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
    pool: &ThreadPool,
) -> LinearWeight {
    let Some(packed) = packed else {
        let parts = parts
            .into_iter()
            .map(|(m, shape)| (bind(m, shape, kernel, arena, pool), shape[0]));
        return LinearWeight::Parts(parts.collect());
    };
    repacked(
        packed,
        parts.into_iter().filter_map(|(m, _)| m.into_plain()),
    )
}

/// A gated op's gate and up weights (`[rows, in_f]` each) as one packed
/// matrix, a group of gate rows then the up group of the same rows, with
/// gated products (`RowOutputs::Gated`) where [`pack_weights`] can make
/// one of them; otherwise each bound on its own and run in turn (`Parts`).
fn bind_gated(
    parts: Vec<(AnyMatrix, [usize; 2])>,
    act: Activation,
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
    pool: &ThreadPool,
) -> LinearWeight {
    let packed = match &parts[..] {
        [(gate, [rows, _]), (up, _)] => gate
            .plain()
            .zip(up.plain())
            .and_then(|(g, u)| pool.install(|| pack_interleaved([g, u], *rows, kernel, arena)))
            .and_then(|mut p| p.gate(act).ok().map(|()| p)),
        _ => None,
    };
    packed_or_parts(packed, parts, kernel, arena, pool)
}

/// Quantized `gate` and `up` weights of `rows` rows each repacked as one
/// matrix group by group in turn (gate rows `8g..8g + 8`, then the same up
/// rows), as [`pack_weights`] packs stacked layers; `None` where it would
/// not pack them, or for float weights.
fn pack_interleaved(
    [gate, up]: [&MatrixWeight; 2],
    rows: usize,
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
) -> Option<PackedWeight> {
    if !kernel.repacks_weights() || !rows.is_multiple_of(GROUP_ROWS) {
        return None;
    }
    let (MatrixSlice::Quant(g), MatrixSlice::Quant(u)) = (gate.slice(), up.slice()) else {
        return None;
    };
    let groups = (0..rows / GROUP_ROWS).map(|k| {
        let first = k * GROUP_ROWS;
        Some([
            g.rows_range(first, GROUP_ROWS)?,
            u.rows_range(first, GROUP_ROWS)?,
        ])
    });
    let parts: Vec<QuantMatrix<'_>> = groups.collect::<Option<Vec<_>>>()?.concat();
    let row_bytes = g.row_bytes();
    // Gives back the mapped bytes of every group wholly inside the packed
    // rows `r` (group `v` of the packed matrix is group `v / 2` of the gate
    // weight for even `v`, of the up weight for odd `v`).
    let release = |r: Range<usize>| {
        let (first, end) = (r.start.div_ceil(GROUP_ROWS), r.end / GROUP_ROWS);
        for (source, w) in [gate, up].into_iter().enumerate() {
            let local_first = (first + 1 - source) / 2;
            let local_end = (end + 1 - source) / 2;
            if local_first < local_end {
                let bytes = GROUP_ROWS * row_bytes;
                w.release_range(local_first * bytes..local_end * bytes);
            }
        }
    };
    let packed = PackedWeight::pack(&parts, arena, &release)?;
    gate.release_pages();
    up.release_pages();
    Some(packed)
}

/// A repacked weight, kept with the mapped weights it was copied from.
fn repacked(packed: PackedWeight, sources: impl IntoIterator<Item = MatrixWeight>) -> LinearWeight {
    let mapped = sources.into_iter().filter(|w| w.is_mapped());
    LinearWeight::Packed(packed, mapped.collect())
}

/// `weight` repacked for a packed kernel when `kernel` uses them and the
/// weight is Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K with a
/// row count that is a multiple of eight, or f16 / bf16 with rows in
/// eights and columns in 32s, into a buffer from `arena` (see
/// [`pack_weights`]). Otherwise `weight` unchanged.
fn pack_if_faster(
    weight: MatrixWeight,
    [_, cols]: [usize; 2],
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
) -> LinearWeight {
    match pack_weights(&[&weight], cols, kernel, arena) {
        Some(p) => repacked(p, [weight]),
        None => LinearWeight::Plain(weight),
    }
}

/// `weights` (one matrix, or the stacked layers' matrices of `cols`
/// columns) repacked as one matrix for a packed kernel into a buffer from
/// `arena`, when `kernel` uses packed weights and they are all of one
/// type that has a packed layout, with rows in whole groups; `None`
/// otherwise. The mapped bytes leave memory part by part as they are
/// copied (a large head would otherwise be resident twice while it is
/// packed), and all of them once packing is done.
fn pack_weights(
    weights: &[&MatrixWeight],
    cols: usize,
    kernel: QuantKernel,
    arena: Option<&WeightArena>,
) -> Option<PackedWeight> {
    if !kernel.repacks_weights() {
        return None;
    }
    let slices: Vec<MatrixSlice<'_>> = weights.iter().map(|w| w.slice()).collect();
    let rows: Vec<usize> = slices.iter().map(|s| slice_rows(s, cols)).collect();
    // Gives back the mapped bytes of the stacked rows `r`, `row_bytes`
    // per row, in every part they cover.
    let release = |row_bytes: usize| {
        let rows = &rows;
        move |r: Range<usize>| {
            for (part, local) in stacked_ranges(rows.iter().copied(), r) {
                weights[part].release_range(local.start * row_bytes..local.end * row_bytes);
            }
        }
    };
    let total: usize = rows.iter().sum();
    let packed = match slices[0] {
        MatrixSlice::Quant(first) => {
            let parts: Vec<QuantMatrix<'_>> = slices
                .iter()
                .map(|s| match s {
                    MatrixSlice::Quant(m) => Some(*m),
                    MatrixSlice::Float(_) => None,
                })
                .collect::<Option<_>>()?;
            PackedWeight::pack(&parts, arena, &release(first.row_bytes()))?
        }
        MatrixSlice::Float(FloatSlice::F16(_) | FloatSlice::BF16(_)) => {
            let kind = half_bits(&slices[0])?.0;
            let parts: Vec<&[u16]> = slices
                .iter()
                .map(|s| {
                    half_bits(s)
                        .filter(|(k, _)| *k == kind)
                        .map(|(_, bits)| bits)
                })
                .collect::<Option<_>>()?;
            let release = release(2 * cols);
            PackedHalf::pack_with(&parts, kind, [total, cols], arena, &release)
                .ok()
                .map(PackedWeight::Half)?
        }
        MatrixSlice::Float(FloatSlice::F32(_)) => return None,
    };
    weights.iter().for_each(|w| w.release_pages());
    Some(packed)
}

/// The rows of a weight of `cols` columns.
fn slice_rows(s: &MatrixSlice<'_>, cols: usize) -> usize {
    match s {
        MatrixSlice::Quant(m) => m.rows(),
        MatrixSlice::Float(w) => w.values() / cols.max(1),
    }
}

/// An f16 or bf16 weight's kind and raw 16-bit values.
fn half_bits<'a>(s: &MatrixSlice<'a>) -> Option<(HalfBits, &'a [u16])> {
    match *s {
        MatrixSlice::Float(FloatSlice::F16(w)) => Some((HalfBits::F16, bytemuck::cast_slice(w))),
        MatrixSlice::Float(FloatSlice::BF16(w)) => Some((HalfBits::Bf16, bytemuck::cast_slice(w))),
        _ => None,
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
