//! Command-line pieces shared by the example programs.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::core::{KvDtype, Placement, Result};
use crate::models::{LoadOptions, ModelFiles, SamplingParams};
use crate::ops::cpu::kernels::{QuantPath, SimdLevel};

/// Sampling flags (`--temperature`, `--top-k`, `--top-p`, `--min-p`,
/// `--repeat-penalty`, `--seed`), flattened into a program's arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the top probability (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalty for tokens already in the prompt or output (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampler settings these flags describe.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed,
        }
    }
}

/// The exit code for a program's result: success, or `error: <message>` on
/// stderr and exit code 1.
pub fn exit_code(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Backend flags (`--device`, `--gpu-layers`, `--kv-dtype`,
/// `--int8-activations`, `--max-simd`), flattened into a program's
/// arguments.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BackendArgs {
    /// Run on this device: cpu, cuda or cuda:N (default: cpu, or cuda with --gpu-layers).
    #[arg(long)]
    pub device: Option<String>,
    /// Run only the first N decoder layers on the GPU; the rest stays on the CPU.
    #[arg(long)]
    pub gpu_layers: Option<usize>,
    /// How the KV cache stores keys and values: f32, f16, q8_0 or q4 (CPU only).
    #[arg(long, default_value_t = KvDtype::F32)]
    pub kv_dtype: KvDtype,
    /// Multiply Q4/Q5/K-quant weights with 8-bit activations, as llama.cpp does: faster
    /// prefill, slightly less precise than the default 16-bit (CPU only).
    #[arg(long)]
    pub int8_activations: bool,
    /// Use at most this SIMD level in CPU linear layers and attention: amx, avx512, avxvnni, avx2,
    /// neon or scalar (default: the fastest this CPU has; avx512 on an AMX CPU leaves the tiles
    /// unused, avx2 on an AVX-512 CPU runs it as an AVX2-only one).
    #[arg(long, value_name = "LEVEL")]
    pub max_simd: Option<SimdLevel>,
}

impl BackendArgs {
    /// The placement these flags describe.
    pub fn placement(&self) -> Result<Placement> {
        Placement::from_flags(self.device.as_deref(), self.gpu_layers)
    }

    /// Sets the placement, the KV-cache type, the CPU activation path and
    /// the SIMD cap of `opts`.
    pub fn apply(&self, opts: &mut LoadOptions) -> Result<()> {
        opts.placement = self.placement()?;
        opts.kv_dtype = self.kv_dtype;
        opts.quant_path = self.int8_activations.then_some(QuantPath::Int8Packed);
        opts.max_simd = self.max_simd;
        Ok(())
    }
}

/// Flags that describe a plain mllm v1 file (one without embedded
/// metadata): its config, tokenizer and chat template. For a file that
/// embeds them they must agree with what it embeds.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ModelFileArgs {
    /// The model's config.json, for a plain mllm v1 file without embedded metadata.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The model's tokenizer.json, for a file without an embedded tokenizer.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// A chat template (Jinja source), for a file without an embedded one.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

impl ModelFileArgs {
    /// Reads the given files into `opts` (errors name the file).
    pub fn apply(&self, opts: &mut LoadOptions) -> Result<()> {
        opts.read_model_files(&ModelFiles {
            config: self.config.clone(),
            tokenizer: self.tokenizer.clone(),
            chat_template: self.chat_template.clone(),
        })
    }
}
