//! Loading a `.mllm` file into a runnable model.

use std::path::Path;
use std::sync::Arc;

use mllm_core::file::MllmFile;
use mllm_core::weights::TrackedWeights;
use mllm_core::Error;
use mllm_core::{Device, Executor, Graph, KvDtype, Placement, Result, StepInput, Tensor};
use mllm_ops::cpu::kernels::{QuantPath, SimdLevel};
use mllm_ops::cpu::CpuBackend;
use mllm_ops::cuda::CudaBackend;
use serde_json::Value;

use crate::chat::ChatTemplate;
use crate::config::HfConfig;
use crate::tokenizer::Tokenizer;
use crate::CausalLm;
use crate::{file_meta, registry};

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Worker threads for the CPU backend (0: one per core).
    pub threads: usize,
    /// Cap on the context (defaults to the model's `max_position_embeddings`).
    pub max_context: Option<usize>,
    /// `config.json` for files without embedded metadata (plain mllm v1
    /// files); for a file with metadata it must agree with it.
    pub config: Option<Value>,
    /// `tokenizer.json` text for files without an embedded tokenizer.
    pub tokenizer_json: Option<String>,
    /// A chat template (Jinja source) for files without an embedded one.
    pub chat_template: Option<String>,
    /// Which device runs which nodes (default: everything on the CPU).
    pub placement: Placement,
    /// How the KV cache stores keys and values (default f32; the others
    /// are CPU-only).
    pub kv_dtype: KvDtype,
    /// How CPU linear layers treat the activations of quantized weights
    /// (default: 16-bit rows, `QuantPath::Int16Activations`).
    pub quant_path: Option<QuantPath>,
    /// The fastest SIMD level CPU linear layers may use (default: the
    /// fastest this CPU has); `Some(SimdLevel::Avx2)` runs an AVX-512 CPU
    /// as an AVX2-only one would.
    pub max_simd: Option<SimdLevel>,
}

/// A loaded model, ready to run steps.
pub struct Model {
    architecture: String,
    config: Value,
    generation_config: Option<Value>,
    executor: Executor,
    vocab_size: usize,
    tokenizer: Option<Arc<Tokenizer>>,
    chat_template: Option<String>,
}

impl Model {
    /// Opens a `.mllm` file, builds its architecture's graph and loads the weights.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Self> {
        Self::load_with(path, opts, |architecture, config| {
            (registry::find(architecture)?.build)(config)
        })
    }

    /// Like [`Model::load`], with the module tree made by `build` from the
    /// file's architecture name and `config.json` instead of by the registry:
    /// this loads architectures defined outside this crate.
    pub fn load_with(
        path: impl AsRef<Path>,
        opts: &LoadOptions,
        build: impl FnOnce(&str, &Value) -> Result<Box<dyn CausalLm>>,
    ) -> Result<Self> {
        let file = MllmFile::open(path)?;
        let meta = file.metadata();
        let (architecture, config) = file_meta::config(&file, opts)?;
        crate::config::check_layer_count(&config, file.entries().len())?;
        let tokenizer_json = file_meta::text(
            &file,
            file.tokenizer_json()?,
            opts.tokenizer_json.as_deref(),
            "tokenizer",
        )?;
        let chat_template = file_meta::text(
            &file,
            file.chat_template()?,
            opts.chat_template.as_deref(),
            "chat template",
        )?
        .map(str::to_string);
        let model = build(&architecture, &config)?;
        let vocab_size = model.vocab_size();
        let mut max_context = model.max_context();
        if let Some(cap) = opts.max_context {
            max_context = max_context.min(cap);
        }
        let graph = Graph::trace(model.as_ref())?;
        let mut cpu = CpuBackend::new(opts.threads)?.with_kv_dtype(opts.kv_dtype);
        if let Some(path) = opts.quant_path {
            cpu = cpu.with_quant_path(path);
        }
        if let Some(max) = opts.max_simd {
            cpu = cpu.with_max_simd(max);
        }
        let weights = TrackedWeights::new(&file);
        let executor = match opts.placement.device {
            Device::Cpu => Executor::new(graph, &cpu, &weights, max_context)?,
            Device::Cuda(_) if opts.kv_dtype != KvDtype::F32 => {
                return Err(Error::InvalidInput(format!(
                    "--kv-dtype {} runs on the CPU only; the CUDA backend stores its KV cache as f32",
                    opts.kv_dtype
                )))
            }
            Device::Cuda(n) => {
                let gpu = CudaBackend::new(n)?;
                let nodes = opts.placement.assign(&graph);
                Executor::with_placement(graph, &[&cpu, &gpu], &nodes, &weights, max_context)?
            }
        };
        weights.check_all_read(&architecture)?;
        let tokenizer = tokenizer_json
            .map(Tokenizer::from_json)
            .transpose()?
            .map(Arc::new);
        file.release_text_entries();
        Ok(Model {
            architecture,
            generation_config: meta.and_then(|m| m.generation_config.clone()),
            config,
            executor,
            vocab_size,
            tokenizer,
            chat_template,
        })
    }

    /// The Hugging Face architecture name.
    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    /// The model's `config.json`.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// Size of the vocabulary (columns of the logits).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Longest sequence a slot can hold.
    pub fn max_context(&self) -> usize {
        self.executor.max_context()
    }

    /// The tokenizer, when the file embeds one or one was given (shared, so
    /// it can be used while the model runs).
    pub fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        self.tokenizer.clone()
    }

    /// The tokenizer, or an error saying the file has none.
    pub fn require_tokenizer(&self) -> Result<Arc<Tokenizer>> {
        self.tokenizer.clone().ok_or_else(|| {
            Error::Tokenizer("this model file embeds no tokenizer; pass token ids instead".into())
        })
    }

    /// The chat template, when the file embeds one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The embedded chat template, compiled with the model's BOS and EOS token
    /// strings.
    pub fn chat_template_renderer(&self) -> Result<ChatTemplate> {
        let source = self
            .chat_template()
            .ok_or_else(|| Error::Tokenizer("this model file embeds no chat template".into()))?;
        let tokenizer = self.require_tokenizer()?;
        let token_text = |id: Option<u32>| {
            id.and_then(|i| tokenizer.id_to_token(i))
                .unwrap_or_default()
        };
        ChatTemplate::new(
            source,
            &token_text(self.bos_id()),
            &token_text(self.eos_ids().first().copied()),
        )
    }

    /// The beginning-of-sequence id from `config.json`, if any.
    pub fn bos_id(&self) -> Option<u32> {
        HfConfig::new(&self.config)
            .and_then(|c| c.token_ids("bos_token_id"))
            .ok()
            .and_then(|ids| ids.first().copied())
    }

    /// End-of-sequence ids: from `generation_config.json`, else `config.json`.
    pub fn eos_ids(&self) -> Vec<u32> {
        let from = |v: &Value| {
            HfConfig::new(v)
                .and_then(|c| c.token_ids("eos_token_id"))
                .unwrap_or_default()
        };
        match self.generation_config.as_ref().map(from) {
            Some(ids) if !ids.is_empty() => ids,
            _ => from(&self.config),
        }
    }

    /// Runs one step (see [`Executor::step`]).
    pub fn step(&mut self, input: &StepInput) -> Result<Tensor> {
        self.executor.step(input)
    }

    /// Tokens the sequence in `slot` holds.
    pub fn slot_len(&self, slot: usize) -> usize {
        self.executor.slot_len(slot)
    }

    /// Keeps only the first `len` tokens of the sequence in `slot`.
    pub fn truncate_slot(&mut self, slot: usize, len: usize) {
        self.executor.truncate_slot(slot, len)
    }

    /// Forgets the sequence in `slot`.
    pub fn reset_slot(&mut self, slot: usize) {
        self.executor.reset_slot(slot)
    }

    /// Makes slot `to` hold the first `len` tokens of slot `from` (see
    /// [`Executor::copy_slot`]).
    pub fn copy_slot(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
        self.executor.copy_slot(from, to, len)
    }

    /// The executor (for inspection: reshape counts, arena size, profile).
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// The executor, mutably (to switch profiling on or off).
    pub fn executor_mut(&mut self) -> &mut Executor {
        &mut self.executor
    }
}
