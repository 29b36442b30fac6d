//! Command-line flags of the `mllm-server` binary.

use std::path::PathBuf;

use clap::Parser;

use crate::engine::EngineConfig;

/// Serve a .mllm model over an OpenAI-compatible HTTP API with a web chat page.
#[derive(Parser, Debug, Clone)]
#[command(name = "mllm-server", version)]
pub struct Args {
    /// The .mllm model file (default: the cached SmolLM2-135M-Instruct Q4_1, fetched on first use).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The id clients use for the model (default: the file name without extension).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences generated at once (KV-cache slots).
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Most tokens one step feeds to the model (decode tokens plus prefill chunks).
    #[arg(long, default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// Prompts are prefilled in chunks that end at multiples of this many tokens.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Tokens per sequence, prompt and reply together (default: the model's context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub files: mllm::cli::ModelFileArgs,
    #[command(flatten)]
    pub backend: mllm::cli::BackendArgs,
    /// CPU threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Require `Authorization: Bearer KEY` on the API routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests that may wait for a slot; beyond this new ones get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
}

/// Context used when `--ctx` is not given and the model allows more.
pub const DEFAULT_MAX_CTX: usize = 4096;

impl Args {
    /// The engine's batching settings.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            parallel: self.parallel,
            max_batch_tokens: self.max_batch_tokens,
            prefill_chunk: self.prefill_chunk,
            max_queue: self.max_queue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags shared with the example programs reach the server: model
    /// files for plain mllm v1 files and the device flags.
    #[test]
    fn shared_flags_parse() {
        let args = Args::try_parse_from([
            "mllm-server",
            "--config",
            "c.json",
            "--tokenizer",
            "t.json",
            "--chat-template",
            "t.jinja",
            "--gpu-layers",
            "2",
            "--kv-dtype",
            "q8_0",
            "--int8-activations",
            "--max-simd",
            "avx2",
        ])
        .unwrap();
        assert_eq!(args.files.config, Some(PathBuf::from("c.json")));
        assert_eq!(args.files.tokenizer, Some(PathBuf::from("t.json")));
        assert_eq!(args.files.chat_template, Some(PathBuf::from("t.jinja")));
        assert_eq!(args.backend.gpu_layers, Some(2));
        assert_eq!(args.backend.device, None);
        assert_eq!(args.backend.kv_dtype, mllm::core::KvDtype::Q8_0);
        let mut opts = mllm::models::LoadOptions::default();
        args.backend.apply(&mut opts).unwrap();
        assert_eq!(
            opts.quant_path,
            Some(mllm::ops::cpu::kernels::QuantPath::Int8Packed)
        );
        assert_eq!(opts.kv_dtype, mllm::core::KvDtype::Q8_0);
        assert_eq!(
            opts.max_simd,
            Some(mllm::ops::cpu::kernels::SimdLevel::Avx2)
        );
    }
}
