//! Perplexity of a model on a text file.
//!
//! ```text
//! cargo run --release --example perplexity -- --model m.mllm --file text.txt --ctx 256
//! ```
//!
//! Method: the whole file is tokenized without special tokens (no BOS is
//! added) and cut into non-overlapping windows of `--ctx` tokens; a final
//! window shorter than `--ctx` is dropped. Each window starts from an empty
//! KV cache, and every token after its first is scored by the negative
//! log-likelihood the model gave it from the tokens before it in the window.
//! `PPL = exp(mean NLL)` over all scored tokens of all windows.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mllm::core::{Error, LogitsMode, Result, StepInput};
use mllm::models::{prefill_steps, LoadOptions, Model};

#[derive(Parser, Debug)]
#[command(about = "Perplexity of a .mllm model on a text file")]
struct Args {
    /// The .mllm model file.
    #[arg(long)]
    model: PathBuf,
    /// The text file to score.
    #[arg(long)]
    file: PathBuf,
    /// Window length in tokens.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score at most this many windows (0: all).
    #[arg(long, default_value_t = 0)]
    max_windows: usize,
    #[command(flatten)]
    backend: mllm::cli::BackendArgs,
    #[command(flatten)]
    files: mllm::cli::ModelFileArgs,
    /// CPU threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// Tokens are fed to the model in steps of this many (see `prefill_steps`:
/// a last step of one token joins the one before), so the logits of a long
/// window never need to be held at once.
const CHUNK: usize = 128;

/// `-log softmax(logits)[target]`, in f64.
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

/// Summed NLL of tokens `1..` of `window`, scored from a fresh KV cache.
fn score_window(model: &mut Model, window: &[u32]) -> Result<f64> {
    model.reset_slot(0);
    let mut total = 0.0;
    for range in prefill_steps(window.len(), CHUNK) {
        let chunk = window[range.clone()].to_vec();
        let logits = model.step(&StepInput::single(0, chunk, LogitsMode::All))?;
        for (i, pos) in range.enumerate() {
            if let Some(&next) = window.get(pos + 1) {
                total += nll(logits.row(i), next);
            }
        }
    }
    Ok(total)
}

fn run(args: Args) -> Result<()> {
    if args.ctx < 2 {
        return Err(Error::InvalidInput("--ctx must be at least 2".into()));
    }
    let mut opts = LoadOptions {
        threads: args.threads,
        ..Default::default()
    };
    args.files.apply(&mut opts)?;
    args.backend.apply(&mut opts)?;
    let mut model = Model::load(&args.model, &opts)?;
    if args.ctx > model.max_context() {
        return Err(Error::InvalidInput(format!(
            "--ctx {} exceeds the model's context of {}",
            args.ctx,
            model.max_context()
        )));
    }
    let text = std::fs::read_to_string(&args.file).map_err(|e| Error::io(&args.file, e))?;
    let ids = model.require_tokenizer()?.encode(&text, false)?;
    let mut windows: Vec<&[u32]> = ids.chunks_exact(args.ctx).collect();
    if args.max_windows > 0 {
        windows.truncate(args.max_windows);
    }
    if windows.is_empty() {
        return Err(Error::InvalidInput(format!(
            "{} has {} tokens, fewer than one window of {}",
            args.file.display(),
            ids.len(),
            args.ctx
        )));
    }
    let (mut sum, mut count) = (0.0, 0usize);
    for (w, window) in windows.iter().enumerate() {
        sum += score_window(&mut model, window)?;
        count += window.len() - 1;
        eprintln!(
            "window {}/{}: running PPL {:.4}",
            w + 1,
            windows.len(),
            (sum / count as f64).exp()
        );
    }
    println!("PPL = {:.4}", (sum / count as f64).exp());
    eprintln!(
        "{} windows of {} tokens, {count} tokens scored",
        windows.len(),
        args.ctx
    );
    Ok(())
}

fn main() -> ExitCode {
    mllm::cli::exit_code(run(Args::parse()))
}
