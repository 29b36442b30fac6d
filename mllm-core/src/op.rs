//! Op descriptions (typed parameters) and the `Op` trait that backends implement.

use std::any::Any;

use crate::step::StepLayout;
use crate::tensor::TensorRef;
use crate::weights::WeightSource;
use crate::{Result, Shape};

/// A linear layer: `y = x W^T + b`, with `W` stored `[out_features, in_features]`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearParams {
    pub in_features: usize,
    pub out_features: usize,
    /// Name of the weight tensor.
    pub weight: String,
    /// Name of the bias tensor, if any.
    pub bias: Option<String>,
}

/// A gated MLP's gate and up layers (one shape, no bias) and the gated
/// activation after them.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedLinearParams {
    pub gate: LinearParams,
    pub up: LinearParams,
    pub act: Activation,
}

/// A token-embedding lookup in a `[vocab, dim]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingParams {
    pub vocab: usize,
    pub dim: usize,
    /// Name of the table tensor.
    pub weight: String,
}

/// Learned absolute position embeddings: row `position + offset` of a
/// `[rows, dim]` table for every token of the step.
#[derive(Clone, Debug, PartialEq)]
pub struct PositionEmbeddingParams {
    /// Rows of the table (the longest context is `rows - offset`).
    pub rows: usize,
    /// Width of one embedding.
    pub dim: usize,
    /// Row of position 0 (OPT keeps two unused rows: offset 2).
    pub offset: usize,
    /// Name of the table tensor.
    pub weight: String,
}

/// RMSNorm or LayerNorm over the last dimension.
///
/// With `groups > 1` every row holds `groups` consecutive vectors of `dim`
/// values (e.g. attention heads), each normalized on its own with the same
/// `[dim]` weights.
#[derive(Clone, Debug, PartialEq)]
pub struct NormParams {
    pub dim: usize,
    /// Vectors of `dim` per row (1: the whole row).
    pub groups: usize,
    pub eps: f32,
    /// Name of the scale tensor `[dim]`.
    pub weight: String,
    /// Name of the shift tensor `[dim]` (LayerNorm only).
    pub bias: Option<String>,
    /// Scale by `1 + weight` instead of `weight` (Gemma's RMSNorm).
    pub unit_offset: bool,
}

/// Llama 3 frequency scaling of rotary embeddings (`rope_type: llama3`).
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: f32,
}

/// Rotary position embeddings applied to `[tokens, heads * head_dim]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub n_heads: usize,
    pub head_dim: usize,
    /// How many leading dims of each head rotate (partial rotary when < head_dim).
    pub rotary_dim: usize,
    pub theta: f32,
    pub llama3: Option<Llama3RopeScaling>,
    /// Rotate adjacent pairs (GLM) instead of HF's rotate_half halves.
    pub interleaved: bool,
}

/// Elementwise activation functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)`.
    Silu,
    /// GELU with the tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// Exact GELU with erf.
    Gelu,
    /// `max(x, 0)`.
    Relu,
}

/// Columns `start..start + len` of a `[tokens, n]` activation (one part of
/// a fused projection's output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSlice {
    /// First column kept.
    pub start: usize,
    /// Columns kept.
    pub len: usize,
}

/// A per-layer KV cache for `kv_heads * head_dim` keys and values per token.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheParams {
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions reserved at a time when a sequence grows.
    pub chunk: usize,
}

/// Causal attention of new queries over a KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier of `q . k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Each query sees itself and the `w - 1` previous tokens.
    pub sliding_window: Option<usize>,
}

/// What a graph node computes, with typed parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum OpDesc {
    Embedding(EmbeddingParams),
    /// Learned absolute position embeddings of the step's tokens.
    PositionEmbedding(PositionEmbeddingParams),
    Linear(LinearParams),
    /// Linear layers on the same input stacked into one (see
    /// [`crate::stacking`]): every layer has the same `in_features`, and
    /// the output holds each layer's outputs in turn, `[rows, Σ
    /// out_features]`.
    StackedLinear(Vec<LinearParams>),
    /// A gated MLP's gate and up layers with their gated activation (see
    /// [`crate::gating`]): `act(x Wg^T) * (x Wu^T)`, `[rows,
    /// gate.out_features]`.
    GatedLinear(GatedLinearParams),
    RmsNorm(NormParams),
    LayerNorm(NormParams),
    Rope(RopeParams),
    Activation(Activation),
    /// Gated activation `act(gate) * up`, inputs `(gate, up)`: SwiGLU with
    /// `Silu`, GeGLU with `Gelu` or `GeluTanh`, ReGLU with `Relu`.
    Glu(Activation),
    /// Elementwise sum of two same-shaped inputs.
    Add,
    /// Elementwise product of two same-shaped inputs.
    Mul,
    /// Multiplies every element by a constant.
    Scale(f32),
    /// Copies a range of columns.
    SliceColumns(ColumnSlice),
    /// Softmax over the last dimension.
    Softmax,
    /// Appends `(k, v)` to the per-sequence cache; its output is the cache state.
    KvCache(KvCacheParams),
    /// Attention of `q` over the cache state produced by a `KvCache` node.
    Attention(AttentionParams),
    /// Keeps the rows that get logits (see [`crate::LogitsMode`]).
    SelectLogitsRows,
}

/// The kinds of values flowing along graph edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// The step's token ids (the graph input).
    Tokens,
    /// An f32 activation `[tokens, features]` in the executor's arena.
    Activation,
    /// State owned by the op that produced it (the KV cache).
    State,
}

impl OpDesc {
    /// Short lowercase op name, for node names and messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            OpDesc::Embedding(_) => "embedding",
            OpDesc::PositionEmbedding(_) => "position_embedding",
            OpDesc::Linear(_) => "linear",
            OpDesc::StackedLinear(_) => "stacked_linear",
            OpDesc::GatedLinear(_) => "gated_linear",
            OpDesc::RmsNorm(_) => "rms_norm",
            OpDesc::LayerNorm(_) => "layer_norm",
            OpDesc::Rope(_) => "rope",
            OpDesc::Activation(_) => "activation",
            OpDesc::Glu(_) => "glu",
            OpDesc::Add => "add",
            OpDesc::Mul => "mul",
            OpDesc::Scale(_) => "scale",
            OpDesc::SliceColumns(_) => "slice_columns",
            OpDesc::Softmax => "softmax",
            OpDesc::KvCache(_) => "kv_cache",
            OpDesc::Attention(_) => "attention",
            OpDesc::SelectLogitsRows => "select_logits_rows",
        }
    }

    /// The kinds of inputs the op takes, in order.
    pub fn input_kinds(&self) -> &'static [ValueKind] {
        use ValueKind::*;
        match self {
            OpDesc::Embedding(_) | OpDesc::PositionEmbedding(_) => &[Tokens],
            OpDesc::Glu(_) | OpDesc::Add | OpDesc::Mul | OpDesc::KvCache(_) => {
                &[Activation, Activation]
            }
            OpDesc::Attention(_) => &[Activation, State],
            _ => &[Activation],
        }
    }

    /// The kind of the op's output.
    pub fn output_kind(&self) -> ValueKind {
        match self {
            OpDesc::KvCache(_) => ValueKind::State,
            _ => ValueKind::Activation,
        }
    }
}

/// One input of an executing op.
#[derive(Clone, Copy)]
pub enum OpInput<'a> {
    /// The step's token ids.
    Tokens(&'a [u32]),
    /// An activation.
    Tensor(TensorRef<'a>),
    /// State of an earlier op (downcast to the backend's concrete type).
    State(&'a dyn Any),
    /// The op's [`Op::overwritable_input`], whose values the executor put
    /// in the output buffer: the op reads them there and overwrites them.
    InOutput,
}

impl<'a> OpInput<'a> {
    /// The activation, or an error naming `op` when this input is not one.
    pub fn tensor(&self, op: &str) -> Result<TensorRef<'a>> {
        match self {
            OpInput::Tensor(t) => Ok(*t),
            _ => Err(crate::Error::shape(op, "expected an activation input")),
        }
    }
}

/// An op instance on some backend, with mllm's three phases.
///
/// - `load` runs once, binding weights (zero-copy where possible), and
///   `loaded` once after every op of the graph has loaded;
/// - `reshape` runs when the step's shapes change and returns the output
///   shape for the given input shapes;
/// - `prepare` runs before every step on the caller's thread;
/// - `execute` computes into the output buffer the executor planned.
pub trait Op: Send {
    /// Binds weights. Ops without weights keep the default.
    fn load(&mut self, _weights: &dyn WeightSource) -> Result<()> {
        Ok(())
    }

    /// Runs once after every op of the graph has loaded: ops that copied
    /// their weights out of the map release its pages here, which loading
    /// the other ops' weights may have mapped back in. Others keep the
    /// default.
    fn loaded(&mut self) {}

    /// The output shape for these input shapes (`Tokens` inputs have shape
    /// `[n_tokens]`, `State` inputs an empty shape), or a shape error.
    fn reshape(&mut self, inputs: &[&Shape], step: &StepLayout) -> Result<Shape>;

    /// Runs before every step on the thread that called the executor, before
    /// the step is handed to the backend's step runner: ops that keep state
    /// grow it here (the KV cache), so that long-lived buffers are allocated
    /// on the caller's thread. Stateless ops keep the default.
    fn prepare(&mut self, _step: &StepLayout) -> Result<()> {
        Ok(())
    }

    /// Computes the output (`output` is empty for `State`-producing ops).
    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        output: &mut [f32],
        step: &StepLayout,
    ) -> Result<()>;

    /// State this op exposes to later ops (the KV cache).
    fn state(&self) -> Option<&dyn Any> {
        None
    }

    /// An input whose buffer the output may take over when nothing reads
    /// that input afterwards: the executor then passes it as
    /// [`OpInput::InOutput`], its values already in `output`. Only for ops
    /// whose output has the input's shape and whose output element `i`
    /// depends on element `i` of the inputs alone. None by default.
    fn overwritable_input(&self) -> Option<usize> {
        None
    }

    /// Forgets everything stored for the sequence in `slot`.
    fn reset_slot(&mut self, _slot: usize) {}

    /// Makes `to` hold the first `len` positions stored for `from` (which
    /// holds at least that many), replacing what `to` held: a sequence
    /// continues another's prefix without recomputing it. Stores may share
    /// the rows rather than copy them, as long as a later write to either
    /// slot leaves the other unchanged. Ops that keep nothing per sequence
    /// ignore it.
    fn copy_slot(&mut self, _from: usize, _to: usize, _len: usize) {}
}
