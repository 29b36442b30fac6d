//! The CPU backend: every op, multi-threaded on an explicit thread pool.

pub mod kernels;
pub mod ops;
mod step;
pub mod weights;

use std::sync::Arc;

use mllm_core::backend::StepRunner;
use mllm_core::op::{GatedLinearParams, LinearParams, Op, OpDesc};
use mllm_core::{Backend, DType, Error, KvDtype, Result};
use rayon::ThreadPool;

use crate::quant::QuantType;

use kernels::{ActivationScratch, QuantPath, SimdLevel, WeightArena};
use ops::*;
use step::PoolRunner;

/// Creates CPU ops that share one worker pool, one arena for repacked
/// weights (see `kernels::weight_memory`), one scratch for quantized
/// activations and one table of RoPE angles. The arena never reuses
/// memory: make one backend per model.
pub struct CpuBackend {
    pool: Arc<ThreadPool>,
    arena: Arc<WeightArena>,
    scratch: Arc<ActivationScratch>,
    rope_angles: Arc<RopeAngles>,
    kv_dtype: KvDtype,
    quant_path: Option<QuantPath>,
    max_simd: Option<SimdLevel>,
}

impl CpuBackend {
    /// A backend with `threads` workers (0: one per available core).
    pub fn new(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("mllm-cpu-{i}"))
            .build()
            .map_err(|e| Error::InvalidInput(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(CpuBackend {
            pool: Arc::new(pool),
            arena: Arc::new(WeightArena::new()),
            scratch: Arc::default(),
            rope_angles: Arc::default(),
            kv_dtype: KvDtype::F32,
            quant_path: None,
            max_simd: None,
        })
    }

    /// The same backend with linear layers treating quantized weights'
    /// activations as `path` (default: the linear op's own,
    /// [`QuantPath::Int16Activations`]).
    pub fn with_quant_path(mut self, path: QuantPath) -> Self {
        self.quant_path = Some(path);
        self
    }

    /// The same backend with linear layers and attention running their
    /// kernels at `max` or a slower SIMD level (default: the fastest this
    /// CPU has; see [`kernels::QuantKernel::capped`]).
    pub fn with_max_simd(mut self, max: SimdLevel) -> Self {
        self.max_simd = Some(max);
        self
    }

    /// The same backend with KV caches stored as `kind` (default f32).
    pub fn with_kv_dtype(mut self, kind: KvDtype) -> Self {
        self.kv_dtype = kind;
        self
    }

    /// A linear op for `layers` (stacked when more than one) with this
    /// backend's pool, arena, activation path and SIMD cap.
    fn linear(&self, layers: Vec<LinearParams>) -> LinearOp {
        self.configured(LinearOp::stacked(layers, Arc::clone(&self.pool)))
    }

    /// `op` with this backend's arena, activation path and SIMD cap.
    fn configured(&self, op: LinearOp) -> LinearOp {
        let mut op = op
            .with_weight_arena(Arc::clone(&self.arena))
            .with_activation_scratch(Arc::clone(&self.scratch));
        if let Some(path) = self.quant_path {
            op = op.with_quant_path(path);
        }
        if let Some(max) = self.max_simd {
            op = op.with_max_simd(max);
        }
        op
    }

    /// A gated linear op (see [`LinearOp::gated`]) set up as [`Self::linear`]
    /// sets up a linear op.
    fn gated_linear(&self, p: &GatedLinearParams) -> LinearOp {
        let op = LinearOp::gated(p.gate.clone(), p.up.clone(), p.act, Arc::clone(&self.pool));
        self.configured(op)
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn create_op(&self, desc: &OpDesc) -> Result<Box<dyn Op>> {
        let pool = || Arc::clone(&self.pool);
        Ok(match desc {
            OpDesc::Embedding(p) => Box::new(EmbeddingOp::new(p.clone())),
            OpDesc::PositionEmbedding(p) => Box::new(PositionEmbeddingOp::new(p.clone())),
            OpDesc::Linear(p) => Box::new(self.linear(vec![p.clone()])),
            OpDesc::StackedLinear(layers) => Box::new(self.linear(layers.clone())),
            OpDesc::GatedLinear(p) => Box::new(self.gated_linear(p)),
            OpDesc::RmsNorm(p) => Box::new(RmsNormOp::new(p.clone(), pool())),
            OpDesc::LayerNorm(p) => Box::new(LayerNormOp::new(p.clone(), pool())),
            OpDesc::Rope(p) => {
                Box::new(RopeOp::new(p.clone(), pool())?.with_angles(Arc::clone(&self.rope_angles)))
            }
            OpDesc::Activation(a) => Box::new(ActivationOp::new(*a)),
            OpDesc::Glu(a) => Box::new(GluOp::new(*a, pool())),
            OpDesc::Add => Box::new(BinaryOp::add(pool())),
            OpDesc::Mul => Box::new(BinaryOp::mul(pool())),
            OpDesc::Scale(f) => Box::new(ScaleOp::new(*f)),
            OpDesc::SliceColumns(s) => Box::new(SliceColumnsOp::new(*s)),
            OpDesc::Softmax => Box::new(SoftmaxOp),
            OpDesc::KvCache(p) => Box::new(KvCacheOp::new(p.clone(), self.kv_dtype)?),
            OpDesc::Attention(p) => {
                let op = AttentionOp::new(p.clone(), pool())?;
                Box::new(match self.max_simd {
                    Some(max) => op.with_max_simd(max),
                    None => op,
                })
            }
            OpDesc::SelectLogitsRows => Box::new(SelectLogitsRowsOp),
        })
    }

    /// Where the linear kernels repack `dtype` weights (see
    /// [`LinearOp::stacked`]): one packed call then replaces several.
    fn stacks_linears(&self, dtype: DType) -> bool {
        self.linear(Vec::new()).repacks(dtype)
    }

    /// Where the integer kernels repack `dtype` weights: their products
    /// then meet the gated activation in the cache (see
    /// [`LinearOp::gated`]). Not for f16/bf16, whose kernels write each
    /// product.
    fn fuses_gated_linears(&self, dtype: DType) -> bool {
        QuantType::from_dtype(dtype).is_some() && self.stacks_linears(dtype)
    }

    /// Steps run on a worker of the pool, with the other workers kept
    /// awake until the step ends (see `step::PoolRunner`): every parallel
    /// op inside then splits its work from there (the caller helps and
    /// steals instead of sleeping until another thread wakes it), which is
    /// what makes the hundreds of parallel ops of a step cheap.
    fn step_runner(&self) -> Option<Arc<dyn StepRunner>> {
        Some(Arc::new(PoolRunner::new(Arc::clone(&self.pool))))
    }
}
