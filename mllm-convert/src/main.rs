//! The `mllm-convert` command line.
//!
//! ```text
//! mllm-convert INPUT -o OUT.mllm [--dtype f32|f16|bf16] [--quiet]
//! mllm-convert MODEL.gguf -o OUT.mllm [--quiet]
//! mllm-convert inspect FILE
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mllm_convert::{convert, format_bytes, inspect, parse_target_dtype, ConvertOptions};
use mllm_core::Result;

/// Convert Hugging Face safetensors models and GGUF files into .mllm files, and inspect .mllm files.
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
    /// (Llama; tensors kept in their GGUF types, tokenizer and chat template rebuilt).
    #[arg(required = true, value_name = "INPUT")]
    input: Option<PathBuf>,
    /// The .mllm file to write.
    #[arg(short, long, required = true, value_name = "OUT.mllm")]
    output: Option<PathBuf>,
    /// Storage type of matrices: f32, f16 or bf16 (vectors always stay f32).
    /// Not for GGUF input, whose tensors are kept as stored.
    #[arg(long, default_value = "f32", value_name = "DTYPE")]
    dtype: String,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Describe a .mllm file: metadata, config summary and every tensor.
    Inspect {
        /// The .mllm file.
        file: PathBuf,
    },
}

fn run(cli: Cli) -> Result<()> {
    if let Some(Command::Inspect { file }) = cli.command {
        print!("{}", inspect(&file)?);
        return Ok(());
    }
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
    let opts = ConvertOptions {
        dtype,
        progress: !cli.quiet,
    };
    let report = convert(&input, &output, &opts)?;
    println!(
        "wrote {} tensors ({}, {}) to {}: {}",
        report.tensors,
        report.architecture,
        report.dtype,
        report.output.display(),
        format_bytes(report.bytes_written)
    );
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
