//! The `mllm-convert` command line.
//!
//! ```text
//! mllm-convert INPUT -o OUT.mllm [--dtype T] [--embed-dtype T] [--head-dtype T] [--quiet]
//! mllm-convert MODEL.gguf -o OUT.mllm [--quiet]
//! mllm-convert quantize IN.mllm OUT.mllm --dtype T [--embed-dtype T] [--head-dtype T] [--quiet]
//! mllm-convert inspect FILE          (.mllm or GGUF)
//! mllm-convert attach IN.mllm -o OUT.mllm (--config config.json | --hf-dir DIR)
//!     [--tokenizer tokenizer.json] [--generation-config FILE] [--chat-template FILE]
//! ```
//!
//! `T` is f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs; which tensors
//! each flag applies to is the policy of `mllm_convert::policy`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use mllm_convert::{
    attach, convert_with_policy, format_bytes, inspect, parse_target_dtype, quantize_file,
    AttachOptions, ConvertReport, DTypePolicy, QuantizeOptions,
};
use mllm_core::{DType, Result};

/// Convert Hugging Face safetensors models and GGUF files into .mllm files, requantize .mllm files, inspect .mllm and GGUF files.
#[derive(Parser, Debug)]
#[command(
    name = "mllm-convert",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Model directory (config.json + model.safetensors or model.safetensors.index.json),
    /// a .safetensors file, a model.safetensors.index.json file, or a .gguf file
    /// (llama, qwen2, qwen3, phi3, gemma or gpt2; tensors kept in their GGUF types,
    /// tokenizer and chat template rebuilt).
    #[arg(required = true, value_name = "INPUT")]
    input: Option<PathBuf>,
    /// The .mllm file to write.
    #[arg(short, long, required = true, value_name = "OUT.mllm")]
    output: Option<PathBuf>,
    /// Storage type of matrices: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs
    /// (vectors always stay f32; rows that are not whole blocks fall back to
    /// q4_1, q8_0 or f16). Not for GGUF input, whose tensors are kept as stored.
    #[arg(long, default_value = "f32", value_name = "DTYPE")]
    dtype: String,
    #[command(flatten)]
    roles: RoleDTypes,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

/// Storage types of the embedding and the output head.
#[derive(Args, Debug)]
struct RoleDTypes {
    /// Storage type of the token embedding (default: --dtype). Position
    /// embeddings take it too, as f16 when it is quantized.
    #[arg(long, value_name = "DTYPE")]
    embed_dtype: Option<String>,
    /// Storage type of an untied output head (default: --dtype). A tied head
    /// is the token embedding.
    #[arg(long, value_name = "DTYPE")]
    head_dtype: Option<String>,
    /// Store Q4_0/Q4_1/Q8_0 matrices (row counts a multiple of 8) in the
    /// packed layout of mllm-rs's kernels: the file then loads by mapping
    /// alone, without repacking into memory.
    #[arg(long)]
    packed: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Describe a .mllm or GGUF file: metadata, config summary and every tensor.
    Inspect {
        /// The .mllm or GGUF file.
        file: PathBuf,
    },
    /// Make a plain mllm v1 file self-describing: embed the config (and the
    /// tokenizer, generation config and chat template), tensor data copied
    /// unchanged. The file's tensors are checked against the config's
    /// architecture before anything is written.
    Attach {
        /// The plain mllm v1 file.
        #[arg(value_name = "IN.mllm")]
        input: PathBuf,
        /// The .mllm file to write.
        #[arg(short, long, value_name = "OUT.mllm")]
        output: PathBuf,
        /// A Hugging Face model directory: its config.json, tokenizer.json,
        /// generation_config.json and chat template (the flags below replace
        /// single files of it).
        #[arg(long, value_name = "DIR")]
        hf_dir: Option<PathBuf>,
        /// The model's config.json (required without --hf-dir).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The model's tokenizer.json.
        #[arg(long, value_name = "FILE")]
        tokenizer: Option<PathBuf>,
        /// The model's generation_config.json.
        #[arg(long, value_name = "FILE")]
        generation_config: Option<PathBuf>,
        /// A chat template (Jinja source).
        #[arg(long, value_name = "FILE")]
        chat_template: Option<PathBuf>,
    },
    /// Requantize a .mllm file written by mllm-rs: metadata, tokenizer and
    /// chat template are kept, tensors are stored as the dtype flags say.
    Quantize {
        /// The .mllm file to read.
        #[arg(value_name = "IN.mllm")]
        input: PathBuf,
        /// The .mllm file to write (may be the input).
        #[arg(value_name = "OUT.mllm")]
        output: PathBuf,
        /// Storage type of matrices: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs.
        #[arg(long, value_name = "DTYPE")]
        dtype: String,
        #[command(flatten)]
        roles: RoleDTypes,
        /// No progress bar.
        #[arg(short, long)]
        quiet: bool,
    },
}

impl RoleDTypes {
    /// The policy with matrices in `dtype` and these role types.
    fn policy(&self, dtype: DType) -> Result<DTypePolicy> {
        let parse = |name: &Option<String>| name.as_deref().map(parse_target_dtype).transpose();
        Ok(DTypePolicy {
            dtype,
            embed_dtype: parse(&self.embed_dtype)?,
            head_dtype: parse(&self.head_dtype)?,
            packed: self.packed,
        })
    }
}

/// The one-line summary of a written file.
fn summary(report: &ConvertReport) -> String {
    let mut line = format!(
        "wrote {} tensors ({}, {}) to {}: {}",
        report.tensors,
        report.architecture,
        report.dtype,
        report.output.display(),
        format_bytes(report.bytes_written)
    );
    if report.fallbacks > 0 {
        line.push_str(&format!(
            "; {} stored in a fallback dtype (rows not whole blocks)",
            report.fallbacks
        ));
    }
    line
}

fn run(cli: Cli) -> Result<()> {
    let report = match cli.command {
        Some(Command::Inspect { file }) => {
            print!("{}", inspect(&file)?);
            return Ok(());
        }
        Some(Command::Attach {
            input,
            output,
            hf_dir,
            config,
            tokenizer,
            generation_config,
            chat_template,
        }) => {
            let opts = AttachOptions {
                hf_dir,
                config,
                tokenizer,
                generation_config,
                chat_template,
            };
            let r = attach(&input, &output, &opts)?;
            let mut line = format!(
                "wrote {} tensors ({}) with metadata to {}",
                r.tensors,
                r.architecture,
                output.display()
            );
            for (embedded, what) in [
                (r.tokenizer, "tokenizer"),
                (r.chat_template, "chat template"),
            ] {
                if embedded {
                    line.push_str(&format!(", {what} embedded"));
                }
            }
            if r.unused > 0 {
                line.push_str(&format!(
                    "; {} tensors the architecture does not use",
                    r.unused
                ));
            }
            println!("{line}");
            return Ok(());
        }
        Some(Command::Quantize {
            input,
            output,
            dtype,
            roles,
            quiet,
        }) => {
            let opts = QuantizeOptions {
                policy: roles.policy(parse_target_dtype(&dtype)?)?,
                progress: !quiet,
            };
            quantize_file(&input, &output, &opts)?
        }
        None => {
            // clap enforces both when there is no subcommand.
            let (Some(input), Some(output)) = (cli.input, cli.output) else {
                return Err(mllm_core::Error::InvalidInput(
                    "expected INPUT and -o OUT.mllm".into(),
                ));
            };
            // GGUF input keeps its tensors as stored: any dtype other than the
            // default is refused by the importer with the reason.
            let dtype = if mllm_convert::gguf::is_gguf(&input) {
                cli.dtype.parse()?
            } else {
                parse_target_dtype(&cli.dtype)?
            };
            let opts = QuantizeOptions {
                policy: cli.roles.policy(dtype)?,
                progress: !cli.quiet,
            };
            convert_with_policy(&input, &output, &opts)?
        }
    };
    println!("{}", summary(&report));
    Ok(())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors print clap's "error: ..." text and exit 1 like any
            // other error; --help and --version print to stdout and succeed.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
