//! Sibling linear layers stacked by the executor (`mllm::core::stacking`):
//! a model whose q, k and v projections run as one stacked op gives the
//! logits of the same model run layer by layer, bit for bit, in prefill,
//! batched and decode steps; only weight types the CPU kernels repack are
//! stacked, layers of different types apart, and a gated MLP's gate and up
//! layers stay apart.

mod common;

use std::sync::Arc;

use common::*;
use mllm::convert::{convert, ConvertOptions};
use mllm::core::backend::StepRunner;
use mllm::core::file::MllmFile;
use mllm::core::file::TensorData;
use mllm::core::op::{Op, OpDesc};
use mllm::core::weights::WeightSource;
use mllm::core::{Backend, DType, Executor, Graph, Result};
use mllm::models::registry;
use mllm::ops::cpu::CpuBackend;

/// The CPU backend without stacking.
struct Unstacked(CpuBackend);

impl Backend for Unstacked {
    fn name(&self) -> String {
        self.0.name()
    }
    fn create_op(&self, desc: &OpDesc) -> Result<Box<dyn Op>> {
        self.0.create_op(desc)
    }
    fn step_runner(&self) -> Option<Arc<dyn StepRunner>> {
        self.0.step_runner()
    }
}

/// An executor for the model in `path` on `backend`.
fn executor(path: &std::path::Path, backend: &dyn Backend) -> Executor {
    let file = MllmFile::open(path).unwrap();
    executor_over(&file, &file, backend)
}

/// An executor for the model described by `file` with its weights from
/// `weights`, on `backend`.
fn executor_over(file: &MllmFile, weights: &dyn WeightSource, backend: &dyn Backend) -> Executor {
    let meta = file.metadata().unwrap();
    let model = (registry::find(&meta.architecture).unwrap().build)(&meta.config).unwrap();
    let graph = Graph::trace(model.as_ref()).unwrap();
    Executor::new(graph, backend, weights, 256).unwrap()
}

/// The weights of one file with the v projections from another, as in
/// llama.cpp's K-quant mixes, which give v more bits than q and k.
struct VFromOtherFile {
    base: MllmFile,
    v: MllmFile,
}

impl WeightSource for VFromOtherFile {
    fn weight(&self, name: &str, shape: &[usize]) -> Result<TensorData> {
        let file = if name.contains("v_proj") {
            &self.v
        } else {
            &self.base
        };
        file.weight(name, shape)
    }
}

/// The names of the executor's stacked nodes.
fn stacked_nodes(ex: &Executor) -> Vec<String> {
    let nodes = ex.graph().nodes().iter();
    let stacked = nodes.filter(|n| matches!(n.desc, OpDesc::StackedLinear(_)));
    stacked.map(|n| n.name.clone()).collect()
}

#[test]
fn stacked_projections_give_the_unstacked_logits() {
    for dtype in [DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::F16] {
        let c = convert_to(&fixture("tiny-llama"), dtype);
        for threads in [1, 2] {
            let cpu = CpuBackend::new(threads).unwrap();
            let mut stacked = executor(&c.path, &cpu);
            let mut plain = executor(&c.path, &Unstacked(CpuBackend::new(threads).unwrap()));
            let what = format!("{dtype}, {threads} threads");
            let repacks = cpu.stacks_linears(dtype);
            let want: &[&str] = if repacks {
                &[
                    "model.layers.0.self_attn.q_proj+k_proj+v_proj",
                    "model.layers.1.self_attn.q_proj+k_proj+v_proj",
                ]
            } else {
                &[]
            };
            assert_eq!(stacked_nodes(&stacked), want, "{what}");
            assert!(stacked_nodes(&plain).is_empty(), "{what}");
            assert_eq!(
                two_sequence_logits(&mut stacked, 39),
                two_sequence_logits(&mut plain, 39),
                "{what}"
            );
        }
    }
}

/// Q5_0 q and k projections with Q8_0 v: q and k stack, v stays alone,
/// and the logits are the unstacked ones.
#[test]
fn projections_of_two_weight_types_stack_by_type() {
    let q5 = convert_to(&fixture("tiny-llama"), DType::Q5_0);
    let q8 = convert_to(&fixture("tiny-llama"), DType::Q8_0);
    let cpu = CpuBackend::new(2).unwrap();
    assert!(cpu.stacks_linears(DType::Q5_0) && cpu.stacks_linears(DType::Q8_0));
    let weights = VFromOtherFile {
        base: MllmFile::open(&q5.path).unwrap(),
        v: MllmFile::open(&q8.path).unwrap(),
    };
    let mut stacked = executor_over(&weights.base, &weights, &cpu);
    let unstacked = Unstacked(CpuBackend::new(2).unwrap());
    let mut plain = executor_over(&weights.base, &weights, &unstacked);
    assert_eq!(
        stacked_nodes(&stacked),
        [
            "model.layers.0.self_attn.q_proj+k_proj",
            "model.layers.1.self_attn.q_proj+k_proj",
        ]
    );
    let logits = two_sequence_logits(&mut stacked, 39);
    assert_eq!(logits, two_sequence_logits(&mut plain, 39));
    // The v projections' type shows: the model of the Q5_0 file alone
    // gives other logits.
    let mut q5_only = executor(&q5.path, &cpu);
    assert_ne!(logits, two_sequence_logits(&mut q5_only, 39));
}

/// Imported Qwen2 (q, k and v projections with biases, stacked with
/// them), Qwen3 (per-head q/k norms after the slices) and Gemma.
#[test]
fn stacked_projections_with_biases_give_the_unstacked_logits() {
    for name in ["tiny-qwen2", "tiny-qwen3", "tiny-gemma"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.mllm");
        let gguf = fixture("gguf").join(format!("{name}.q8_0.gguf"));
        convert(&gguf, &path, &ConvertOptions::default()).unwrap();
        let mut stacked = executor(&path, &CpuBackend::new(2).unwrap());
        let mut plain = executor(&path, &Unstacked(CpuBackend::new(2).unwrap()));
        let nodes = stacked_nodes(&stacked);
        let stacks = CpuBackend::new(1).unwrap().stacks_linears(DType::Q8_0);
        let qkv = nodes.iter().any(|n| n.ends_with("q_proj+k_proj+v_proj"));
        assert_eq!(qkv, stacks, "{name}: {nodes:?}");
        assert_eq!(
            two_sequence_logits(&mut stacked, 39),
            two_sequence_logits(&mut plain, 39),
            "{name}"
        );
    }
}

#[test]
fn f32_weights_and_fused_files_are_not_stacked() {
    let cpu = CpuBackend::new(1).unwrap();
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    assert!(stacked_nodes(&executor(&c.path, &cpu)).is_empty());
    // GPT-2's q, k and v are one matrix in the file already, and its MLP
    // has no gate.
    let c = convert_to(&fixture("tiny-gpt2"), DType::Q8_0);
    assert!(stacked_nodes(&executor(&c.path, &cpu)).is_empty());
}
